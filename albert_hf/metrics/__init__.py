"""Every task's scoring, offline: GLUE's metrics shipped as an `evaluate` module (here), the official SQuAD v1.1 /
v2.0 evaluation (`squad.py`), seqeval's NER scores (`ner.py`), and accuracy / F1 / correlations for your own data
(here).

`evaluate.load("glue", task)` needs the network; `load_glue_metric(task)` loads the same metrics from the
package (`evaluate.load(GLUE_METRIC_DIR, task)`).
"""

from .scores import GLUE_METRIC_DIR, classification_metrics, load_glue_metric, regression_metrics

__all__ = ["GLUE_METRIC_DIR", "classification_metrics", "load_glue_metric", "regression_metrics"]
