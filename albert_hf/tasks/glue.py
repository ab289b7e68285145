"""GLUE for run_glue.py: the task table, data reading (Hub, original TSVs, csv, json), preprocessing, metrics,
the paper's hyper-parameters and submission files.

Every source ends in the same schema, the one of the Hub's `nyu-mll/glue`: the task's text columns
(e.g. `sentence1`, `sentence2`), `label` (an id in the Hub's label order, or a float score for STS-B) and, when the
file has one, `idx` (the row id the GLUE server expects in a submission).
"""

from __future__ import annotations

import csv
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset, DatasetDict, load_dataset

from ..errors import InputError
from ..hub.model_card import CardDataset, from_sources, hub_dataset_id, limits
from ..metrics import load_glue_metric
from ..runtime.input_files import check_not_empty, read_with_datasets
from . import text_classification
from .finetuning import (
    OFFICIAL_FINETUNING,
    SPLIT_FLAGS,
    best_on_dev,
    check_columns,
    limit,
    load_checkpoint_config,
    save_results,
    suffixed,
)
from .seeds import Baseline, majority_class

logger = logging.getLogger("albert_hf.tasks.glue")


@dataclass(frozen=True)
class GlueTask:
    name: str
    folder: str  # folder of the original GLUE download (glue_data/<folder>)
    text_columns: tuple[str, ...]
    # The label values written in the original files, in the id order of the Hub dataset's ClassLabel; these are
    # also the values a GLUE submission expects. None for the regression task.
    labels: tuple[str, ...] | None
    label_names: tuple[str, ...] | None  # the Hub's ClassLabel names, for config.id2label
    tsv_columns: dict  # original TSV header -> our column
    tsv_files: dict  # split -> file name in the task folder
    submission_files: dict  # test split -> file name in the GLUE submission zip
    metric: str  # configuration of albert_hf/metrics/glue
    predict_only: bool = False

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        return 1 if self.is_regression else len(self.labels)

    @property
    def main_metric(self) -> str:
        """The official key metric, which picks the best checkpoint and seed: MCC, Pearson, else accuracy."""
        return {"cola": "matthews_correlation", "stsb": "pearson"}.get(self.name, "accuracy")

    def split_kind(self, split: str) -> str:
        """'train', 'validation' or 'test' for a split name such as 'validation_matched'."""
        return split.split("_")[0]

    def describe(self) -> str:
        return f"GLUE {self.folder}"

    # What run_glue.py asks of a task; text_classification.OwnTask answers the same for a user's own data.
    def encode_labels(self, dataset, where: str):
        return encode_labels(dataset, self, where)

    def label_config(self) -> dict:
        return label_config(self)

    def compute_metrics_function(self):
        return compute_metrics_function(self)

    def write_predictions(self, path, indices, logits) -> Path:
        return write_submission(path, self, indices, logits)


_STANDARD_FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
_INDEX = {"index": "idx"}
_PAIR = {"sentence1": "sentence1", "sentence2": "sentence2", **_INDEX}
_NLI_LABELS = ("entailment", "neutral", "contradiction")

TASKS = {
    task.name: task
    for task in [
        # CoLA train/dev have no header (source, label, original author's mark, sentence); the test has one.
        GlueTask("cola", "CoLA", ("sentence",), ("0", "1"), ("unacceptable", "acceptable"),
                 {"sentence": "sentence", "label": "label", **_INDEX}, _STANDARD_FILES, {"test": "CoLA.tsv"},
                 "cola"),
        GlueTask("sst2", "SST-2", ("sentence",), ("0", "1"), ("negative", "positive"),
                 {"sentence": "sentence", "label": "label", **_INDEX}, _STANDARD_FILES, {"test": "SST-2.tsv"},
                 "sst2"),
        # MRPC: a UTF-8 BOM before "Quality" (the label), and two sentence-id columns we drop.
        GlueTask("mrpc", "MRPC", ("sentence1", "sentence2"), ("0", "1"), ("not_equivalent", "equivalent"),
                 {"Quality": "label", "#1 String": "sentence1", "#2 String": "sentence2", **_INDEX},
                 _STANDARD_FILES, {"test": "MRPC.tsv"}, "mrpc"),
        GlueTask("stsb", "STS-B", ("sentence1", "sentence2"), None, None,
                 {**_PAIR, "score": "label"}, _STANDARD_FILES, {"test": "STS-B.tsv"}, "stsb"),
        GlueTask("qqp", "QQP", ("question1", "question2"), ("0", "1"), ("not_duplicate", "duplicate"),
                 {"question1": "question1", "question2": "question2", "is_duplicate": "label", "id": "idx"},
                 _STANDARD_FILES, {"test": "QQP.tsv"}, "qqp"),
        # MNLI: the gold label is the last column (annotator labels label1..label5 precede it).
        GlueTask("mnli", "MNLI", ("premise", "hypothesis"), _NLI_LABELS, _NLI_LABELS,
                 {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label", **_INDEX},
                 {"train": "train.tsv", "validation_matched": "dev_matched.tsv",
                  "validation_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
                  "test_mismatched": "test_mismatched.tsv"},
                 {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"}, "mnli"),
        GlueTask("qnli", "QNLI", ("question", "sentence"), ("entailment", "not_entailment"),
                 ("entailment", "not_entailment"),
                 {"question": "question", "sentence": "sentence", "label": "label", **_INDEX},
                 _STANDARD_FILES, {"test": "QNLI.tsv"}, "qnli"),
        GlueTask("rte", "RTE", ("sentence1", "sentence2"), ("entailment", "not_entailment"),
                 ("entailment", "not_entailment"), {**_PAIR, "label": "label"}, _STANDARD_FILES,
                 {"test": "RTE.tsv"}, "rte"),
        GlueTask("wnli", "WNLI", ("sentence1", "sentence2"), ("0", "1"), ("not_entailment", "entailment"),
                 {**_PAIR, "label": "label"}, _STANDARD_FILES, {"test": "WNLI.tsv"}, "wnli"),
        # The diagnostic set: unlabelled, scored by the GLUE server; predicted by an MNLI model, MNLI's labels.
        GlueTask("ax", "diagnostic", ("premise", "hypothesis"), _NLI_LABELS, _NLI_LABELS,
                 {"sentence1": "premise", "sentence2": "hypothesis", **_INDEX}, {"test": "diagnostic.tsv"},
                 {"test": "AX.tsv"}, "ax", predict_only=True),
    ]
}
COLA_HEADERLESS_COLUMNS = ("source", "label", "author_label", "sentence")
GLUE_HUB_DATASET = "nyu-mll/glue"

# The official run_glue.sh (LR, total batch, steps, warmup) and the paper's "ALBERT DR" (Table 14), the one value
# the released configurations give both the hidden and the attention dropout; the table is in
# docs/official_recipe.md. Neither has a row for WNLI or AX.
PAPER_HPARAMS = {
    "cola": dict(learning_rate=1e-5, batch_size=16, max_steps=5336, warmup_steps=320, albert_dropout=0.0),
    "stsb": dict(learning_rate=2e-5, batch_size=16, max_steps=3598, warmup_steps=214, albert_dropout=0.0),
    "sst2": dict(learning_rate=1e-5, batch_size=32, max_steps=20935, warmup_steps=1256, albert_dropout=0.0),
    "mnli": dict(learning_rate=3e-5, batch_size=128, max_steps=10000, warmup_steps=1000, albert_dropout=0.0),
    "qnli": dict(learning_rate=1e-5, batch_size=32, max_steps=33112, warmup_steps=1986, albert_dropout=0.0),
    "qqp": dict(learning_rate=5e-5, batch_size=128, max_steps=14000, warmup_steps=1000, albert_dropout=0.1),
    "rte": dict(learning_rate=3e-5, batch_size=32, max_steps=800, warmup_steps=200, albert_dropout=0.1),
    "mrpc": dict(learning_rate=2e-5, batch_size=32, max_steps=800, warmup_steps=200, albert_dropout=0.0),
}
# Common to every task (the official run_glue.sh): max length 512, head dropout 0.1, and the official optimizer.
# The official run_classifier scores a checkpoint every 100-200 steps on dev and keeps the best.
PAPER_COMMON = dict(max_seq_length=512, classifier_dropout_prob=0.1, **OFFICIAL_FINETUNING, **best_on_dev(200))


def get_task(name: str | None) -> GlueTask:
    if name is None or name.lower() not in TASKS:
        raise InputError(f"Unknown GLUE task {name!r}: --task_name must be one of {', '.join(TASKS)}")
    return TASKS[name.lower()]


@dataclass
class GlueDataArguments:
    """Data arguments, named as in transformers' run_glue.py (plus --data_dir)."""

    task_name: str | None = field(default=None, metadata={
        "help": f"a GLUE task, one of: {', '.join(TASKS)}; leave it out to fine-tune on your own data "
        "(--train_file / --validation_file / --test_file or --dataset_name)"})
    data_dir: str | None = field(
        default=None,
        metadata={"help": "an original GLUE task folder (e.g. glue_data/MRPC), or glue_data itself"},
    )
    dataset_name: str | None = field(default=None, metadata={
        "help": "used when no local file is given: for a GLUE task the Hub dataset holding it (default "
        f"{GLUE_HUB_DATASET}, config = task); for your own data a Hub dataset, a folder of data files or a "
        "save_to_disk folder"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "your own data: the Hub config"})
    text_column_names: str | None = field(default=None, metadata={
        "help": "your own data: the one or two text columns, comma-separated (default: sentence1,sentence2 when "
        "there, else the first one or two text columns)"})
    label_column_name: str = field(default="label", metadata={"help": "your own data: the label column"})
    train_file: str | None = field(default=None, metadata={
        "help": "training data: .tsv (GLUE), .csv, .json, .jsonl (and .parquet for your own data)"})
    validation_file: str | None = field(default=None, metadata={"help": "dev data (MNLI: matched)"})
    validation_mismatched_file: str | None = field(default=None, metadata={"help": "MNLI: dev mismatched"})
    test_file: str | None = field(default=None, metadata={"help": "unlabelled test data (MNLI: matched)"})
    test_mismatched_file: str | None = field(default=None, metadata={"help": "MNLI: test mismatched"})
    max_seq_length: int = field(
        default=128, metadata={"help": "pairs are truncated longest-first to this many tokens"}
    )
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "pad every example to max_seq_length (False: pad per batch)"}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "recompute the tokenized datasets"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    max_train_samples: int | None = field(default=None, metadata={"help": "keep only the first N train rows"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "keep only the first N rows of each dev set"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "keep only the first N test rows"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "text-classification", "AutoModelForSequenceClassification", "run_glue.py"

    def card_tags(self) -> list[str]:
        return [] if self.task_name is None else ["glue", self.task.name]

    def card_dataset(self, wanted, task=None) -> CardDataset:
        """The card's Data section: the GLUE task from the Hub or from its files, or the user's own data, whose
        `task` (`text_classification.OwnTask`) was read from it by `task_and_splits`."""
        if self.task_name is None:
            if task is None:
                raise ValueError("the card of your own data names its task: pass the one task_and_splits returned")
            return text_classification.card_dataset(self, task, wanted)
        task = self.task
        mnli = task.name == "mnli"
        splits = dict(splits={"eval_": "validation_matched" if mnli else "validation", "predict_": "test"},
                      suffixes={"_mm": "validation_mismatched"} if mnli else {})
        files = self.local_files()
        sources = {}
        for split in wanted:
            if self.data_dir is None and not files:
                hub_id = hub_dataset_id(self.dataset_name)
                sources[split] = (hub_id, f"the Hub's {hub_id} ({task.name})")
                continue
            given = [Path(path) for name, path in files.items() if task.split_kind(name) == split]
            for path in given:  # the original GLUE files are TSVs in a task-specific layout; other formats are not
                sources[split] = (GLUE_HUB_DATASET if path.suffix.lower() == ".tsv" else None, f"`{path.name}`")
            if not given and self.data_dir is not None:
                sources[split] = (GLUE_HUB_DATASET, f"the original GLUE TSV files in `{Path(self.data_dir).name}`")
        extra = f" Inputs: at most {self.max_seq_length} tokens.{limits(self, wanted)}"
        return from_sources(f"GLUE {task.folder}", sources, task.name, extra, **splits)

    def __post_init__(self):
        if self.task_name is None:
            self.own_data_checks()
            self.task = None  # read from the data (text_classification.infer_task)
            return
        self.task = get_task(self.task_name)
        self.task_name = self.task.name
        self.dataset_name = self.dataset_name or GLUE_HUB_DATASET
        for name in ("dataset_config_name", "text_column_names"):
            if getattr(self, name) is not None:
                raise InputError(f"--{name} is for your own data (no --task_name): GLUE tasks have their own")
        if self.label_column_name != "label":
            raise InputError("--label_column_name is for your own data (no --task_name): GLUE tasks have their own")
        if self.task.name != "mnli" and (self.validation_mismatched_file or self.test_mismatched_file):
            raise InputError("--validation_mismatched_file / --test_mismatched_file are for --task_name mnli only")
        for name in ("train_file", "validation_file", "validation_mismatched_file", "test_file",
                     "test_mismatched_file"):
            path = getattr(self, name)
            if path is not None and Path(path).suffix.lower() not in READERS:
                raise InputError(f"--{name} {path}: unsupported extension; use one of {', '.join(READERS)}")

    def own_data_checks(self) -> None:
        if self.data_dir is not None:
            raise InputError("--data_dir reads the original GLUE folders: pass --task_name with it, or give your "
                             "own data as --train_file / --validation_file / --test_file")
        if self.validation_mismatched_file or self.test_mismatched_file:
            raise InputError("--validation_mismatched_file / --test_mismatched_file are for --task_name mnli only")
        files = [name for name in ("train_file", "validation_file", "test_file") if getattr(self, name)]
        if not files and not self.dataset_name:
            raise InputError("no data: pass --task_name (a GLUE task), or your own data as --train_file / "
                             "--validation_file / --test_file or --dataset_name")
        if files and self.dataset_name:
            raise InputError("pass your own data as files (--train_file ...) or as --dataset_name, not both")
        for name in files:
            if Path(getattr(self, name)).suffix.lower() not in text_classification.FORMATS:
                raise InputError(f"--{name} {getattr(self, name)}: unsupported extension; use one of "
                                 f"{', '.join(text_classification.FORMATS)}")

    def local_files(self) -> dict:
        """Split name -> file given on the command line."""
        matched = "_matched" if self.task.name == "mnli" else ""
        files = {"train": self.train_file, f"validation{matched}": self.validation_file,
                 "validation_mismatched": self.validation_mismatched_file, f"test{matched}": self.test_file,
                 "test_mismatched": self.test_mismatched_file}
        return {split: path for split, path in files.items() if path is not None}


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_glue_tsv(path, task: GlueTask) -> Dataset:
    """One file of the original GLUE download, as the GLUE/BERT/ALBERT processors read it.

    Tab-separated with quoting disabled (MRPC, STS-B and MNLI sentences contain unbalanced `"`), a UTF-8 BOM
    dropped (MRPC), CoLA's headerless train/dev recognised. Columns are renamed to the Hub's names and the rest
    (ids, parses, genres, annotator labels) dropped. Rows whose field count differs from the header (a few
    broken QQP lines in some copies) are skipped and counted in a warning.

    Args:
        path (`str` or `os.PathLike`): the TSV file, e.g. glue_data/MRPC/train.tsv.
        task (`GlueTask`): the task whose layout the file has (`tsv_columns`).

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
            rows = [(line, row) for line, row in
                    enumerate(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE), start=1) if row]
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
        hint = ("; it is not tab-separated: a comma-separated file needs the .csv extension"
                if len(header) == 1 and "," in header[0] else "")
        raise InputError(f"{path}: its header {header} names none of {task.name}'s columns "
                         f"{list(task.tsv_columns)}{hint}")
    columns = {name: [] for name in keep.values()}
    malformed = []
    for line, row in rows:
        if len(row) != len(header):
            malformed.append(line)
            continue
        for position, name in keep.items():
            columns[name].append(row[position])
    if malformed:
        logger.warning("%s: skipped %d malformed row(s) (expected %d tab-separated fields), first at line %d",
                       path, len(malformed), len(header), malformed[0])
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


def _task_folder(data_dir: Path, task: GlueTask) -> Path:
    """`data_dir` itself, or its `<task folder>` subfolder (so both glue_data/MRPC and glue_data work)."""
    if not data_dir.is_dir():
        raise InputError(f"--data_dir {data_dir}: no such folder")
    if (data_dir / task.folder).is_dir() and not any((data_dir / name).exists() for name in task.tsv_files.values()):
        return data_dir / task.folder
    return data_dir


def load_raw_splits(data_args: GlueDataArguments, needed, cache_dir=None, token=None) -> tuple[DatasetDict, dict]:
    """The raw splits of a GLUE task and where each came from (for error messages).

    Local files take precedence: --data_dir's TSV files, each replaced by the --*_file of the same split; with none at
    all, the Hub dataset --dataset_name (config = task name) is loaded. Only the splits of the `needed` kinds are
    kept; a kind the data lacks is simply absent (`task_and_splits` stops on it).

    Args:
        data_args (`GlueDataArguments`): the data arguments, with their GLUE `task`.
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
    task = data_args.task
    sources = {}
    if data_args.data_dir is not None:
        folder = _task_folder(Path(data_args.data_dir), task)
        for split, name in task.tsv_files.items():
            candidates = [folder / name] + ([folder / "AX.tsv"] if task.name == "ax" else [])
            found = next((path for path in candidates if path.is_file()), None)
            if found is not None:
                sources[split] = found
        if not sources:
            raise InputError(f"--data_dir {data_args.data_dir}: none of {list(task.tsv_files.values())} "
                                    f"found for {task.name} (looked in {folder})")
    sources.update({split: Path(path) for split, path in data_args.local_files().items()})
    sources = {split: path for split, path in sources.items() if task.split_kind(split) in needed}

    if data_args.data_dir is None and not data_args.local_files():
        logger.info("Loading %s/%s from the Hub (pass --data_dir or --*_file to use local files)",
                    data_args.dataset_name, task.name)
        try:
            hub = load_dataset(data_args.dataset_name, task.name, cache_dir=cache_dir, token=token)
        except ConnectionError as error:
            raise InputError(f"{error}\nOffline? Pass --data_dir (the original GLUE folders) or "
                                  "--train_file/--validation_file/--test_file") from error
        splits = DatasetDict({name: split for name, split in hub.items() if task.split_kind(name) in needed})
        return splits, {name: f"{data_args.dataset_name}/{task.name}[{name}]" for name in splits}

    splits = DatasetDict()
    for split, path in sources.items():
        splits[split] = READERS[path.suffix.lower()](path, task)
        logger.info("%s: %d rows from %s", split, len(splits[split]), path)
    return splits, {split: str(path) for split, path in sources.items()}


def encode_labels(dataset: Dataset, task: GlueTask, where: str) -> Dataset:
    """The `label` column as ids in the Hub's order (float scores for STS-B).

    Accepted values: the original files' values ("0"/"1", "entailment"), the Hub's label names ("equivalent"),
    or integer ids. Anything else stops the run, naming the file, the row and the allowed values.

    Args:
        dataset (`datasets.Dataset`): a labelled split.
        task (`GlueTask`): its task (`labels`, `label_names`, regression or not).
        where (`str`): the file and split, named in errors.

    Returns:
        `datasets.Dataset`: `dataset` with `label` replaced by `int` ids (STS-B: `float` scores), as its last column.

    Raises:
        InputError: there is no `label` column, a label is not one of the task's, or an STS-B score is not a finite
            number.
    """
    if "label" not in dataset.column_names:
        original = [name for name, column in task.tsv_columns.items() if column == "label"]
        raise InputError(f"{where}: missing the label column 'label' (original GLUE TSV header: {original}); "
                         f"found columns {dataset.column_names}")
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
                raise InputError(f"{where}: row {row}: unknown label {value!r} in column 'label' for {task.name}; "
                                 f"expected one of {allowed} or an id 0-{len(task.labels) - 1}")
    # Added before the old column goes: a dataset left with no column would have no rows either.
    return dataset.add_column("label_id", encoded).remove_columns("label").rename_column("label_id", "label")


def prepare_splits(splits: DatasetDict, sources: dict, task) -> DatasetDict:
    """Check each split's text columns, encode the labels of train/dev splits, drop those of test splits.

    An empty value in a text column (e.g. an empty csv field) is read as empty text, with a warning.

    Args:
        splits (`DatasetDict`): the raw splits, from `load_raw_splits` (or `text_classification.load_raw_splits`).
        sources (`dict`): split -> where it came from, named in messages.
        task (`GlueTask` or `text_classification.OwnTask`): the text columns and the labels.

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


# ----------------------------------------------------------------------------------------------------------------
# Preprocessing and metrics


def tokenize_function(tokenizer, task: GlueTask, max_seq_length: int, pad_to_max_length: bool):
    """Batched map function: `[CLS] a [SEP] (b [SEP])` with segment ids 0/1, truncating the longer side first
    (the official `_truncate_seq_pair`, which pops from the end of whichever side is longer)."""

    def tokenize(batch):
        texts = [["" if text is None else text for text in batch[column]] for column in task.text_columns]
        return tokenizer(*texts, truncation="longest_first", max_length=max_seq_length,
                         padding="max_length" if pad_to_max_length else False, return_token_type_ids=True)

    return tokenize


def compute_metrics_function(task: GlueTask):
    """Trainer `compute_metrics`: the GLUE metric of the task (plus `combined_score` as in run_glue.py)."""
    metric = load_glue_metric(task.metric)

    def compute_metrics(eval_prediction):
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        predictions = np.squeeze(logits, axis=-1) if task.is_regression else np.argmax(logits, axis=-1)
        result = metric.compute(predictions=predictions, references=eval_prediction.label_ids)
        if len(result) > 1:
            result["combined_score"] = float(np.mean(list(result.values())))
        return result

    return compute_metrics


def label_config(task: GlueTask) -> dict:
    """Config fields for the task's head: num_labels, id2label/label2id with the Hub's names, problem type."""
    if task.is_regression:
        return dict(num_labels=1, problem_type="regression", finetuning_task=task.name)
    return dict(num_labels=task.num_labels, id2label=dict(enumerate(task.label_names)),
                label2id={name: i for i, name in enumerate(task.label_names)},
                problem_type="single_label_classification", finetuning_task=task.name)


def check_checkpoint_labels(config, task: GlueTask) -> None:
    """Stop when a checkpoint fine-tuned on other labels would be silently relabelled (e.g. an RTE model run on
    MNLI). Checkpoints without named labels (pretrained ones: LABEL_0, LABEL_1) are fine."""
    names = [str(name) for _, name in sorted((int(i), n) for i, n in (config.id2label or {}).items())]
    if task.is_regression or all(name.startswith("LABEL_") for name in names):
        return
    if tuple(names) != task.label_names:
        raise InputError(f"The checkpoint's labels {names} are not those of {task.name} {list(task.label_names)}; "
                         "start from a pretrained (or same-task) checkpoint")


def write_submission(path, task: GlueTask, indices, logits) -> Path:
    """A GLUE submission file: `index<TAB>prediction`, label values as the GLUE server expects them
    (0/1 for CoLA, SST-2, MRPC, QQP, WNLI; entailment/... for MNLI, QNLI, RTE, AX; scores for STS-B)."""
    path = Path(path)
    if task.is_regression:
        predictions = [f"{score:.3f}" for score in np.squeeze(logits, axis=-1).tolist()]
    else:
        predictions = [task.labels[i] for i in np.argmax(logits, axis=-1).tolist()]
    with path.open("w", encoding="utf-8") as file:
        file.write("index\tprediction\n")
        for index, prediction in zip(indices, predictions):
            file.write(f"{index}\t{prediction}\n")
    return path


# ----------------------------------------------------------------------------------------------------------------
# --paper_hparams


def paper_recipe(task: GlueTask) -> tuple[str, dict]:
    """(name, recipe): the task's row with what every task shares, for `finetuning.apply_paper_hparams`."""
    if task.name not in PAPER_HPARAMS:
        raise InputError(f"--paper_hparams: the official run_glue.sh and the paper have no recipe for {task.name} "
                         f"(tasks: {', '.join(PAPER_HPARAMS)}); give the hyper-parameters explicitly")
    return task.name, {**PAPER_HPARAMS[task.name], **PAPER_COMMON}


# ----------------------------------------------------------------------------------------------------------------
# run_glue.py's steps: the task and its splits, tokenizing, the test sets' predictions

# A second dev or test set's metric keys get this suffix, as in transformers' run_glue.py (mnli-mm).
SUFFIXES = {"validation_mismatched": "_mm", "test_mismatched": "_mm"}


def task_and_splits(data_args: GlueDataArguments, model_args, wanted: dict) -> tuple:
    """The task and its splits, for a GLUE --task_name or, without one, for the user's own data, whose task
    (`text_classification.OwnTask`) is read from it and from the checkpoint's labels.

    For a GLUE task the data is read and checked before the checkpoint's config is read (its labels must be the
    task's); for the user's own data the splits are read first, then the config, whose labels the task's classes
    are reconciled with.

    Args:
        data_args (`GlueDataArguments`): the data arguments; `task` None for the user's own data.
        model_args (`finetuning.ModelArguments`): the checkpoint (its config), `cache_dir`, `token` and
            `ignore_mismatched_sizes`.
        wanted (`dict`): split kind -> max_samples (None: every row), from `finetuning.wanted_samples`.

    Returns:
        `tuple`: (task, raw splits as read (`DatasetDict`), split -> source (`dict`), the prepared splits
        (`prepare_splits`), each cut to its kind's max_samples (`dict`)).

    Raises:
        InputError: a wanted kind has no split, the data fails its checks, or the checkpoint was fine-tuned on other
            labels (for the user's own data, unless --ignore_mismatched_sizes).
    """
    task = data_args.task
    if task is None:
        raw_splits, sources = text_classification.load_raw_splits(data_args, wanted, model_args.cache_dir,
                                                                  model_args.token)
        task = text_classification.infer_task(
            raw_splits, sources, data_args, load_checkpoint_config(model_args), model_args.source("config")[1],
            model_args.ignore_mismatched_sizes)
        logger.info("Your data: %s", task.describe())
        splits = prepare_splits(raw_splits, sources, task)
    else:
        raw_splits, sources = load_raw_splits(data_args, wanted, model_args.cache_dir, model_args.token)
        for kind in wanted:
            if not any(task.split_kind(split) == kind for split in raw_splits):
                raise InputError(f"{SPLIT_FLAGS[kind]} needs {kind} data for {task.name}: pass --{kind}_file, or a "
                                 "--data_dir holding "
                                 f"{[n for split, n in task.tsv_files.items() if task.split_kind(split) == kind]}")
        splits = prepare_splits(raw_splits, sources, task)
        check_checkpoint_labels(load_checkpoint_config(model_args), task)
    splits = {split: limit(dataset, wanted[task.split_kind(split)]) for split, dataset in splits.items()}
    return task, raw_splits, sources, splits


def tokenize_splits(splits: dict, tokenizer, task: GlueTask, data_args: GlueDataArguments, main_process_first) -> dict:
    """Each split tokenized (`tokenize_function`), with its `label` column only besides the model's inputs.

    Args:
        splits (`dict`): split -> prepared dataset (`task_and_splits`).
        tokenizer (`PreTrainedTokenizerBase`): the model's tokenizer.
        task (`GlueTask` or `text_classification.OwnTask`): the text columns.
        data_args (`GlueDataArguments`): `max_seq_length`, `pad_to_max_length`, `preprocessing_num_workers` and
            `overwrite_cache`.
        main_process_first (`Callable`): `TrainingArguments.main_process_first`: the main process tokenizes first, the
            others then read its cache.

    Returns:
        `dict`: split -> `datasets.Dataset` with `input_ids`, `token_type_ids`, `attention_mask` and, when the split
        has one, `label`.
    """
    tokenize = tokenize_function(tokenizer, task, data_args.max_seq_length, data_args.pad_to_max_length)
    with main_process_first(desc="tokenizing"):
        return {split: dataset.map(tokenize, batched=True, num_proc=data_args.preprocessing_num_workers,
                                   remove_columns=[c for c in dataset.column_names if c != "label"],
                                   load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenizing {split}")
                for split, dataset in splits.items()}


def labels_of_test_set(raw, task, where: str):
    """The encoded labels of a test set when it has them all, else None: the GLUE test files have no label
    column, the Hub's test splits have -1; a file with only some labelled rows gets a warning."""
    if "label" not in raw.column_names:
        return None
    missing = [value is None or str(value).strip() in ("", "-1") for value in raw["label"]]
    if all(missing):
        return None
    if any(missing):
        logger.warning("%s: %d of %d rows have no label: no metrics (predict_results.json) for it", where,
                       sum(missing), len(missing))
        return None
    return task.encode_labels(raw, where)["label"]


def predict_and_write(trainer, task: GlueTask, features: dict, raw_splits, splits: dict, sources: dict,
                      output_dir) -> dict | None:
    """Each test split's predictions file and, for those whose rows all have labels, their `predict_*` metrics.

    The files are the task's (`submission_files`: MRPC.tsv, MNLI-m.tsv, ... for GLUE; predict_results.txt for the
    user's own data), `index<TAB>prediction`. A second test set's metric keys are suffixed (`SUFFIXES`: MNLI's
    mismatched set, `_mm`). Every process calls it; only the main process writes the files.

    Args:
        trainer (`finetuning.AlbertTrainer`): the run's trainer, its `compute_metrics` the task's.
        task (`GlueTask` or `text_classification.OwnTask`): the task (`write_predictions`, `submission_files`).
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


def baseline(task, dev) -> Baseline:
    """What a model that learned nothing scores on the dev set `dev` (its encoded `label` column), on the task's main
    metric: the majority class's accuracy, MCC 0 (a constant prediction), Pearson 0.1 for a regression."""
    if task.main_metric == "accuracy":
        return majority_class(dev["label"], task.label_names)
    if task.main_metric == "matthews_correlation":
        return Baseline("matthews_correlation", 0.0, "a constant prediction")
    return Baseline("pearson", 0.1, "an unrelated score (correlation 0.1)")
