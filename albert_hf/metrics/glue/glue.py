"""GLUE metrics as an `evaluate` module that works offline: `evaluate.load(<this directory>, task)`.

Computes what the GLUE benchmark defines for each task (Wang et al., 2019, Table 1; the same keys as the Hub's
`glue` metric):

- cola, ax: Matthews correlation (`matthews_correlation`); ax is 3-way, with the multi-class generalisation
  (Gorodkin's R_K), as the GLUE diagnostic leaderboard scores it.
- mrpc, qqp: `accuracy` and `f1`, the F1 of the positive class (label 1: equivalent / duplicate).
- stsb: Pearson and Spearman correlation (`pearson`, `spearmanr`) of the predicted and gold scores.
- sst2, mnli, mnli_matched, mnli_mismatched, qnli, rte, wnli: `accuracy`.

The scores come from scipy (`pearsonr`, `spearmanr`) and scikit-learn (`matthews_corrcoef`, `f1_score`), as in
evaluate's own GLUE metric. Degenerate inputs: MCC and F1 are 0.0 when undefined, correlations nan (fewer than
two rows, or a constant side).
"""

import warnings

import datasets
import evaluate
import numpy as np
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

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


def correlations(x, y) -> dict:
    """Pearson and Spearman correlation of two float arrays; nan where undefined, without scipy's warning."""
    if len(x) < 2:
        return {"pearson": float("nan"), "spearmanr": float("nan")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ConstantInputWarning: the nan says it
        return {"pearson": float(pearsonr(x, y)[0]), "spearmanr": float(spearmanr(x, y)[0])}


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
        if task in ("cola", "ax"):  # for 3 classes (ax) the multi-class generalisation, Gorodkin's R_K
            return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}
        if task == "stsb":
            return correlations(predictions.astype(np.float64), references.astype(np.float64))
        if task in ("mrpc", "qqp"):  # F1 of the positive class, 0.0 where nothing is predicted or gold positive
            return {
                "accuracy": accuracy(predictions, references),
                "f1": float(f1_score(references, predictions, pos_label=1, zero_division=0.0)),
            }
        return {"accuracy": accuracy(predictions, references)}
