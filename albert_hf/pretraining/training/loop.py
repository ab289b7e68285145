"""The pretraining loop: `fit` trains a `Run` (the whole job's object, defined here) one optimizer step at a time
(step.py), with the log window (output/log.py), the held-out evaluation (evaluation.py), the checkpoints
(output/checkpoints.py), --on_divergence rollback and the --max_consecutive_skips limit (divergence.py), and a stop
signal honoured at a step boundary with a checkpoint. Where the loop stands is its `TrainingState` (at the end of
this module: what a checkpoint saves of it). job.py builds the `Run` it trains (`prepare`) and saves it after
(`finish`).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from accelerate import Accelerator, DistributedType
from accelerate.utils import send_to_device
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from ...runtime.distributed import gather_full_model
from ...runtime.hardware import Hardware, Precision
from ...runtime.preemption import StopOnSignal, at_stage, deferred
from ...runtime.throughput import Throughput, peak_memory_gib
from ..arguments import PretrainingArguments
from ..data.collator import DataCollatorForAlbertPretraining
from ..output.card import card_run
from ..output.checkpoints import StepCheckpoints, truncate_metrics_log
from ..output.final_folder import save_final_model, where_trained
from ..output.hub_push import HubPush, download_last_checkpoint, hub_source
from ..output.log import MetricsLog, format_metrics
from .divergence import Diverged, check_losses, check_weights, newest_finite, stop_line
from .evaluation import evaluate, metrics_from_counts
from .step import COUNTS, GRAD_NORM, accumulation_groups, training_step, update_gate
from .step_graph import StepGraph

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything `prepare` builds, which `fit` trains and `finish` saves."""

    args: PretrainingArguments
    accelerator: Accelerator
    tokenizer: transformers.PreTrainedTokenizerBase
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    collate: DataCollatorForAlbertPretraining
    train_dataloader: DataLoader
    eval_dataloader: DataLoader | None
    eval_documents: datasets.Dataset | datasets.IterableDataset | None  # for the fill-mask examples
    checkpoints: StepCheckpoints
    num_parameters: int
    global_batch: int
    hardware: Hardware
    precision: Precision
    throughput: Throughput  # the model FLOPs per token and the peak of the logged rates and MFU
    step_graph: StepGraph | None = None  # --torch_compile_mode whole-step-graph
    hub: HubPush | None = None  # --push_to_hub

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output.output_dir)

    @property
    def stream(self) -> datasets.IterableDataset | None:
        """The process's own endless stream of training pairs under --streaming (its position is checkpointed)."""
        dataset = self.train_dataloader.dataset
        return dataset if isinstance(dataset, datasets.IterableDataset) else None


def optimizer_step(run: Run, micro_batches) -> torch.Tensor:
    """One optimizer step (`training_step`), or with --torch_compile_mode whole-step-graph a replay of the captured
    step and the schedule's step; the six counts of `step_counts` and the gradient norm."""
    if run.step_graph is None:
        return training_step(run.model, micro_batches, run.optimizer, run.scheduler, run.accelerator,
                             run.args.optimization.max_grad_norm, run.args.optimization.loss_normalization)
    counts = run.step_graph(micro_batches)
    run.scheduler.step()
    return counts


def started(groups):
    """`groups`, its first taken with stop signals deferred: the DataLoader's workers start then, and a start cut
    short leaves an iterator that torch cannot shut down (a traceback at exit)."""
    with deferred():
        first = next(groups, None)
    if first is not None:
        yield first
        yield from groups


def timed(groups):
    """Each of `groups` with the seconds spent waiting for it (the data wait of the logged rows)."""
    while True:
        began = time.perf_counter()
        group = next(groups, None)
        if group is None:
            return
        yield group, time.perf_counter() - began


def first_step_stage(run: Run) -> str:
    """What the first optimizer step does besides the step, for the stop line."""
    if run.step_graph is not None:
        return "capturing the whole-step graph (the first step)"
    return "compiling the model (the first step)" if run.args.model.torch_compile else "taking the first step"


def fit(run: Run, stop: StopOnSignal | None = None) -> FitResult:
    """The training loop, from the checkpoint --resume_from_checkpoint names (if any) to --max_train_steps, with
    logging, evaluation and checkpoints. When `stop` reports a signal (in any process) at a step boundary, every
    process saves the checkpoint of that step and the loop ends there."""
    output, accelerator = run.args.output, run.accelerator
    steps, accumulation = run.args.optimization.max_train_steps, run.args.optimization.gradient_accumulation_steps
    state = resume(run)
    log = metrics_log(run)
    progress = tqdm(total=steps, initial=state.step, disable=not accelerator.is_main_process,
                    desc="pretraining", dynamic_ncols=True)
    eval_metrics, stopped, compiled, rollbacks = {}, None, False, 0
    run.model.train()
    at_stage(first_step_stage(run))  # until the first step is done
    try:  # closed on the way out too, so that an error line starts on a line of its own
        while state.step < steps and stopped is None:
            for micro_batches, waited in timed(started(accumulation_groups(epoch_batches(run, state), accumulation))):
                state.batches_in_epoch += len(micro_batches)
                state.window_data_wait += waited
                began = time.perf_counter()
                counts = optimizer_step(run, micro_batches)
                if run.args.model.torch_compile and not compiled:  # the first step compiles
                    compiled = True
                    logger.info("torch.compile: the first step took %.1f s, compiling included",
                                time.perf_counter() - began)
                state.add_step(counts, micro_batches, update_gate(run.optimizer, accelerator.device))
                if stop is not None:
                    stop.saving()  # a step to save from here on: a signal waits for the step boundary
                progress.update(1)
                try:
                    eval_metrics = after_step(run, state, log, progress) or eval_metrics
                except Diverged as diverged:  # stops the run, or with --on_divergence rollback goes back
                    rollbacks += 1
                    state = roll_back(run, state, log, progress, diverged, rollbacks)
                    continue
                if state.step >= steps:
                    break
                if stop is not None and stop.agreed(accelerator.device):  # returns at once if just saved
                    stopped = FitResult(eval_metrics, state.step, stop.name, save_checkpoint(run, state))
                    break
            else:
                state.next_epoch()
    finally:
        progress.close()
    if stopped is not None:
        return stopped
    if run.eval_dataloader is not None and (not output.eval_steps or steps % output.eval_steps):
        eval_metrics = evaluate_and_log(run, state, log)
    return FitResult(eval_metrics, state.step, run_tokens=state.run_tokens, run_seconds=state.run_seconds)



# ----------------------------------------------------------------------------------------------------------------
# The parts of `fit`'s loop


def resume(run: Run) -> TrainingState:
    """A fresh state, or the one of the checkpoint --resume_from_checkpoint names (and the stream's position)."""
    args, accelerator = run.args, run.accelerator
    state = TrainingState.start(accelerator.device)
    value = args.output.resume_from_checkpoint
    if hub_source(value, args.output) is not None:  # the state --hub_strategy checkpoint pushed
        value = str(download_last_checkpoint(value, args.output, accelerator))
    path = run.checkpoints.resolve(value) if value else None
    if path is None:
        return state
    state.restore(run.checkpoints.load(path, COUNTS), accelerator.is_main_process)
    if run.stream is not None:
        run.stream.load_state_dict(run.checkpoints.stream_state(path))
    if accelerator.is_main_process:
        truncate_metrics_log(run.output_dir / "metrics.jsonl", state.step)
    logger.info("Resumed from %s: step %d, epoch %d, batch %d of the epoch", path, state.step, state.epoch,
                state.batches_in_epoch)
    return state


def epoch_batches(run: Run, state: TrainingState):
    """The batches of the state's epoch, from the state's position in it."""
    run.collate.set_epoch(state.epoch)
    if hasattr(run.train_dataloader, "set_epoch"):
        run.train_dataloader.set_epoch(state.epoch)
    if run.stream is not None:  # unprepared (see prepare); resumed by its state_dict, not by skipping
        accelerator = run.accelerator
        return (send_to_device(batch, accelerator.device, non_blocking=accelerator.non_blocking)
                for batch in run.train_dataloader)
    if state.batches_in_epoch:
        return run.accelerator.skip_first_batches(run.train_dataloader, state.batches_in_epoch)
    return run.train_dataloader


# the logged rows' names of the window's fields that are not training means (those get "train_")
RUN_FIELDS = ("lr", "tokens_per_second", "model_tflops_per_second", "mfu", "grad_norm", "data_wait",
              "peak_memory_gib", "skipped_steps")
SHORT_NAMES = {"model_tflops_per_second": "tflops/s", "peak_memory_gib": "mem_gib"}  # the progress bar's


def log_window(run: Run, state: TrainingState, log, progress):
    """A collective: the training means of the window and the run's rates (runtime/throughput.py), into the
    progress bar and the metrics log; a non-finite loss stops the run (pretraining/training/divergence.py)."""
    metrics = state.window_metrics(run.accelerator, run.args.objective.task, current_lr(run), run.throughput)
    progress.set_postfix({SHORT_NAMES.get(k, k.replace("_accuracy", "_acc")):
                          "non-finite" if v is None else f"{v:.3g}" for k, v in metrics.items() if k != "lr"})
    log.write(state.step, {k if k in RUN_FIELDS else f"train_{k}": v for k, v in metrics.items()})
    check_losses(metrics, state.step, metrics["lr"], lambda: newest_checkpoint(run), "training")
    for row in run.hub.sent_rows() if run.hub is not None else ():  # main process: the uploads done meanwhile
        log.write(state.step, row)


def after_step(run: Run, state: TrainingState, log, progress) -> dict | None:
    """What follows a step: the skip limit, the logged window, the evaluation (its metrics returned) and the
    checkpoint, each when due; a run that diverged raises `Diverged`."""
    output, steps = run.args.output, run.args.optimization.max_train_steps
    check_skips(run, state, log, progress)
    if state.step % output.logging_steps == 0 or state.step == steps:
        log_window(run, state, log, progress)
    eval_metrics = None
    if run.eval_dataloader is not None and output.eval_steps and state.step % output.eval_steps == 0:
        eval_metrics = evaluate_and_log(run, state, log)
        logger.info("step %d: %s", state.step, format_metrics(eval_metrics))
    if output.checkpointing_steps and state.step % output.checkpointing_steps == 0:
        save_checkpoint(run, state)
    return eval_metrics


def roll_back(run: Run, state: TrainingState, log, progress, diverged: Diverged,
              rollbacks: int) -> TrainingState:
    """--on_divergence rollback: the newest finite checkpoint from before the divergence is loaded (weights,
    optimizer, schedule, step count), and training goes on with the data where it is, so that the batches since
    that checkpoint are not seen again. One line and one metrics row say so. Without a checkpoint to go back to,
    or past --max_rollbacks, `diverged` stops the run."""
    optimization = run.args.optimization
    if optimization.on_divergence != "rollback":
        raise diverged
    path = newest_checkpoint(run, before=diverged.before)
    if path is None or rollbacks > optimization.max_rollbacks:
        why = "no checkpoint to roll back to" if path is None else f"{optimization.max_rollbacks} rollbacks done"
        raise Diverged(f"{diverged} ({why})") from None
    back = TrainingState.start(run.accelerator.device)
    back.restore(run.checkpoints.load(path, COUNTS), run.accelerator.is_main_process)
    back.epoch, back.batches_in_epoch = state.epoch, state.batches_in_epoch  # the data goes on from here
    if run.accelerator.is_main_process:
        truncate_metrics_log(run.output_dir / "metrics.jsonl", back.step)
    log.write(back.step, {"rollback": rollbacks, "rolled_back_from_step": state.step})
    logger.warning("%s; rolled back to %s (rollback %d of at most %d): training goes on from step %d with the "
                   "batches after step %d", diverged, path, rollbacks, optimization.max_rollbacks, back.step,
                   state.step)
    progress.n = back.step
    progress.refresh()
    return back


def check_skips(run: Run, state: TrainingState, log, progress):
    """--max_consecutive_skips: that many steps skipped in a row (their loss or gradients not finite) stop the run,
    after their window is logged, in every process at the same step (pretraining/training/divergence.py)."""
    limit = run.args.optimization.max_consecutive_skips
    if not limit:
        return  # nothing read: on a GPU the read waits on the step before
    in_a_row = state.consecutive_skips()
    if in_a_row >= limit:
        log_window(run, state, log, progress)
        skipped = int(state.skips[2].cpu())
        # a checkpoint written during the skipped steps holds the weights that lead to them: one from before
        first = state.step - state.consecutive.lag - in_a_row + 1
        raise Diverged(stop_line(state.step, f"{in_a_row} steps in a row (from step {first}) were skipped, their "
                                             f"loss or gradients not finite ({skipped} skipped in all)",
                                 current_lr(run), newest_checkpoint(run, before=first)), before=first)


def evaluate_and_log(run: Run, state: TrainingState, log) -> dict:
    """A collective: held-out metrics, logged with the run's model FLOPs and mean MFU up to here (training time, not
    this evaluation's); a non-finite loss stops the run (pretraining/training/divergence.py)."""
    totals = run.throughput.totals(*state.run_totals(run.accelerator))
    metrics = evaluate(run.model, run.eval_dataloader, run.accelerator, run.args.objective.task)
    log.write(state.step, {**metrics, **totals})
    if run.hub is not None:
        run.hub.latest_eval = metrics  # the next pushed checkpoint's card shows them
    check_losses(metrics, state.step, current_lr(run), lambda: newest_checkpoint(run), "held-out")
    return metrics


def save_checkpoint(run: Run, state: TrainingState) -> Path:
    """A collective: every process calls it at the same step. Non-finite weights are not written: the run stops."""
    check_weights(run.model, run.accelerator, state.step, current_lr(run), lambda: newest_checkpoint(run),
                  f"the step-{state.step} checkpoint")
    pushed = run.hub is not None and run.hub.pushes(state.step)  # --hub_strategy: this step's model (and state)
    sharded = run.accelerator.distributed_type == DistributedType.FSDP  # a checkpoint's weights are shards then
    model = gather_full_model(run.accelerator, run.model) if pushed or sharded else None  # a collective under FSDP
    saved = state.checkpoint_state(run.accelerator)
    path = run.checkpoints.save(state.step, saved, stream_state=None if run.stream is None else run.stream.state_dict(),
                                full_model=model if sharded else None)
    if pushed:
        run.checkpoints.wait_for_record()  # uploaded with the state
        if model is not None:  # its all_results.json names the step and tokens (run_checkpoint_evals.py reads them)
            cost = run.throughput.summary(state.step, saved["run_tokens"] + saved["window_tokens"],
                                          saved["run_seconds"] + saved["window_seconds"])
            run.hub.push_checkpoint(state.step, path, lambda folder: save_final_model(
                model, run.tokenizer, folder, card_run(run.args.model, run.args.data, run.args.objective,
                                                       run.args.optimization, run.args.output),
                run.hub.latest_eval, run.global_batch, run.accelerator.num_processes,
                where=where_trained(run.hardware, run.precision, run.accelerator.num_processes), cost=cost))
    return path


def metrics_log(run: Run) -> MetricsLog:
    return MetricsLog(run.output_dir / "metrics.jsonl", run.accelerator, run.args.output.with_tracking)


def current_lr(run: Run) -> float:
    return float(run.scheduler.get_last_lr()[0])


def newest_checkpoint(run: Run, before: int | None = None) -> Path | None:
    """The checkpoint a diverged run can go back to: the newest complete one with finite weights (of a step before
    `before`, where given)."""
    return newest_finite([path for step, path in run.checkpoints.complete() if before is None or step < before])


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
