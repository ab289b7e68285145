"""SQuAD v1.1 / v2.0 for run_squad.py: reading, windowed features, post-processing, outputs, metrics.

The recipe is the official ALBERT one (google-research/albert's `squad_utils.py`), on a fast tokenizer's offsets
instead of the official LCS character alignment:
- `[CLS] question [SEP] context-window [SEP]`, the question cut to `max_query_length` pieces, windows of the
  context advancing by `doc_stride` pieces (the official meaning: the step between window starts);
- a training window that does not contain the answer (and every window of an unanswerable question) points at
  [CLS] (position 0) and is marked `is_impossible`;
- post-processing over all windows of a question: n-best (start, end) pairs, starts only where the window gives
  the token its most context (`token_is_max_context`), at most `max_answer_length` pieces; for v2.0 the null score
  against the best span.

Two heads: the plain span head (`AlbertHFForQuestionAnswering`, the official v1.1 head; for v2.0 the BERT/HF
null-score-difference rule) and the official ALBERT v2 answerability head (`AlbertHFForQuestionAnsweringWithAnswerability` in modeling_albert_hf.py).

`SquadTrainer` runs the model on the windows and post-processes against the questions in its `evaluate` (as
transformers' QuestionAnsweringTrainer does), so evaluations during training (--eval_strategy), the best-checkpoint
choice (--metric_for_best_model f1) and the final evaluation and prediction all see the same SQuAD metrics.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset, load_dataset
from transformers.trainer_utils import speed_metrics

from .finetuning import OFFICIAL_FINETUNING, AlbertTrainer, check_columns, fit_max_seq_length
from .corpus import check_json_start
from .errors import InputError, datasets_read_errors, input_errors
from .squad_metrics import OFFICIAL_NA_PROB_THRESH, squad_v1_metrics, squad_v2_metrics

logger = logging.getLogger("albert_hf.squad")

# The paper's SQuAD rows (Table 14; the official run_squad_v1.py/run_squad_v2.py): whole epochs, int(87,599 / 48 x 2)
# = 3649 and int(130,319 / 48 x 3) = 8144 steps, warm-up 10%. Both use windows of stride 128, questions of at most 64
# pieces, n-best 20 and answers of at most 30 pieces, and the config's own ALBERT dropout. v2.0 is the official
# run_squad_v2.py: its answerability head (dropout_prob 0.1, beams of 5 x 5) and the threshold tuned on dev.
PAPER_HPARAMS = {
    "v1.1": dict(learning_rate=5e-5, batch_size=48, max_steps=3649, warmup_steps=365, max_seq_length=384),
    "v2.0": dict(learning_rate=3e-5, batch_size=48, max_steps=8144, warmup_steps=814, max_seq_length=512,
                 answerability_head=True, tune_null_threshold=True, start_n_top=5, end_n_top=5,
                 classifier_dropout_prob=0.1),
}
PAPER_COMMON = dict(doc_stride=128, max_query_length=64, n_best_size=20, max_answer_length=30, **OFFICIAL_FINETUNING)

REQUIRED_COLUMNS = ["id", "question", "context", "answers"]
# Columns of the evaluation features that post-processing needs but the model must not see.
POSTPROCESSING_COLUMNS = ["example_id", "offset_mapping", "token_is_max_context"]


@dataclass
class SquadDataArguments:
    """Data and SQuAD options (names as transformers' run_qa.py; the defaults are the official ALBERT ones)."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset, e.g. squad or squad_v2"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "config of the Hub dataset"})
    train_file: str | None = field(
        default=None, metadata={"help": "official SQuAD JSON (train-v1.1.json, train-v2.0.json), or the flattened "
                                        "Hub format as .json/.jsonl/.parquet (id, title, context, question, answers)"})
    validation_file: str | None = field(default=None, metadata={"help": "as train_file, e.g. dev-v2.0.json"})
    test_file: str | None = field(
        default=None, metadata={"help": "as validation_file, for --do_predict (predict_predictions.json); answers "
                                        "are optional: with them, predict_results.json has the metrics"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for feature building"})
    max_seq_length: int = field(default=384, metadata={"help": "pieces per window, question and specials included"})
    max_query_length: int = field(default=64, metadata={"help": "the question is cut to this many pieces"})
    doc_stride: int = field(
        default=128, metadata={"help": "step between the starts of consecutive context windows, in pieces (the "
                                       "official meaning; run_qa.py passes it to the tokenizer as the overlap)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N eval questions"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "use only the first N test questions"})
    version_2_with_negative: bool = field(default=False, metadata={"help": "SQuAD v2.0: some questions have no answer"})
    null_score_diff_threshold: float = field(
        default=0.0, metadata={"help": "v2.0: predict no answer when the null odds reach this (>=, as the official "
                                       "code; span head: null score minus best span score; answerability head: the "
                                       "classifier logit)"})
    tune_null_threshold: bool = field(
        default=False, metadata={"help": "v2.0: use instead the threshold that maximises F1 on the evaluation set "
                                         "itself (official ALBERT/XLNet practice: the numbers are tuned on dev)"})
    n_best_size: int = field(default=20, metadata={"help": "candidates kept per question (nbest_predictions.json)"})
    max_answer_length: int = field(default=30, metadata={"help": "longest answer, in pieces"})
    answerability_head: bool = field(
        default=False, metadata={"help": "v2.0: the official ALBERT v2 head (start, end conditioned on the start, "
                                         "answerability classifier) instead of the plain span head"})
    start_n_top: int = field(default=5, metadata={"help": "answerability head: beam of start positions"})
    end_n_top: int = field(default=5, metadata={"help": "answerability head: end positions per start"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "question-answering", "AutoModelForQuestionAnswering", "run_squad.py"

    def card_tags(self) -> list[str]:
        return ["squad"] + ["squad_v2"] * self.version_2_with_negative

    def card_dataset(self, wanted):
        from .model_card import squad_card_dataset

        return squad_card_dataset(self, wanted)

    def __post_init__(self):
        if self.dataset_name is None and not (self.train_file or self.validation_file or self.test_file):
            raise InputError("Give --dataset_name (e.g. squad_v2) or --train_file/--validation_file/--test_file")
        if self.max_seq_length < 5:
            raise InputError(f"--max_seq_length {self.max_seq_length}: [CLS] question [SEP] context [SEP] needs at "
                             "least 5 pieces")
        if self.max_query_length < 1:
            raise InputError(f"--max_query_length {self.max_query_length}: the question needs at least 1 piece")
        if self.doc_stride <= 0:
            raise InputError("doc_stride must be positive")
        if self.answerability_head and not self.version_2_with_negative:
            raise InputError("--answerability_head is the SQuAD v2.0 head: pass --version_2_with_negative too")


def fit_lengths(data_args: SquadDataArguments, config) -> None:
    """Makes the window lengths compose: --max_seq_length is capped at the model's positions, then a
    --max_query_length that would leave the context no room in a window (the default 64 with --max_seq_length 64)
    is cut to half the window's room, logged once. Windows advance by min(doc_stride, window), as the official
    loop, so --doc_stride composes with any window."""
    fit_max_seq_length(data_args, config)
    room = data_args.max_seq_length - 3  # [CLS] question [SEP] context [SEP]
    if data_args.max_query_length >= room:
        capped = room // 2
        logger.warning("--max_query_length %d would leave no context in a --max_seq_length %d window: questions keep "
                       "their first %d pieces", data_args.max_query_length, data_args.max_seq_length, capped)
        data_args.max_query_length = capped


def paper_recipe(data_args: SquadDataArguments) -> tuple[str, dict]:
    """(name, recipe) of the paper's row for the data's version, for `finetuning.apply_paper_hparams`."""
    version = "v2.0" if data_args.version_2_with_negative else "v1.1"
    return f"SQuAD {version}", {**PAPER_HPARAMS[version], **PAPER_COMMON}


# ----------------------------------------------------------------------------------------------------------------
# Reading


def _flatten_official(data: dict, path) -> list[dict]:
    """Rows in the Hub layout from the official nested JSON: data[].paragraphs[].qas[].

    v2.0 unanswerable questions get empty answers (their `plausible_answers` are not answers).
    """
    rows = []
    for a, article in enumerate(data["data"]):
        where = f"{path}: data[{a}]"
        for p, paragraph in enumerate(_of_type(_of_type(article, dict, where).get("paragraphs", []), list,
                                               f"{where}.paragraphs")):
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
                answers = [_of_type(x, dict, f"{where}.qas[{q}].answers[{i}]")
                           for i, x in enumerate(_of_type(answers, list, f"{where}.qas[{q}].answers"))]
                rows.append({
                    "id": str(qa["id"]),
                    "title": str(article.get("title", "")),
                    "context": context,
                    "question": _of_type(qa["question"], str, f"{where}.qas[{q}].question"),
                    "answers": _answers_column([x.get("text") for x in answers],
                                               [x.get("answer_start") for x in answers], f"{where}.qas[{q}].answers"),
                })
    return rows


_JSON_TYPE_NAMES = {dict: "object", list: "list", str: "string"}


def _of_type(value, kind: type, where: str):
    if not isinstance(value, kind):
        raise InputError(f"{where}: expected a JSON {_JSON_TYPE_NAMES[kind]}, found {type(value).__name__} "
                         f"{value!r:.40}")
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
    """The official nested SQuAD JSON, or the flattened Hub layout in .json/.jsonl/.parquet, as a Dataset.

    With `answers_required=False` (test files) rows without an `answers` column are read with empty answers.
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
            dataset = load_dataset(builder, data_files=str(path), split="train",
                                   **({"field": field_name} if builder == "json" else {}))
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


def load_squad_splits(data_args: SquadDataArguments, cache_dir=None, token=None) -> dict:
    """{"train", "validation", "test": Dataset} (those there are) from local files or a Hub dataset; a local file
    replaces the Hub's split of the same name."""
    splits = {}
    if data_args.dataset_name is not None:
        hub = load_dataset(data_args.dataset_name, data_args.dataset_config_name, cache_dir=cache_dir, token=token)
        for name in ("train", "validation", "test"):
            if name in hub:
                check_examples(hub[name], f"{data_args.dataset_name}[{name}]")
                splits[name] = hub[name]
    for name, path in (("train", data_args.train_file), ("validation", data_args.validation_file),
                       ("test", data_args.test_file)):
        if path is not None:
            splits[name] = read_squad_file(path, answers_required=name != "test")
    return splits


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
    if start is None or start < 0 or context[start:start + len(text)] != text:
        return "an answer text that is not at its answer_start"
    return None


def select_trainable(dataset: Dataset, version_2: bool, where: str) -> Dataset:
    """Drop (and count in the log) the training questions that cannot be labelled."""
    keep, problems = [], collections.defaultdict(list)
    for row, (question_id, context, answers) in enumerate(zip(dataset["id"], dataset["context"], dataset["answers"])):
        problem = _answer_problem(context, answers, version_2)
        if problem is None:
            keep.append(row)
        else:
            problems[problem].append(question_id)
    for problem, ids in problems.items():
        logger.warning("%s: skipped %d of %d training questions with %s (e.g. id %s)",
                       where, len(ids), len(dataset), problem, ids[0])
    return dataset if len(keep) == len(dataset) else dataset.select(keep)


def select_evaluable(dataset: Dataset, version_2: bool, where: str, labelled: bool = True) -> Dataset:
    """Evaluation questions: an empty context is a counted skip; v1.1 mode refuses unanswerable questions (in a
    labelled set; an unlabelled test set has no answers at all)."""
    if labelled and not version_2:
        for question_id, answers in zip(dataset["id"], dataset["answers"]):
            if not answers["text"]:
                raise InputError(f"{where}: question {question_id!r} has no answer: this is SQuAD v2.0 data, pass "
                                 "--version_2_with_negative")
    keep = [row for row, context in enumerate(dataset["context"]) if context.strip()]
    if len(keep) < len(dataset):
        logger.warning("%s: skipped %d of %d evaluation questions with an empty context (left out of predictions "
                       "and metrics)", where, len(dataset) - len(keep), len(dataset))
        dataset = dataset.select(keep)
    return dataset


# ----------------------------------------------------------------------------------------------------------------
# Features


def window_starts(num_context_tokens: int, max_context_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of the context windows, as the official `doc_spans` loop: advance by doc_stride until the
    window reaches the end of the context."""
    spans, start = [], 0
    while True:
        length = min(num_context_tokens - start, max_context_tokens)
        spans.append((start, length))
        if start + length >= num_context_tokens:
            return spans
        start += min(length, doc_stride)


def max_context_flags(spans: list[tuple[int, int]]) -> list[list[bool]]:
    """For each window, for each of its context tokens: is this the window where the token has the most context?

    Official `_check_is_max_context`: score = min(left, right context) + 0.01 * window length; the first window
    wins ties.
    """
    best = {}
    for span_index, (start, length) in enumerate(spans):
        for position in range(start, start + length):
            score = min(position - start, start + length - 1 - position) + 0.01 * length
            if position not in best or score > best[position][0]:
                best[position] = (score, span_index)
    return [[best[position][1] == span_index for position in range(start, start + length)]
            for span_index, (start, length) in enumerate(spans)]


def _answer_token_span(offsets, start_char: int, end_char: int) -> tuple[int, int]:
    """First piece ending after the answer's first character, last piece starting before its end."""
    start = next((i for i, (_, piece_end) in enumerate(offsets) if piece_end > start_char), None)
    end = max((i for i, (piece_start, _) in enumerate(offsets) if piece_start < end_char), default=None)
    return None if start is None or end is None or end < start else (start, end)


def build_features(examples: dict, tokenizer, data_args: SquadDataArguments, training: bool) -> dict:
    """Batched `Dataset.map` function: one feature per context window.

    All features have `input_ids`, `token_type_ids`, `attention_mask`, `p_mask` (1 on question, [SEP] and
    padding; 0 on [CLS] and context) padded to max_seq_length. Training adds `start_positions`, `end_positions`,
    `is_impossible`; evaluation adds `example_id`, `offset_mapping` (character span in the context, None outside
    it) and `token_is_max_context`.
    """
    questions = [q.lstrip() for q in examples["question"]]
    question_ids = tokenizer(questions, add_special_tokens=False)["input_ids"]
    contexts = tokenizer(examples["context"], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    length = data_args.max_seq_length
    out = collections.defaultdict(list)
    for i, question in enumerate(question_ids):
        question = question[: data_args.max_query_length]
        context_ids, context_offsets = contexts["input_ids"][i], contexts["offset_mapping"][i]
        first_context_position = len(question) + 2  # after [CLS] question [SEP]
        spans = window_starts(len(context_ids), length - len(question) - 3, data_args.doc_stride)
        max_context = max_context_flags(spans)
        if training:
            answers = examples["answers"][i]
            answer_tokens = None
            if answers["text"]:
                start_char = answers["answer_start"][0]
                answer_tokens = _answer_token_span(context_offsets, start_char, start_char + len(answers["text"][0]))
                if answer_tokens is None:  # select_trainable only lets through answers made of visible text
                    raise InputError(f"question {examples['id'][i]!r}: the answer covers no piece of the context")
        for (start, span_length), flags in zip(spans, max_context):
            ids = [cls, *question, sep, *context_ids[start:start + span_length], sep]
            used = len(ids)
            out["input_ids"].append(ids + [pad] * (length - used))
            out["token_type_ids"].append([0] * first_context_position + [1] * (used - first_context_position)
                                         + [0] * (length - used))
            out["attention_mask"].append([1] * used + [0] * (length - used))
            out["p_mask"].append([0] + [1] * (first_context_position - 1) + [0] * span_length
                                 + [1] * (length - used + 1))
            if training:
                inside = (answer_tokens is not None and start <= answer_tokens[0]
                          and answer_tokens[1] < start + span_length)
                shift = first_context_position - start
                out["start_positions"].append(answer_tokens[0] + shift if inside else 0)
                out["end_positions"].append(answer_tokens[1] + shift if inside else 0)
                out["is_impossible"].append(0.0 if inside else 1.0)
            else:
                out["example_id"].append(examples["id"][i])
                offsets = [None] * length
                offsets[first_context_position:first_context_position + span_length] = [
                    list(o) for o in context_offsets[start:start + span_length]]
                out["offset_mapping"].append(offsets)
                after = length - first_context_position - span_length
                out["token_is_max_context"].append([False] * first_context_position + flags + [False] * after)
    return dict(out)


def features_dataset(examples: Dataset, tokenizer, data_args: SquadDataArguments, training: bool) -> Dataset:
    return examples.map(
        build_features, batched=True, remove_columns=examples.column_names,
        num_proc=data_args.preprocessing_num_workers,
        fn_kwargs=dict(tokenizer=tokenizer, data_args=data_args, training=training),
        desc=f"SQuAD {'training' if training else 'evaluation'} features",
    )


# ----------------------------------------------------------------------------------------------------------------
# Post-processing


def _features_per_example(examples: Dataset, features: Dataset) -> list[list[int]]:
    row_of_id = {question_id: row for row, question_id in enumerate(examples["id"])}
    per_example = [[] for _ in range(len(examples))]
    for feature_index, question_id in enumerate(features["example_id"]):
        per_example[row_of_id[question_id]].append(feature_index)
    return per_example


def _softmax(scores: list[float]) -> list[float]:
    if not scores:
        return []
    exp = np.exp(np.array(scores, dtype=np.float64) - max(scores))
    return (exp / exp.sum()).tolist()


def _valid_span(offsets, max_context, start: int, end: int, max_answer_length: int) -> bool:
    return (start < len(offsets) and end < len(offsets) and offsets[start] is not None and offsets[end] is not None
            and start <= end and end - start + 1 <= max_answer_length and max_context[start])


def _nbest(candidates: list[dict], n_best_size: int) -> list[dict]:
    """Best first, one entry per answer character span (overlapping windows find the same span twice)."""
    unique = {}
    for candidate in sorted(candidates, key=lambda c: c["score"], reverse=True):
        unique.setdefault(candidate.pop("span"), candidate)
    return list(unique.values())[:n_best_size]


def postprocess_span_predictions(examples, features, start_logits, end_logits, n_best_size=20, max_answer_length=30,
                                 version_2=False):
    """Per question: n-best spans over all its windows (BERT/ALBERT v1 `write_predictions`).

    Returns (best non-null answer, n-best list, null odds). Null odds (v2.0) = the smallest null score
    ([CLS] start + [CLS] end) over the windows minus the best span's score: positive means "no answer" looks better.
    """
    contexts, question_ids = examples["context"], examples["id"]
    # read window by window: the whole offset column of a large eval set is millions of Python objects
    windows = features.select_columns(["offset_mapping", "token_is_max_context"])
    best, nbest, null_odds, no_span = {}, {}, {}, 0
    for row, feature_indices in enumerate(_features_per_example(examples, features)):
        question_id = question_ids[row]
        candidates, null_score = [], None
        for f in feature_indices:
            starts, ends = start_logits[f], end_logits[f]
            offsets, max_context = windows[f]["offset_mapping"], windows[f]["token_is_max_context"]
            feature_null = float(starts[0] + ends[0])
            if null_score is None or feature_null < null_score[0]:
                null_score = (feature_null, float(starts[0]), float(ends[0]))
            top_starts = np.argsort(starts)[::-1][:n_best_size]
            top_ends = np.argsort(ends)[::-1][:n_best_size]
            for s in top_starts:
                for e in top_ends:
                    if not _valid_span(offsets, max_context, s, e, max_answer_length):
                        continue
                    span = (offsets[s][0], offsets[e][1])
                    candidates.append({"span": span, "text": contexts[row][span[0]:span[1]],
                                       "start_logit": float(starts[s]), "end_logit": float(ends[e]),
                                       "score": float(starts[s] + ends[e])})
        entries = _nbest(candidates, n_best_size)
        best_entry = entries[0] if entries else None
        if version_2:
            entries.append({"text": "", "start_logit": null_score[1], "end_logit": null_score[2],
                            "score": null_score[0]})
            entries = sorted(entries, key=lambda c: c["score"], reverse=True)[:n_best_size]
            if not any(entry["text"] == "" for entry in entries):  # keep the null in the n-best it competes with
                entries[-1] = {"text": "", "start_logit": null_score[1], "end_logit": null_score[2],
                               "score": null_score[0]}
            null_odds[question_id] = null_score[0] - best_entry["score"] if best_entry else float("inf")
        for entry, probability in zip(entries, _softmax([entry["score"] for entry in entries])):
            entry["probability"] = probability
            entry.pop("score")
        best[question_id] = best_entry["text"] if best_entry else ""
        nbest[question_id] = entries
        no_span += best_entry is None
    if no_span:
        logger.info("%d of %d questions have no valid span in their n-best: their answer is \"\"", no_span, len(best))
    return best, nbest, null_odds


def postprocess_beam_predictions(examples, features, start_top_log_probs, start_top_index, end_top_log_probs,
                                 end_top_index, cls_logits, start_n_top=5, end_n_top=5, n_best_size=20,
                                 max_answer_length=30):
    """Per question, from the answerability head's beam (official ALBERT v2 `write_predictions_v2`).

    Candidates: start_n_top starts x end_n_top ends per window, scored by start + end log-probability; the
    null odds are the smallest answerability logit over the question's windows (if any window looks answerable,
    the question does). Returns (best non-null answer, n-best list, null odds).
    """
    contexts, question_ids = examples["context"], examples["id"]
    # read window by window: the whole offset column of a large eval set is millions of Python objects
    windows = features.select_columns(["offset_mapping", "token_is_max_context"])
    best, nbest, null_odds = {}, {}, {}
    for row, feature_indices in enumerate(_features_per_example(examples, features)):
        question_id = question_ids[row]
        candidates = []
        null_odds[question_id] = min(float(cls_logits[f]) for f in feature_indices)
        for f in feature_indices:
            offsets, max_context = windows[f]["offset_mapping"], windows[f]["token_is_max_context"]
            for i in range(start_n_top):
                s = int(start_top_index[f][i])
                for j in range(end_n_top):
                    e = int(end_top_index[f][i * end_n_top + j])
                    if not _valid_span(offsets, max_context, s, e, max_answer_length):
                        continue
                    span = (offsets[s][0], offsets[e][1])
                    start_lp, end_lp = float(start_top_log_probs[f][i]), float(end_top_log_probs[f][i * end_n_top + j])
                    candidates.append({"span": span, "text": contexts[row][span[0]:span[1]],
                                       "start_log_prob": start_lp, "end_log_prob": end_lp, "score": start_lp + end_lp})
        entries = _nbest(candidates, n_best_size)
        for entry, probability in zip(entries, _softmax([entry["score"] for entry in entries])):
            entry["probability"] = probability
            entry.pop("score")
        best[question_id] = entries[0]["text"] if entries else ""
        nbest[question_id] = entries
    return best, nbest, null_odds


def apply_null_threshold(best_answers: dict, null_odds: dict, threshold: float) -> dict:
    """v2.0 decision: "" where the null odds reach the threshold, the best span below it.

    `>=` as the official `write_predictions_v2` (the span only when `score_diff < threshold`): with a tuned
    threshold, the question whose odds are the threshold itself gets "".
    """
    return {q: "" if null_odds[q] >= threshold else answer for q, answer in best_answers.items()}


def golds_of(examples: Dataset) -> dict:
    return {question_id: list(answers["text"]) for question_id, answers in zip(examples["id"], examples["answers"])}


def squad_metrics(golds, best_answers, null_odds, version_2, threshold, tune_threshold=False):
    """(predictions, metrics).

    v1.1: the official v1.1 EM/F1 of the best answers. v2.0, as the official `evaluate_v2` (squad_utils.py):
    - best_exact/best_f1 and their thresholds are the official sweep over the null odds applied to the best
      non-null answers, so `best_f1_thresh` is directly a value for --null_score_diff_threshold;
      `tune_threshold` uses that value for the predictions (tuned on this set: the official first pass);
    - the predictions are the null decision (`apply_null_threshold`) at the threshold;
    - exact/f1/HasAns/NoAns are the official evaluation of those predictions with the null odds as no-answer
      probabilities, so a question whose odds are above `na_prob_thresh` (the official 1.0) is scored as a
      no-answer prediction even when it kept its span (only possible at thresholds above 1.0).
    """
    if not version_2:
        return best_answers, squad_v1_metrics(golds, best_answers)
    sweep = squad_v2_metrics(golds, best_answers, na_probs=null_odds)
    if tune_threshold:
        threshold = sweep["best_f1_thresh"]
    predictions = apply_null_threshold(best_answers, null_odds, threshold)
    metrics = squad_v2_metrics(golds, predictions, na_probs=null_odds, na_prob_thresh=OFFICIAL_NA_PROB_THRESH)
    metrics.update({key: sweep[key] for key in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")})
    metrics["null_threshold"] = threshold
    return predictions, metrics


def write_outputs(output_dir, prefix: str, predictions: dict, nbest: dict, null_odds: dict | None) -> None:
    """predictions.json, nbest_predictions.json and (v2.0) null_odds.json, named as transformers' utils_qa does."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    files = {"predictions.json": predictions, "nbest_predictions.json": nbest}
    if null_odds is not None:
        files["null_odds.json"] = null_odds
    for name, content in files.items():
        path = output_dir / (f"{prefix}_{name}" if prefix else name)
        path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        logger.info("Wrote %s", path)


def prepare_questions(examples: Dataset, tokenizer, data_args: SquadDataArguments, where: str):
    """(questions, their windows) of an evaluation or test set: `select_evaluable`, then `features_dataset`."""
    examples = select_evaluable(examples, data_args.version_2_with_negative, where, has_gold_answers(examples))
    return examples, features_dataset(examples, tokenizer, data_args, training=False)


def model_inputs(features: Dataset) -> Dataset:
    """The windows without the columns only post-processing reads."""
    return features.remove_columns([c for c in POSTPROCESSING_COLUMNS if c in features.column_names])


def postprocess(examples: Dataset, features: Dataset, outputs, data_args: SquadDataArguments):
    """(best non-null answer, n-best, null odds) per question from the model outputs on its windows, for either head."""
    if data_args.answerability_head:
        return postprocess_beam_predictions(
            examples, features, *outputs[:5], start_n_top=data_args.start_n_top, end_n_top=data_args.end_n_top,
            n_best_size=data_args.n_best_size, max_answer_length=data_args.max_answer_length)
    start_logits, end_logits = outputs[:2]
    return postprocess_span_predictions(
        examples, features, start_logits, end_logits, n_best_size=data_args.n_best_size,
        max_answer_length=data_args.max_answer_length, version_2=data_args.version_2_with_negative)


@dataclass
class SquadPredictions:
    """A SquadTrainer run over a set of questions."""

    predictions: dict  # question id -> answer ("" = no answer, v2.0)
    nbest: dict  # question id -> n-best entries
    null_odds: dict | None  # v2.0: question id -> null odds
    metrics: dict  # "<prefix>_" keys: runtime, windows, and the SQuAD metrics when the questions have answers


class SquadTrainer(AlbertTrainer):
    """AlbertTrainer whose `evaluate` gives the SQuAD metrics (transformers' QuestionAnsweringTrainer, on our
    post-processing): the model runs on the evaluation windows, its outputs are post-processed against the
    evaluation questions (n-best spans; v2.0: the null decision, --null_score_diff_threshold or with
    --tune_null_threshold the threshold tuned on the set) and scored with the official EM/F1, keys prefixed
    "eval_" and logged. Evaluations during training (--eval_strategy) and --metric_for_best_model (e.g. f1) see
    these metrics; `evaluate_questions` and `predict_questions` are the same run for the final evaluation and for
    --do_predict, returning the predictions for the output files too.
    """

    def __init__(self, *args, data_args: SquadDataArguments, eval_examples: Dataset | None = None,
                 eval_features: Dataset | None = None, **kwargs):
        if (eval_examples is None) != (eval_features is None):
            raise ValueError("SquadTrainer: give eval_examples and eval_features together")
        kwargs["eval_dataset"] = None if eval_features is None else model_inputs(eval_features)
        super().__init__(*args, **kwargs)
        self.data_args = data_args
        self.eval_examples, self.eval_features = eval_examples, eval_features

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", eval_examples=None) -> dict:
        """SQuAD metrics on `eval_dataset` (windows from `features_dataset`, post-processing columns included) and
        its questions `eval_examples`; by default the trainer's own evaluation set."""
        if eval_dataset is None and eval_examples is None:
            eval_dataset, eval_examples = self.eval_features, self.eval_examples
        if eval_dataset is None or eval_examples is None:
            raise ValueError("SquadTrainer.evaluate needs the evaluation windows and their questions (run_squad.py: "
                             "--validation_file or a --dataset_name with a validation split)")
        return self.evaluate_questions(eval_examples, eval_dataset, ignore_keys, metric_key_prefix).metrics

    def evaluate_questions(self, examples: Dataset, features: Dataset, ignore_keys=None,
                           metric_key_prefix: str = "eval") -> SquadPredictions:
        """`evaluate`, returning the predictions as well: logged, and the callbacks' on_evaluate called."""
        result = self._run_questions(examples, features, ignore_keys, metric_key_prefix, "Evaluation")
        self.log(result.metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, result.metrics)
        return result

    def predict_questions(self, examples: Dataset, features: Dataset, ignore_keys=None,
                          metric_key_prefix: str = "predict", null_threshold: float | None = None) -> SquadPredictions:
        """The same run for --do_predict (callbacks' on_predict). `null_threshold` replaces the v2.0 threshold
        (and its tuning), e.g. with the one tuned on the dev set."""
        result = self._run_questions(examples, features, ignore_keys, metric_key_prefix, "Prediction", null_threshold)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, result.metrics)
        return result

    def _run_questions(self, examples, features, ignore_keys, prefix, description, null_threshold=None):
        data_args, version_2 = self.data_args, self.data_args.version_2_with_negative
        start_time = time.time()
        # The trainer's own evaluation set through Trainer's (possibly cached) eval loader; any other set through a
        # loader of its own (get_eval_dataloader(dataset) returns the cached eval loader with persistent workers).
        if features is self.eval_features:
            dataloader = self.get_eval_dataloader()
        else:
            dataloader = self.get_test_dataloader(model_inputs(features))
        output = self.evaluation_loop(dataloader, description=description, prediction_loss_only=False,
                                      ignore_keys=ignore_keys, metric_key_prefix=prefix)
        metrics = dict(output.metrics)
        if f"{prefix}_model_preparation_time" in metrics:
            start_time += metrics[f"{prefix}_model_preparation_time"]
        batch_size = self.args.eval_batch_size * self.args.world_size
        metrics.update(speed_metrics(prefix, start_time, num_samples=len(features),
                                     num_steps=math.ceil(len(features) / batch_size)))
        best, nbest, null_odds = postprocess(examples, features, output.predictions, data_args)
        threshold = data_args.null_score_diff_threshold if null_threshold is None else null_threshold
        if has_gold_answers(examples):
            tune = data_args.tune_null_threshold and null_threshold is None
            predictions, scores = squad_metrics(golds_of(examples), best, null_odds, version_2, threshold, tune)
            metrics.update({f"{prefix}_{key}": value for key, value in scores.items()})
        else:
            predictions = apply_null_threshold(best, null_odds, threshold) if version_2 else best
            if version_2:
                metrics[f"{prefix}_null_threshold"] = threshold
        metrics[f"{prefix}_features"] = len(features)
        return SquadPredictions(predictions, nbest, null_odds if version_2 else None, metrics)
