"""Evaluation metrics shipped inside albert_hf as `evaluate` modules, so they load without the Hub.

`evaluate.load("glue", task)` needs the network; `load_glue_metric(task)` loads the same metrics from the
package (`evaluate.load(GLUE_METRIC_DIR, task)`).
"""

from pathlib import Path

GLUE_METRIC_DIR = Path(__file__).resolve().parent / "glue"


def load_glue_metric(task: str, **kwargs):
    """The GLUE metric of `task` (cola, sst2, mrpc, stsb, qqp, mnli, mnli_matched, mnli_mismatched, qnli, rte,
    wnli, ax) as an `evaluate.Metric`; kwargs go to `evaluate.load` (e.g. experiment_id)."""
    import evaluate

    return evaluate.load(str(GLUE_METRIC_DIR), task, **kwargs)


def classification_metrics(predictions, references) -> dict:
    """Accuracy and macro-F1 of class ids: F1 = 2TP / (2TP + FP + FN) per class, averaged over the classes that
    occur in the references or the predictions (as scikit-learn's `f1_score(average="macro")`)."""
    import numpy as np

    predictions, references = np.asarray(predictions), np.asarray(references)
    scores = []
    for label in np.union1d(predictions, references):
        true_positives = np.sum((predictions == label) & (references == label))
        wrong = np.sum((predictions == label) != (references == label))  # false positives + false negatives
        scores.append(2 * true_positives / (2 * true_positives + wrong))
    return {"accuracy": float(np.mean(predictions == references)), "macro_f1": float(np.mean(scores))}


def regression_metrics(predictions, references) -> dict:
    """Pearson and Spearman correlation and the mean squared error of predicted and gold scores."""
    import numpy as np

    from .glue.glue import pearson, spearman

    x, y = np.asarray(predictions, dtype=np.float64), np.asarray(references, dtype=np.float64)
    return {"pearson": pearson(x, y), "spearmanr": spearman(x, y), "mse": float(np.mean((x - y) ** 2))}
