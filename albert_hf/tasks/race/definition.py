"""RACE for run_race.py: the paper's rows (--paper_hparams, --race_recipe), accuracy (overall and per subset) and the
baseline. The questions are read in data.py, formatted in features.py; the predictions file is evaluation.py's."""

import numpy as np

from ..paper_hparams import OFFICIAL_FINETUNING, best_on_dev
from ..seeds import Baseline
from .data import RaceDataArguments

# The RACE rows of the recipe (docs/official_recipe.md). v2 models: the official run_race.py defaults and README
# (lr 1e-5, the v2 configs' dropout 0); v1 models: the paper's Table 14 (lr 2e-5, dropout 0.1), which the official
# README warns makes v2 models diverge. Both: total batch 32, 12000 steps, 1000 warm-up, 512 tokens with the
# question+option part at 128, head dropout 0.1 (run_race.py's dropout_prob), the official optimizer.
PAPER_HPARAMS = {"v2": dict(learning_rate=1e-5, albert_dropout=0.0), "v1": dict(learning_rate=2e-5, albert_dropout=0.1)}
PAPER_COMMON = dict(
    batch_size=32,
    max_steps=12000,
    warmup_steps=1000,
    max_seq_length=512,
    max_qa_length=128,
    classifier_dropout_prob=0.1,
    **OFFICIAL_FINETUNING,
    **best_on_dev(1000),
)
MAIN_METRIC = "accuracy"
# Every RACE question has four options: a model that learned nothing is right one time in four.
BASELINE = Baseline(MAIN_METRIC, 0.25, "chance (1 of 4 options)")


def paper_recipe(data_args: RaceDataArguments) -> tuple[str, dict]:
    """(name, recipe) of the --race_recipe row, for `paper_hparams.apply_paper_hparams`."""
    row = data_args.race_recipe
    return f"RACE, {row} models", {**PAPER_HPARAMS[row], **PAPER_COMMON}


# ----------------------------------------------------------------------------------------------------------------
# Metrics and predictions


def accuracy_by_subset(predicted, labels, subsets) -> dict:
    """Accuracy overall and, for the levels present, per level (the paper reports RACE-M, RACE-H and RACE)."""
    predicted, labels, subsets = np.asarray(predicted), np.asarray(labels), np.asarray(subsets, dtype=object)
    correct = predicted == labels
    metrics = {"accuracy": float(correct.mean())}
    for level in ("high", "middle"):
        chosen = subsets == level
        if chosen.any():
            metrics[f"accuracy_{level}"] = float(correct[chosen].mean())
            metrics[f"num_{level}"] = int(chosen.sum())
    return metrics


def compute_accuracy(eval_prediction) -> dict:
    """Trainer's compute_metrics (used for evaluations during training and best-checkpoint selection)."""
    return {"accuracy": float((eval_prediction.predictions.argmax(-1) == eval_prediction.label_ids).mean())}
