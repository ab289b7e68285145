"""Your own labelled data in run_glue.py (no --task_name): text classification or regression, read the way
transformers' run_glue.py reads a user's data.

- Data: --train_file / --validation_file / --test_file (.csv, .tsv, .json, .jsonl, .parquet), or --dataset_name
  (a Hub dataset with --dataset_config_name, a folder of such files, or a folder written by `save_to_disk`).
- Text: --text_column_names, else `sentence1` and `sentence2` when both are there, else the first one or two text
  columns other than the label.
- Labels: the column --label_column_name (default `label`). Strings and integers are classes, sorted (a
  ClassLabel keeps its names and order); floats mean regression. A checkpoint already fine-tuned on the same classes
  keeps its mapping; other classes are refused unless --ignore_mismatched_sizes.

`OwnTask` answers what run_glue.py asks of a GLUE task (`glue.tasks.GlueTask`): text columns, labels, metrics and the
predictions file.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datasets import ClassLabel, DatasetDict, Value, load_dataset, load_from_disk

from ..errors import InputError, first_line
from ..hub.model_card import CardDataset, limits, user_data
from ..metrics import classification_metrics, regression_metrics
from ..runtime.input_files import read_with_datasets
from .finetuning import SPLIT_FLAGS, write_index_predictions

logger = logging.getLogger(__name__)

# file extension -> (datasets builder, its options)
FORMATS = {".csv": ("csv", {}), ".tsv": ("csv", {"delimiter": "\t"}), ".json": ("json", {}),
           ".jsonl": ("json", {}), ".parquet": ("parquet", {})}
SPLIT_KINDS = ("train", "validation", "test")
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
        labels = "regression (float labels)" if self.is_regression else \
            f"{self.num_labels} classes {list(self.label_names)}"
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
                    raise InputError(f"{where}: row {row}: label {value!r} is not a number (the training labels "
                                     "are floats: regression)")
                encoded.append(float(number))
        else:
            ids = {name: i for i, name in enumerate(self.label_names)}
            for row, value in enumerate(values):
                if value is None:
                    raise InputError(f"{where}: row {row}: no label")
                key = label_key(value)
                if key not in ids:
                    raise InputError(f"{where}: row {row}: label {value!r} is not among the training labels "
                                     f"{list(self.label_names)}")
                encoded.append(ids[key])
        return dataset.add_column("label_id", encoded).remove_columns("label").rename_column("label_id", "label")

    def label_config(self) -> dict:
        if self.is_regression:
            return dict(num_labels=1, problem_type="regression", finetuning_task="text-classification")
        return dict(num_labels=self.num_labels, id2label=dict(enumerate(self.label_names)),
                    label2id={name: i for i, name in enumerate(self.label_names)},
                    problem_type="single_label_classification", finetuning_task="text-classification")

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


def label_key(value) -> str:
    """A label as a class name: strings as they are (stripped), integers as their digits."""
    if isinstance(value, (bool, np.bool_)):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_file(path):
    path = Path(path)
    builder, options = FORMATS[path.suffix.lower()]
    return read_with_datasets(path, builder, **options)


def with_label_column(dataset, label_column: str, where: str, required: bool):
    """`label_column` renamed to `label` (a different column already called `label` is dropped, with a note)."""
    if label_column not in dataset.column_names:
        if required:
            raise InputError(f"{where}: no label column {label_column!r} (--label_column_name); found "
                             f"{dataset.column_names}")
        return dataset.remove_columns([name for name in ("label",) if name in dataset.column_names])
    if label_column == "label":
        return dataset
    if "label" in dataset.column_names:
        logger.info("%s: using column %r as the label; its column 'label' is not used", where, label_column)
        dataset = dataset.remove_columns("label")
    return dataset.rename_column(label_column, "label")


def load_hub_or_folder(name: str, config: str | None, cache_dir=None, token=None) -> DatasetDict:
    """--dataset_name: a `save_to_disk` folder, a folder of data files, or a Hub dataset."""
    folder = Path(name)
    try:
        if (folder / "dataset_dict.json").is_file():
            return load_from_disk(str(folder))
        return load_dataset(name, config, cache_dir=cache_dir, token=token)
    except (ConnectionError, FileNotFoundError, ValueError, OSError) as error:
        offline = " (offline? pass --train_file/--validation_file/--test_file)" if not folder.exists() else ""
        raise InputError(f"--dataset_name {name}: {first_line(error)}{offline}") from None


def load_raw_splits(data_args, needed, cache_dir=None, token=None) -> tuple[DatasetDict, dict]:
    """The splits of the user's data that `needed` asks for, with `label` the label column, and where each came from.

    --train_file / --validation_file / --test_file when any is given (only those of needed splits are read), else
    --dataset_name (`load_hub_or_folder`). The label column (--label_column_name) is renamed `label`; a test split may
    lack it.

    Args:
        data_args (`GlueDataArguments`): the data arguments (the files, `dataset_name`, `dataset_config_name`,
            `label_column_name`).
        needed (`dict` or `set`): the splits to read, "train", "validation", "test" (`wanted`'s keys).
        cache_dir (`str`, *optional*): the `datasets` cache for a Hub dataset.
        token (`str`, *optional*): the Hub token for a Hub dataset.

    Returns:
        `tuple(DatasetDict, dict)`: the splits (labels not yet encoded), and split -> its file or `<dataset>[<split>]`.

    Raises:
        InputError: a needed split is not there, a file or the dataset cannot be read, or a train or validation split
            has no label column.
    """
    label_column = data_args.label_column_name
    files = {kind: getattr(data_args, f"{kind}_file") for kind in SPLIT_KINDS}
    splits, sources = DatasetDict(), {}
    if any(files.values()):
        for kind, path in files.items():
            if path is not None and kind in needed:
                splits[kind] = read_file(path)
                sources[kind] = str(path)
                logger.info("%s: %d rows from %s", kind, len(splits[kind]), path)
    else:
        found = load_hub_or_folder(data_args.dataset_name, data_args.dataset_config_name, cache_dir, token)
        for kind in set(needed) & set(found):
            sources[kind] = f"{data_args.dataset_name}[{kind}]"
            splits[kind] = found[kind]
        available = list(found)
    for kind in sorted(set(needed) - set(splits)):
        where = f"--{kind}_file" if any(files.values()) else f"--dataset_name {data_args.dataset_name} (splits: " \
            f"{available})"
        raise InputError(f"{SPLIT_FLAGS[kind]} needs {kind} data: none in {where}")
    for kind in splits:  # a test split may have no labels
        splits[kind] = with_label_column(splits[kind], label_column, sources[kind], required=kind != "test")
    return splits, sources


# ----------------------------------------------------------------------------------------------------------------
# The task the data describes


def is_text(feature) -> bool:
    return isinstance(feature, Value) and feature.dtype in ("string", "large_string")


def choose_text_columns(dataset, given: str | None, where: str) -> tuple[str, ...]:
    """The one or two text columns of the user's data.

    --text_column_names when given; else `sentence1` and `sentence2` when both are there; else the first one or two
    string columns other than `label`.

    Args:
        dataset (`datasets.Dataset`): a split of the data.
        given (`str`, *optional*): --text_column_names, one or two column names separated by a comma.
        where (`str`): the file or split, named in errors.

    Returns:
        `tuple[str, ...]`: the one or two column names, in order.

    Raises:
        InputError: `given` names a column the split lacks, or not one or two columns; or, without `given`, the split
            has no string column besides `label`.
    """
    columns = [name for name in dataset.column_names if name != "label"]
    if given:
        names = tuple(name.strip() for name in given.split(",") if name.strip())
        missing = [name for name in names if name not in dataset.column_names]
        if missing or not 1 <= len(names) <= 2:
            raise InputError(f"--text_column_names {given}: " + (f"{where} has no column(s) {missing}; found "
                             f"{dataset.column_names}" if missing else "one or two columns, separated by a comma"))
        return names
    if "sentence1" in columns and "sentence2" in columns:
        return ("sentence1", "sentence2")
    texts = [name for name in columns if is_text(dataset.features[name])]
    if not texts:
        raise InputError(f"{where}: no text column besides the label; found {dataset.column_names} "
                         "(--text_column_names names them)")
    return tuple(texts[:2])


def value_kind(value) -> str:
    for kind, types in (("bool", (bool, np.bool_)), ("int", (int, np.integer)), ("float", (float, np.floating)),
                        ("str", str)):
        if isinstance(value, types):
            return kind
    return type(value).__name__


def class_names(dataset, where: str) -> tuple[str, ...] | None:
    """The training labels' classes in id order, or None for float labels (regression).

    A ClassLabel keeps its names and order; strings, integers and booleans are classes, sorted by value (integers
    numerically) and named as `label_key` writes them; floats, even whole ones, mean regression.

    Args:
        dataset (`datasets.Dataset`): the training split, with its `label` column.
        where (`str`): the file or split, named in errors.

    Returns:
        `tuple[str, ...]` or `None`: the class names, or None for regression.

    Raises:
        InputError: a row has no label, the labels mix types, or they are of another type (e.g. lists).
    """
    feature = dataset.features["label"]
    if isinstance(feature, ClassLabel):
        return tuple(feature.names)
    values = dataset["label"]
    missing = next((row for row, value in enumerate(values) if value is None), None)
    if missing is not None:
        raise InputError(f"{where}: row {missing}: no label")
    kinds = {}  # type name -> first row
    for row, value in enumerate(values):
        kinds.setdefault(value_kind(value), row)
    if len(kinds) > 1:
        first, second = sorted(kinds.items(), key=lambda kind: kind[1])[:2]
        raise InputError(f"{where}: the labels mix types: row {first[1]} is {first[0]}, row {second[1]} is "
                         f"{second[0]} (strings or integers for classes, floats for regression)")
    kind = next(iter(kinds))
    if kind == "float":
        return None
    if kind not in ("str", "int", "bool"):
        raise InputError(f"{where}: the labels are {kind}: expected strings, integers or floats")
    return tuple(label_key(value) for value in sorted(set(values)))


def checkpoint_classes(config) -> tuple[str, ...] | None:
    """The classes a checkpoint was fine-tuned on, or None (pretrained: LABEL_0, LABEL_1)."""
    names = [str(name) for _, name in sorted((int(i), n) for i, n in (config.id2label or {}).items())]
    return None if all(name.startswith("LABEL_") for name in names) else tuple(names)


def labels_without_training(checkpoint_config, model_name: str, what: str = "classes"):
    """With no training data, the labels are the checkpoint's (None: regression); a pretrained one has none."""
    if checkpoint_config.problem_type == "regression":
        return None
    fine_tuned = checkpoint_classes(checkpoint_config)
    if fine_tuned is None:
        raise InputError(f"{model_name} has no {what} of its own (not fine-tuned), and without --do_train no "
                         "training data says which: fine-tune it first, or pass --train_file")
    return fine_tuned


def reconcile_labels(names, checkpoint_config, model_name: str, where: str, ignore_mismatched_sizes: bool,
                     what: str = "classes"):
    """The training data's label `names` (None: regression), in the checkpoint's order when it was fine-tuned on
    the same ones, so that its head keeps its meaning. Other labels than a fine-tuned checkpoint's stop the run,
    unless --ignore_mismatched_sizes.

    Args:
        names (`tuple[str, ...]`, *optional*): the training data's labels (`class_names`,
            `ner.tag_names`); None: regression.
        checkpoint_config (`PretrainedConfig`): the checkpoint's config (`id2label`, `problem_type`).
        model_name (`str`): the checkpoint, named in messages.
        where (`str`): the training file or split, named in messages.
        ignore_mismatched_sizes (`bool`): --ignore_mismatched_sizes: train a new head on other labels, with a warning.
        what (`str`, defaults to `"classes"`): the labels' name in messages, e.g. "tags".

    Returns:
        `tuple[str, ...]` or `None`: the checkpoint's labels when they are `names` in another order, else `names`.

    Raises:
        InputError: the checkpoint was fine-tuned on other labels (or on regression against classes, or the reverse),
            without --ignore_mismatched_sizes.
    """
    fine_tuned = checkpoint_classes(checkpoint_config)
    was_regression = checkpoint_config.problem_type == "regression"
    if fine_tuned is not None and names is not None and set(fine_tuned) == set(names):
        return fine_tuned
    if (fine_tuned is None and not was_regression) or names == fine_tuned:
        return names
    had = "regression" if was_regression else f"the {what} {list(fine_tuned)}"
    has = "float labels (regression)" if names is None else f"the {what} {list(names)}"
    if not ignore_mismatched_sizes:
        raise InputError(f"{model_name} was fine-tuned on {had}, and {where} has {has}: pass "
                         "--ignore_mismatched_sizes to train a new head, or start from a pretrained checkpoint")
    logger.warning("%s was fine-tuned on %s; --ignore_mismatched_sizes: training on %s", model_name, had, has)
    return names


def infer_task(splits: DatasetDict, sources: dict, data_args, checkpoint_config, model_name: str,
               ignore_mismatched_sizes: bool) -> OwnTask:
    """The task of the user's data: text columns, and the classes of the training labels (or the checkpoint's,
    when there is no training data), reconciled with what the checkpoint was fine-tuned on.

    The text columns are chosen in the first split among train, validation, test.

    Args:
        splits (`DatasetDict`): the raw splits (`load_raw_splits`).
        sources (`dict`): split -> where it came from, named in messages.
        data_args (`GlueDataArguments`): `text_column_names`.
        checkpoint_config (`PretrainedConfig`): the checkpoint's config (`id2label`, `problem_type`).
        model_name (`str`): the checkpoint, named in messages.
        ignore_mismatched_sizes (`bool`): --ignore_mismatched_sizes (`reconcile_labels`).

    Returns:
        `OwnTask`: the text columns and the class names (None: regression).

    Raises:
        InputError: the text columns or the labels cannot be had (`choose_text_columns`, `class_names`,
            `reconcile_labels`), or without training data the checkpoint has no labels of its own.
    """
    first = next(kind for kind in SPLIT_KINDS if kind in splits)
    text_columns = choose_text_columns(splits[first], data_args.text_column_names, sources[first])
    if "train" not in splits:
        return OwnTask(text_columns, labels_without_training(checkpoint_config, model_name))
    names = class_names(splits["train"], sources["train"])
    return OwnTask(text_columns, reconcile_labels(names, checkpoint_config, model_name, sources["train"],
                                                  ignore_mismatched_sizes))


def card_dataset(data_args, task: OwnTask, wanted) -> CardDataset:
    """The card's Data section for run_glue.py on the user's own data, whose task `infer_task` read."""
    extra = (f" {task.describe().capitalize()}; inputs: at most {data_args.max_seq_length} tokens."
             f"{limits(data_args, wanted)}")
    return user_data(data_args, wanted, extra)
