"""What a run's speed is worth, as every logged row says it: model TFLOP/s and MFU, and the memory it holds.

    model_tflops_per_second = F x tokens_per_second / 1e12     F: model FLOPs per token of a training step (flops.py)
    mfu                     = model_tflops_per_second / (devices x peak)

`tokens_per_second` counts the real tokens of the whole run (every process; padding is not work), so MFU is the
share of the devices' peak that went into the model's useful FLOPs. The peak is per device and stated with its
source (`hardware.mfu_peak`): a GPU's dense spec peak for the precision in use, or --peak_tflops.
"""

import resource
import sys
from dataclasses import dataclass

import torch

from .hardware import Peak

GIB = 2**30


def flop_rates(flops_per_second: float, devices: int, peak: Peak | None) -> dict:
    """`model_tflops_per_second` and, with a peak, `mfu` (against every device's peak), for the model FLOPs a second
    of all processes."""
    tflops = flops_per_second / 1e12
    return {"model_tflops_per_second": tflops, **({"mfu": tflops / (devices * peak.tflops)} if peak else {})}


@dataclass(frozen=True)
class Throughput:
    flops_per_token: float  # model FLOPs of a training step (forward and backward) per token
    devices: int  # the run's processes, one device each
    peak: Peak | None  # per device; None: no MFU is logged

    def rates(self, tokens_per_second: float) -> dict:
        """`model_tflops_per_second` and, with a peak, `mfu`, for a window's token rate over all processes."""
        return flop_rates(self.flops_per_token * tokens_per_second, self.devices, self.peak)

    def totals(self, tokens: float, seconds: float) -> dict:
        """The run's summary: its tokens and total model FLOPs, and its mean rate and MFU over `seconds` of
        training."""
        found = {"total_tokens": tokens, "total_model_flops": self.flops_per_token * tokens}
        if seconds > 0:
            mean = self.rates(tokens / seconds)
            found["mean_model_tflops_per_second"] = mean["model_tflops_per_second"]
            if "mfu" in mean:
                found["mean_mfu"] = mean["mfu"]
        return found

    def summary(self, steps: int, tokens: float, seconds: float) -> dict:
        """The run's cost after `steps` (`COST_FIELDS`): all_results.json's and the card's, at the end and in each
        checkpoint pushed to the Hub."""
        return {"train_steps": steps, **self.totals(tokens, seconds), **self.peak_said()}

    def peak_said(self) -> dict:
        """{"mfu_peak": "989 TFLOP/s (H100 SXM, bf16 dense)"}: the peak of `mfu` and `mean_mfu`, for the summaries;
        {} without one."""
        return {"mfu_peak": self.peak.describe()} if self.peak is not None else {}


# what a run's summaries hold of its cost (all_results.json, the card's training table): the steps, `Throughput.totals`
# and `peak_said`
COST_FIELDS = (
    "train_steps",
    "total_tokens",
    "total_model_flops",
    "mean_model_tflops_per_second",
    "mean_mfu",
    "mfu_peak",
)


def cost_rows(cost: dict) -> dict:
    """A summary's `cost` as the card's training table says it."""
    rows = {}
    if "total_tokens" in cost:
        rows["tokens"] = f"{cost['total_tokens']:,.0f}"
    if "total_model_flops" in cost:
        rows["model FLOPs"] = f"{cost['total_model_flops']:.3g}"
    if "mean_model_tflops_per_second" in cost:
        rows["model TFLOP/s (mean)"] = f"{cost['mean_model_tflops_per_second']:.3g}"
    if "mean_mfu" in cost:
        rows["MFU (mean)"] = f"{cost['mean_mfu']:.2%} of {cost['mfu_peak']} a device"
    return rows


def peak_memory_gib(device: torch.device) -> float:
    """A GPU's peak allocated memory since the process began (torch's allocator, no device read); on a CPU the
    process's peak resident memory: Linux's VmHWM, which starts afresh with the program (getrusage's maximum keeps
    the parent's from before the fork, a launcher's or a notebook's)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    try:
        with open("/proc/self/status") as status:
            return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) * 1024 / GIB
    except (OSError, StopIteration):  # not Linux: the kernel's maximum, in KiB (bytes on macOS)
        scale = 1 if sys.platform == "darwin" else 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / GIB
