"""Scores for GLUE (the `evaluate` module shipped in glue/, loaded offline) and for your own data: accuracy and
macro-F1 of classes, correlations and the squared error of scores."""

from pathlib import Path

GLUE_METRIC_DIR = Path(__file__).resolve().parent / "glue"


def load_glue_metric(task: str, **kwargs):
    """The GLUE metric of `task` (cola, sst2, mrpc, stsb, qqp, mnli, mnli_matched, mnli_mismatched, qnli, rte,
    wnli, ax) as an `evaluate.Metric`; kwargs go to `evaluate.load` (e.g. experiment_id)."""
    import evaluate

    return evaluate.load(str(GLUE_METRIC_DIR), task, **kwargs)


def classification_metrics(predictions, references) -> dict:
    """Accuracy and macro-F1 of class ids (scikit-learn's `f1_score(average="macro")`: the mean over the classes
    that occur in the references or the predictions)."""
    import numpy as np
    from sklearn.metrics import f1_score

    predictions, references = np.asarray(predictions), np.asarray(references)
    return {
        "accuracy": float(np.mean(predictions == references)),
        "macro_f1": float(f1_score(references, predictions, average="macro", zero_division=0.0)),
    }


def regression_metrics(predictions, references) -> dict:
    """Pearson and Spearman correlation (scipy) and the mean squared error of predicted and gold scores."""
    import numpy as np

    from .glue.glue import correlations

    x, y = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    return {**correlations(x, y), "mse": float(np.mean((x - y) ** 2))}
