"""The pretraining job (run_pretraining.py), by stage. Read in this order:

1. The entry: `job.py` (`main`: parse, prepare, fit, finish; `preprocess` for --preprocess_only), the typed
   argument groups in `arguments.py`, their resolution against each other and the machine in `resolution.py`, and
   the plan of memory and time (--dry_run, --auto_find_batch_size) in `plan.py`.
2. The data, `data/`: text (`corpus.py`, `embedded_corpus.py`, `splits.py`) -> sentences (`sentences.py`) -> pairs
   (`pairs.py`) -> batches (`collator.py`), assembled by `inputs.py`; or pairs prepared once (`prepared_data.py`).
   Several sources mixed: named in `sources.py`, drawn on the mix's schedule in `mixture.py`.
3. The training, `training/`: `loop.py` (`fit`; where it stands: `TrainingState` in `state.py`) runs one optimizer step
   at a time (`step.py`; `step_graph.py` captures it as a CUDA graph) on the model of `model.py`; the held-out
   evaluation and the metrics in `evaluation.py`; a run that diverges in `divergence.py`. A step reads job.py ->
   loop.py -> step.py.
4. What a run writes, `output/`: the log (`log.py`), the checkpoints (`checkpoints.py`, each a model folder too:
   `loadable.py`), the final folder (`final_folder.py`), its card (`pretraining_card.py`) and the Hub (`hub_push.py`).
"""
