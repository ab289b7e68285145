"""The held-out evaluation of pretraining and the metrics of the logged rows: mean losses and accuracies from the
six counts a step or an evaluation sums (`step.COUNTS`)."""

import torch

from .step import COUNTS, MLM_CORRECT, MLM_COUNT, MLM_LOSS, PAIR_CORRECT, PAIR_COUNT, PAIR_LOSS, mlm_targets


@torch.no_grad()
def example_counts(outputs, batch) -> torch.Tensor:
    """Per example: [MLM loss sum, MLM correct, MLM count, pair loss, pair correct, pair count], shape (batch, 6);
    "pair" is the 2-way head's task (SOP or NSP; its logits are `sop_logits` either way).

    For evaluation: per-example rows let `gather_for_metrics` drop the samples accelerate repeats to even out the
    last batch, so the losses are computed again per token here (training uses the model's own: `step_counts`).
    """
    sop_logits = outputs.sop_logits
    counts = torch.zeros(sop_logits.shape[0], COUNTS, dtype=torch.float64, device=sop_logits.device)
    labels = batch.get("labels")
    if labels is not None and outputs.mlm_loss is not None:
        targets, weights, owner = mlm_targets(batch)
        logits = outputs.prediction_logits.float()
        token_loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none").double() * weights
        counts[:, MLM_LOSS].index_add_(0, owner, token_loss)
        counts[:, MLM_CORRECT].index_add_(0, owner, (logits.argmax(-1) == targets).double() * weights)
        counts[:, MLM_COUNT].index_add_(0, owner, weights)
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[:, PAIR_LOSS] = torch.nn.functional.cross_entropy(sop_logits.float(), order, reduction="none").double()
        counts[:, PAIR_CORRECT] = (sop_logits.argmax(-1) == order).double()
        counts[:, PAIR_COUNT] = 1
    return counts


def metrics_from_counts(totals: torch.Tensor, prefix: str = "", pair_task: str = "sop") -> dict:
    """Mean losses and accuracies; the 2-way head's metrics are named after the task it is trained on (sop/nsp)."""
    sums = totals.tolist()
    mlm_loss, mlm_correct, mlm_n = sums[MLM_LOSS], sums[MLM_CORRECT], sums[MLM_COUNT]
    pair_loss, pair_correct, pair_n = sums[PAIR_LOSS], sums[PAIR_CORRECT], sums[PAIR_COUNT]
    metrics = {}
    if mlm_n:
        metrics.update({f"{prefix}mlm_loss": mlm_loss / mlm_n, f"{prefix}mlm_accuracy": mlm_correct / mlm_n})
    if pair_n:
        metrics.update(
            {f"{prefix}{pair_task}_loss": pair_loss / pair_n, f"{prefix}{pair_task}_accuracy": pair_correct / pair_n}
        )
    return metrics


@torch.no_grad()
def evaluate(model, dataloader, accelerator, task: str, mix: tuple | None = None) -> dict:
    """The held-out metrics (eval_mlm_loss, ...). A mixed run's (`mix`: its source names and their weights) per
    source too (eval_<name>_mlm_loss, ...), each pair counted for its own source ("source" in its batch); the overall
    figures are then the sources' weighted as the training mix (`mixed_metrics`)."""
    model.eval()
    totals = torch.zeros(len(mix[0]) if mix else 1, COUNTS, dtype=torch.float64)  # a row a source (one: all)
    everything = 0
    for batch in dataloader:
        source = batch.pop("source", None)
        with accelerator.autocast():
            outputs = model(**batch)
        counts = example_counts(outputs, batch)
        if source is None:
            totals[everything] += accelerator.gather_for_metrics(counts).sum(0).cpu()
        else:
            counts, source = accelerator.gather_for_metrics((counts, source))
            totals.index_add_(0, source.cpu(), counts.cpu())
    model.train()
    if not mix:
        return metrics_from_counts(totals[everything], prefix="eval_", pair_task=task)
    return mixed_metrics(totals, *mix, pair_task=task)


def mixed_metrics(totals: torch.Tensor, names, weights: dict, pair_task: str) -> dict:
    """Per source (eval_<name>_*), and overall each metric as the mix weighs the sources: sum of w_s m_s over the
    sources with held-out pairs, divided by the sum of their weights."""
    per_source = {name: metrics_from_counts(totals[i], pair_task=pair_task) for i, name in enumerate(names)}
    overall = {}
    for key in dict.fromkeys(key for metrics in per_source.values() for key in metrics):
        held = [(weights.get(name, 0.0), metrics[key]) for name, metrics in per_source.items() if key in metrics]
        total = sum(weight for weight, _ in held)
        if total:
            overall[f"eval_{key}"] = sum(weight * value for weight, value in held) / total
    return overall | {
        f"eval_{name}_{key}": value for name, metrics in per_source.items() for key, value in metrics.items()
    }


START_METRICS = ("mlm_accuracy", "mlm_loss")  # compared with step 0 at the end of a continued run


def since_start(start: dict, end: dict, sources=()) -> tuple[list[str], list[str]]:
    """A continued run's held-out change since step 0 (the loaded model): (a line overall and one per source, the
    sources whose MLM accuracy fell: forgetting). `start` and `end`: evaluation rows (eval_*, eval_<name>_*)."""
    lines, forgot = [], []
    for name in (None, *sources):
        prefix = "eval_" if name is None else f"eval_{name}_"
        parts = [
            f"{metric} {start[prefix + metric]:.4f} → {end[prefix + metric]:.4f} "
            f"({end[prefix + metric] - start[prefix + metric]:+.4f})"
            for metric in START_METRICS
            if prefix + metric in start and prefix + metric in end
        ]
        if parts:
            lines.append(f"{name or 'overall'}: {', '.join(parts)}")
        accuracy = prefix + "mlm_accuracy"
        if name is not None and accuracy in start and accuracy in end and end[accuracy] < start[accuracy]:
            forgot.append(name)
    return lines, forgot
