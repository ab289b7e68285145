"""GLUE metrics as an `evaluate` module that works offline: `evaluate.load(<this directory>, task)`.

Computes what the GLUE benchmark defines for each task (Wang et al., 2019, Table 1; the same keys as the Hub's
`glue` metric):

- cola, ax: Matthews correlation (`matthews_correlation`); ax is 3-way, with the multi-class generalisation
  (Gorodkin's R_K), as the GLUE diagnostic leaderboard scores it.
- mrpc, qqp: `accuracy` and `f1`, the F1 of the positive class (label 1: equivalent / duplicate).
- stsb: Pearson and Spearman correlation (`pearson`, `spearmanr`) of the predicted and gold scores.
- sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli: `accuracy`.

Everything is written out with numpy (no sklearn/scipy), so the tests can check it against those libraries.
Degenerate inputs follow sklearn/scipy: MCC and F1 are 0.0 when undefined, correlations nan.
"""

import datasets
import evaluate
import numpy as np

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and Bowman, Samuel R.},
  booktitle={ICLR}, year={2019}
}
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions: predicted label ids (float scores for stsb).
    references: gold label ids (float scores for stsb).
Returns: a dict with the task's metrics (see the module docstring).
Example:
    >>> metric = evaluate.load("albert_hf/metrics/glue", "mrpc")
    >>> metric.compute(predictions=[1, 0, 1], references=[1, 1, 1])
    {'accuracy': 0.666..., 'f1': 0.8}
"""

ACCURACY_TASKS = ("sst2", "mnli", "mnli_matched", "mnli_mismatched", "qnli", "rte", "wnli")
TASKS = ("cola", "ax", "mrpc", "qqp", "stsb") + ACCURACY_TASKS


def accuracy(predictions, references):
    return float((predictions == references).mean())


def f1_positive(predictions, references):
    """F1 of class 1: 2TP / (2TP + FP + FN)."""
    true_positives = np.sum((predictions == 1) & (references == 1))
    false_positives = np.sum((predictions == 1) & (references != 1))
    false_negatives = np.sum((predictions != 1) & (references == 1))
    denominator = 2 * true_positives + false_positives + false_negatives
    return float(2 * true_positives / denominator) if denominator else 0.0


def matthews_correlation(predictions, references):
    """Matthews correlation from the confusion matrix; for K classes the R_K statistic (binary MCC when K = 2)."""
    classes = np.union1d(predictions, references)
    total = len(references)
    correct = np.sum(predictions == references)
    predicted_counts = np.array([np.sum(predictions == c) for c in classes], dtype=np.float64)
    true_counts = np.array([np.sum(references == c) for c in classes], dtype=np.float64)
    covariance = correct * total - predicted_counts @ true_counts
    variance_product = (total**2 - predicted_counts @ predicted_counts) * (total**2 - true_counts @ true_counts)
    return float(covariance / np.sqrt(variance_product)) if variance_product > 0 else 0.0


def pearson(x, y):
    x = x - x.mean()
    y = y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    return float(x @ y / denominator) if denominator > 0 else float("nan")


def average_ranks(values):
    """Ranks 1..n, tied values sharing the mean of their ranks (what Spearman's rho correlates)."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start index of each run of equal values in the sorted order.
    run_starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    run_ends = np.r_[run_starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    for start, end in zip(run_starts, run_ends):
        ranks[order[start:end]] = (start + 1 + end) / 2  # mean of ranks start+1 .. end
    return ranks


def spearman(x, y):
    return pearson(average_ranks(x), average_ranks(y))


@evaluate.utils.file_utils.add_start_docstrings(__doc__, _KWARGS_DESCRIPTION)
class Glue(evaluate.Metric):
    def _info(self):
        if self.config_name not in TASKS:
            raise KeyError(f"Unknown GLUE metric configuration {self.config_name!r}; choose one of {list(TASKS)}")
        value_type = "float64" if self.config_name == "stsb" else "int64"
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value(value_type), "references": datasets.Value(value_type)}
            ),
        )  # no format="numpy": it would hand float64 scores over as float32

    def _compute(self, predictions, references):
        predictions = np.asarray(predictions)
        references = np.asarray(references)
        if len(references) == 0:
            raise ValueError("GLUE metric: no predictions to score")
        task = self.config_name
        if task in ("cola", "ax"):
            return {"matthews_correlation": matthews_correlation(predictions, references)}
        if task == "stsb":
            x, y = predictions.astype(np.float64), references.astype(np.float64)
            return {"pearson": pearson(x, y), "spearmanr": spearman(x, y)}
        if task in ("mrpc", "qqp"):
            return {"accuracy": accuracy(predictions, references), "f1": f1_positive(predictions, references)}
        return {"accuracy": accuracy(predictions, references)}
