"""The pretraining step: the counts behind the logged metrics, evaluation, the loss weights of a step's
micro-batches, one optimizer step, and `TrainingState`, where the loop stands (what a checkpoint saves of it).
`loop.fit` runs the loop around them."""

import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from ..runtime.throughput import Throughput, peak_memory_gib

logger = logging.getLogger(__name__)

LOSS_NORMALIZATIONS = ("global", "per_device")


# ----------------------------------------------------------------------------------------------------------------
# Metrics

# The sums behind every metric: MLM loss, MLM correct, MLM count, pair loss, pair correct, pair count.
COUNTS = 6
# A training step returns them and, at index GRAD_NORM, its gradients' global norm before clipping (-1: none known,
# under DeepSpeed, which clips inside its engine).
GRAD_NORM = COUNTS

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
        counts[0] = outputs.mlm_loss.double() * masked
        counts[1] = ((outputs.prediction_logits.argmax(-1) == targets).double() * weights).sum()
        counts[2] = masked
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[3] = outputs.sop_loss.double() * order.numel()
        counts[4] = (outputs.sop_logits.argmax(-1) == order).sum()
        counts[5].fill_(order.numel())  # fill_: a kernel (an assignment would copy from the host)
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
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in micro_batches:
        if batch.get("labels") is not None:
            counts[0] += masked_count(batch)
        if batch.get("sentence_order_label") is not None:
            counts[1] += batch["sentence_order_label"].numel()
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


def training_step(model, micro_batches, optimizer, scheduler, accelerator, max_grad_norm,
                  normalization: str = "global") -> torch.Tensor:
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


def accumulate_and_update(model, micro_batches, optimizer, accelerator, max_grad_norm,
                          normalization: str = "global", own_all_reduce: bool = False) -> torch.Tensor:
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
    """The 0-dim device tensor through which albert_hf's optimizers skip a step (`optimization.Lamb`), made on first
    use and kept: a captured step writes and reads the same one. None for an optimizer without one."""
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper
    if not hasattr(inner, "update_gate"):
        return None
    if inner.update_gate is None:
        inner.update_gate = torch.ones((), dtype=torch.float32, device=device)
    return inner.update_gate


# ----------------------------------------------------------------------------------------------------------------
# Where the loop stands


class LaggedRead:
    """A device scalar, read on the host without waiting for the step just queued: each step's value is copied into
    one of two host slots (pinned, on a GPU) behind an event, and a read takes the slot of the step before, whose
    event has passed. On a CPU the copy is done at once and the read is the step's own value. Every process reads
    the same step's value, so their decisions agree without a collective."""

    def __init__(self, device: torch.device):
        self.lag = int(device.type == "cuda")
        self.host = torch.zeros(2, dtype=torch.float64, pin_memory=bool(self.lag))
        self.events = [None, None]

    def record(self, value: torch.Tensor, step: int):
        self.host[step % 2].copy_(value, non_blocking=bool(self.lag))
        if self.lag:
            self.events[step % 2] = torch.cuda.Event()
            self.events[step % 2].record()

    def read(self, step: int) -> float:
        """The value recorded at `step` (on a CPU) or at `step - 1` (on a GPU); 0 before any."""
        slot = (step - self.lag) % 2
        if self.lag:
            if self.events[slot] is None:
                return 0.0
            self.events[slot].synchronize()
        return float(self.host.numpy()[slot])  # host memory: no device read


@dataclass
class TrainingState:
    """The loop's position and its logging window: what a checkpoint saves besides the model, the optimizer, the
    schedule, the RNGs and the data position.

    The training metrics logged every --logging_steps are means over a window of steps. The window's sums travel
    with the checkpoint (summed over processes, held by the main process), so that a resumed run logs exactly what
    the uninterrupted run would have, wherever the checkpoint fell inside a window.

    A skipped step (its gradients not finite: `accumulate_and_update`) adds nothing to the window's sums; `skips`
    counts it on the device, the same in every process: in the window, in a row up to the last step (read each step
    through `LaggedRead`, for --max_consecutive_skips), and in all.

    Each step's gradient norm is kept on the device (the window logs its last step's). The run's closed windows add
    up to its tokens and seconds (for its total model FLOPs and mean MFU), which checkpoints carry too."""

    window: torch.Tensor  # the six counts of `step_counts`, summed over the window's steps
    window_tokens: torch.Tensor  # this process's real tokens in the window, on the device: read when logged
    window_start: float  # time.perf_counter() when the window began
    skips: torch.Tensor  # steps skipped [in the window, in a row up to the last step, in all], on the device
    consecutive: LaggedRead
    grad_norm: torch.Tensor  # the last step's gradient norm before clipping, on the device (-1: none known)
    step: int = 0  # optimizer steps completed
    epoch: int = 0
    batches_in_epoch: int = 0
    window_data_wait: float = 0.0  # seconds this process waited for its batches in the window
    run_tokens: float = 0.0  # real tokens of all processes in the run's closed windows
    run_seconds: float = 0.0  # the closed windows' wall time

    @classmethod
    def start(cls, device: torch.device) -> "TrainingState":
        return cls(torch.zeros(COUNTS, dtype=torch.float64, device=device),
                   torch.zeros((), dtype=torch.float64, device=device), time.perf_counter(),
                   torch.zeros(3, dtype=torch.float64, device=device), LaggedRead(device),
                   torch.full((), -1.0, dtype=torch.float64, device=device))

    def restore(self, saved: dict, main_process: bool):
        """The position of a checkpoint's training state (checked by StepCheckpoints.load); its window on the main
        process, which holds the sums; the skip counts in every process."""
        self.step, self.epoch, self.batches_in_epoch = saved["step"], saved["epoch"], saved["batches_in_epoch"]
        self.skips.copy_(torch.tensor([saved.get("window_skipped", 0), saved.get("consecutive_skips", 0),
                                       saved.get("skipped_steps", 0)], dtype=torch.float64))
        self.consecutive.record(self.skips[1], self.step)
        self.run_tokens, self.run_seconds = saved.get("run_tokens", 0.0), saved.get("run_seconds", 0.0)
        if main_process and "window" in saved:
            self.window = torch.tensor(saved["window"], dtype=torch.float64, device=self.window.device)
            self.window_tokens.fill_(saved["window_tokens"])
            self.window_start = time.perf_counter() - saved["window_seconds"]
            self.window_data_wait = saved.get("window_data_wait", 0.0)

    def add_step(self, outputs: torch.Tensor, micro_batches, gate: torch.Tensor | None):
        """One optimizer step done (`outputs`: a training step's counts and gradient norm): its counts (none for a
        skipped step, `gate` 0) and real tokens into the window, its norm kept."""
        counts = outputs[:COUNTS]
        self.grad_norm.copy_(outputs[GRAD_NORM])
        if gate is not None:
            skipped = 1.0 - gate.to(torch.float64)
            self.window += torch.where(skipped > 0, 0.0, counts)  # a skipped step's counts may hold NaN
            one = torch.ones((), dtype=torch.float64, device=skipped.device)
            self.skips.mul_(torch.stack((one, skipped, one))).add_(skipped)  # window += s; row = (row + 1) s; all += s
        else:
            self.window += counts
        for batch in micro_batches:
            self.window_tokens += batch["attention_mask"].sum()
        self.step += 1
        self.consecutive.record(self.skips[1], self.step)

    def consecutive_skips(self) -> int:
        """Steps skipped in a row up to the last one (on a GPU: up to the one before, not to wait for the last)."""
        return int(self.consecutive.read(self.step))

    def next_epoch(self):
        self.epoch += 1
        self.batches_in_epoch = 0

    def window_sums(self, accelerator) -> torch.Tensor:
        """A collective: the six counts, the real tokens, then the seconds spent waiting for batches, summed over
        all processes."""
        wait = torch.full((1,), self.window_data_wait, dtype=torch.float64, device=self.window.device)
        return accelerator.reduce(torch.cat([self.window, self.window_tokens.view(1), wait]), "sum").cpu()

    def run_totals(self, accelerator) -> tuple[float, float]:
        """A collective: the run's real tokens (all processes) and wall seconds of training up to now."""
        tokens = float(self.window_sums(accelerator)[COUNTS])
        return self.run_tokens + tokens, self.run_seconds + time.perf_counter() - self.window_start

    def window_metrics(self, accelerator, pair_task: str, lr: float, throughput: Throughput) -> dict:
        """A collective: the window's means, its learning rate, token rate and what `throughput` makes of it (model
        TFLOP/s, MFU), last gradient norm (None when that step was not finite), share of time spent waiting for
        batches (the processes' mean), peak memory (the processes' most) and skipped steps; then a new window
        begins."""
        elapsed = time.perf_counter() - self.window_start
        sums = self.window_sums(accelerator)
        metrics = metrics_from_counts(sums[:COUNTS], pair_task=pair_task)
        tokens, wait = float(sums[COUNTS]), float(sums[COUNTS + 1])
        metrics.update(lr=lr, tokens_per_second=tokens / elapsed, **throughput.rates(tokens / elapsed))
        norm = float(self.grad_norm.cpu())
        if norm != -1.0:  # -1: no norm known (DeepSpeed)
            metrics["grad_norm"] = norm if math.isfinite(norm) else None
        metrics["data_wait"] = wait / accelerator.num_processes / elapsed
        memory = torch.tensor([peak_memory_gib(accelerator.device)], device=accelerator.device)
        metrics["peak_memory_gib"] = float(accelerator.gather(memory).max().cpu())
        skipped = int(self.skips[0].cpu())
        if skipped:
            metrics["skipped_steps"] = skipped
        self.run_tokens += tokens
        self.run_seconds += elapsed
        self.window.zero_()
        self.window_tokens.zero_()
        self.skips[0].zero_()
        self.window_data_wait = 0.0
        self.window_start = time.perf_counter()
        return metrics

    def checkpoint_state(self, accelerator) -> dict:
        """A collective: what a checkpoint saves of the state (the window summed over processes)."""
        *sums, tokens, wait = self.window_sums(accelerator).tolist()
        window_skipped, consecutive, skipped = self.skips.cpu().tolist()
        return {"step": self.step, "epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch,
                "skipped_steps": int(skipped), "window_skipped": int(window_skipped),
                "consecutive_skips": int(consecutive), "window": sums, "window_tokens": tokens,
                "window_seconds": time.perf_counter() - self.window_start, "window_data_wait": wait,
                "run_tokens": self.run_tokens, "run_seconds": self.run_seconds}


@dataclass
class FitResult:
    """How `fit` ended: at --max_train_steps, or early on a stop signal with a checkpoint written."""

    eval_metrics: dict  # the last evaluation's
    steps: int  # optimizer steps completed
    stopped_by: str | None = None  # the signal's name (SIGTERM, SIGINT, SIGUSR1) when one ended the run early
    checkpoint: Path | None = None  # the step_N written when it stopped
    run_tokens: float = 0.0  # the run's real tokens (all processes) and training seconds, for its summary
    run_seconds: float = 0.0
