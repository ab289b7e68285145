"""A run that diverges stops, and leaves nothing non-finite on disk.

One bad step (a learning rate 10^8 too high, a loss spike, an fp16 overflow that nothing caught) can turn every
weight into NaN, and from then on every step, evaluation and checkpoint is NaN too: the run would spend the rest of
its budget, write NaN checkpoints and rotate the good ones away. It is checked where the host reads numbers anyway,
so a training step reads nothing more from the device:
- the training losses of each logged window and the held-out losses of each evaluation;
- the weights, before a checkpoint or the final folder is written (one flag a process, all-reduced: under FSDP each
  process holds a shard);
- the checkpoints `--resume_from_checkpoint latest` chooses from, which hold non-finite weights when a run that
  did not check its weights saved them: those newer than the newest finite one are renamed `step_N.non-finite`,
  with a line, so that the resumed run writes its own `step_N` (`checkpoints.StepCheckpoints.resolve`).
A non-finite value stops every process with one line (`Diverged`, exit status 2): the step, what was not finite,
the learning rate, the newest checkpoint to go back to, and what to try.
"""

import math
from collections.abc import Callable
from pathlib import Path

import torch

from ...errors import InputError


class Diverged(InputError):
    """The run's losses or weights are no longer finite. `before`: the step from which the run went wrong, where
    known (a run of skipped steps), so that a rollback picks a checkpoint from before it."""

    def __init__(self, line: str, before: int | None = None):
        super().__init__(line)
        self.before = before


def stop_line(step: int, what: str, lr: float, newest: Path | None) -> str:
    back = (
        f"the newest checkpoint, {newest}, has finite weights: run again with --resume_from_checkpoint {newest} "
        "and a lower --learning_rate"
        if newest is not None
        else "no checkpoint was written before it: start over with a lower --learning_rate"
    )
    return f"step {step}: {what} at learning rate {lr:.3g}: the run has diverged; {back}"


def check_losses(metrics: dict, step: int, lr: float, newest: Callable[[], Path | None], what: str) -> None:
    """Diverged when one of `metrics`' losses (the names ending in `_loss`) is not finite. `newest()` finds the
    checkpoint to go back to (it reads weights from disk: only when stopping)."""
    for name, value in metrics.items():
        if name.endswith("_loss") and not math.isfinite(value):
            raise Diverged(stop_line(step, f"the {what} {name} is {value}", lr, newest()))


def local_tensors(model: torch.nn.Module):
    """This process's part of each parameter (its shard under FSDP2, where parameters are DTensors)."""
    for param in model.parameters():
        yield param.to_local() if hasattr(param, "to_local") else param


@torch.no_grad()
def weights_finite(model: torch.nn.Module, accelerator) -> bool:
    """A collective: whether every process's weights are finite."""
    flags = [torch.isfinite(tensor).all() for tensor in local_tensors(model) if tensor.numel()]
    bad = (~torch.stack(flags).all()).to(torch.float32) if flags else torch.zeros((), device=accelerator.device)
    return accelerator.reduce(bad.to(accelerator.device), "sum").item() == 0


def check_weights(model, accelerator, step: int, lr: float, newest: Callable[[], Path | None], before: str) -> None:
    """A collective: Diverged, in every process, when a weight is not finite (before `before` is written)."""
    if not weights_finite(model, accelerator):
        raise Diverged(stop_line(step, f"a weight is not finite, so {before} was not written", lr, newest()))


def checkpoint_finite(path: Path) -> bool | None:
    """Whether the model weights a checkpoint folder holds are finite: None when it holds no safetensors weights
    (an FSDP checkpoint saved as shards), which is not read here."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("model*.safetensors"))
    if not files:
        return None
    for file in files:
        with safe_open(file, framework="pt") as weights:
            for name in weights.keys():
                tensor = weights.get_tensor(name)
                if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                    return False
    return True


def newest_finite(candidates: list[Path]) -> Path | None:
    """The newest of `candidates` (oldest first) whose weights are finite, or cannot be read here."""
    return next((path for path in reversed(candidates) if checkpoint_finite(path) is not False), None)
