"""The training of a pretraining run: the loop (`loop.py`), one optimizer step (`step.py`, captured whole by
`step_graph.py`), the model and optimizer (`model.py`), evaluation and metrics (`evaluation.py`), divergence
(`divergence.py`)."""
