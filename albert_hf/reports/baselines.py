"""What a model that learned nothing scores on the held-out pairs, so that a run's numbers can be judged.

Measured on the very pairs and masks the evaluation uses (static masking):
- `<task>_accuracy` (sop or nsp): always answering the held-out pairs' majority label, i.e. chance given the
  label balance;
- `mlm_accuracy`: always guessing the most frequent piece of the held-out text;
- `mlm_loss`: the unigram cross-entropy of the masked pieces, the piece frequencies taken from the held-out text
  (add-one smoothed over the vocabulary), in nats like the MLM loss.
The piece frequencies come from the held-out text itself, which flatters the baselines slightly: a model has to
beat them from what it saw in training.
"""

from __future__ import annotations

import numpy as np
from torch.utils.data import DataLoader

BASELINE_SUFFIX = "_baseline"  # eval_mlm_accuracy -> eval_mlm_accuracy_baseline


def heldout_baselines(
    eval_pairs, collator, vocab_size: int, special_ids, pair_task: str | None, prefix: str = "eval_"
) -> dict:
    """{f"{prefix}{metric}{BASELINE_SUFFIX}": value} for mlm_accuracy, mlm_loss and, with a pair task, its
    accuracy. `collator` must be the evaluation's (static masks)."""
    counts = np.zeros(vocab_size, np.int64)
    special = np.zeros(vocab_size, bool)
    special[list(special_ids)] = True
    targets, labels = [], []
    for batch in DataLoader(eval_pairs, batch_size=256, collate_fn=collator):
        masked, mlm_labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        original = np.where(mlm_labels != -100, mlm_labels, masked)[batch["attention_mask"].numpy() == 1]
        counts += np.bincount(original[~special[original]], minlength=vocab_size)
        targets.append(mlm_labels[mlm_labels != -100])
        if "sentence_order_label" in batch:
            labels.append(batch["sentence_order_label"].numpy())
    targets = np.concatenate(targets) if targets else np.zeros(0, np.int64)
    if not len(targets):
        return {}
    probabilities = (counts + 1) / (counts.sum() + vocab_size)
    baselines = {
        f"{prefix}mlm_accuracy{BASELINE_SUFFIX}": float(np.mean(targets == counts.argmax())),
        f"{prefix}mlm_loss{BASELINE_SUFFIX}": float(-np.mean(np.log(probabilities[targets]))),
    }
    if pair_task and labels:
        share = float(np.mean(np.concatenate(labels)))
        baselines[f"{prefix}{pair_task}_accuracy{BASELINE_SUFFIX}"] = max(share, 1 - share)
    return baselines


# What each baseline is, for the end-of-run summary.
BASELINE_NAMES = {
    "mlm_accuracy": "always the most frequent piece",
    "mlm_loss": "unigram cross-entropy",
    "sop_accuracy": "majority label",
    "nsp_accuracy": "majority label",
}


def with_baselines(metrics: dict) -> list[tuple[str, str]]:
    """(name, "value (what a baseline scores)") for the summary; the baseline entries themselves are folded in."""
    rows = []
    for key, value in metrics.items():
        if key.endswith(BASELINE_SUFFIX):
            continue
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        baseline = metrics.get(key + BASELINE_SUFFIX)
        if baseline is not None:
            name = next((label for metric, label in BASELINE_NAMES.items() if key.endswith(metric)), "baseline")
            text += f" ({name}: {baseline:.4f})"
        rows.append((key, text))
    return rows
