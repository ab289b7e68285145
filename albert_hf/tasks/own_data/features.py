"""Your own data's features: which columns are the texts, and the labels (their names, read from the data or the
checkpoint, reconciled with the checkpoint's)."""

from __future__ import annotations

import logging

import numpy as np
from datasets import ClassLabel, Value

from ...errors import InputError

logger = logging.getLogger(__name__)


def label_key(value) -> str:
    """A label as a class name: strings as they are (stripped), integers as their digits."""
    if isinstance(value, (bool, np.bool_)):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


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
            raise InputError(
                f"--text_column_names {given}: "
                + (
                    f"{where} has no column(s) {missing}; found {dataset.column_names}"
                    if missing
                    else "one or two columns, separated by a comma"
                )
            )
        return names
    if "sentence1" in columns and "sentence2" in columns:
        return ("sentence1", "sentence2")
    texts = [name for name in columns if is_text(dataset.features[name])]
    if not texts:
        raise InputError(
            f"{where}: no text column besides the label; found {dataset.column_names} (--text_column_names names them)"
        )
    return tuple(texts[:2])


def value_kind(value) -> str:
    for kind, types in (
        ("bool", (bool, np.bool_)),
        ("int", (int, np.integer)),
        ("float", (float, np.floating)),
        ("str", str),
    ):
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
        raise InputError(
            f"{where}: the labels mix types: row {first[1]} is {first[0]}, row {second[1]} is "
            f"{second[0]} (strings or integers for classes, floats for regression)"
        )
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
        raise InputError(
            f"{model_name} has no {what} of its own (not fine-tuned), and without --do_train no "
            "training data says which: fine-tune it first, or pass --train_file"
        )
    return fine_tuned


def reconcile_labels(
    names, checkpoint_config, model_name: str, where: str, ignore_mismatched_sizes: bool, what: str = "classes"
):
    """The training data's label `names` (None: regression), in the checkpoint's order when it was fine-tuned on
    the same ones, so that its head keeps its meaning. Other labels than a fine-tuned checkpoint's stop the run,
    unless --ignore_mismatched_sizes.

    Args:
        names (`tuple[str, ...]`, *optional*): the training data's labels (`class_names`,
            `ner.data.tag_names`); None: regression.
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
        raise InputError(
            f"{model_name} was fine-tuned on {had}, and {where} has {has}: pass "
            "--ignore_mismatched_sizes to train a new head, or start from a pretrained checkpoint"
        )
    logger.warning("%s was fine-tuned on %s; --ignore_mismatched_sizes: training on %s", model_name, had, has)
    return names
