"""Token classification's metric (entity precision, recall and F1, seqeval's rules) and baseline."""

from __future__ import annotations

import numpy as np
from datasets import Dataset

from ...metrics.ner import entity_scores
from ..seeds import Baseline

MAIN_METRIC = "f1"  # over entities (seqeval)


# A model that learned nothing tags every word O (or entities at random): no entity found right.
BASELINE = Baseline(MAIN_METRIC, 0.0, "no entity found")


def word_tags(logits, first_pieces, names) -> list[list[str]]:
    """Each sentence's predicted tag per word, from its first piece (`O` for words cut off by truncation)."""
    predictions = np.argmax(logits, axis=-1)
    return [
        [names[predictions[row][position]] if position >= 0 else "O" for position in firsts]
        for row, firsts in enumerate(first_pieces)
    ]


def compute_metrics_function(features: Dataset, names: tuple[str, ...], per_type: bool):
    """Trainer `compute_metrics` for `features` (the evaluation loop keeps their order): scores per word."""
    first_pieces = features["first_pieces"]
    gold = [[names[tag] for tag in tags] for tags in features["ner_tags"]]

    def compute_metrics(eval_prediction):
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return entity_scores(gold, word_tags(logits, first_pieces, names), per_type)

    return compute_metrics
