"""RACE (Lai et al., 2017) for run_race.py: reading the data (data.py), the official input formatting
(features.py), the recipe and accuracy (job.py)."""

from .data import RaceDataArguments, article_rows, load_race_split
from .features import build_choice_input, data_collator, encode_questions, fill_option, fit_lengths
from .job import (
           BASELINE,
           MAIN_METRIC,
           accuracy_by_subset,
           compute_accuracy,
           evaluate_and_write_predictions,
           paper_recipe,
)

__all__ = ["BASELINE", "MAIN_METRIC", "RaceDataArguments", "accuracy_by_subset", "article_rows", "build_choice_input",
           "compute_accuracy", "data_collator", "encode_questions", "evaluate_and_write_predictions", "fill_option",
           "fit_lengths", "load_race_split", "paper_recipe"]
