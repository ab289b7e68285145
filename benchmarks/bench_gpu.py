"""Pretraining steps at the shapes users run, on one GPU: albert_hf against transformers' ALBERT and the GPU's peak.

    python benchmarks/bench_gpu.py --out bench_gpu.json       # the shapes below on the first GPU, bf16 (~3 minutes)
    python benchmarks/bench_gpu.py --device cpu --mode fp32 --shapes tiny:4x32 tiny:auto:64 --windows 2 \\
        --window_steps 1 --out /tmp/bench.json                # the suite's run

Shapes are PRESET:BATCHxSEQ, or PRESET:auto:SEQ for the largest batch (doubling from 8) whose training step fits.
The defaults: base 32 x 128 (where the host, not the GPU, limits), base 128 x 128 (phase 1 of the recipe), base
32 x 512 (`recipes/base.yaml` per device), large 16 x 512, xxlarge at 512 with its largest batch.

For each shape, both implementations hold the same weights and train on the same batches (20 masked positions a
sequence, as the official max_predictions_per_seq, given to albert_hf in the collator's fixed-size form; SOP
labels), with LAMB and global clipping at 1.0, under bf16 autocast (`--mode`), both on SDPA attention (pinned).
After `--warmup` steps each, `--windows` windows of `--window_steps` steps alternate between the implementations
(who goes first alternates too); each window is timed with CUDA events. Reported per implementation:
- tokens/s: the median over the windows;
- TFLOP/s by the model's FLOPs (`bench_model.albert_flops`: every layer at every position, the MLM head at the masked
  positions), and by the FLOPs each one executes (albert_hf's last layer only at [CLS] and the masked rows,
  transformers' MLM head at every position); both tested against torch's FlopCounterMode;
- MFU of each against the GPU's dense spec peak (`albert_hf.runtime.hardware.gpu_peak`, by device name; bf16's
  column, or TF32's for `--mode fp32`; an unknown GPU gets none) and against the same-run `F.linear` rate at the
  model's GEMM shapes with this batch's tokens, mixed as a layer has them, each shape timed over back-to-back calls
  (`gemm_rate`);
- the SDPA kernel each one ran (flash, efficient, cuDNN, math), read from the aten ops of a profiled step;
- peak memory of a step: what the step allocates above the memory in use before it (its gradients included), plus
  the implementation's parameters and optimizer state; none for steps that replay CUDA graphs;
- host syncs in one training step (`torch.cuda.set_sync_debug_mode`, reported only once a planted `.item()` read 1),
  and the share of the step that clipping and LAMB's update take (timed apart from the forward and backward), for
  ours.
Variants of albert_hf: `--unmasked` (no attention mask: the rows are full), `--compile_modes` at `--compile_shapes`
(compiled as `run_pretraining.py --torch_compile_mode MODE` compiles it on a GPU: `compile_blocks(dynamic=False,
mode=MODE)`, each mode's compile time printed as it finishes), and `--graph_shapes`: the whole step (forward,
backward, clipping, LAMB) captured as one CUDA graph (`WholeStepGraph`), of the eager model and of the model compiled
in the first of `--compile_modes`, with its losses beside eager's on the same batches. Writes one JSON file (after
every shape, so a run stopped by a time limit keeps what it measured) and prints a table last.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from albert_hf.runtime.hardware import gpu_peak
from bench_model import MASKED_PER_SEQ, albert_flops, make_batch

DEFAULT_SHAPES = ["base:32x128", "base:128x128", "base:32x512", "large:16x512", "xxlarge:auto:512"]


def spec_peak(device: torch.device, mode: str = "bf16") -> float | None:
    """The GPU's dense spec peak for `mode`'s matmuls (bf16: the 16-bit column, fp32: TF32, as `--mode fp32` runs);
    None off albert_hf's table (`runtime.hardware.GPU_PEAK_TFLOPS`)."""
    if device.type != "cuda":
        return None
    peak = gpu_peak(torch.cuda.get_device_name(device), "no" if mode == "fp32" else "bf16", tf32=True)
    return None if peak is None else peak.tflops


@dataclass
class Shape:
    preset: str
    batch: int | None  # None: the largest that fits
    seq: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        preset, _, rest = text.partition(":")
        if rest.startswith("auto:"):
            return cls(preset, None, int(rest.split(":")[1]))
        batch, _, seq = rest.partition("x")
        return cls(preset, int(batch), int(seq))

    def name(self, batch: int | None = None) -> str:
        return f"{self.preset} {batch or self.batch} x {self.seq}"


class Clock:
    """Seconds of GPU work between start() and stop(), by CUDA events; wall seconds on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.begin, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.begin.record()
        else:
            self.begin = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.end.record()
            self.end.synchronize()
            return self.begin.elapsed_time(self.end) / 1000
        return time.perf_counter() - self.begin


def build(preset: str, seq: int, device: torch.device):
    """Both implementations on `device`, with the same weights, each with its LAMB, both on SDPA attention."""
    import transformers

    import albert_hf
    from albert_hf.optimization import Lamb, parameter_groups

    config = albert_hf.AlbertHFConfig.from_preset(preset, max_position_embeddings=max(512, seq))
    torch.manual_seed(0)
    with device:
        ours = albert_hf.AlbertHFForPreTraining(config)
        theirs = transformers.AlbertForPreTraining(config.to_albert_config())
    theirs.load_state_dict(ours.state_dict())
    runners = {}
    for name, model in (("transformers", theirs), ("albert_hf", ours)):
        model.set_attn_implementation("sdpa")  # pinned: the default could change with transformers' version
        model.train()
        runners[name] = Runner(
            model, Lamb(parameter_groups(model), lr=1e-4), drop=OURS_ONLY if name == "transformers" else ()
        )
    return config, runners


OURS_ONLY = ("masked_lm_positions", "masked_lm_weights")  # the collator's fixed-size positions; transformers has none


def forward_backward(model, batch, dtype, cache: bool = True) -> torch.Tensor:
    # autocast's weight-cast cache must be off inside a CUDA graph capture (torch.cuda.graphs' docs)
    with torch.autocast(batch["input_ids"].device.type, dtype=dtype, enabled=dtype is not None, cache_enabled=cache):
        loss = model(**batch).loss
    loss.backward()
    return loss


def update(model, optimizer):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_step(model, optimizer, batch, dtype):
    forward_backward(model, batch, dtype)
    update(model, optimizer)


class WholeStepGraph:
    """Forward, backward, clipping and LAMB's update captured as one CUDA graph over static input buffers (the
    whole-network capture of torch.cuda.graphs, as MLPerf's BERT runs it); a step copies its batch into the buffers
    and replays. The warm-up steps the capture needs are undone (weights restored, moments zeroed), so the graph
    starts where the eager model stands. The learning rate is the one at capture."""

    def __init__(self, model, optimizer, batch: dict, dtype, warmup: int = 3):
        self.static = {k: v.clone() for k, v in batch.items()}
        weights = [p.detach().clone() for p in model.parameters()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):  # allocations and lazy state (LAMB's moments) happen outside the capture
                train_step(model, optimizer, self.static, dtype)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss = forward_backward(model, self.static, dtype, cache=False)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        with torch.no_grad():
            for param, weight in zip(model.parameters(), weights):
                param.copy_(weight)
            for state in optimizer.state.values():
                for value in state.values():
                    value.zero_() if isinstance(value, torch.Tensor) else None

    def replay(self, batch: dict) -> torch.Tensor:
        for key, value in batch.items():
            self.static[key].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.loss


@dataclass
class Runner:
    """One implementation's training step: its model, optimizer, the batch keys it does not take, and for a
    whole-step graph the captured graph."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    drop: tuple = ()
    graph: WholeStepGraph | None = None
    compile_mode: str = ""

    def inputs(self, batch: dict) -> dict:
        return {k: v for k, v in batch.items() if k not in self.drop}

    def step(self, batch: dict, dtype) -> None:
        if self.graph is not None:
            self.graph.replay(self.inputs(batch))
        else:
            train_step(self.model, self.optimizer, self.inputs(batch), dtype)

    @property
    def replays_graphs(self) -> bool:
        """Whether a step replays CUDA graphs (whole-step, or compiled with reduce-overhead), which hide their ops."""
        return self.graph is not None or "reduce-overhead" in self.compile_mode

    def capture(self, batch: dict, dtype) -> "Runner":
        self.graph = WholeStepGraph(self.model, self.optimizer, self.inputs(batch), dtype)
        return self


def copy_runner(runner: Runner, drop: tuple = ()) -> Runner:
    """A deep copy of `runner`'s model with a fresh LAMB (no state yet, as the original before its first step)."""
    import copy

    from albert_hf.optimization import Lamb, parameter_groups

    model = copy.deepcopy(runner.model)
    return Runner(model, Lamb(parameter_groups(model), lr=1e-4), drop=drop or runner.drop)


def update_share(runner: Runner, batches, dtype, device, steps: int) -> float:
    """The share of a training step spent in clipping and the optimizer's update, timed apart (CUDA events)."""
    clock, parts = Clock(device), {"model": 0.0, "update": 0.0}
    for i in range(steps):
        clock.start()
        forward_backward(runner.model, runner.inputs(batches[i % 2]), dtype)
        parts["model"] += clock.stop()
        clock.start()
        update(runner.model, runner.optimizer)
        parts["update"] += clock.stop()
    return parts["update"] / (parts["model"] + parts["update"])


def persistent_bytes(model, optimizer) -> int:
    """Parameters and the optimizer's state: what stays allocated between steps (gradients are freed by
    zero_grad(set_to_none=True) and allocated again inside the step, so the step's own peak counts them)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    return params + state


def step_peak_gib(runner: Runner, batch, dtype, device) -> float | None:
    """Peak memory of one training step of this implementation alone (see the module docstring); None where the step
    replays CUDA graphs, whose memory pools stay allocated between steps and so are not in the step's peak."""
    if device.type != "cuda" or runner.replays_graphs:
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    runner.step(batch, dtype)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before + persistent_bytes(runner.model, runner.optimizer)) / 2**30


def count_syncs(fn) -> int:
    """Synchronizing CUDA calls made by `fn()`, as torch's sync debug mode warns of them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def host_syncs(step, device: torch.device, planted=None) -> dict:
    """Host syncs in one call of `step`, once the counter has shown that it counts: one planted `.item()` (after one
    uncounted, as the first call can warn twice) must read 1, else the count is None: a 0 from a counter that sees
    nothing would mean nothing."""
    if device.type != "cuda":
        return {"host_syncs_per_step": None, "planted_item_counted": None}
    planted = planted or (lambda: torch.ones(1, device=device).item())
    count_syncs(planted)
    counted = count_syncs(planted)
    return {"host_syncs_per_step": count_syncs(step) if counted == 1 else None, "planted_item_counted": counted}


# SDPA's kernels as the aten ops that launch them (their forward; the backward op is named after it)
SDPA_KERNELS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cuDNN",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def attention_kernels(runner: Runner, batch, dtype) -> list[str]:
    """Which of SDPA's kernels one forward and backward of this runner ran (by the aten ops the profiler saw), or
    'matmul + softmax' when no SDPA op ran (albert_hf's CPU training path)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        forward_backward(runner.model, runner.inputs(batch), dtype)
    runner.optimizer.zero_grad(set_to_none=True)
    names = {event.name for event in profile.events()}
    return sorted({kernel for op, kernel in SDPA_KERNELS.items() if op in names}) or ["matmul + softmax"]


def gemm_rate(config, tokens: int, dtype, device, calls: int = 20) -> dict:
    """The same-run MFU denominator: `F.linear` TFLOP/s at the model's GEMM shapes with this step's tokens, mixed as
    a layer has them (4 of H->H, one H->I, one I->H). Each shape runs `calls` times back to back between two
    CUDA events: one sync per call would time the launch gap too (226 against 569 TFLOP/s at a small shape)."""
    import torch.nn.functional as F

    h, i, clock = config.hidden_size, config.intermediate_size, Clock(device)
    rates, total_flops, total_s = {}, 0.0, 0.0
    for (inputs, outputs), count in (((h, h), 4), ((h, i), 1), ((i, h), 1)):
        made = dict(dtype=dtype, device=device)
        x, w = torch.randn(tokens, inputs, **made), torch.randn(outputs, inputs, **made)
        b = torch.randn(outputs, **made)
        for _ in range(3):
            F.linear(x, w, b)
        clock.start()
        for _ in range(calls):
            F.linear(x, w, b)
        seconds, flops = clock.stop(), 2 * tokens * inputs * outputs * calls
        rates[f"{tokens}x{inputs}->{outputs}"] = flops / seconds / 1e12
        total_flops, total_s = total_flops + count * flops, total_s + count * seconds
    return {"mixed": total_flops / total_s / 1e12, **rates}


def executed_flops(config, batch: int, seq: int, name: str) -> float:
    """FLOPs the implementation runs: albert_hf's last layer only at [CLS] and the masked rows; transformers' MLM
    head at every position."""
    if name == "transformers":
        return albert_flops(config, batch, seq, MASKED_PER_SEQ, mlm_rows_per_seq=seq)
    return albert_flops(config, batch, seq, MASKED_PER_SEQ, last_layer_queries=MASKED_PER_SEQ + 1)


def batches_for(config, batch: int, seq: int, device: torch.device) -> list[dict]:
    """Two batches as run_pretraining.py's collator gives them on a GPU: full rows, and for albert_hf the masked
    positions in the fixed-size form (MASKED_PER_SEQ a row), so that no size is read from the device."""
    from albert_hf.pretraining.data.collator import fixed_size_positions

    generator, batches = torch.Generator().manual_seed(0), []
    for _ in range(2):
        made = make_batch(config, batch, seq, generator)
        positions, weights = fixed_size_positions(made["labels"].numpy(), MASKED_PER_SEQ)
        made.update(masked_lm_positions=torch.from_numpy(positions), masked_lm_weights=torch.from_numpy(weights))
        batches.append({k: v.to(device) for k, v in made.items()})
    return batches


def largest_batch(shape: Shape, device: torch.device, dtype, limit: int) -> int:
    """The largest batch (8, 16, 32, ... up to `limit`) at which albert_hf's training step fits on the device."""
    config, runners = build(shape.preset, shape.seq, device)
    ours = runners.pop("albert_hf")
    del runners
    fits, batch = 0, 8
    while batch <= limit:
        try:
            ours.step(batches_for(config, batch, shape.seq, device)[0], dtype)
            torch.cuda.synchronize(device) if device.type == "cuda" else None
            fits, batch = batch, batch * 2
        except torch.OutOfMemoryError:
            break
        finally:
            ours.optimizer.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    del ours
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return fits


def compiled_runner(ours: Runner, mode: str) -> Runner:
    # what run_pretraining.py --torch_compile_mode MODE does on a GPU: the blocks and the head with its loss
    runner = copy_runner(ours)
    runner.model.compile_blocks(dynamic=False, mode=mode)
    runner.compile_mode = mode
    return runner


def graph_check(ours: Runner, batches, dtype, compile_mode: str | None = None, steps: int = 4) -> tuple[Runner, dict]:
    """A whole-step graph of albert_hf (its blocks compiled first in `compile_mode`, if given), and its losses beside
    eager's from the same weights on the same batches."""
    eager, graphed = copy_runner(ours), compiled_runner(ours, compile_mode) if compile_mode else copy_runner(ours)
    graphed.capture(batches[0], dtype)
    losses = []
    for i in range(steps):
        batch = batches[i % 2]
        eager_loss = forward_backward(eager.model, eager.inputs(batch), dtype)
        update(eager.model, eager.optimizer)
        losses.append((eager_loss.item(), graphed.graph.replay(graphed.inputs(batch)).item()))
    worst = max(abs(a - b) / abs(a) for a, b in losses)
    return graphed, {"eager_and_graph_losses": losses, "largest_relative_difference": worst}


def time_runners(runners: dict, batches, dtype, device, args, result: dict) -> dict:
    """Median seconds a step of each runner, over windows that alternate between them (after the warm-up)."""
    clock = Clock(device)
    for name, runner in list(runners.items()):
        try:
            for i in range(args.warmup):
                runner.step(batches[i % 2], dtype)
        except torch.OutOfMemoryError:  # transformers' step can need more than the batch ours was sized for
            del runners[name], runner
            result[name] = {"error": f"out of memory at batch {batches[0]['input_ids'].shape[0]}"}
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    seconds = {name: [] for name in runners}
    for window in range(args.windows):
        order = list(runners) if window % 2 == 0 else list(reversed(runners))
        for name in order:
            clock.start()
            for i in range(args.window_steps):
                runners[name].step(batches[i % 2], dtype)
            seconds[name].append(clock.stop() / args.window_steps)
    return {name: statistics.median(times) for name, times in seconds.items()}


def add_variants(runners: dict, shape: Shape, batch: int, batches, dtype, args, result: dict, compile_modes, graphed):
    """albert_hf without the attention mask (`--unmasked`), compiled in each mode, and as a whole-step graph."""
    ours = runners["albert_hf"]
    if args.unmasked:  # every row is full: no mask lets SDPA choose its flash kernel
        runners["albert_hf unmasked"] = copy_runner(ours, drop=("attention_mask",))
    for mode in compile_modes:
        name = f"albert_hf compiled ({mode})"
        start = time.perf_counter()
        runners[name] = compiled_runner(ours, mode)
        for i in range(2):  # the first step compiles; the second shows a recompile if there is one
            runners[name].step(batches[i % 2], dtype)
        torch.cuda.synchronize() if batches[0]["input_ids"].is_cuda else None
        result[f"{name} compile_s"] = round(time.perf_counter() - start, 1)
        print(f"{shape.name(batch)}: {name} compiled and ran 2 steps in {result[f'{name} compile_s']} s", flush=True)
    if graphed:  # the whole step as one CUDA graph: eager, and compiled in the first mode asked for
        for mode in [None] + compile_modes[:1]:
            name = "albert_hf whole-step graph" + (f" of compiled ({mode})" if mode else "")
            start = time.perf_counter()
            try:
                runners[name], result[f"{name} check"] = graph_check(ours, batches, dtype, mode)
                result[f"{name} capture_s"] = round(time.perf_counter() - start, 1)
                print(f"{shape.name(batch)}: {name}: {json.dumps(result[f'{name} check'])}", flush=True)
            except Exception as error:  # noqa: BLE001 - recorded; the others still run
                result[name] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
                print(f"{shape.name(batch)}: {name}: {result[name]['error']}", flush=True)


def bench_shape(shape: Shape, batch: int, device, dtype, args, compile_modes: list[str], graphed=False) -> dict:
    config, runners = build(shape.preset, shape.seq, device)
    batches = batches_for(config, batch, shape.seq, device)
    result = {
        "preset": shape.preset,
        "batch": batch,
        "seq": shape.seq,
        "tokens_per_step": batch * shape.seq,
        "parameters": sum(p.numel() for p in runners["albert_hf"].model.parameters()),
    }
    add_variants(runners, shape, batch, batches, dtype, args, result, compile_modes, graphed)
    step_seconds = time_runners(runners, batches, dtype, device, args, result)
    flops = albert_flops(config, batch, shape.seq, MASKED_PER_SEQ)
    peak = spec_peak(device, args.mode)
    gemm = gemm_rate(config, batch * shape.seq, dtype or torch.float32, device)
    for name, runner in runners.items():
        step_s = step_seconds[name]
        tflops, executed = flops / step_s / 1e12, executed_flops(config, batch, shape.seq, name) / step_s / 1e12
        result[name] = {
            "tokens_per_s": batch * shape.seq / step_s,
            "step_ms": step_s * 1000,
            "tflops": tflops,
            "tflops_executed": executed,
            "mfu_spec": tflops / peak if peak else None,
            "mfu_spec_executed": executed / peak if peak else None,
            "mfu_gemm": tflops / gemm["mixed"],
            "peak_gib": step_peak_gib(runner, batches[0], dtype, device),
            "attention": [
                f"{kernel} (as eager: a CUDA graph hides its ops)" for kernel in result["albert_hf"]["attention"]
            ]
            if runner.replays_graphs
            else attention_kernels(runner, batches[0], dtype),
        }
    if "albert_hf" in runners:
        ours, first = runners["albert_hf"], batches[0]
        result["albert_hf"].update(host_syncs(lambda: ours.step(first, dtype), device))
        result["albert_hf"]["update_share"] = update_share(ours, batches, dtype, device, args.window_steps)
    result["gemm_peak_tflops"], result["gemm_rates_tflops"] = gemm["mixed"], gemm
    result["spec_peak_tflops"], result["flops_per_step"] = peak, flops
    if "transformers" in runners and "albert_hf" in runners:
        result["ratio"] = result["albert_hf"]["tokens_per_s"] / result["transformers"]["tokens_per_s"]
    del runners, batches
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return result


def percent(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def print_table(report: dict):
    print(
        f"\n{report['device_name']}, {report['mode']}, LAMB; MFU against the spec peak "
        f"({report['spec_peak_tflops'] or 'unknown'} TFLOP/s) by the model's FLOPs and by the FLOPs each side "
        "executes, and against the same-run F.linear rate at the model's shapes"
    )
    shares = [
        f"{row['preset']} {row['batch']} x {row['seq']} {percent(row['albert_hf']['update_share'])}"
        for row in report["shapes"]
        if "update_share" in row.get("albert_hf", {})
    ]
    print(f"albert_hf's clipping and LAMB update, share of the step: {', '.join(shares) or '-'}")
    print(
        "| shape | implementation | tokens/s | step ms | TFLOP/s executed | MFU spec | MFU spec executed | "
        "MFU GEMM | attention | peak GiB | ours/theirs |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for row in report["shapes"]:
        if "error" in row:
            print(f"| {row['shape']} | - | {row['error']} | | | | | | | | |")
            continue
        theirs = row.get("transformers", {}).get("tokens_per_s")
        for name in [
            k for k, v in row.items() if isinstance(v, dict) and not k.endswith("check") and k != "gemm_rates_tflops"
        ]:
            cell = row[name]
            if "error" in cell:
                print(f"| {row['preset']} {row['batch']} x {row['seq']} | {name} | {cell['error']} | | | | | | | | |")
                continue
            memory = f"{cell['peak_gib']:.2f}" if cell["peak_gib"] is not None else "-"
            ratio = f"{cell['tokens_per_s'] / theirs:.2f}x" if name != "transformers" and theirs else ""
            print(
                f"| {row['preset']} {row['batch']} x {row['seq']} | {name} | {cell['tokens_per_s']:,.0f} | "
                f"{cell['step_ms']:.1f} | {cell['tflops_executed']:.1f} | {percent(cell['mfu_spec'])} | "
                f"{percent(cell['mfu_spec_executed'])} | {percent(cell['mfu_gemm'])} | "
                f"{', '.join(cell['attention'])} | {memory} | {ratio} |"
            )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--mode", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--windows", type=int, default=6, help="timed windows per implementation")
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--max_auto_batch", type=int, default=256, help="where PRESET:auto:SEQ stops doubling")
    parser.add_argument(
        "--compile_modes",
        nargs="*",
        default=[],
        help="also albert_hf under torch.compile in these modes (default, reduce-overhead, ...)",
    )
    parser.add_argument("--compile_shapes", nargs="*", default=[], help="the shapes (as in --shapes) to compile at")
    parser.add_argument(
        "--graph_shapes",
        nargs="*",
        default=[],
        help="the shapes (as in --shapes) where albert_hf also runs as one CUDA graph a step",
    )
    parser.add_argument(
        "--unmasked",
        action="store_true",
        help="also albert_hf without the attention mask (the rows are full), as SDPA's flash kernel",
    )
    parser.add_argument(
        "--time_limit", type=float, default=None, help="seconds; shapes not started by then are skipped"
    )
    parser.add_argument("--out", default="bench_gpu.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu.py: --device cuda, but torch sees no CUDA device (use --device cpu to try it here)")
    if args.mode == "fp16":
        sys.exit("bench_gpu.py: --mode fp16 needs loss scaling, which this benchmark does not do; use bf16 or fp32")
    dtype = {"bf16": torch.bfloat16, "fp32": None}[args.mode]
    torch.backends.cuda.matmul.allow_tf32 = True  # what run_pretraining.py sets on GPUs that have TF32
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if args.graph_shapes and device.type != "cuda":
        sys.exit("bench_gpu.py: --graph_shapes captures CUDA graphs, which need --device cuda")
    report = {
        "device_name": name,
        "mode": args.mode,
        "spec_peak_tflops": spec_peak(device, args.mode),
        "torch": torch.__version__,
        "args": vars(args),
        "shapes": [],
    }
    print(f"bench_gpu on {name} ({args.mode})", flush=True)
    began = time.perf_counter()
    for text in args.shapes:
        shape = Shape.parse(text)
        if args.time_limit and time.perf_counter() - began > args.time_limit:
            report["shapes"].append({"shape": text, "error": "skipped: --time_limit reached"})
            continue
        start = time.perf_counter()
        try:
            batch = shape.batch or largest_batch(shape, device, dtype, args.max_auto_batch)
            if not batch:
                raise RuntimeError("batch 8 does not fit")
            row = bench_shape(
                shape,
                batch,
                device,
                dtype,
                args,
                args.compile_modes if text in args.compile_shapes else [],
                graphed=text in args.graph_shapes,
            )
            row["largest_batch_searched"] = shape.batch is None
        except Exception as error:  # noqa: BLE001 - recorded; the other shapes still run
            row = {"shape": text, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
        row["seconds"] = round(time.perf_counter() - start, 1)
        report["shapes"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    failed = [row["shape"] for row in report["shapes"] if "error" in row]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
