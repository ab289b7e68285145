"""run_glue.py's own steps: the test sets' predictions, the GLUE submission files and the metrics of a test set with
labels. The data arguments and the splits are in data.py, the tokenizing in features.py, the tasks and their
recipes, metrics and baselines in definition.py."""

from __future__ import annotations

import logging
from pathlib import Path

from ..outputs import save_results, suffixed
from .definition import GlueTask

logger = logging.getLogger(__name__)

# A second dev or test set's metric keys get this suffix, as in transformers' run_glue.py (mnli-mm).
SUFFIXES = {"validation_mismatched": "_mm", "test_mismatched": "_mm"}


def labels_of_test_set(raw, task, where: str):
    """The encoded labels of a test set when it has them all, else None: the GLUE test files have no label
    column, the Hub's test splits have -1; a file with only some labelled rows gets a warning."""
    if "label" not in raw.column_names:
        return None
    missing = [value is None or str(value).strip() in ("", "-1") for value in raw["label"]]
    if all(missing):
        return None
    if any(missing):
        logger.warning(
            "%s: %d of %d rows have no label: no metrics (predict_results.json) for it",
            where,
            sum(missing),
            len(missing),
        )
        return None
    return task.encode_labels(raw, where)["label"]


def predict_and_write(
    trainer, task: GlueTask, features: dict, raw_splits, splits: dict, sources: dict, output_dir
) -> dict | None:
    """Each test split's predictions file and, for those whose rows all have labels, their `predict_*` metrics.

    The files are the task's (`submission_files`: MRPC.tsv, MNLI-m.tsv, ... for GLUE; predict_results.txt for the
    user's own data), `index<TAB>prediction`. A second test set's metric keys are suffixed (`SUFFIXES`: MNLI's
    mismatched set, `_mm`). Every process calls it; only the main process writes the files.

    Args:
        trainer (`trainer.AlbertTrainer`): the run's trainer, its `compute_metrics` the task's.
        task (`GlueTask` or `own_data.definition.OwnTask`): the task (`write_predictions`, `submission_files`).
        features (`dict`): split -> tokenized dataset (`tokenize_splits`); the test splits among them are predicted.
        raw_splits (`DatasetDict`): the splits as read, whose labels a test split may have.
        splits (`dict`): split -> prepared dataset; its `idx` column, when there is one, gives the row ids written.
        sources (`dict`): split -> where it came from, named in warnings.
        output_dir (`str` or `os.PathLike`): the folder for the predictions files.

    Returns:
        `dict` or `None`: the `predict_*` metrics and `predict_samples` of the labelled test splits, as written to
        predict_results.json and all_results.json in the trainer's output_dir; None when no test split has labels
        (the GLUE test files).

    Raises:
        InputError: a test split whose rows all have labels has one that is not the task's.
    """
    metrics = {}
    for split in [split for split in features if task.split_kind(split) == "test"]:
        dataset = features[split]
        labels = labels_of_test_set(raw_splits[split].select(range(len(dataset))), task, f"{sources[split]} ({split})")
        if labels is not None:  # then Trainer.predict computes the task metric too
            dataset = dataset.add_column("label", labels)
        output = trainer.predict(dataset, metric_key_prefix="predict")
        indices = splits[split]["idx"] if "idx" in splits[split].column_names else range(len(splits[split]))
        if trainer.is_world_process_zero():
            path = task.write_predictions(Path(output_dir) / task.submission_files[split], indices, output.predictions)
            logger.info("%s predictions: %s", split, path)
        if labels is not None:
            metrics.update(suffixed({**output.metrics, "predict_samples": len(dataset)}, SUFFIXES.get(split, "")))
    return save_results(trainer, "predict", metrics) if metrics else None
