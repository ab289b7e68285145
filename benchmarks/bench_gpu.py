"""Pretraining steps at the shapes users run, on one GPU: albert_hf against transformers' ALBERT and the GPU's peak.

    python benchmarks/bench_gpu.py --out bench_gpu.json       # the shapes below on the first GPU, bf16 (~3 minutes)
    python benchmarks/bench_gpu.py --device cpu --mode fp32 --shapes tiny:4x32 tiny:auto:64 --windows 2 \\
        --window_steps 1 --out /tmp/bench.json                # the suite's run

Shapes are PRESET:BATCHxSEQ, or PRESET:auto:SEQ for the largest batch (doubling from 8) whose training step fits.
The defaults: base 32 x 128 (where the host, not the GPU, limits), base 128 x 128 (phase 1 of the recipe), base
32 x 512 (`recipes/base.yaml` per device), large 16 x 512, xxlarge at 512 with its largest batch.

For each shape, both implementations hold the same weights and train on the same batches (20 masked positions a
sequence, as the official max_predictions_per_seq, given to albert_hf in the collator's fixed-size form; SOP
labels), with LAMB and global clipping at 1.0, under bf16 autocast (`--mode`). After `--warmup` steps each,
`--windows` windows of `--window_steps` steps alternate between the two (who goes first alternates too); each
window is timed with CUDA events. Reported per implementation:
- tokens/s: the median over the windows;
- TFLOP/s from `bench_model.albert_flops` (every layer at every position, the MLM head at the masked positions);
- MFU against the GPU's dense bf16 spec peak (`SPEC_PEAK_TFLOPS`, by device name; an unknown GPU gets none) and
  against the same-run `F.linear` rate at the model's GEMM shapes with this batch's tokens;
- peak memory of a step: what the step allocates above the memory in use before it, plus the implementation's
  own parameters, gradients and optimizer state;
- host syncs in one training step (`torch.cuda.set_sync_debug_mode`), and the share of the step that clipping and
  LAMB's update take (timed apart from the forward and backward), for ours.
Writes one JSON file (after every shape, so a run stopped by a time limit keeps what it measured) and prints a
table last. With `--compile_modes`, albert_hf compiled as `run_pretraining.py --torch_compile_mode MODE` compiles
it on a GPU (`compile_blocks(dynamic=False, mode=MODE)`) runs too, at `--compile_shapes`; each mode's compile time
is printed as it finishes.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_model import MASKED_PER_SEQ, albert_flops, gemm_peak, make_batch

DEFAULT_SHAPES = ["base:32x128", "base:128x128", "base:32x512", "large:16x512", "xxlarge:auto:512"]
# Dense (no sparsity) 16-bit tensor-core TFLOP/s from the vendors' data sheets, matched against
# torch.cuda.get_device_name() in this order; T4 and V100 have no bf16, so theirs is the fp16 figure.
SPEC_PEAK_TFLOPS = [(("H200",), 989.0), (("H100", "PCIe"), 756.0), (("H100", "NVL"), 835.0), (("H100",), 989.0),
                    (("A100",), 312.0), (("L40S",), 362.0), (("L40",), 181.0), (("L4",), 121.0), (("T4",), 65.0),
                    (("V100",), 125.0)]


def spec_peak(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for words, peak in SPEC_PEAK_TFLOPS if all(word in name for word in words)), None)


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
    """Both implementations on `device`, with the same weights, each with its LAMB."""
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
        model.train()
        runners[name] = [model, Lamb(parameter_groups(model), lr=1e-4)]
    return config, runners


OURS_ONLY = ("masked_lm_positions", "masked_lm_weights")  # the collator's fixed-size positions; transformers has none


def forward_backward(model, batch, dtype):
    from albert_hf import AlbertHFPreTrainedModel

    if not isinstance(getattr(model, "_orig_mod", model), AlbertHFPreTrainedModel):
        batch = {k: v for k, v in batch.items() if k not in OURS_ONLY}
    with torch.autocast(batch["input_ids"].device.type, dtype=dtype, enabled=dtype is not None):
        loss = model(**batch).loss
    loss.backward()


def update(model, optimizer):
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def train_step(model, optimizer, batch, dtype):
    forward_backward(model, batch, dtype)
    update(model, optimizer)


def update_share(model, optimizer, batches, dtype, device, steps: int) -> float:
    """The share of a training step spent in clipping and the optimizer's update, timed apart (CUDA events)."""
    clock, parts = Clock(device), {"model": 0.0, "update": 0.0}
    for i in range(steps):
        clock.start()
        forward_backward(model, batches[i % 2], dtype)
        parts["model"] += clock.stop()
        clock.start()
        update(model, optimizer)
        parts["update"] += clock.stop()
    return parts["update"] / (parts["model"] + parts["update"])


def persistent_bytes(model, optimizer) -> int:
    """Parameters, their gradients (held at the step's end, before zero_grad) and the optimizer's state."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor))
    return 2 * params + state


def step_peak_gib(model, optimizer, batch, dtype, device) -> float | None:
    """Peak memory of one training step of this implementation alone (see the module docstring)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    train_step(model, optimizer, batch, dtype)
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before + persistent_bytes(model, optimizer)) / 2**30


def host_syncs(model, optimizer, batch, dtype, device) -> int | None:
    """Synchronizing CUDA calls in one training step (the forward, backward and optimizer), counted by torch."""
    if device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(model, optimizer, batch, dtype)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def batches_for(config, batch: int, seq: int, device: torch.device) -> list[dict]:
    """Two batches as run_pretraining.py's collator gives them on a GPU: full rows, and for albert_hf the masked
    positions in the fixed-size form (MASKED_PER_SEQ a row), so that no size is read from the device."""
    from albert_hf.data_collator import fixed_size_positions

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
    model, optimizer = runners.pop("albert_hf")
    del runners
    fits, batch = 0, 8
    while batch <= limit:
        try:
            train_step(model, optimizer, batches_for(config, batch, shape.seq, device)[0], dtype)
            torch.cuda.synchronize(device) if device.type == "cuda" else None
            fits, batch = batch, batch * 2
        except torch.OutOfMemoryError:
            break
        finally:
            optimizer.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    del model, optimizer
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return fits


def compiled_runner(runners: dict, mode: str):
    import copy

    from albert_hf.optimization import Lamb, parameter_groups

    # what run_pretraining.py --torch_compile_mode MODE does on a GPU: the blocks and the head with its loss
    model = copy.deepcopy(runners["albert_hf"][0]).compile_blocks(dynamic=False, mode=mode)
    return [model, Lamb(parameter_groups(model), lr=1e-4)]


def bench_shape(shape: Shape, batch: int, device, dtype, args, compile_modes: list[str]) -> dict:
    config, runners = build(shape.preset, shape.seq, device)
    batches = batches_for(config, batch, shape.seq, device)
    result = {"preset": shape.preset, "batch": batch, "seq": shape.seq, "tokens_per_step": batch * shape.seq,
              "parameters": sum(p.numel() for p in runners["albert_hf"][0].parameters())}
    for mode in compile_modes:
        name = f"albert_hf compiled ({mode})"
        start = time.perf_counter()
        runners[name] = compiled_runner(runners, mode)
        for i in range(2):  # the first step compiles; the second shows a recompile if there is one
            train_step(*runners[name], batches[i % 2], dtype)
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        result[f"{name} compile_s"] = round(time.perf_counter() - start, 1)
        print(f"{shape.name(batch)}: {name} compiled and ran 2 steps in {result[f'{name} compile_s']} s", flush=True)
    clock = Clock(device)
    for name, (model, optimizer) in list(runners.items()):
        try:
            for i in range(args.warmup):
                train_step(model, optimizer, batches[i % 2], dtype)
        except torch.OutOfMemoryError:  # transformers' step can need more than the batch ours was sized for
            del runners[name], model, optimizer
            result[name] = {"error": f"out of memory at batch {batch}"}
            gc.collect()
            torch.cuda.empty_cache() if device.type == "cuda" else None
    seconds = {name: [] for name in runners}
    for window in range(args.windows):
        order = list(runners) if window % 2 == 0 else list(reversed(runners))
        for name in order:
            model, optimizer = runners[name]
            clock.start()
            for i in range(args.window_steps):
                train_step(model, optimizer, batches[i % 2], dtype)
            seconds[name].append(clock.stop() / args.window_steps)
    flops = albert_flops(config, batch, shape.seq, MASKED_PER_SEQ)
    peak = spec_peak(device)
    gemm = gemm_peak(config, tokens=batch * shape.seq, dtype=dtype or torch.float32, device=device)["median"]
    for name, (model, optimizer) in runners.items():
        step_s = statistics.median(seconds[name])
        tflops = flops / step_s / 1e12
        result[name] = {"tokens_per_s": batch * shape.seq / step_s, "step_ms": step_s * 1000, "tflops": tflops,
                        "mfu_spec": tflops / peak if peak else None, "mfu_gemm": tflops / gemm,
                        "peak_gib": step_peak_gib(model, optimizer, batches[0], dtype, device)}
    if "albert_hf" in runners:
        result["albert_hf"]["host_syncs_per_step"] = host_syncs(*runners["albert_hf"], batches[0], dtype, device)
        result["albert_hf"]["update_share"] = update_share(*runners["albert_hf"], batches, dtype, device,
                                                           args.window_steps)
    result["gemm_peak_tflops"], result["spec_peak_tflops"], result["flops_per_step"] = gemm, peak, flops
    if "transformers" in runners and "albert_hf" in runners:
        result["ratio"] = result["albert_hf"]["tokens_per_s"] / result["transformers"]["tokens_per_s"]
    del runners, batches
    gc.collect()
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return result


def percent(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def print_table(report: dict):
    print(f"\n{report['device_name']}, {report['mode']}, LAMB; MFU against the spec peak "
          f"({report['spec_peak_tflops'] or 'unknown'} TFLOP/s) and the same-run F.linear rate at the model's shapes")
    shares = [f"{row['preset']} {row['batch']} x {row['seq']} {percent(row['albert_hf']['update_share'])}"
              for row in report["shapes"] if "update_share" in row.get("albert_hf", {})]
    print(f"albert_hf's clipping and LAMB update, share of the step: {', '.join(shares) or '-'}")
    print("| shape | implementation | tokens/s | step ms | TFLOP/s | MFU spec | MFU GEMM | peak GiB | ours/theirs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in report["shapes"]:
        if "error" in row:
            print(f"| {row['shape']} | - | {row['error']} | | | | | | |")
            continue
        theirs = row.get("transformers", {}).get("tokens_per_s")
        for name in [k for k, v in row.items() if isinstance(v, dict)]:
            cell = row[name]
            if "error" in cell:
                print(f"| {row['preset']} {row['batch']} x {row['seq']} | {name} | {cell['error']} | | | | | | |")
                continue
            memory = f"{cell['peak_gib']:.2f}" if cell["peak_gib"] is not None else "-"
            ratio = f"{cell['tokens_per_s'] / theirs:.2f}x" if name != "transformers" and theirs else ""
            print(f"| {row['preset']} {row['batch']} x {row['seq']} | {name} | {cell['tokens_per_s']:,.0f} | "
                  f"{cell['step_ms']:.1f} | {cell['tflops']:.1f} | {percent(cell['mfu_spec'])} | "
                  f"{percent(cell['mfu_gemm'])} | {memory} | {ratio} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES)
    parser.add_argument("--mode", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--windows", type=int, default=6, help="timed windows per implementation")
    parser.add_argument("--window_steps", type=int, default=5)
    parser.add_argument("--max_auto_batch", type=int, default=256, help="where PRESET:auto:SEQ stops doubling")
    parser.add_argument("--compile_modes", nargs="*", default=[],
                        help="also albert_hf under torch.compile in these modes (default, reduce-overhead, ...)")
    parser.add_argument("--compile_shapes", nargs="*", default=[], help="the shapes (as in --shapes) to compile at")
    parser.add_argument("--time_limit", type=float, default=None,
                        help="seconds; shapes not started by then are skipped")
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
    report = {"device_name": name, "mode": args.mode, "spec_peak_tflops": spec_peak(device),
              "torch": torch.__version__, "args": vars(args), "shapes": []}
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
            row = bench_shape(shape, batch, device, dtype, args, args.compile_modes if text in args.compile_shapes
                              else [])
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
