"""SQuAD post-processing (transformers' utils_qa.py): the model's outputs on the windows of each question become its
n-best answers and, for v2.0, its null odds against the threshold, then the official EM/F1 (metrics/squad.py) and
the prediction files."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from datasets import Dataset

from ...metrics.squad import OFFICIAL_NA_PROB_THRESH, squad_v1_metrics, squad_v2_metrics

if TYPE_CHECKING:
    from .data import SquadDataArguments

logger = logging.getLogger(__name__)

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
    return (
        start < len(offsets)
        and end < len(offsets)
        and offsets[start] is not None
        and offsets[end] is not None
        and start <= end
        and end - start + 1 <= max_answer_length
        and max_context[start]
    )


def _nbest(candidates: list[dict], n_best_size: int) -> list[dict]:
    """Best first, one entry per answer character span (overlapping windows find the same span twice)."""
    unique = {}
    for candidate in sorted(candidates, key=lambda c: c["score"], reverse=True):
        unique.setdefault(candidate.pop("span"), candidate)
    return list(unique.values())[:n_best_size]


def postprocess_span_predictions(
    examples, features, start_logits, end_logits, n_best_size=20, max_answer_length=30, version_2=False
):
    """Per question: the n-best spans over all its windows, from the span head's logits (BERT/ALBERT v1
    `write_predictions`).

    A span starts at a token of its window's context where that window gives the token its most context
    (`token_is_max_context`), ends at or after its start within the context, and covers at most `max_answer_length`
    pieces; a character span found in several windows counts once, with its best score (start + end logit). The null
    odds (v2.0) are the smallest null score ([CLS] start + [CLS] end logit) over the question's windows minus the
    best span's score: positive means "no answer" looks better.

    Args:
        examples (`datasets.Dataset`): the questions, with their `id` and `context` columns.
        features (`datasets.Dataset`): their windows from `features_dataset(..., training=False)`, with `example_id`,
            `offset_mapping` and `token_is_max_context`.
        start_logits (`np.ndarray` of shape `(num_windows, max_seq_length)`): the start logits, one row per window of
            `features`, in its order.
        end_logits (`np.ndarray` of shape `(num_windows, max_seq_length)`): the end logits, likewise.
        n_best_size (`int`, defaults to 20): the starts and the ends tried per window, and the entries kept per
            question.
        max_answer_length (`int`, defaults to 30): the longest answer, in pieces.
        version_2 (`bool`, defaults to `False`): SQuAD v2.0: a null entry in each n-best list, and the null odds.

    Returns:
        `tuple(dict, dict, dict)`, each keyed by question id:
        - the best non-null answer text ("" when no window has a valid span);
        - the n-best list, best first: `{"text", "start_logit", "end_logit", "probability"}` entries, the
          probabilities a softmax over the entries kept; for v2.0 the null entry (`"text": ""`, the null score's
          logits) is among them, replacing the last entry when it would not rank;
        - the null odds (v2.0; `inf` for a question without a valid span), empty for v1.1.
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
                    candidates.append(
                        {
                            "span": span,
                            "text": contexts[row][span[0] : span[1]],
                            "start_logit": float(starts[s]),
                            "end_logit": float(ends[e]),
                            "score": float(starts[s] + ends[e]),
                        }
                    )
        entries = _nbest(candidates, n_best_size)
        best_entry = entries[0] if entries else None
        if version_2:
            entries.append(
                {"text": "", "start_logit": null_score[1], "end_logit": null_score[2], "score": null_score[0]}
            )
            entries = sorted(entries, key=lambda c: c["score"], reverse=True)[:n_best_size]
            if not any(entry["text"] == "" for entry in entries):  # keep the null in the n-best it competes with
                entries[-1] = {
                    "text": "",
                    "start_logit": null_score[1],
                    "end_logit": null_score[2],
                    "score": null_score[0],
                }
            null_odds[question_id] = null_score[0] - best_entry["score"] if best_entry else float("inf")
        for entry, probability in zip(entries, _softmax([entry["score"] for entry in entries])):
            entry["probability"] = probability
            entry.pop("score")
        best[question_id] = best_entry["text"] if best_entry else ""
        nbest[question_id] = entries
        no_span += best_entry is None
    if no_span:
        logger.info('%d of %d questions have no valid span in their n-best: their answer is ""', no_span, len(best))
    return best, nbest, null_odds


def postprocess_beam_predictions(
    examples,
    features,
    start_top_log_probs,
    start_top_index,
    end_top_log_probs,
    end_top_index,
    cls_logits,
    start_n_top=5,
    end_n_top=5,
    n_best_size=20,
    max_answer_length=30,
):
    """Per question: the n-best spans from the answerability head's beam (official ALBERT v2 `write_predictions_v2`).

    Candidates: `start_n_top` starts x `end_n_top` ends per window, scored by start + end log-probability, kept under
    the same rules as `postprocess_span_predictions` (a start where its window gives the token its most context, at
    most `max_answer_length` pieces, one entry per character span). The null odds are the smallest answerability
    logit over the question's windows (higher means "no answer"; if any window looks answerable, the question does).

    Args:
        examples (`datasets.Dataset`): the questions, with their `id` and `context` columns.
        features (`datasets.Dataset`): their windows from `features_dataset(..., training=False)`, with `example_id`,
            `offset_mapping` and `token_is_max_context`.
        start_top_log_probs (`np.ndarray` of shape `(num_windows, start_n_top)`): the beam's start log-probabilities.
        start_top_index (`np.ndarray` of shape `(num_windows, start_n_top)`): the beam's start positions.
        end_top_log_probs (`np.ndarray` of shape `(num_windows, start_n_top * end_n_top)`): the end log-probabilities,
            index `i * end_n_top + j` the j-th end of the i-th start.
        end_top_index (`np.ndarray` of shape `(num_windows, start_n_top * end_n_top)`): the end positions, likewise.
        cls_logits (`np.ndarray` of shape `(num_windows,)`): the answerability logits.
        start_n_top (`int`, defaults to 5): the starts read per window; at most the model's `start_n_top`.
        end_n_top (`int`, defaults to 5): the ends read per start; the model's `end_n_top`.
        n_best_size (`int`, defaults to 20): the entries kept per question.
        max_answer_length (`int`, defaults to 30): the longest answer, in pieces.

    Returns:
        `tuple(dict, dict, dict)`, each keyed by question id:
        - the best non-null answer text ("" when no candidate is valid);
        - the n-best list, best first: `{"text", "start_log_prob", "end_log_prob", "probability"}` entries, the
          probabilities a softmax over the entries kept (no null entry);
        - the null odds of every question.
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
                    candidates.append(
                        {
                            "span": span,
                            "text": contexts[row][span[0] : span[1]],
                            "start_log_prob": start_lp,
                            "end_log_prob": end_lp,
                            "score": start_lp + end_lp,
                        }
                    )
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
    """The predictions of a set of questions and their official SQuAD metrics.

    v1.1: the official v1.1 EM/F1 of the best answers. v2.0, as the official `evaluate_v2` (squad_utils.py):
    - best_exact/best_f1 and their thresholds are the official sweep over the null odds applied to the best
      non-null answers, so `best_f1_thresh` is directly a value for --null_score_diff_threshold;
      `tune_threshold` uses that value for the predictions (tuned on this set: the official first pass);
    - the predictions are the null decision (`apply_null_threshold`) at the threshold;
    - exact/f1/HasAns/NoAns are the official evaluation of those predictions with the null odds as no-answer
      probabilities, so a question whose odds are above `na_prob_thresh` (the official 1.0) is scored as a
      no-answer prediction even when it kept its span (only possible at thresholds above 1.0).

    Args:
        golds (`dict`): question id -> its gold answer texts (`golds_of`); an empty list: an unanswerable question.
        best_answers (`dict`): question id -> its best non-null answer text, from the post-processing.
        null_odds (`dict`): question id -> its null odds (v2.0); not read for v1.1.
        version_2 (`bool`): score as SQuAD v2.0 rather than v1.1.
        threshold (`float`): v2.0: "" is predicted where the null odds reach it (`>=`); not read for v1.1 or with
            `tune_threshold`.
        tune_threshold (`bool`, defaults to `False`): v2.0: use the `best_f1_thresh` of this set instead of
            `threshold`.

    Returns:
        `tuple(dict, dict)`: the predictions (question id -> answer text, "" for no answer; for v1.1 `best_answers`
        itself) and the metrics: v1.1 `exact_match` and `f1` in percent; v2.0 `exact`, `f1` (percent) and `total`,
        the same three per `HasAns_` / `NoAns_` kind present, `best_exact`, `best_exact_thresh`, `best_f1`,
        `best_f1_thresh`, and `null_threshold`, the threshold the predictions used.

    Raises:
        InputError: there are no gold questions; for v1.1, a question has no gold answer (v2.0 data); for v2.0, a
            question has no best answer or no null odds.
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


def postprocess(examples: Dataset, features: Dataset, outputs, data_args: SquadDataArguments):
    """(best non-null answer, n-best, null odds) per question from the model outputs on its windows, for either head."""
    if data_args.answerability_head:
        return postprocess_beam_predictions(
            examples,
            features,
            *outputs[:5],
            start_n_top=data_args.start_n_top,
            end_n_top=data_args.end_n_top,
            n_best_size=data_args.n_best_size,
            max_answer_length=data_args.max_answer_length,
        )
    start_logits, end_logits = outputs[:2]
    return postprocess_span_predictions(
        examples,
        features,
        start_logits,
        end_logits,
        n_best_size=data_args.n_best_size,
        max_answer_length=data_args.max_answer_length,
        version_2=data_args.version_2_with_negative,
    )
