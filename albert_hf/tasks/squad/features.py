"""SQuAD features (transformers' run_qa.py preprocessing): the questions of data.py cut into
`[CLS] question [SEP] context-window [SEP]` windows with their answer positions (training) or the columns
post-processing reads (evaluation); see evaluation.py beside it."""

from __future__ import annotations

import collections
import logging
from dataclasses import replace

from datasets import Dataset

from ...errors import InputError
from ..inputs import fit_max_seq_length
from .data import POSTPROCESSING_COLUMNS, SquadDataArguments, has_gold_answers, select_evaluable, select_trainable

logger = logging.getLogger(__name__)


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
    return [
        [best[position][1] == span_index for position in range(start, start + length)]
        for span_index, (start, length) in enumerate(spans)
    ]


def _answer_token_span(offsets, start_char: int, end_char: int) -> tuple[int, int]:
    """First piece ending after the answer's first character, last piece starting before its end."""
    start = next((i for i, (_, piece_end) in enumerate(offsets) if piece_end > start_char), None)
    end = max((i for i, (piece_start, _) in enumerate(offsets) if piece_start < end_char), default=None)
    return None if start is None or end is None or end < start else (start, end)


def build_features(examples: dict, tokenizer, data_args: SquadDataArguments, training: bool) -> dict:
    """Batched `Dataset.map` function: one feature per context window of each question.

    The question (leading whitespace stripped) keeps its first `max_query_length` pieces; each context window starts
    `doc_stride` pieces after the one before, or a window after it when that is less (`window_starts`). All features
    have `input_ids`, `token_type_ids` (1 on the context and its [SEP]), `attention_mask` and `p_mask` (1 on
    question, [SEP] and padding; 0 on [CLS] and context), padded to max_seq_length. Training adds `start_positions`,
    `end_positions` (window positions of the first answer, or 0, [CLS], when the window does not hold all of it or
    there is none) and `is_impossible` (1.0 for those, else 0.0); evaluation adds `example_id`, `offset_mapping`
    (`[start, end]` character span in the context, None outside it) and `token_is_max_context`.

    Args:
        examples (`dict`): a batch of questions, columns -> lists: `id`, `question`, `context` and, for training,
            `answers`.
        tokenizer (`PreTrainedTokenizerFast`): the model's tokenizer; a fast one, for the offsets.
        data_args (`SquadDataArguments`): `max_seq_length`, `max_query_length` and `doc_stride`.
        training (`bool`): build training features (answer positions) rather than evaluation features.

    Returns:
        `dict`: column -> one value per window of the batch's questions (one or more windows each).

    Raises:
        InputError: (training) an answer covers no piece of its context; `select_trainable` drops such questions first.
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
            ids = [cls, *question, sep, *context_ids[start : start + span_length], sep]
            used = len(ids)
            out["input_ids"].append(ids + [pad] * (length - used))
            out["token_type_ids"].append(
                [0] * first_context_position + [1] * (used - first_context_position) + [0] * (length - used)
            )
            out["attention_mask"].append([1] * used + [0] * (length - used))
            out["p_mask"].append(
                [0] + [1] * (first_context_position - 1) + [0] * span_length + [1] * (length - used + 1)
            )
            if training:
                inside = (
                    answer_tokens is not None and start <= answer_tokens[0] and answer_tokens[1] < start + span_length
                )
                shift = first_context_position - start
                out["start_positions"].append(answer_tokens[0] + shift if inside else 0)
                out["end_positions"].append(answer_tokens[1] + shift if inside else 0)
                out["is_impossible"].append(0.0 if inside else 1.0)
            else:
                out["example_id"].append(examples["id"][i])
                offsets = [None] * length
                offsets[first_context_position : first_context_position + span_length] = [
                    list(o) for o in context_offsets[start : start + span_length]
                ]
                out["offset_mapping"].append(offsets)
                after = length - first_context_position - span_length
                out["token_is_max_context"].append([False] * first_context_position + flags + [False] * after)
    return dict(out)


def features_dataset(examples: Dataset, tokenizer, data_args: SquadDataArguments, training: bool) -> Dataset:
    """The windows of a set of questions: `build_features` mapped over them in batches.

    Args:
        examples (`datasets.Dataset`): the questions (for training, those `select_trainable` kept).
        tokenizer (`PreTrainedTokenizerFast`): the model's tokenizer; a fast one, for the offsets.
        data_args (`SquadDataArguments`): the window lengths, and `preprocessing_num_workers`, the processes mapping.
        training (`bool`): training features (answer positions) rather than evaluation features.

    Returns:
        `datasets.Dataset`: one row per window, with the columns of `build_features` only.
    """
    return examples.map(
        build_features,
        batched=True,
        remove_columns=examples.column_names,
        num_proc=data_args.preprocessing_num_workers,
        fn_kwargs=dict(tokenizer=tokenizer, data_args=data_args, training=training),
        desc=f"SQuAD {'training' if training else 'evaluation'} features",
    )


def prepare_questions(examples: Dataset, tokenizer, data_args: SquadDataArguments, where: str):
    """The questions of an evaluation or test set and their windows: `select_evaluable`, then `features_dataset`.

    Args:
        examples (`datasets.Dataset`): the questions; a set with no answer at all (a test set) is read as unlabelled.
        tokenizer (`PreTrainedTokenizerFast`): the model's tokenizer; a fast one, for the offsets.
        data_args (`SquadDataArguments`): the window lengths, and `version_2_with_negative`.
        where (`str`): the file or split, named in warnings and errors.

    Returns:
        `tuple(datasets.Dataset, datasets.Dataset)`: the questions kept (those with a non-empty context) and their
        evaluation windows (`build_features` with `training=False`).

    Raises:
        InputError: in v1.1 mode, a labelled set has a question without an answer (v2.0 data).
    """
    examples = select_evaluable(examples, data_args.version_2_with_negative, where, has_gold_answers(examples))
    return examples, features_dataset(examples, tokenizer, data_args, training=False)


def model_inputs(features: Dataset) -> Dataset:
    """The windows without the columns only post-processing reads."""
    return features.remove_columns([c for c in POSTPROCESSING_COLUMNS if c in features.column_names])


def fit_lengths(data_args: SquadDataArguments, config) -> SquadDataArguments:
    """The window lengths made to compose: --max_seq_length capped at the model's positions
    (`inputs.fit_max_seq_length`), then a --max_query_length that would leave the context no room in a window
    (the default 64 with --max_seq_length 64) cut to half the window's room, with a warning. Windows advance by
    min(doc_stride, window), as the official loop, so --doc_stride composes with any window.

    Args:
        data_args: the parsed SQuAD data arguments; left as they are.
        config: the model's config.

    Returns:
        The data arguments the run uses: `data_args` itself when both lengths fit, else a checked copy.
    """
    data_args = fit_max_seq_length(data_args, config)
    room = data_args.max_seq_length - 3  # [CLS] question [SEP] context [SEP]
    if data_args.max_query_length < room:
        return data_args
    capped = room // 2
    logger.warning(
        "--max_query_length %d would leave no context in a --max_seq_length %d window: questions keep "
        "their first %d pieces",
        data_args.max_query_length,
        data_args.max_seq_length,
        capped,
    )
    return replace(data_args, max_query_length=capped)


def training_features(splits: dict, tokenizer, data_args: SquadDataArguments, training_args) -> tuple:
    """(the trainable training questions, their windows), or ((), None) without a training split."""
    if "train" not in splits:
        return (), None
    examples = select_trainable(splits["train"], data_args.version_2_with_negative, data_args.train_file or "train")
    with training_args.main_process_first(desc="training features"):
        dataset = features_dataset(examples, tokenizer, data_args, training=True)
    logger.info("%d training questions -> %d windows", len(examples), len(dataset))
    return examples, dataset
