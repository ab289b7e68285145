"""SQuAD examples: the data and window options (`SquadDataArguments`, as transformers' run_qa.py names them), the
questions read from the official JSON or the Hub's flattened format, checked, and those a run can train on or score
selected. features.py cuts them into the model's windows."""

from __future__ import annotations

import collections
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, load_dataset

from ...errors import InputError, datasets_read_errors, input_errors
from ...hub.model_card import CardDataset, from_sources, hub_dataset_id, limits
from ...runtime.input_files import check_json_start
from ..inputs import check_columns, limit

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ["id", "question", "context", "answers"]


# Questions in the official SQuAD files: a file in the official JSON format is that dataset only when it holds them
# all (SQuAD's JSON is the exchange format of many QA sets, and of partial copies such as half of the v2.0 dev set).
SQUAD_QUESTIONS = {
    ("1.1", "train"): 87599,
    ("1.1", "validation"): 10570,
    ("v2.0", "train"): 130319,
    ("v2.0", "validation"): 11873,
}


def is_official_squad(path: Path, version: str, split: str) -> bool:
    expected = SQUAD_QUESTIONS.get((version, split))
    if expected is None or path.suffix.lower() != ".json" or not path.is_file():
        return False
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
        return str(content.get("version")) == version and expected == sum(
            len(paragraph["qas"]) for article in content["data"] for paragraph in article["paragraphs"]
        )
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False


@dataclass
class SquadDataArguments:
    """Data and SQuAD options (names as transformers' run_qa.py; the defaults are the official ALBERT ones)."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset, e.g. squad or squad_v2"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "config of the Hub dataset"})
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "official SQuAD JSON (train-v1.1.json, train-v2.0.json), or the flattened "
            "Hub format as .json/.jsonl/.parquet (id, title, context, question, answers)"
        },
    )
    validation_file: str | None = field(default=None, metadata={"help": "as train_file, e.g. dev-v2.0.json"})
    test_file: str | None = field(
        default=None,
        metadata={
            "help": "as validation_file, for --do_predict (predict_predictions.json); answers "
            "are optional: with them, predict_results.json has the metrics"
        },
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for feature building"})
    max_seq_length: int = field(default=384, metadata={"help": "pieces per window, question and specials included"})
    max_query_length: int = field(default=64, metadata={"help": "the question is cut to this many pieces"})
    doc_stride: int = field(
        default=128,
        metadata={
            "help": "step between the starts of consecutive context windows, in pieces (the "
            "official meaning; run_qa.py passes it to the tokenizer as the overlap)"
        },
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N eval questions"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "use only the first N test questions"})
    version_2_with_negative: bool = field(default=False, metadata={"help": "SQuAD v2.0: some questions have no answer"})
    null_score_diff_threshold: float = field(
        default=0.0,
        metadata={
            "help": "v2.0: predict no answer when the null odds reach this (>=, as the official "
            "code; span head: null score minus best span score; answerability head: the "
            "classifier logit)"
        },
    )
    tune_null_threshold: bool = field(
        default=False,
        metadata={
            "help": "v2.0: use instead the threshold that maximises F1 on the evaluation set "
            "itself (official ALBERT/XLNet practice: the numbers are tuned on dev)"
        },
    )
    n_best_size: int = field(default=20, metadata={"help": "candidates kept per question (nbest_predictions.json)"})
    max_answer_length: int = field(default=30, metadata={"help": "longest answer, in pieces"})
    answerability_head: bool = field(
        default=False,
        metadata={
            "help": "v2.0: the official ALBERT v2 head (start, end conditioned on the start, "
            "answerability classifier) instead of the plain span head"
        },
    )
    start_n_top: int = field(default=5, metadata={"help": "answerability head: beam of start positions"})
    end_n_top: int = field(default=5, metadata={"help": "answerability head: end positions per start"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "question-answering", "AutoModelForQuestionAnswering", "run_squad.py"

    def card_tags(self) -> list[str]:
        return ["squad"] + ["squad_v2"] * self.version_2_with_negative

    def card_dataset(self, wanted) -> CardDataset:
        v2 = self.version_2_with_negative
        name, official, version = (
            ("SQuAD v2.0", "rajpurkar/squad_v2", "v2.0") if v2 else ("SQuAD v1.1", "rajpurkar/squad", "1.1")
        )
        sources = {}
        for split in wanted:
            path = getattr(self, f"{split}_file", None)
            if path:
                found = is_official_squad(Path(path), version, split)
                sources[split] = (
                    official if found else None,
                    f"`{Path(path).name}`" + (f" (the official {name} {split} file)" if found else ""),
                )
            elif self.dataset_name:
                hub_id = hub_dataset_id(self.dataset_name)
                sources[split] = (hub_id, f"the Hub's {hub_id}")
        extra = (
            f" Windows of {self.max_seq_length} tokens (question: at most {self.max_query_length}), "
            f"stride {self.doc_stride}.{limits(self, wanted)}"
        )
        config = self.dataset_config_name if self.dataset_name else None
        return from_sources(name, sources, config, extra)

    def __post_init__(self):
        if self.dataset_name is None and not (self.train_file or self.validation_file or self.test_file):
            raise InputError("Give --dataset_name (e.g. squad_v2) or --train_file/--validation_file/--test_file")
        if self.max_seq_length < 5:
            raise InputError(
                f"--max_seq_length {self.max_seq_length}: [CLS] question [SEP] context [SEP] needs at least 5 pieces"
            )
        if self.max_query_length < 1:
            raise InputError(f"--max_query_length {self.max_query_length}: the question needs at least 1 piece")
        if self.doc_stride <= 0:
            raise InputError("doc_stride must be positive")
        if self.answerability_head and not self.version_2_with_negative:
            raise InputError("--answerability_head is the SQuAD v2.0 head: pass --version_2_with_negative too")


# Columns of the evaluation features that post-processing needs but the model must not see.
POSTPROCESSING_COLUMNS = ["example_id", "offset_mapping", "token_is_max_context"]

# ----------------------------------------------------------------------------------------------------------------
# Reading


def _flatten_official(data: dict, path) -> list[dict]:
    """Rows in the Hub layout from the official nested JSON: data[].paragraphs[].qas[].

    v2.0 unanswerable questions get empty answers (their `plausible_answers` are not answers).
    """
    rows = []
    for a, article in enumerate(data["data"]):
        where = f"{path}: data[{a}]"
        for p, paragraph in enumerate(
            _of_type(_of_type(article, dict, where).get("paragraphs", []), list, f"{where}.paragraphs")
        ):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            if "context" not in _of_type(paragraph, dict, where):
                raise InputError(f"{where} has no 'context'")
            context = _of_type(paragraph["context"], str, f"{where}.context")
            for q, qa in enumerate(_of_type(paragraph.get("qas", []), list, f"{where}.qas")):
                if not str(_of_type(qa, dict, f"{where}.qas[{q}]").get("id", "")).strip():
                    raise InputError(f"{where}.qas[{q}]: the question has no 'id'")
                if "question" not in qa:
                    raise InputError(f"{where}.qas[{q}] (id {qa['id']}) has no 'question'")
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                answers = [
                    _of_type(x, dict, f"{where}.qas[{q}].answers[{i}]")
                    for i, x in enumerate(_of_type(answers, list, f"{where}.qas[{q}].answers"))
                ]
                rows.append(
                    {
                        "id": str(qa["id"]),
                        "title": str(article.get("title", "")),
                        "context": context,
                        "question": _of_type(qa["question"], str, f"{where}.qas[{q}].question"),
                        "answers": _answers_column(
                            [x.get("text") for x in answers],
                            [x.get("answer_start") for x in answers],
                            f"{where}.qas[{q}].answers",
                        ),
                    }
                )
    return rows


_JSON_TYPE_NAMES = {dict: "object", list: "list", str: "string"}


def _of_type(value, kind: type, where: str):
    if not isinstance(value, kind):
        raise InputError(
            f"{where}: expected a JSON {_JSON_TYPE_NAMES[kind]}, found {type(value).__name__} {value!r:.40}"
        )
    return value


def _answers_column(texts, starts, where: str) -> dict:
    """{"text", "answer_start"} checked: as many texts as starts, strings and non-negative integers."""
    if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
        raise InputError(f"{where}: answers need as many 'text' strings as 'answer_start' offsets")
    for text, start in zip(texts, starts):
        if not isinstance(text, str):
            raise InputError(f"{where}: answer text {text!r:.40} is not a string")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InputError(f"{where}: answer_start {start!r:.40} is not a character offset (an integer >= 0)")
    return {"text": texts, "answer_start": starts}


def read_squad_file(path, answers_required: bool = True) -> Dataset:
    """The questions of a SQuAD file: the official nested JSON, or the flattened Hub layout in .json/.jsonl/.parquet.

    The official JSON's unanswerable (v2.0) questions get empty answers. With `answers_required=False` (test files),
    rows without an `answers` column are read with empty answers. Every file is checked (`check_examples`).

    Args:
        path (`str` or `os.PathLike`): the file; its extension is `.json`, `.jsonl` or `.parquet`.
        answers_required (`bool`, defaults to `True`): whether the rows must have an `answers` column.

    Returns:
        `datasets.Dataset`: one row per question, with `id`, `question`, `context` and `answers`
        (`{"text": [...], "answer_start": [...]}`); the official JSON adds `title`, flattened rows keep their columns.

    Raises:
        InputError: the file is missing, has another extension, is not UTF-8, cannot be read as SQuAD rows, or fails
            the checks (a missing column or id, a repeated id, answers that are not texts with character offsets).
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"SQuAD file not found: {path}")
    if path.suffix not in (".json", ".jsonl", ".parquet"):
        raise InputError(f"{path}: unsupported extension; use the official .json, or .json/.jsonl/.parquet rows")
    data = None
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as error:
            raise InputError(f"{path}: not UTF-8 text ({error})") from None
        except json.JSONDecodeError:
            pass  # JSON lines
    articles = data.get("data") if isinstance(data, dict) else None
    if isinstance(articles, list) and articles and isinstance(articles[0], dict) and "paragraphs" in articles[0]:
        dataset = Dataset.from_list(_flatten_official(data, path))
    else:
        builder = "parquet" if path.suffix == ".parquet" else "json"
        field_name = "data" if isinstance(articles, list) else None  # {"data": [rows]} as datasets' json `field`
        if builder == "json":
            check_json_start(path)
        with input_errors(f"{path}: cannot be read as SQuAD rows ({builder})", *datasets_read_errors()):
            dataset = load_dataset(
                builder, data_files=str(path), split="train", **({"field": field_name} if builder == "json" else {})
            )
    if not answers_required and "answers" not in dataset.column_names and len(dataset):
        dataset = dataset.add_column("answers", [{"text": [], "answer_start": []}] * len(dataset))
    check_examples(dataset, str(path))
    return dataset


def check_examples(dataset: Dataset, where: str) -> None:
    """Stop on what would silently corrupt results: missing columns, questions without an id, repeated ids."""
    check_columns(dataset, REQUIRED_COLUMNS, where)
    seen = set()
    for row, question_id in enumerate(dataset["id"]):
        if question_id is None or not str(question_id).strip():
            raise InputError(f"{where}: row {row} (question {dataset[row]['question']!r}) has no 'id'")
        if question_id in seen:
            raise InputError(f"{where}: question id {question_id!r} appears twice (row {row}); ids must be unique")
        seen.add(question_id)
    for name in ("context", "question"):
        for row, value in enumerate(dataset[name]):
            _of_type(value, str, f"{where}: row {row} {name!r}")
    for row, answers in enumerate(dataset["answers"]):
        _of_type(answers, dict, f"{where}: row {row} 'answers'")
        _answers_column(answers.get("text"), answers.get("answer_start"), f"{where}: row {row} 'answers'")


# split -> (what asks for it, the file argument giving it)
NEEDS = {
    "train": ("--do_train", "train_file"),
    "validation": ("--do_eval (or --eval_strategy steps/epoch)", "validation_file"),
    "test": ("--do_predict", "test_file"),
}


def check_sources(data_args: SquadDataArguments, wanted) -> None:
    """A split asked for (`wanted`) with neither its --*_file nor a --dataset_name stops the run at once."""
    for split in wanted:
        flag, file_argument = NEEDS[split]
        if data_args.dataset_name is None and getattr(data_args, file_argument) is None:
            raise InputError(
                f"{flag} needs a {split} set: give --{file_argument} (or a --dataset_name that has a {split} split)"
            )


def load_squad_splits(data_args: SquadDataArguments, wanted: dict | None = None, cache_dir=None, token=None) -> dict:
    """The SQuAD splits of a run, from local files or a Hub dataset.

    A local file (--train_file, --validation_file, --test_file) replaces the Hub's split of the same name; a test file
    may have no answers.

    Args:
        data_args (`SquadDataArguments`): the data arguments (the files, --dataset_name, --dataset_config_name).
        wanted (`dict`, *optional*): split -> max_samples (None: every row), from `inputs.wanted_samples`: those
            splits only, each cut to its first max_samples questions. None: every split there is, uncut.
        cache_dir (`str`, *optional*): the `datasets` cache for the Hub dataset.
        token (`str`, *optional*): the Hub token for the Hub dataset.

    Returns:
        `dict`: split ("train", "validation", "test") -> its questions (`datasets.Dataset`, as `read_squad_file`).

    Raises:
        InputError: a split in `wanted` is in neither the files nor the Hub dataset, a file cannot be read, or a
            file or Hub split fails the checks.
    """
    splits = {}
    if data_args.dataset_name is not None:
        hub = load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir, token=token)
        for name in ("train", "validation", "test"):
            if name in hub:
                check_examples(hub[name], f"{data_args.dataset_name}[{name}]")
                splits[name] = hub[name]
    for name, path in (
        ("train", data_args.train_file),
        ("validation", data_args.validation_file),
        ("test", data_args.test_file),
    ):
        if path is not None:
            splits[name] = read_squad_file(path, answers_required=name != "test")
    if wanted is None:
        return splits
    for split in wanted:
        if split not in splits:
            flag, file_argument = NEEDS[split]
            raise InputError(
                f"{flag} needs a {split} set: --dataset_name {data_args.dataset_name} has no "
                f"{split} split; give --{file_argument}"
            )
    return {split: limit(splits[split], max_samples) for split, max_samples in wanted.items()}


def has_gold_answers(examples: Dataset) -> bool:
    """Whether a set of questions is labelled: at least one has an answer (a test set without answers has none)."""
    return any(answers["text"] for answers in examples["answers"])


def _answer_problem(context: str, answers: dict, version_2: bool) -> str | None:
    """Why a training question cannot be used, or None. The official code skips these too ("Could not find")."""
    if not context.strip():
        return "an empty context"
    if not answers["text"]:
        return None if version_2 else "no answer (v2.0 data? pass --version_2_with_negative)"
    start, text = answers["answer_start"][0], answers["text"][0]
    if not text.strip():
        return "an empty answer text"
    if start is None or start < 0 or context[start : start + len(text)] != text:
        return "an answer text that is not at its answer_start"
    return None


def select_trainable(dataset: Dataset, version_2: bool, where: str) -> Dataset:
    """The training questions that can be labelled; the others are dropped and counted in a warning, per reason.

    Dropped: an empty context; no answer in v1.1 mode; an empty first answer text; a first answer text that is not at
    its `answer_start`. The official code skips these too ("Could not find").

    Args:
        dataset (`datasets.Dataset`): the training questions (`id`, `context`, `answers`).
        version_2 (`bool`): SQuAD v2.0, where a question without an answer is kept (an unanswerable one).
        where (`str`): the file or split, named in the warnings.

    Returns:
        `datasets.Dataset`: `dataset` itself when every question is kept, else the questions kept, in order.
    """
    keep, problems = [], collections.defaultdict(list)
    for row, (question_id, context, answers) in enumerate(zip(dataset["id"], dataset["context"], dataset["answers"])):
        problem = _answer_problem(context, answers, version_2)
        if problem is None:
            keep.append(row)
        else:
            problems[problem].append(question_id)
    for problem, ids in problems.items():
        logger.warning(
            "%s: skipped %d of %d training questions with %s (e.g. id %s)",
            where,
            len(ids),
            len(dataset),
            problem,
            ids[0],
        )
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


def select_evaluable(dataset: Dataset, version_2: bool, where: str, labelled: bool = True) -> Dataset:
    """Evaluation questions: an empty context is a counted skip; v1.1 mode refuses unanswerable questions (in a
    labelled set; an unlabelled test set has no answers at all)."""
    if labelled and not version_2:
        for question_id, answers in zip(dataset["id"], dataset["answers"]):
            if not answers["text"]:
                raise InputError(
                    f"{where}: question {question_id!r} has no answer: this is SQuAD v2.0 data, pass "
                    "--version_2_with_negative"
                )
    keep = [row for row, context in enumerate(dataset["context"]) if context.strip()]
    if len(keep) < len(dataset):
        logger.warning(
            "%s: skipped %d of %d evaluation questions with an empty context (left out of predictions and metrics)",
            where,
            len(dataset) - len(keep),
            len(dataset),
        )
        dataset = dataset.select(keep)
    return dataset
