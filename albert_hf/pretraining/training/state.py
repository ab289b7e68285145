"""Where the pretraining loop stands (`TrainingState`: what a checkpoint saves besides the model, the optimizer, the
schedule, the RNGs and the data position), and `LaggedRead`, how it reads a device scalar without waiting."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import InputError
from ...runtime.throughput import Throughput, peak_memory_gib
from .evaluation import metrics_from_counts
from .step import COUNTS, GRAD_NORM

STATE_FILE = "training_state.json"  # a checkpoint's copy of the state, written last: a step_N without it is none

# `window_sums`, by index after the six counts: the window's real tokens, its seconds spent waiting for batches, then
# each source's [tokens, pairs] (SOURCE_TOKENS, SOURCE_PAIRS)
WINDOW_TOKENS, WINDOW_WAIT, WINDOW_SOURCES = COUNTS, COUNTS + 1, COUNTS + 2
SOURCE_TOKENS, SOURCE_PAIRS = 0, 1
# `skips`, by index: the steps skipped in the window, in a row up to the last step, and in all
IN_WINDOW, IN_A_ROW, IN_ALL = 0, 1, 2


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
    # A mixed run's sources: this process's [tokens, pairs] of each in the window, on the device (read when
    # logged); the run's closed windows' (all processes), on the host; the last logged (window, run) totals.
    source_names: tuple[str, ...] = ()
    source_window: torch.Tensor | None = None
    source_run: np.ndarray | None = None
    source_totals: tuple | None = None

    @classmethod
    def start(cls, device: torch.device, source_names=()) -> "TrainingState":
        state = cls(
            torch.zeros(COUNTS, dtype=torch.float64, device=device),
            torch.zeros((), dtype=torch.float64, device=device),
            time.perf_counter(),
            torch.zeros(3, dtype=torch.float64, device=device),
            LaggedRead(device),
            torch.full((), -1.0, dtype=torch.float64, device=device),
        )
        state.resize_sources(source_names)
        return state

    def resize_sources(self, names) -> None:
        """The per-source counts for `names` (a resumed mix may add sources), the counts kept by name."""
        names = tuple(names)
        old = dict(zip(self.source_names, range(len(self.source_names))))
        window = torch.zeros((len(names), 2), dtype=torch.float64, device=self.window.device)
        run = np.zeros((len(names), 2))
        for i, name in enumerate(names):
            if name in old:
                window[i] = self.source_window[old[name]]
                run[i] = self.source_run[old[name]]
        self.source_names, self.source_window, self.source_run = names, window, run

    def restore(self, saved: dict, main_process: bool):
        """The position of a checkpoint's training state (checked by StepCheckpoints.load); its window on the main
        process, which holds the sums; the skip counts in every process."""
        self.step, self.epoch, self.batches_in_epoch = saved["step"], saved["epoch"], saved["batches_in_epoch"]
        self.skips.copy_(
            torch.tensor(
                [saved.get("window_skipped", 0), saved.get("consecutive_skips", 0), saved.get("skipped_steps", 0)],
                dtype=torch.float64,
            )
        )
        self.consecutive.record(self.skips[IN_A_ROW], self.step)
        self.run_tokens, self.run_seconds = saved.get("run_tokens", 0.0), saved.get("run_seconds", 0.0)
        counts = saved.get("sources", {})
        for i, name in enumerate(self.source_names):
            self.source_run[i] = counts.get(name, {}).get("run", (0.0, 0.0))
            if main_process:
                self.source_window[i] = torch.tensor(
                    counts.get(name, {}).get("window", (0.0, 0.0)), dtype=torch.float64
                )
        if main_process and "window" in saved:
            self.window = torch.tensor(saved["window"], dtype=torch.float64, device=self.window.device)
            self.window_tokens.fill_(saved["window_tokens"])
            self.window_start = time.perf_counter() - saved["window_seconds"]
            self.window_data_wait = saved.get("window_data_wait", 0.0)

    def add_step(self, outputs: torch.Tensor, micro_batches, gate: torch.Tensor | None, sources=None):
        """One optimizer step done (`outputs`: a training step's counts and gradient norm): its counts (none for a
        skipped step, `gate` 0) and real tokens into the window, its norm kept; a mixed run's tokens and pairs per
        source (`sources`: each micro-batch's source indices), on the device."""
        for batch, source in zip(micro_batches, sources or ()):
            tokens = batch["attention_mask"].sum(1, dtype=torch.float64)
            self.source_window.index_add_(0, source, torch.stack((tokens, torch.ones_like(tokens)), 1))  # SOURCE_*
        counts = outputs[:COUNTS]
        self.grad_norm.copy_(outputs[GRAD_NORM])
        if gate is not None:
            skipped = 1.0 - gate.to(torch.float64)
            self.window += torch.where(skipped > 0, 0.0, counts)  # a skipped step's counts may hold NaN
            one = torch.ones((), dtype=torch.float64, device=skipped.device)
            # in the window += s; in a row = (in a row + 1) s; in all += s (IN_WINDOW, IN_A_ROW, IN_ALL)
            self.skips.mul_(torch.stack((one, skipped, one))).add_(skipped)
        else:
            self.window += counts
        for batch in micro_batches:
            self.window_tokens += batch["attention_mask"].sum()
        self.step += 1
        self.consecutive.record(self.skips[IN_A_ROW], self.step)

    def consecutive_skips(self) -> int:
        """Steps skipped in a row up to the last one (on a GPU: up to the one before, not to wait for the last)."""
        return int(self.consecutive.read(self.step))

    def next_epoch(self):
        self.epoch += 1
        self.batches_in_epoch = 0

    def window_sums(self, accelerator) -> torch.Tensor:
        """A collective: the six counts, the real tokens, the seconds spent waiting for batches, then a mixed run's
        [tokens, pairs] of each source, summed over all processes."""
        wait = torch.full((1,), self.window_data_wait, dtype=torch.float64, device=self.window.device)
        return accelerator.reduce(
            torch.cat([self.window, self.window_tokens.view(1), wait, self.source_window.flatten()]), "sum"
        ).cpu()

    def run_totals(self, accelerator) -> tuple[float, float]:
        """A collective: the run's real tokens (all processes) and wall seconds of training up to now."""
        tokens = float(self.window_sums(accelerator)[WINDOW_TOKENS])
        return self.run_tokens + tokens, self.run_seconds + time.perf_counter() - self.window_start

    def window_metrics(self, accelerator, pair_task: str, lr: float, throughput: Throughput) -> dict:
        """A collective: the window's means, its learning rate, token rate and what `throughput` makes of it (model
        TFLOP/s, MFU), last gradient norm (None when that step was not finite), share of time spent waiting for
        batches (the processes' mean), peak memory (the processes' most) and skipped steps; then a new window
        begins."""
        elapsed = time.perf_counter() - self.window_start
        sums = self.window_sums(accelerator)
        metrics = metrics_from_counts(sums[:COUNTS], pair_task=pair_task)
        tokens, wait = float(sums[WINDOW_TOKENS]), float(sums[WINDOW_WAIT])
        metrics.update(lr=lr, tokens_per_second=tokens / elapsed, **throughput.rates(tokens / elapsed))
        norm = float(self.grad_norm.cpu())
        if norm != -1.0:  # -1: no norm known (DeepSpeed)
            metrics["grad_norm"] = norm if math.isfinite(norm) else None
        metrics["data_wait"] = wait / accelerator.num_processes / elapsed
        memory = torch.tensor([peak_memory_gib(accelerator.device)], device=accelerator.device)
        metrics["peak_memory_gib"] = float(accelerator.gather(memory).max().cpu())
        skipped = int(self.skips[IN_WINDOW].cpu())
        if skipped:
            metrics["skipped_steps"] = skipped
        self.run_tokens += tokens
        self.run_seconds += elapsed
        window = sums[WINDOW_SOURCES:].numpy().reshape(-1, 2)
        self.source_run += window
        self.source_totals = (window, self.source_run.copy())
        self.source_window.zero_()
        self.window.zero_()
        self.window_tokens.zero_()
        self.skips[IN_WINDOW].zero_()
        self.window_data_wait = 0.0
        self.window_start = time.perf_counter()
        return metrics

    def checkpoint_state(self, accelerator) -> dict:
        """A collective: what a checkpoint saves of the state (the window summed over processes)."""
        totals = self.window_sums(accelerator).tolist()
        sums, tokens, wait = totals[:COUNTS], totals[WINDOW_TOKENS], totals[WINDOW_WAIT]
        sources = totals[WINDOW_SOURCES:]
        window_skipped, consecutive, skipped = self.skips.cpu().tolist()
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batches_in_epoch": self.batches_in_epoch,
            "skipped_steps": int(skipped),
            "window_skipped": int(window_skipped),
            "consecutive_skips": int(consecutive),
            "window": sums,
            "window_tokens": tokens,
            "window_seconds": time.perf_counter() - self.window_start,
            "window_data_wait": wait,
            "run_tokens": self.run_tokens,
            "run_seconds": self.run_seconds,
            **(
                {
                    "sources": {
                        name: {"window": sources[2 * i : 2 * i + 2], "run": self.source_run[i].tolist()}
                        for i, name in enumerate(self.source_names)
                    }
                }
                if self.source_names
                else {}
            ),
        }


def checked_position(path: Path, state, window_length: int) -> dict:
    """The loop's position in `state` (read from `path`'s STATE_FILE), checked: the position, and the logging
    window of `window_length` sums when saved."""
    positions = ("step", "epoch", "batches_in_epoch")
    if not isinstance(state, dict) or not all(type(state.get(key)) is int and state[key] >= 0 for key in positions):
        raise InputError(
            f"--resume_from_checkpoint {path}: {STATE_FILE} does not hold the loop's position "
            f"({', '.join(positions)}: integers >= 0)"
        )
    if "window" in state:
        sums = state["window"]
        if not (
            isinstance(sums, list)
            and len(sums) == window_length
            and all(type(v) in (int, float) for v in [*sums, state.get("window_tokens"), state.get("window_seconds")])
        ):
            raise InputError(
                f"--resume_from_checkpoint {path}: the logging window in its training state is "
                f"not {window_length} + 2 numbers"
            )
    skips = ("skipped_steps", "window_skipped", "consecutive_skips")  # written since skipped steps were counted
    if not all(type(state.get(key, 0)) is int and state.get(key, 0) >= 0 for key in skips):
        raise InputError(
            f"--resume_from_checkpoint {path}: {STATE_FILE}: the skipped-step counts "
            f"({', '.join(skips)}) are not integers >= 0"
        )
    totals = ("window_data_wait", "run_tokens", "run_seconds")  # 0 where a checkpoint has none
    if not all(
        type(state.get(key, 0)) in (int, float) and math.isfinite(state.get(key, 0)) and state.get(key, 0) >= 0
        for key in totals
    ):
        raise InputError(
            f"--resume_from_checkpoint {path}: {STATE_FILE}: the run's totals ({', '.join(totals)}) "
            "are not finite numbers >= 0"
        )
    counts = state.get("sources", {})  # a mixed run's [tokens, pairs] of each source (its plan: "mix")
    if not (
        isinstance(counts, dict)
        and all(
            isinstance(pair, dict)
            and all(
                isinstance(pair.get(key), list)
                and len(pair[key]) == 2
                and all(type(v) in (int, float) and math.isfinite(v) and v >= 0 for v in pair[key])
                for key in ("window", "run")
            )
            for pair in counts.values()
        )
    ):
        raise InputError(
            f"--resume_from_checkpoint {path}: {STATE_FILE}: the sources' counts are not [tokens, "
            "pairs] of the window and of the run for each source"
        )
    return state
