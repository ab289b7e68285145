"""run_ner.py's predictions: each word's tag written one sentence per line (transformers' run_ner.py format), with the
metrics when the test set has tags."""

from __future__ import annotations

import logging
from pathlib import Path

from datasets import Dataset

from ..outputs import save_results
from .definition import compute_metrics_function, word_tags

logger = logging.getLogger(__name__)


PREDICTIONS_FILE = "predictions.txt"  # transformers' run_ner.py: one sentence per line, its tags space-separated


def write_predictions(path, logits, first_pieces, names) -> Path:
    """One line per sentence, its words' predicted tags separated by spaces (transformers' run_ner.py)."""
    path = Path(path)
    sentences = word_tags(logits, first_pieces, names)
    cut = sum(position < 0 for firsts in first_pieces for position in firsts)
    if cut:
        logger.warning("%d word(s) beyond --max_seq_length had no piece to tag: written as O in %s", cut, path)
    path.write_text("".join(" ".join(tags) + "\n" for tags in sentences), encoding="utf-8")
    return path


def predict_and_write(
    trainer, features: Dataset, inputs: Dataset, names: tuple[str, ...], per_type: bool, output_dir
) -> dict | None:
    """The test split's predictions file and, when its sentences have tags, its `predict_*` metrics.

    The file is PREDICTIONS_FILE (predictions.txt) in `output_dir`: one line per sentence, its words' predicted tags
    separated by spaces (`O` for words truncation cut off). Sets `trainer.compute_metrics` to this split's
    (None without tags). Every process calls it; only the main process writes the file.

    Args:
        trainer (`trainer.AlbertTrainer`): the run's trainer.
        features (`datasets.Dataset`): the test split's features (`tokenize_splits`), with `first_pieces`.
        inputs (`datasets.Dataset`): its model columns (`tokenize_splits`).
        names (`tuple[str, ...]`): the tags in id order.
        per_type (`bool`): also the scores of each entity type (--return_entity_level_metrics).
        output_dir (`str` or `os.PathLike`): the folder for the predictions file.

    Returns:
        `dict` or `None`: with tags, the `predict_*` metrics and `predict_samples`, as written to predict_results.json
        and all_results.json in the trainer's output_dir; None without.
    """
    labelled = "labels" in features.column_names
    trainer.compute_metrics = compute_metrics_function(features, names, per_type) if labelled else None
    output = trainer.predict(inputs, metric_key_prefix="predict")
    if trainer.is_world_process_zero():
        path = write_predictions(
            Path(output_dir) / PREDICTIONS_FILE, output.predictions, features["first_pieces"], names
        )
        logger.info("test predictions: %s", path)
    return save_results(trainer, "predict", {**output.metrics, "predict_samples": len(features)}) if labelled else None
