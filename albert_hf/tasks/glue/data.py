"""run_glue.py's data: its arguments (`GlueDataArguments`, transformers' names), where the task comes from (a GLUE
--task_name, or the user's own data: decided once as a `TaskData`), and the splits read and prepared."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ...errors import InputError
from ...hub.model_card import CardDataset, from_sources, hub_dataset_id, limits
from ..inputs import SPLIT_FLAGS, limit, load_checkpoint_config
from ..own_data.data import OwnData
from .definition import GLUE_HUB_DATASET, TASKS, GlueTask, check_checkpoint_labels, get_task, paper_recipe
from .files import READERS, load_raw_splits, local_files, prepare_splits

logger = logging.getLogger(__name__)


@dataclass
class GlueDataArguments:
    """Data arguments, named as in transformers' run_glue.py (plus --data_dir)."""

    task_name: str | None = field(
        default=None,
        metadata={
            "help": f"a GLUE task, one of: {', '.join(TASKS)}; leave it out to fine-tune on your own data "
            "(--train_file / --validation_file / --test_file or --dataset_name)"
        },
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "an original GLUE task folder (e.g. glue_data/MRPC), or glue_data itself"}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "used when no local file is given: for a GLUE task the Hub dataset holding it (default "
            f"{GLUE_HUB_DATASET}, config = task); for your own data a Hub dataset, a folder of data files or a "
            "save_to_disk folder"
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "your own data: the Hub config"})
    text_column_names: str | None = field(
        default=None,
        metadata={
            "help": "your own data: the one or two text columns, comma-separated (default: sentence1,sentence2 when "
            "there, else the first one or two text columns)"
        },
    )
    label_column_name: str = field(default="label", metadata={"help": "your own data: the label column"})
    train_file: str | None = field(
        default=None,
        metadata={"help": "training data: .tsv (GLUE), .csv, .json, .jsonl (and .parquet for your own data)"},
    )
    validation_file: str | None = field(default=None, metadata={"help": "dev data (MNLI: matched)"})
    validation_mismatched_file: str | None = field(default=None, metadata={"help": "MNLI: dev mismatched"})
    test_file: str | None = field(default=None, metadata={"help": "unlabelled test data (MNLI: matched)"})
    test_mismatched_file: str | None = field(default=None, metadata={"help": "MNLI: test mismatched"})
    max_seq_length: int = field(default=128, metadata={"help": "pairs are truncated longest-first to this many tokens"})
    pad_to_max_length: bool = field(
        default=True, metadata={"help": "pad every example to max_seq_length (False: pad per batch)"}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "recompute the tokenized datasets"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    max_train_samples: int | None = field(default=None, metadata={"help": "keep only the first N train rows"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "keep only the first N rows of each dev set"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "keep only the first N test rows"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "text-classification", "AutoModelForSequenceClassification", "run_glue.py"

    def __post_init__(self):
        # The one place that tells a GLUE task from the user's own data: the steps ask `task_data`.
        if self.task_name is None:
            self.task_data = OwnData()
        else:
            self.task_data = GlueTaskData(get_task(self.task_name))
            self.task_name = self.task_data.task.name
            self.dataset_name = self.dataset_name or GLUE_HUB_DATASET
        self.task_data.check_arguments(self)

    def card_tags(self) -> list[str]:
        return self.task_data.card_tags()

    def card_dataset(self, wanted, task=None) -> CardDataset:
        """The card's Data section (`TaskData.card_dataset`); `task` is the one `task_and_splits` returned, which
        the card of the user's own data names."""
        return self.task_data.card_dataset(self, wanted, task)


class TaskData(Protocol):
    """Where run_glue.py's task comes from, which the steps ask: a GLUE --task_name (`GlueTaskData`), or the user's
    own data, whose task is read from it (`OwnData`). `GlueDataArguments` decides which, once, from --task_name."""

    def check_arguments(self, data_args: GlueDataArguments) -> None:
        """Stop on a data argument this kind of run does not take (InputError)."""

    def check_wanted(self, wanted: dict) -> None:
        """Stop on splits (`inputs.wanted_samples`) this kind of run cannot give (InputError)."""

    def paper_recipe(self) -> tuple[str, dict]:
        """(name, recipe) for --paper_hparams (`paper_hparams.apply_paper_hparams`), or InputError where there is
        none."""

    def read(self, data_args: GlueDataArguments, model_args, wanted: dict) -> tuple:
        """(task, raw splits, split -> source, prepared splits): `task_and_splits` before the max_samples cut."""

    def card_tags(self) -> list[str]:
        """The model card's tags beside the pipeline's."""

    def card_dataset(self, data_args: GlueDataArguments, wanted, task) -> CardDataset:
        """The card's Data section, for the splits `wanted` and the `task` that `read` returned."""


@dataclass(frozen=True)
class GlueTaskData:
    """A GLUE task (--task_name): its files or the Hub's nyu-mll/glue, its own labels and recipe."""

    task: GlueTask

    def check_arguments(self, data_args: GlueDataArguments) -> None:
        for name in ("dataset_config_name", "text_column_names"):
            if getattr(data_args, name) is not None:
                raise InputError(f"--{name} is for your own data (no --task_name): GLUE tasks have their own")
        if data_args.label_column_name != "label":
            raise InputError("--label_column_name is for your own data (no --task_name): GLUE tasks have their own")
        if self.task.name != "mnli" and (data_args.validation_mismatched_file or data_args.test_mismatched_file):
            raise InputError("--validation_mismatched_file / --test_mismatched_file are for --task_name mnli only")
        for name in (
            "train_file",
            "validation_file",
            "validation_mismatched_file",
            "test_file",
            "test_mismatched_file",
        ):
            path = getattr(data_args, name)
            if path is not None and Path(path).suffix.lower() not in READERS:
                raise InputError(f"--{name} {path}: unsupported extension; use one of {', '.join(READERS)}")

    def check_wanted(self, wanted: dict) -> None:
        if self.task.predict_only and set(wanted) != {"test"}:
            raise InputError(
                f"{self.task.name} is the GLUE diagnostic set (unlabelled): --do_predict only, with a "
                "model fine-tuned on MNLI"
            )

    def paper_recipe(self) -> tuple[str, dict]:
        return paper_recipe(self.task)

    def read(self, data_args: GlueDataArguments, model_args, wanted: dict) -> tuple:
        """The data read and checked before the checkpoint's config is read: its labels must be the task's."""
        task = self.task
        raw_splits, sources = load_raw_splits(data_args, task, wanted, model_args.cache_dir, model_args.token)
        for kind in wanted:
            if not any(task.split_kind(split) == kind for split in raw_splits):
                raise InputError(
                    f"{SPLIT_FLAGS[kind]} needs {kind} data for {task.name}: pass --{kind}_file, or a "
                    "--data_dir holding "
                    f"{[n for split, n in task.tsv_files.items() if task.split_kind(split) == kind]}"
                )
        splits = prepare_splits(raw_splits, sources, task)
        check_checkpoint_labels(load_checkpoint_config(model_args), task)
        return task, raw_splits, sources, splits

    def card_tags(self) -> list[str]:
        return ["glue", self.task.name]

    def card_dataset(self, data_args: GlueDataArguments, wanted, task) -> CardDataset:
        """The GLUE task from the Hub or from its files."""
        task = self.task
        mnli = task.name == "mnli"
        splits = dict(
            splits={"eval_": "validation_matched" if mnli else "validation", "predict_": "test"},
            suffixes={"_mm": "validation_mismatched"} if mnli else {},
        )
        files = local_files(data_args, task)
        sources = {}
        for split in wanted:
            if data_args.data_dir is None and not files:
                hub_id = hub_dataset_id(data_args.dataset_name)
                sources[split] = (hub_id, f"the Hub's {hub_id} ({task.name})")
                continue
            given = [Path(path) for name, path in files.items() if task.split_kind(name) == split]
            for path in given:  # the original GLUE files are TSVs in a task-specific layout; other formats are not
                sources[split] = (GLUE_HUB_DATASET if path.suffix.lower() == ".tsv" else None, f"`{path.name}`")
            if not given and data_args.data_dir is not None:
                sources[split] = (GLUE_HUB_DATASET, f"the original GLUE TSV files in `{Path(data_args.data_dir).name}`")
        extra = f" Inputs: at most {data_args.max_seq_length} tokens.{limits(data_args, wanted)}"
        return from_sources(f"GLUE {task.folder}", sources, task.name, extra, **splits)


def task_and_splits(data_args: GlueDataArguments, model_args, wanted: dict) -> tuple:
    """The task and its splits, for a GLUE --task_name or for the user's own data (`data_args.task_data.read`).

    Args:
        data_args (`GlueDataArguments`): the data arguments and their `task_data`.
        model_args (`arguments.ModelArguments`): the checkpoint (its config), `cache_dir`, `token` and
            `ignore_mismatched_sizes`.
        wanted (`dict`): split kind -> max_samples (None: every row), from `inputs.wanted_samples`.

    Returns:
        `tuple`: (task, raw splits as read (`DatasetDict`), split -> source (`dict`), the prepared splits
        (`files.prepare_splits`), each cut to its kind's max_samples (`dict`)).

    Raises:
        InputError: a wanted kind has no split, the data fails its checks, or the checkpoint was fine-tuned on other
            labels (for the user's own data, unless --ignore_mismatched_sizes).
    """
    task, raw_splits, sources, splits = data_args.task_data.read(data_args, model_args, wanted)
    splits = {split: limit(dataset, wanted[task.split_kind(split)]) for split, dataset in splits.items()}
    return task, raw_splits, sources, splits
