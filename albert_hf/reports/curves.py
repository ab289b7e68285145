"""training_curves.png: a run's curves against step, drawn headless with matplotlib.

Pretraining (`pretraining_curves`, from metrics.jsonl): MLM loss, MLM accuracy and the pair task's accuracy,
train and held-out, with the held-out baselines (`baselines.py`) as dashed lines, and the learning rate.
Fine-tuning (`trainer_curves`, from Trainer's log history): training loss, each evaluation metric, learning rate.
"""

from __future__ import annotations

from pathlib import Path

CURVES_FILE = "training_curves.png"


def _figure(panels: int):
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4), squeeze=False)
    return plt, figure, axes[0]


def _save(plt, figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _series(rows: list[dict], key: str):
    points = [(row["step"], row[key]) for row in rows if isinstance(row.get(key), (int, float))]
    return [step for step, _ in points], [value for _, value in points]


def pretraining_curves(rows: list[dict], baselines: dict, path: Path, pair_task: str | None, sources=()) -> Path | None:
    """`rows`: metrics.jsonl's rows (train_*, eval_*, lr per step). A mixed run's `sources` each get a held-out
    line of their own (eval_<name>_*): which source the model learns and which it forgets. None when there is
    nothing to draw."""
    metrics = ["mlm_loss", "mlm_accuracy"] + ([f"{pair_task}_accuracy"] if pair_task else [])
    if not any(_series(rows, f"{split}_{metric}")[0] for metric in metrics for split in ("train", "eval")):
        return None
    plt, figure, axes = _figure(len(metrics) + 1)
    for axis, metric in zip(axes, metrics):
        for split, style in (("train", "-"), ("eval", "o-")):
            steps, values = _series(rows, f"{split}_{metric}")
            if steps:
                axis.plot(steps, values, style, label="held-out" if split == "eval" else split, markersize=3)
        for name in sources:
            steps, values = _series(rows, f"eval_{name}_{metric}")
            if steps:
                axis.plot(steps, values, "o--", label=f"held-out {name}", markersize=2, linewidth=1)
        baseline = baselines.get(f"eval_{metric}_baseline")
        if baseline is not None:
            axis.axhline(baseline, linestyle="--", color="gray", label="baseline")
        axis.set_title(metric.replace("_", " "))
        axis.set_xlabel("step")
        axis.legend(fontsize=8)
    steps, values = _series(rows, "lr")
    axes[-1].plot(steps, values)
    axes[-1].set_title("learning rate")
    axes[-1].set_xlabel("step")
    return _save(plt, figure, Path(path))


def trainer_curves(log_history: list[dict], path: Path) -> Path | None:
    """Training loss, the evaluation metrics (eval_* but runtime and speed) and the learning rate of Trainer's
    state.log_history (its TrainerState). None when nothing was logged."""
    evaluated = sorted(
        {
            key
            for row in log_history
            for key in row
            if key.startswith("eval_")
            and not key.endswith(("_runtime", "_per_second", "_samples"))
            and key != "eval_epoch"
        }
    )
    panels = [key for key in ["loss", *evaluated, "learning_rate"] if _series(log_history, key)[0]]
    if not panels:
        return None
    plt, figure, axes = _figure(len(panels))
    for axis, key in zip(axes, panels):
        steps, values = _series(log_history, key)
        axis.plot(steps, values, "o-" if key.startswith("eval_") else "-", markersize=3)
        axis.set_title("training loss" if key == "loss" else key.replace("_", " "))
        axis.set_xlabel("step")
    return _save(plt, figure, Path(path))
