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
