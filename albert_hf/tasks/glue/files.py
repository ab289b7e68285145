"""Reading a GLUE task's data (the original TSV files, csv/json files, the Hub's nyu-mll/glue) into one schema, its
labels encoded, and writing the GLUE submission files.

Every source ends in the same schema, the one of the Hub's `nyu-mll/glue`: the task's text columns
(e.g. `sentence1`, `sentence2`), `label` (an id in the Hub's label order, or a float score for STS-B) and, when the
file has one, `idx` (the row id the GLUE server expects in a submission). A task is a `definition.GlueTask`.
"""

from __future__ import annotations

import csv
import logging
import math
import sys
from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict, load_dataset

from ...errors import InputError
from ...runtime.input_files import check_not_empty, read_with_datasets
from ..inputs import check_columns
from ..outputs import write_index_predictions

logger = logging.getLogger(__name__)

COLA_HEADERLESS_COLUMNS = ("source", "label", "author_label", "sentence")


def read_glue_tsv(path, task) -> Dataset:
    """One file of the original GLUE download, as the GLUE/BERT/ALBERT processors read it.

    Tab-separated with quoting disabled (MRPC, STS-B and MNLI sentences contain unbalanced `"`), a UTF-8 BOM
    dropped (MRPC), CoLA's headerless train/dev recognised. Columns are renamed to the Hub's names and the rest
    (ids, parses, genres, annotator labels) dropped. Rows whose field count differs from the header (a few
    broken QQP lines in some copies) are skipped and counted in a warning.

    Args:
        path (`str` or `os.PathLike`): the TSV file, e.g. glue_data/MRPC/train.tsv.
        task (`definition.GlueTask`): the task whose layout the file has (`tsv_columns`).

    Returns:
        `datasets.Dataset`: the task's columns the header has, renamed: its text columns, `label` (the values as
        written, not yet encoded) and `idx` (integers when every value is digits).

    Raises:
        InputError: the file is missing, empty or not UTF-8, its header names none of the task's columns, or it has
            no data rows (none with the header's field count).
    """
    path = Path(path)
    check_not_empty(path)
    csv.field_size_limit(sys.maxsize)
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            # (line number, fields), blank lines left out
            rows = [
                (line, row)
                for line, row in enumerate(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE), start=1)
                if row
            ]
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error})") from error
    if task.name == "cola" and rows and rows[0][1][0] != "index":
        header = list(COLA_HEADERLESS_COLUMNS)
    else:
        header, rows = rows[0][1], rows[1:]
    if not rows:
        raise InputError(f"{path}: no data rows after the header")
    keep = {position: task.tsv_columns[name] for position, name in enumerate(header) if name in task.tsv_columns}
    if not keep:
        hint = (
            "; it is not tab-separated: a comma-separated file needs the .csv extension"
            if len(header) == 1 and "," in header[0]
            else ""
        )
        raise InputError(
            f"{path}: its header {header} names none of {task.name}'s columns {list(task.tsv_columns)}{hint}"
        )
    columns = {name: [] for name in keep.values()}
    malformed = []
    for line, row in rows:
        if len(row) != len(header):
            malformed.append(line)
            continue
        for position, name in keep.items():
            columns[name].append(row[position])
    if malformed:
        logger.warning(
            "%s: skipped %d malformed row(s) (expected %d tab-separated fields), first at line %d",
            path,
            len(malformed),
            len(header),
            malformed[0],
        )
    if not columns or not next(iter(columns.values())):
        raise InputError(f"{path}: no usable rows (header {header})")
    if "idx" in columns and all(value.isdigit() for value in columns["idx"]):
        columns["idx"] = [int(value) for value in columns["idx"]]
    return Dataset.from_dict(columns)


READERS = {
    ".tsv": read_glue_tsv,
    ".csv": lambda path, task: read_with_datasets(path, "csv"),
    ".json": lambda path, task: read_with_datasets(path, "json"),
    ".jsonl": lambda path, task: read_with_datasets(path, "json"),
}


def task_folder(data_dir: Path, task) -> Path:
    """`data_dir` itself, or its `<task folder>` subfolder (so both glue_data/MRPC and glue_data work)."""
    if not data_dir.is_dir():
        raise InputError(f"--data_dir {data_dir}: no such folder")
    if (data_dir / task.folder).is_dir() and not any((data_dir / name).exists() for name in task.tsv_files.values()):
        return data_dir / task.folder
    return data_dir


def local_files(data_args, task) -> dict:
    """Split name -> file given on the command line (`data.GlueDataArguments`' --*_file), under `task`'s split names."""
    matched = "_matched" if task.name == "mnli" else ""
    files = {
        "train": data_args.train_file,
        f"validation{matched}": data_args.validation_file,
        "validation_mismatched": data_args.validation_mismatched_file,
        f"test{matched}": data_args.test_file,
        "test_mismatched": data_args.test_mismatched_file,
    }
    return {split: path for split, path in files.items() if path is not None}


def load_raw_splits(data_args, task, needed, cache_dir=None, token=None) -> tuple[DatasetDict, dict]:
    """The raw splits of a GLUE task and where each came from (for error messages).

    Local files take precedence: --data_dir's TSV files, each replaced by the --*_file of the same split; with none at
    all, the Hub dataset --dataset_name (config = task name) is loaded. Only the splits of the `needed` kinds are
    kept; a kind the data lacks is simply absent (`data.GlueTaskData.read` stops on it).

    Args:
        data_args (`data.GlueDataArguments`): the data arguments.
        task (`definition.GlueTask`): the GLUE task they name.
        needed (`dict` or `set`): the split kinds to read, "train", "validation", "test" (`wanted`'s keys).
        cache_dir (`str`, *optional*): the `datasets` cache for the Hub dataset.
        token (`str`, *optional*): the Hub token for the Hub dataset.

    Returns:
        `tuple(DatasetDict, dict)`: the splits under the task's names (MNLI: `validation_matched`, `test_mismatched`,
        ...), as read (`read_glue_tsv` for a TSV), and split -> its file or `<dataset>/<task>[<split>]`.

    Raises:
        InputError: --data_dir is not a folder or holds none of the task's files, a file cannot be read, or the Hub
            cannot be reached.
    """
    sources = {}
    if data_args.data_dir is not None:
        folder = task_folder(Path(data_args.data_dir), task)
        for split, name in task.tsv_files.items():
            candidates = [folder / name] + ([folder / "AX.tsv"] if task.name == "ax" else [])
            found = next((path for path in candidates if path.is_file()), None)
            if found is not None:
                sources[split] = found
        if not sources:
            raise InputError(
                f"--data_dir {data_args.data_dir}: none of {list(task.tsv_files.values())} "
                f"found for {task.name} (looked in {folder})"
            )
    sources.update({split: Path(path) for split, path in local_files(data_args, task).items()})
    sources = {split: path for split, path in sources.items() if task.split_kind(split) in needed}

    if data_args.data_dir is None and not local_files(data_args, task):
        logger.info(
            "Loading %s/%s from the Hub (pass --data_dir or --*_file to use local files)",
            data_args.dataset_name,
            task.name,
        )
        try:
            hub = load_dataset(data_args.dataset_name, task.name, cache_dir=cache_dir, token=token)
        except ConnectionError as error:
            raise InputError(
                f"{error}\nOffline? Pass --data_dir (the original GLUE folders) or "
                "--train_file/--validation_file/--test_file"
            ) from error
        splits = DatasetDict({name: split for name, split in hub.items() if task.split_kind(name) in needed})
        return splits, {name: f"{data_args.dataset_name}/{task.name}[{name}]" for name in splits}

    splits = DatasetDict()
    for split, path in sources.items():
        splits[split] = READERS[path.suffix.lower()](path, task)
        logger.info("%s: %d rows from %s", split, len(splits[split]), path)
    return splits, {split: str(path) for split, path in sources.items()}


def encode_labels(dataset: Dataset, task, where: str) -> Dataset:
    """The `label` column as ids in the Hub's order (float scores for STS-B).

    Accepted values: the original files' values ("0"/"1", "entailment"), the Hub's label names ("equivalent"),
    or integer ids. Anything else stops the run, naming the file, the row and the allowed values.

    Args:
        dataset (`datasets.Dataset`): a labelled split.
        task (`definition.GlueTask`): its task (`labels`, `label_names`, regression or not).
        where (`str`): the file and split, named in errors.

    Returns:
        `datasets.Dataset`: `dataset` with `label` replaced by `int` ids (STS-B: `float` scores), as its last column.

    Raises:
        InputError: there is no `label` column, a label is not one of the task's, or an STS-B score is not a finite
            number.
    """
    if "label" not in dataset.column_names:
        original = [name for name, column in task.tsv_columns.items() if column == "label"]
        raise InputError(
            f"{where}: missing the label column 'label' (original GLUE TSV header: {original}); "
            f"found columns {dataset.column_names}"
        )
    values = dataset["label"]
    if task.is_regression:
        encoded = []
        for row, value in enumerate(values):
            try:
                score = float(value)
            except (TypeError, ValueError):
                score = math.nan
            if not 0 <= score <= 5:  # nan fails too
                raise InputError(f"{where}: row {row}: label {value!r} is not a similarity score (a number, 0-5)")
            encoded.append(score)
    else:
        ids = {value: i for i, value in enumerate(task.labels)}
        ids.update({name: i for i, name in enumerate(task.label_names)})
        encoded = []
        for row, value in enumerate(values):
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < len(task.labels):
                encoded.append(int(value))
            elif isinstance(value, str) and value.strip() in ids:
                encoded.append(ids[value.strip()])
            else:
                allowed = sorted(set(task.labels) | set(task.label_names))
                raise InputError(
                    f"{where}: row {row}: unknown label {value!r} in column 'label' for {task.name}; "
                    f"expected one of {allowed} or an id 0-{len(task.labels) - 1}"
                )
    # Added before the old column goes: a dataset left with no column would have no rows either.
    return dataset.add_column("label_id", encoded).remove_columns("label").rename_column("label_id", "label")


def prepare_splits(splits: DatasetDict, sources: dict, task) -> DatasetDict:
    """Check each split's text columns, encode the labels of train/dev splits, drop those of test splits.

    An empty value in a text column (e.g. an empty csv field) is read as empty text, with a warning.

    Args:
        splits (`DatasetDict`): the raw splits, from `load_raw_splits` (or `own_data.data.load_raw_splits`).
        sources (`dict`): split -> where it came from, named in messages.
        task (`definition.GlueTask` or `own_data.definition.OwnTask`): the text columns and the labels.

    Returns:
        `DatasetDict`: the same splits; test splits without a `label` column, the others with their labels encoded
        (`task.encode_labels`).

    Raises:
        InputError: a text column is missing or does not hold text, or a label cannot be encoded.
    """
    prepared = DatasetDict()
    for split, dataset in splits.items():
        where = f"{sources[split]} ({split})"
        check_columns(dataset, task.text_columns, where, f" for {task.name} (expected {list(task.text_columns)})")
        for column in task.text_columns:
            feature = dataset.features[column]
            if getattr(feature, "dtype", None) not in ("string", "large_string", "null"):
                raise InputError(f"{where}: column {column!r} holds {feature}, not text")
            empty = sum(text is None for text in dataset[column])
            if empty:  # e.g. an empty csv field; a few real QQP questions are empty
                logger.warning("%s: %d empty value(s) in column %r, read as empty text", where, empty, column)
        if task.split_kind(split) == "test":
            # Unlabelled by definition (the Hub stores -1); predictions never need a label.
            prepared[split] = dataset.remove_columns([c for c in ("label",) if c in dataset.column_names])
        else:
            prepared[split] = task.encode_labels(dataset, where)
    return prepared


def write_submission(path, task, indices, logits) -> Path:
    """A GLUE submission file: `index<TAB>prediction`, label values as the GLUE server expects them
    (0/1 for CoLA, SST-2, MRPC, QQP, WNLI; entailment/... for MNLI, QNLI, RTE, AX; scores for STS-B)."""
    return write_index_predictions(path, indices, logits, task.labels, task.is_regression)
