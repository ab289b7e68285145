"""One optimizer step of pretraining: the loss weights of its micro-batches, their forward and backward, the
clipping and the update, all on the device (`training_step`), and the counts behind the logged metrics that it
returns. `loop.fit` runs it once a step; `step_graph.StepGraph` captures it as a CUDA graph."""

import contextlib
import math

import torch
from torch.nn.parallel import DistributedDataParallel

LOSS_NORMALIZATIONS = ("global", "per_device")

# The sums behind every metric, by index: MLM loss, MLM correct, MLM count, pair loss, pair correct, pair count.
MLM_LOSS, MLM_CORRECT, MLM_COUNT, PAIR_LOSS, PAIR_CORRECT, PAIR_COUNT = range(6)
COUNTS = 6
# A training step returns them and, at index GRAD_NORM, its gradients' global norm before clipping (-1: none known,
# under DeepSpeed, which clips inside its engine).
GRAD_NORM = COUNTS


@torch.no_grad()
def step_counts(outputs, batch) -> torch.Tensor:
    """The same six sums for a whole training micro-batch, shape (6,), from the losses the model already computed
    (its means over the masked tokens and over the pairs, times their counts).

    No grad: the training loop adds these into a running window, which would otherwise chain every step's graph
    into one that is never freed (about 30 MB a step at H=256, batch 32).
    """
    counts = torch.zeros(COUNTS, dtype=torch.float64, device=outputs.sop_logits.device)
    labels = batch.get("labels")
    if labels is not None and outputs.mlm_loss is not None:
        targets, weights, _ = mlm_targets(batch)  # in the head's row order
        masked = weights.sum()
        counts[MLM_LOSS] = outputs.mlm_loss.double() * masked
        counts[MLM_CORRECT] = ((outputs.prediction_logits.argmax(-1) == targets).double() * weights).sum()
        counts[MLM_COUNT] = masked
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[PAIR_LOSS] = outputs.sop_loss.double() * order.numel()
        counts[PAIR_CORRECT] = (outputs.sop_logits.argmax(-1) == order).sum()
        counts[PAIR_COUNT].fill_(order.numel())  # fill_: a kernel (an assignment would copy from the host)
    return counts


def mlm_targets(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MLM head's rows as the model orders them: (target ids, weights (float64: 1, or 0 for the padding of
    the fixed-size form), the example of each row). From `masked_lm_positions` when the batch has them (no count
    read from the device), else from `labels != -100`."""
    labels = batch["labels"]
    positions = batch.get("masked_lm_positions")
    if positions is not None:
        weights = batch["masked_lm_weights"].flatten().double()
        owner = torch.arange(labels.shape[0], device=labels.device).repeat_interleave(positions.shape[1])
        return labels.gather(1, positions).clamp(min=0).flatten(), weights, owner
    masked = labels != -100
    targets = labels[masked]
    return targets, targets.new_ones(targets.shape, dtype=torch.float64), masked.nonzero()[:, 0]


def masked_count(batch) -> torch.Tensor:
    """The batch's masked tokens, as a device tensor (from the collator's weights when it gave them)."""
    if batch.get("masked_lm_weights") is not None:
        return batch["masked_lm_weights"].sum()
    return (batch["labels"] != -100).sum()


# ----------------------------------------------------------------------------------------------------------------
# One optimizer step: the gradient of the batch it stands for


def accumulation_groups(batches, size: int):
    """The micro-batches of each optimizer step, in lists of `size`; a shorter last one when the epoch ends."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def loss_weights(micro_batches, accelerator, normalization: str = "global") -> torch.Tensor:
    """(w_mlm, w_pair) for one optimizer step: each micro-batch's backward gets its summed MLM loss times w_mlm
    plus its summed pair (SOP/NSP) loss times w_pair (`weighted_loss`).

    global: w = P / N and P / S, with N the masked tokens and S the pairs of the whole step (every micro-batch of
        every process, counted before the first backward with one all-reduce) and P the processes, whose gradients
        DDP and FSDP average. The step's gradient is then that of mean MLM loss over all N masked tokens plus mean
        pair loss over all S pairs: the same as one batch of all of them, whatever the split. Accumulating
        micro-batch means instead weighs a masked token of a micro-batch with few by more (short sequences,
        padding, n-gram spans): 4.5% off in gradient norm on a realistic batch of 32 split in 4.
    per_device: w = 1 / N_p and 1 / S_p, this process's own counts: the mean over the process's tokens, averaged
        over processes. That is the official code on TPUs, where each core's loss is the mean over its own shard
        and the cross-shard optimizer averages the cores' gradients.
    """
    device = micro_batches[0]["input_ids"].device
    tokens, pairs = 0, 1  # the step's masked tokens and pairs, by index
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in micro_batches:
        if batch.get("labels") is not None:
            counts[tokens] += masked_count(batch)
        if batch.get("sentence_order_label") is not None:
            counts[pairs] += batch["sentence_order_label"].numel()
    scale = 1.0
    if normalization == "global":
        counts, scale = accelerator.reduce(counts, "sum"), accelerator.num_processes
    return scale / counts.clamp(min=1)


def weighted_loss(outputs, batch, weights: torch.Tensor) -> torch.Tensor:
    """A micro-batch's share of the step's loss (`loss_weights`), from the means the model computed."""
    loss = outputs.sop_logits.new_zeros(())
    if outputs.mlm_loss is not None:
        loss = loss + outputs.mlm_loss * (masked_count(batch) * weights[0]).to(loss.dtype)
    if outputs.sop_loss is not None:
        loss = loss + outputs.sop_loss * (batch["sentence_order_label"].numel() * weights[1]).to(loss.dtype)
    return loss


def training_step(
    model, micro_batches, optimizer, scheduler, accelerator, max_grad_norm, normalization: str = "global"
) -> torch.Tensor:
    """One optimizer step over its micro-batches (`accumulate_and_update`), then the schedule's step. Returns the six
    counts of `step_counts`, summed over the micro-batches, and the gradient norm (at GRAD_NORM).

    A step whose gradients are not finite changes nothing (`accumulate_and_update`), and its batches count as
    dropped: the schedule advances. Under fp16 the grad scaler also skips such a step; the schedule then does not
    advance, as in transformers' Trainer.
    """
    counts = accumulate_and_update(model, micro_batches, optimizer, accelerator, max_grad_norm, normalization)
    if not accelerator.optimizer_step_was_skipped:
        scheduler.step()
    return counts


def accumulate_and_update(
    model,
    micro_batches,
    optimizer,
    accelerator,
    max_grad_norm,
    normalization: str = "global",
    own_all_reduce: bool = False,
) -> torch.Tensor:
    """The device's part of a step: forward and backward of each micro-batch (the processes' gradients are
    synchronised on the last one only), clipping, the update, the gradients freed. Nothing is read back to the
    host, so that the step can be captured as a CUDA graph (`step_graph.StepGraph`).

    `own_all_reduce` (the captured step of a DDP model): the micro-batches run through the wrapped module, and the
    step averages the gradients itself, in one all-reduce after the last backward (`average_gradients`), which a
    CUDA graph holds; DDP's reducer, driven from the host by autograd hooks, is not used. With cross-layer sharing
    a shared block's gradient is complete only when the backward reaches the first layer, so DDP's overlap of
    communication with the backward had little to hide.

    Returns the six counts of `step_counts`, summed over the micro-batches, then the gradients' global norm before
    clipping (the value the clipping used; -1 under DeepSpeed), all float64 on the device.

    A step whose gradients' global norm is not finite (a NaN or an overflow anywhere: in a loss, a gradient, in any
    process) is skipped on the device: the optimizer's update gate (`update_gate`) reads 0, and neither a weight nor
    a moment changes. The norm is the clipping's, the same in every process (DDP's averaged gradients, FSDP's
    all-reduced norm), so every process skips the same steps."""
    weights = loss_weights(micro_batches, accelerator, normalization)
    own_all_reduce = own_all_reduce and isinstance(model, DistributedDataParallel)
    forward = model.module if own_all_reduce else model
    counts = 0
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last and not own_all_reduce else accelerator.no_sync(model):
            with accelerator.autocast():
                outputs = forward(**batch)
            accelerator.backward(weighted_loss(outputs, batch, weights))
        counts = counts + step_counts(outputs, batch)
        del outputs  # a micro-batch's logits are not kept while the next one runs
    if own_all_reduce:
        average_gradients(model.parameters(), model.process_group)
    # the global norm, after unscaling; without clipping (inf) the gradients are left as they are
    norm = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf)
    if norm is None:  # DeepSpeed clips, and skips, inside its engine
        norm = torch.full((), -1.0, device=counts.device)
    elif hasattr(norm, "full_tensor"):  # FSDP2: the whole model's norm, already all-reduced
        norm = norm.full_tensor()
    gate = update_gate(optimizer, norm.device)
    if gate is not None:
        gate.copy_(torch.isfinite(norm))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return torch.cat([counts, norm.detach().to(torch.float64).view(1)])


def average_gradients(parameters, group) -> None:
    """Each gradient replaced by its mean over the processes of `group`, as DDP's is: one all-reduce of all of them
    side by side (ALBERT has few parameter tensors: base's are 32). A parameter without a gradient (a head the task
    leaves out) has none in any process and is left out."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    torch.distributed.all_reduce(flat, group=group)
    flat.div_(torch.distributed.get_world_size(group))
    for grad, mean in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(mean.view_as(grad))


def update_gate(optimizer, device: torch.device) -> torch.Tensor | None:
    """The optimizer's update gate (`optimization._UncorrectedAdam.gate_on`), through accelerate's wrapper; None for
    an optimizer without one."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    return inner.gate_on(device) if hasattr(inner, "gate_on") else None
