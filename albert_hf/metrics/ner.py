"""NER scores: seqeval's entity precision, recall and F1 in its default mode (conlleval's counting, what
transformers' run_ner.py reports), and the word accuracy."""

import warnings


def with_prefix(tag: str) -> str:
    """The tag as seqeval reads it, which takes the first letter for the prefix: `I-X` for a tag `X` without one."""
    if tag == "O" or (tag[:2] in ("B-", "I-", "E-", "S-") and len(tag) > 2):
        return tag
    return f"I-{tag}"


def entity_scores(gold: list[list[str]], predicted: list[list[str]], per_type: bool = False) -> dict:
    """Entity precision, recall and F1 (micro-averaged) and word accuracy, as seqeval computes them in its default mode.

    A tag without a prefix is scored as the inside of its own type (`with_prefix`).

    Args:
        gold (`list[list[str]]`): each sentence's gold tags, one per word.
        predicted (`list[list[str]]`): each sentence's predicted tags, one per word, as `gold`.
        per_type (`bool`, defaults to `False`): add the scores of each entity type.

    Returns:
        `dict`: `precision`, `recall`, `f1` (0.0 when there is no entity at all) and `accuracy`, as `float`s; with
        `per_type`, `{type}_precision`, `{type}_recall` and `{type}_f1` for each type in the gold tags or the
        predictions.
    """
    from seqeval.metrics import accuracy_score, classification_report

    gold = [[with_prefix(tag) for tag in tags] for tags in gold]
    predicted = [[with_prefix(tag) for tag in tags] for tags in predicted]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's mean of no types, where there is no entity
        report = classification_report(gold, predicted, output_dict=True, zero_division=0)
    totals = report.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0})  # none without entities
    result = {
        "precision": totals["precision"],
        "recall": totals["recall"],
        "f1": totals["f1-score"],
        "accuracy": accuracy_score(gold, predicted),
    }
    if per_type:
        for kind in sorted(name for name in report if not name.endswith(" avg")):
            result.update(
                {
                    f"{kind}_precision": report[kind]["precision"],
                    f"{kind}_recall": report[kind]["recall"],
                    f"{kind}_f1": report[kind]["f1-score"],
                }
            )
    return {name: float(value) for name, value in result.items()}
