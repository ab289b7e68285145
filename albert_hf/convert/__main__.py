"""`python -m albert_hf.convert ...`: see `albert_hf.convert.main`."""

from ..runtime.cli import run_entry_point
from . import main

run_entry_point(main)
