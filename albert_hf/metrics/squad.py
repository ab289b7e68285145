"""The official SQuAD evaluation, as plain functions (no `evaluate` download needed, works offline).

Reproduces the two official scripts:
- `evaluate-v1.1.py`: EM and F1 on normalised answers, max over the gold answers, a question without a
  prediction scores 0 and still counts in the total.
- `evaluate-v2.0.py`: the same normalisation; an empty prediction is the no-answer; F1 is 1 when prediction and
  gold are both empty; an answer that normalises to "" is not a gold answer; HasAns_/NoAns_ breakdown; with
  no-answer probabilities, `na_prob_thresh` (official default 1.0) and best_exact/best_f1 with their thresholds.

Golds are `{question_id: [answer texts]}` (an empty list = unanswerable), predictions `{question_id: text}`.
`python -m albert_hf.metrics.squad data.json predictions.json [--na-prob-file null_odds.json]` runs the
evaluation on official files, like the official scripts.
"""

import argparse
import collections
import json
import re
import string
import sys

from ..errors import InputError

PUNCTUATION = set(string.punctuation)
# evaluate-v2.0.py's default --na-prob-thresh, which the official ALBERT evaluate_v2 uses too
OFFICIAL_NA_PROB_THRESH = 1.0
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower case, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace (in that order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in PUNCTUATION)
    text = ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match_v1(prediction: str, gold: str) -> bool:
    return normalize_answer(prediction) == normalize_answer(gold)


def _token_f1(prediction_tokens: list, gold_tokens: list) -> float:
    """F1 of the shared bag of tokens; 0 when nothing is shared."""
    num_same = sum((collections.Counter(prediction_tokens) & collections.Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_v1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1; v1.1 gives 0 when nothing is shared, even when both sides are empty."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(gold).split())


def exact_match_v2(prediction: str, gold: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def f1_v2(prediction: str, gold: str) -> float:
    """As v1.1, except that an empty side (the no-answer) scores 1 when both are empty, else 0."""
    prediction_tokens = normalize_answer(prediction).split() if prediction else []
    gold_tokens = normalize_answer(gold).split() if gold else []
    if not prediction_tokens or not gold_tokens:
        return float(prediction_tokens == gold_tokens)
    return _token_f1(prediction_tokens, gold_tokens)


def squad_v1_metrics(golds: dict, predictions: dict) -> dict:
    """{"exact_match", "f1"} in percent over all questions of `golds`, as evaluate-v1.1.py computes them."""
    if not golds:
        raise InputError("No gold questions to evaluate")
    exact_match = f1 = 0.0
    for question_id, gold_answers in golds.items():
        if not gold_answers:
            raise InputError(
                f"Question {question_id!r} has no gold answer: SQuAD v1.1 needs one for every "
                "question (unanswerable questions are SQuAD v2.0: use the v2 metric)"
            )
        if question_id not in predictions:
            continue  # the official script scores it 0 and keeps it in the total
        prediction = predictions[question_id]
        exact_match += max(exact_match_v1(prediction, gold) for gold in gold_answers)
        f1 += max(f1_v1(prediction, gold) for gold in gold_answers)
    return {"exact_match": 100.0 * exact_match / len(golds), "f1": 100.0 * f1 / len(golds)}


def raw_scores_v2(golds: dict, predictions: dict) -> tuple[dict, dict]:
    """Per-question EM and F1 (max over golds); golds normalising to "" are dropped, none left means ["" ]."""
    exact, f1 = {}, {}
    for question_id, gold_answers in golds.items():
        gold_answers = [gold for gold in gold_answers if normalize_answer(gold)] or [""]
        prediction = predictions[question_id]
        exact[question_id] = max(exact_match_v2(prediction, gold) for gold in gold_answers)
        f1[question_id] = max(f1_v2(prediction, gold) for gold in gold_answers)
    return exact, f1


def apply_no_answer_threshold(scores: dict, na_probs: dict, has_answer: dict, na_prob_thresh: float) -> dict:
    """A question whose no-answer probability is above the threshold is scored as if "" had been predicted."""
    return {
        question_id: float(not has_answer[question_id]) if na_probs[question_id] > na_prob_thresh else score
        for question_id, score in scores.items()
    }


def _summary(exact: dict, f1: dict, question_ids) -> dict:
    total = len(question_ids)
    return {
        "exact": 100.0 * sum(exact[q] for q in question_ids) / total,
        "f1": 100.0 * sum(f1[q] for q in question_ids) / total,
        "total": total,
    }


def find_best_threshold(predictions: dict, scores: dict, na_probs: dict, has_answer: dict) -> tuple[float, float]:
    """(best score in percent, threshold): the official sweep over no-answer probabilities.

    Start from "every question is answered with no-answer"; walk the questions by increasing no-answer
    probability, letting each one keep its prediction; the best running total and the probability where it is
    reached are returned. Predicting "" above the threshold (and the prediction at or below it) gives that score;
    the official second pass predicts "" from the threshold on (`>=`), so the question at the threshold itself
    gets "" there.
    """
    running = best = sum(1 for has in has_answer.values() if not has)
    best_threshold = 0.0
    for question_id in sorted(na_probs, key=lambda q: na_probs[q]):
        if question_id not in scores:
            continue
        if has_answer[question_id]:
            running += scores[question_id]
        elif predictions[question_id]:
            running -= 1  # an unanswerable question loses its point once an answer is predicted for it
        if running > best:
            best, best_threshold = running, na_probs[question_id]
    return 100.0 * best / len(scores), best_threshold


def squad_v2_metrics(
    golds: dict, predictions: dict, na_probs: dict | None = None, na_prob_thresh: float = OFFICIAL_NA_PROB_THRESH
) -> dict:
    """The dict evaluate-v2.0.py prints: exact, f1, total, HasAns_*, NoAns_*; with `na_probs` also
    best_exact, best_exact_thresh, best_f1, best_f1_thresh.

    As in the official script, `na_probs` (when given) also re-scores the questions whose no-answer
    probability is above `na_prob_thresh` as no-answer predictions.
    """
    if not golds:
        raise InputError("No gold questions to evaluate")
    missing = [q for q in golds if q not in predictions]
    if missing:  # the official script fails on these with a KeyError; say which
        raise InputError(f"{len(missing)} question(s) have no prediction, e.g. {missing[:3]}")
    if na_probs is not None and golds.keys() - na_probs.keys():
        raise InputError(
            f"{len(golds.keys() - na_probs.keys())} question(s) have no no-answer probability, "
            f"e.g. {sorted(golds.keys() - na_probs.keys())[:3]}"
        )
    has_answer = {q: bool(answers) for q, answers in golds.items()}
    exact_raw, f1_raw = raw_scores_v2(golds, predictions)
    used_na_probs = na_probs if na_probs is not None else {q: 0.0 for q in predictions}
    exact = apply_no_answer_threshold(exact_raw, used_na_probs, has_answer, na_prob_thresh)
    f1 = apply_no_answer_threshold(f1_raw, used_na_probs, has_answer, na_prob_thresh)
    result = _summary(exact, f1, list(golds))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        question_ids = [q for q, has in has_answer.items() if has == wanted]
        if question_ids:
            result.update({f"{prefix}_{key}": value for key, value in _summary(exact, f1, question_ids).items()})
    if na_probs is not None:
        result["best_exact"], result["best_exact_thresh"] = find_best_threshold(
            predictions, exact_raw, na_probs, has_answer
        )
        result["best_f1"], result["best_f1_thresh"] = find_best_threshold(predictions, f1_raw, na_probs, has_answer)
    return result


def golds_from_official_json(data: dict) -> dict:
    """{question_id: [answer texts]} from the official nested SQuAD JSON (v1.1 or v2.0)."""
    return {
        qa["id"]: [answer["text"] for answer in qa["answers"]]
        for article in data["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description="Official SQuAD v1.1 / v2.0 evaluation")
    parser.add_argument("data_file")
    parser.add_argument("pred_file")
    parser.add_argument("--na-prob-file", help="v2.0: JSON {id: no-answer probability}, e.g. null_odds.json")
    parser.add_argument("--na-prob-thresh", type=float, default=OFFICIAL_NA_PROB_THRESH)
    parser.add_argument("--version", choices=["1.1", "2.0"], help="default: the data file's 'version' field")
    args = parser.parse_args(argv)
    with open(args.data_file, encoding="utf-8") as f:
        data = json.load(f)
    with open(args.pred_file, encoding="utf-8") as f:
        predictions = json.load(f)
    golds = golds_from_official_json(data)
    version = args.version or ("2.0" if str(data.get("version", "")).startswith("v2") else "1.1")
    if version == "1.1":
        for question_id in golds.keys() - predictions.keys():
            print(f"Unanswered question {question_id} will receive score 0.", file=sys.stderr)
        result = squad_v1_metrics(golds, predictions)
    else:
        na_probs = None
        if args.na_prob_file:
            with open(args.na_prob_file, encoding="utf-8") as f:
                na_probs = json.load(f)
        result = squad_v2_metrics(golds, predictions, na_probs, args.na_prob_thresh)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
