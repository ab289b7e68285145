"""What a pretraining run writes: the log, the checkpoints (each also a model folder), the final folder, its model
card, and the Hub."""
