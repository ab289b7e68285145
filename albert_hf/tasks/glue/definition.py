"""The GLUE tasks (`GlueTask`, `TASKS`: columns, labels, files, metric) and the paper's hyper-parameters for each, with
what a task answers for run_glue.py: its labels in the config, its metric, its checkpoint check."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...metrics import load_glue_metric
from ..paper_hparams import OFFICIAL_FINETUNING, best_on_dev
from ..seeds import Baseline, majority_class
from . import files


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

    # What run_glue.py asks of a task; `own_data.definition.OwnTask` answers the same for a user's own data.
    def encode_labels(self, dataset, where: str):
        return files.encode_labels(dataset, self, where)

    def label_config(self) -> dict:
        return label_config(self)

    def compute_metrics_function(self):
        return compute_metrics_function(self)

    def write_predictions(self, path, indices, logits) -> Path:
        return files.write_submission(path, self, indices, logits)


_STANDARD_FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
_INDEX = {"index": "idx"}
_PAIR = {"sentence1": "sentence1", "sentence2": "sentence2", **_INDEX}
_NLI_LABELS = ("entailment", "neutral", "contradiction")

TASKS = {
    task.name: task
    for task in [
        # CoLA train/dev have no header (source, label, original author's mark, sentence); the test has one.
        GlueTask(
            "cola",
            "CoLA",
            ("sentence",),
            ("0", "1"),
            ("unacceptable", "acceptable"),
            {"sentence": "sentence", "label": "label", **_INDEX},
            _STANDARD_FILES,
            {"test": "CoLA.tsv"},
            "cola",
        ),
        GlueTask(
            "sst2",
            "SST-2",
            ("sentence",),
            ("0", "1"),
            ("negative", "positive"),
            {"sentence": "sentence", "label": "label", **_INDEX},
            _STANDARD_FILES,
            {"test": "SST-2.tsv"},
            "sst2",
        ),
        # MRPC: a UTF-8 BOM before "Quality" (the label), and two sentence-id columns we drop.
        GlueTask(
            "mrpc",
            "MRPC",
            ("sentence1", "sentence2"),
            ("0", "1"),
            ("not_equivalent", "equivalent"),
            {"Quality": "label", "#1 String": "sentence1", "#2 String": "sentence2", **_INDEX},
            _STANDARD_FILES,
            {"test": "MRPC.tsv"},
            "mrpc",
        ),
        GlueTask(
            "stsb",
            "STS-B",
            ("sentence1", "sentence2"),
            None,
            None,
            {**_PAIR, "score": "label"},
            _STANDARD_FILES,
            {"test": "STS-B.tsv"},
            "stsb",
        ),
        GlueTask(
            "qqp",
            "QQP",
            ("question1", "question2"),
            ("0", "1"),
            ("not_duplicate", "duplicate"),
            {"question1": "question1", "question2": "question2", "is_duplicate": "label", "id": "idx"},
            _STANDARD_FILES,
            {"test": "QQP.tsv"},
            "qqp",
        ),
        # MNLI: the gold label is the last column (annotator labels label1..label5 precede it).
        GlueTask(
            "mnli",
            "MNLI",
            ("premise", "hypothesis"),
            _NLI_LABELS,
            _NLI_LABELS,
            {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label", **_INDEX},
            {
                "train": "train.tsv",
                "validation_matched": "dev_matched.tsv",
                "validation_mismatched": "dev_mismatched.tsv",
                "test_matched": "test_matched.tsv",
                "test_mismatched": "test_mismatched.tsv",
            },
            {"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv"},
            "mnli",
        ),
        GlueTask(
            "qnli",
            "QNLI",
            ("question", "sentence"),
            ("entailment", "not_entailment"),
            ("entailment", "not_entailment"),
            {"question": "question", "sentence": "sentence", "label": "label", **_INDEX},
            _STANDARD_FILES,
            {"test": "QNLI.tsv"},
            "qnli",
        ),
        GlueTask(
            "rte",
            "RTE",
            ("sentence1", "sentence2"),
            ("entailment", "not_entailment"),
            ("entailment", "not_entailment"),
            {**_PAIR, "label": "label"},
            _STANDARD_FILES,
            {"test": "RTE.tsv"},
            "rte",
        ),
        GlueTask(
            "wnli",
            "WNLI",
            ("sentence1", "sentence2"),
            ("0", "1"),
            ("not_entailment", "entailment"),
            {**_PAIR, "label": "label"},
            _STANDARD_FILES,
            {"test": "WNLI.tsv"},
            "wnli",
        ),
        # The diagnostic set: unlabelled, scored by the GLUE server; predicted by an MNLI model, MNLI's labels.
        GlueTask(
            "ax",
            "diagnostic",
            ("premise", "hypothesis"),
            _NLI_LABELS,
            _NLI_LABELS,
            {"sentence1": "premise", "sentence2": "hypothesis", **_INDEX},
            {"test": "diagnostic.tsv"},
            {"test": "AX.tsv"},
            "ax",
            predict_only=True,
        ),
    ]
}
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


def paper_recipe(task: GlueTask) -> tuple[str, dict]:
    """(name, recipe): the task's row with what every task shares, for `paper_hparams.apply_paper_hparams`."""
    if task.name not in PAPER_HPARAMS:
        raise InputError(
            f"--paper_hparams: the official run_glue.sh and the paper have no recipe for {task.name} "
            f"(tasks: {', '.join(PAPER_HPARAMS)}); give the hyper-parameters explicitly"
        )
    return task.name, {**PAPER_HPARAMS[task.name], **PAPER_COMMON}


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
    return dict(
        num_labels=task.num_labels,
        id2label=dict(enumerate(task.label_names)),
        label2id={name: i for i, name in enumerate(task.label_names)},
        problem_type="single_label_classification",
        finetuning_task=task.name,
    )


def check_checkpoint_labels(config, task: GlueTask) -> None:
    """Stop when a checkpoint fine-tuned on other labels would be silently relabelled (e.g. an RTE model run on
    MNLI). Checkpoints without named labels (pretrained ones: LABEL_0, LABEL_1) are fine."""
    names = [str(name) for _, name in sorted((int(i), n) for i, n in (config.id2label or {}).items())]
    if task.is_regression or all(name.startswith("LABEL_") for name in names):
        return
    if tuple(names) != task.label_names:
        raise InputError(
            f"The checkpoint's labels {names} are not those of {task.name} {list(task.label_names)}; "
            "start from a pretrained (or same-task) checkpoint"
        )


def baseline(task, dev) -> Baseline:
    """What a model that learned nothing scores on the dev set `dev` (its encoded `label` column), on the task's main
    metric: the majority class's accuracy, MCC 0 (a constant prediction), Pearson 0.1 for a regression."""
    if task.main_metric == "accuracy":
        return majority_class(dev["label"], task.label_names)
    if task.main_metric == "matthews_correlation":
        return Baseline("matthews_correlation", 0.0, "a constant prediction")
    return Baseline("pearson", 0.1, "an unrelated score (correlation 0.1)")
