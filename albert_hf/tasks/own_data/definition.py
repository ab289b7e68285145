"""Your own labelled data's task (`OwnTask`): classification or regression, its labels in the config, its metric and
its predictions file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets import ClassLabel

from ...errors import InputError
from ...metrics import classification_metrics, regression_metrics
from ..outputs import write_index_predictions
from .features import label_key

PREDICTIONS_FILE = "predict_results.txt"  # transformers' run_glue.py: index<TAB>prediction


@dataclass(frozen=True)
class OwnTask:
    text_columns: tuple[str, ...]
    label_names: tuple[str, ...] | None  # class names in id order; None: regression
    name: str = "your data"
    predict_only: bool = False
    submission_files = {"test": PREDICTIONS_FILE}

    @property
    def is_regression(self) -> bool:
        return self.label_names is None

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.label_names)

    @property
    def main_metric(self) -> str:
        return "pearson" if self.is_regression else "accuracy"

    def split_kind(self, split: str) -> str:
        return split

    def describe(self) -> str:
        labels = (
            "regression (float labels)" if self.is_regression else f"{self.num_labels} classes {list(self.label_names)}"
        )
        return f"text columns {list(self.text_columns)}; {labels}"

    def encode_labels(self, dataset, where: str):
        """The `label` column as class ids in this task's order (floats for regression); a value the training set
        lacks, or no value, stops the run naming the file and row."""
        feature = dataset.features["label"]
        values = dataset["label"]
        if isinstance(feature, ClassLabel):
            values = [None if value is None or value < 0 else feature.names[value] for value in values]
        encoded = []
        if self.is_regression:
            for row, value in enumerate(values):
                number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
                if not math.isfinite(number):
                    raise InputError(
                        f"{where}: row {row}: label {value!r} is not a number (the training labels "
                        "are floats: regression)"
                    )
                encoded.append(float(number))
        else:
            ids = {name: i for i, name in enumerate(self.label_names)}
            for row, value in enumerate(values):
                if value is None:
                    raise InputError(f"{where}: row {row}: no label")
                key = label_key(value)
                if key not in ids:
                    raise InputError(
                        f"{where}: row {row}: label {value!r} is not among the training labels {list(self.label_names)}"
                    )
                encoded.append(ids[key])
        return dataset.add_column("label_id", encoded).remove_columns("label").rename_column("label_id", "label")

    def label_config(self) -> dict:
        if self.is_regression:
            return dict(num_labels=1, problem_type="regression", finetuning_task="text-classification")
        return dict(
            num_labels=self.num_labels,
            id2label=dict(enumerate(self.label_names)),
            label2id={name: i for i, name in enumerate(self.label_names)},
            problem_type="single_label_classification",
            finetuning_task="text-classification",
        )

    def compute_metrics_function(self):
        """Trainer `compute_metrics`: accuracy and macro-F1, or Pearson, Spearman and MSE."""

        def compute_metrics(eval_prediction):
            logits = eval_prediction.predictions
            logits = logits[0] if isinstance(logits, tuple) else logits
            if self.is_regression:
                return regression_metrics(np.squeeze(logits, axis=-1), eval_prediction.label_ids)
            return classification_metrics(np.argmax(logits, axis=-1), eval_prediction.label_ids)

        return compute_metrics

    def write_predictions(self, path, indices, logits) -> Path:
        """`index<TAB>prediction` per row, as transformers' run_glue.py writes them: the class name, or the score."""
        return write_index_predictions(path, indices, logits, self.label_names, self.is_regression)
