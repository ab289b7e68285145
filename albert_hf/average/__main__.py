"""`python -m albert_hf.average OUT CHECKPOINT CHECKPOINT ...`: see `albert_hf.average`."""

from ..runtime.cli import run_entry_point
from .averaging import main

run_entry_point(main)
