"""Your own labelled data in run_glue.py (no --task_name): text classification or regression, read the way
transformers' run_glue.py reads a user's data.

- Data: --train_file / --validation_file / --test_file (.csv, .tsv, .json, .jsonl, .parquet), or --dataset_name
  (a Hub dataset with --dataset_config_name, a folder of such files, or a folder written by `save_to_disk`).
- Text: --text_column_names, else `sentence1` and `sentence2` when both are there, else the first one or two text
  columns other than the label.
- Labels: the column --label_column_name (default `label`). Strings and integers are classes, sorted (a
  ClassLabel keeps its names and order); floats mean regression. A checkpoint already fine-tuned on the same classes
  keeps its mapping; other classes are refused unless --ignore_mismatched_sizes.

The text columns and the labels are chosen in features.py; `OwnTask` (definition.py) answers what run_glue.py asks of a
GLUE task (`glue.definition.GlueTask`): text columns, labels, metrics and the predictions file."""

from __future__ import annotations

import logging
from pathlib import Path

from datasets import DatasetDict, load_dataset, load_from_disk

from ...errors import InputError, first_line
from ...hub.model_card import CardDataset, limits, user_data
from ...runtime.input_files import read_with_datasets
from ..glue.files import prepare_splits
from ..inputs import SPLIT_FLAGS, load_checkpoint_config
from .definition import OwnTask
from .features import choose_text_columns, class_names, labels_without_training, reconcile_labels

logger = logging.getLogger(__name__)

# file extension -> (datasets builder, its options)
FORMATS = {
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"delimiter": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    ".parquet": ("parquet", {}),
}
SPLIT_KINDS = ("train", "validation", "test")


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
            raise InputError(
                f"{where}: no label column {label_column!r} (--label_column_name); found {dataset.column_names}"
            )
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
        where = (
            f"--{kind}_file"
            if any(files.values())
            else f"--dataset_name {data_args.dataset_name} (splits: {available})"
        )
        raise InputError(f"{SPLIT_FLAGS[kind]} needs {kind} data: none in {where}")
    for kind in splits:  # a test split may have no labels
        splits[kind] = with_label_column(splits[kind], label_column, sources[kind], required=kind != "test")
    return splits, sources


# ----------------------------------------------------------------------------------------------------------------
# The task the data describes


def infer_task(
    splits: DatasetDict, sources: dict, data_args, checkpoint_config, model_name: str, ignore_mismatched_sizes: bool
) -> OwnTask:
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
    return OwnTask(
        text_columns, reconcile_labels(names, checkpoint_config, model_name, sources["train"], ignore_mismatched_sizes)
    )


def card_dataset(data_args, task: OwnTask, wanted) -> CardDataset:
    """The card's Data section for run_glue.py on the user's own data, whose task `infer_task` read."""
    extra = (
        f" {task.describe().capitalize()}; inputs: at most {data_args.max_seq_length} tokens."
        f"{limits(data_args, wanted)}"
    )
    return user_data(data_args, wanted, extra)


class OwnData:
    """The user's own data (no --task_name): its task (`definition.OwnTask`) read from it and from the
    checkpoint's labels."""

    def check_arguments(self, data_args) -> None:
        if data_args.data_dir is not None:
            raise InputError(
                "--data_dir reads the original GLUE folders: pass --task_name with it, or give your "
                "own data as --train_file / --validation_file / --test_file"
            )
        if data_args.validation_mismatched_file or data_args.test_mismatched_file:
            raise InputError("--validation_mismatched_file / --test_mismatched_file are for --task_name mnli only")
        files = [name for name in ("train_file", "validation_file", "test_file") if getattr(data_args, name)]
        if not files and not data_args.dataset_name:
            raise InputError(
                "no data: pass --task_name (a GLUE task), or your own data as --train_file / "
                "--validation_file / --test_file or --dataset_name"
            )
        if files and data_args.dataset_name:
            raise InputError("pass your own data as files (--train_file ...) or as --dataset_name, not both")
        for name in files:
            if Path(getattr(data_args, name)).suffix.lower() not in FORMATS:
                raise InputError(
                    f"--{name} {getattr(data_args, name)}: unsupported extension; use one of {', '.join(FORMATS)}"
                )

    def check_wanted(self, wanted: dict) -> None:
        pass  # any split: the kinds the data lacks stop `read`

    def paper_recipe(self) -> tuple[str, dict]:
        raise InputError(
            "--paper_hparams is the paper's recipe for a GLUE --task_name; for your own data give "
            "the hyper-parameters explicitly"
        )

    def read(self, data_args, model_args, wanted: dict) -> tuple:
        """The splits read first, then the config, whose labels the task's classes are reconciled with."""
        raw_splits, sources = load_raw_splits(data_args, wanted, model_args.cache_dir, model_args.token)
        task = infer_task(
            raw_splits,
            sources,
            data_args,
            load_checkpoint_config(model_args),
            model_args.source("config")[1],
            model_args.ignore_mismatched_sizes,
        )
        logger.info("Your data: %s", task.describe())
        return task, raw_splits, sources, prepare_splits(raw_splits, sources, task)

    def card_tags(self) -> list[str]:
        return []

    def card_dataset(self, data_args, wanted, task) -> CardDataset:
        if task is None:
            raise ValueError("the card of your own data names its task: pass the one task_and_splits returned")
        return card_dataset(data_args, task, wanted)
