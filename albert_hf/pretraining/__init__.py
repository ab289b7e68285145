"""The pretraining job (run_pretraining.py): arguments, inputs, model, step, checkpoints, final folder."""
