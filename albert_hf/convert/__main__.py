"""`python -m albert_hf.convert ...`: see `albert_hf.convert.cli`."""

from ..runtime.cli import run_entry_point
from .cli import main

run_entry_point(main)
