"""The evaluation of a pretraining run's checkpoints downstream (run_checkpoint_evals.py)."""

from .job import main

__all__ = ["main"]
