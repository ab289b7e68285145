"""The held-out evaluation of pretraining and the metrics of the logged rows: mean losses and accuracies from the
six counts a step or an evaluation sums (`step.COUNTS`)."""

import torch

from .step import COUNTS, mlm_targets


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
        counts[:, 0].index_add_(0, owner, token_loss)
        counts[:, 1].index_add_(0, owner, (logits.argmax(-1) == targets).double() * weights)
        counts[:, 2].index_add_(0, owner, weights)
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[:, 3] = torch.nn.functional.cross_entropy(sop_logits.float(), order, reduction="none").double()
        counts[:, 4] = (sop_logits.argmax(-1) == order).double()
        counts[:, 5] = 1
    return counts


def metrics_from_counts(totals: torch.Tensor, prefix: str = "", pair_task: str = "sop") -> dict:
    """Mean losses and accuracies; the 2-way head's metrics are named after the task it is trained on (sop/nsp)."""
    mlm_loss, mlm_correct, mlm_n, pair_loss, pair_correct, pair_n = totals.tolist()
    metrics = {}
    if mlm_n:
        metrics.update({f"{prefix}mlm_loss": mlm_loss / mlm_n, f"{prefix}mlm_accuracy": mlm_correct / mlm_n})
    if pair_n:
        metrics.update({f"{prefix}{pair_task}_loss": pair_loss / pair_n,
                        f"{prefix}{pair_task}_accuracy": pair_correct / pair_n})
    return metrics


@torch.no_grad()
def evaluate(model, dataloader, accelerator, task: str) -> dict:
    model.eval()
    totals = torch.zeros(COUNTS, dtype=torch.float64)
    for batch in dataloader:
        with accelerator.autocast():
            outputs = model(**batch)
        totals += accelerator.gather_for_metrics(example_counts(outputs, batch)).sum(0).cpu()
    model.train()
    return metrics_from_counts(totals, prefix="eval_", pair_task=task)
