"""Where a training step's GPU time goes: the CUDA kernels of albert_hf's step (and transformers'), grouped.

    python benchmarks/profile_gpu.py --out profile_gpu.json     # base 128 x 128 and 32 x 128, bf16, ~90 s

For each shape and implementation (as bench_gpu.py builds them: same weights, LAMB, clipping, bf16 autocast):
"albert_hf default" is the step run_pretraining.py takes on a GPU with no flag (the blocks and the MLM head compiled,
the whole step one CUDA graph), "albert_hf" its eager step (--torch_compile_mode none), "transformers" theirs. After
`--warmup` steps, `--steps` steps run under `torch.profiler` (CPU and CUDA activity). Every kernel, memcpy and memset
on the GPU is summed by name and put in one group by its name (`GROUPS`, first match): attention, GEMM, optimizer
and clipping (the multi-tensor kernels), loss (log-softmax and NLL), copies and memsets, elementwise / LayerNorm /
GELU, other. Idle is the GPU's span over the profiled steps less the union of its kernels' intervals: launch gaps
and host waits. The same steps are timed without the profiler too (CUDA events). Writes one JSON file after every
shape and prints, per shape, the groups and the top `--top` kernels by GPU time a step.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import torch

from bench_gpu import Clock, Shape, batches_for, build, compiled_runner  # noqa: E402

# (group, words in the kernel's lower-cased name), the first match wins: attention's kernels carry "cutlass" too
GROUPS = [
    ("attention", ("flash", "fmha", "attention", "attn", "cudnn")),
    ("GEMM", ("gemm", "xmma", "cutlass", "cublas", "nvjet", "splitk", "sm90_", "sm80_", "ampere_")),
    ("optimizer and clipping", ("multi_tensor", "foreach", "lpnorm")),
    ("loss", ("log_softmax", "softmax", "nll_loss", "cross_entropy")),
    ("copies and memsets", ("memcpy", "memset", "copy", "catarray", "fill")),
    (
        "elementwise / LayerNorm / GELU",
        (
            "layer_norm",
            "layernorm",
            "gammabeta",
            "gelu",
            "elementwise",
            "vectorized",
            "unrolled",
            "reduce",
            "triton",
            "dropout",
            "index",
            "embedding",
            "gather",
            "scatter",
            "where",
            "tanh",
        ),
    ),
]


def group_of(kernel: str) -> str:
    name = kernel.lower()
    return next((group for group, words in GROUPS if any(word in name for word in words)), "other")


def busy_union(intervals: list[tuple[float, float]]) -> float:
    """Microseconds covered by at least one of the (start, end) intervals."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered


GPU_RANGE = re.compile(r"[\w.]+#")  # a range's name (`Optimizer.step#Lamb.step`), where no kernel's starts so


def gpu_events(profile) -> list:
    """The profiler's events that ran on the GPU: kernels, memcpys and memsets, without the ranges torch marks on the
    GPU's timeline around them (`Optimizer.step#Lamb.step`), which would count their kernels twice."""
    from torch.autograd import DeviceType

    return [
        event for event in profile.events() if event.device_type == DeviceType.CUDA and not GPU_RANGE.match(event.name)
    ]


DEFAULT = "albert_hf default"


def default_runner(ours, batch: dict, dtype):
    """The step run_pretraining.py takes on a GPU with no flag: blocks and head compiled, captured whole."""
    return compiled_runner(ours, "default").capture(batch, dtype)


def runner_for(name: str, runners: dict, batch: dict, dtype):
    return default_runner(runners["albert_hf"], batch, dtype) if name == DEFAULT else runners[name]


def profile_runner(runner, batches, dtype, args) -> dict:
    device = batches[0]["input_ids"].device
    for i in range(args.warmup):
        runner.step(batches[i % 2], dtype)
    clock = Clock(device)
    clock.start()
    for i in range(args.steps):
        runner.step(batches[i % 2], dtype)
    step_ms = clock.stop() * 1000 / args.steps
    torch.cuda.synchronize(device)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for i in range(args.steps):
            runner.step(batches[i % 2], dtype)
        torch.cuda.synchronize(device)
    events = gpu_events(profile)
    if not events:  # a profiler that does not see into CUDA graph replays
        return {"no_kernels_seen": "the profiler saw no kernel of this step (a CUDA graph's replay)"}
    intervals = [(event.time_range.start, event.time_range.end) for event in events]
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    kernels = defaultdict(lambda: [0.0, 0])
    for event in events:
        kernels[event.name][0] += event.time_range.elapsed_us() / 1000 / args.steps
        kernels[event.name][1] += 1
    groups = defaultdict(float)
    for name, (ms, _) in kernels.items():
        groups[group_of(name)] += ms
    groups["idle (gaps between kernels)"] = (span - busy_union(intervals)) / 1000 / args.steps
    top = sorted(kernels.items(), key=lambda item: -item[1][0])[: args.top]
    return {
        "step_ms_unprofiled": step_ms,
        "gpu_span_ms_per_step": span / 1000 / args.steps,
        "groups_ms_per_step": dict(sorted(groups.items(), key=lambda item: -item[1])),
        "top_kernels": [
            {"name": name, "group": group_of(name), "ms_per_step": ms, "calls_per_step": calls / args.steps}
            for name, (ms, calls) in top
        ],
    }


def print_profile(title: str, row: dict, top: int):
    if "no_kernels_seen" in row:
        print(f"\n{title}: {row['no_kernels_seen']}")
        return
    span = row["gpu_span_ms_per_step"]
    print(f"\n{title}: {row['step_ms_unprofiled']:.2f} ms a step unprofiled, GPU span {span:.2f} ms a step profiled")
    print("| group | ms/step | share of span |\n|---|---:|---:|")
    for group, ms in row["groups_ms_per_step"].items():
        print(f"| {group} | {ms:.3f} | {100 * ms / span:.1f}% |")
    print(f"| kernel (top {top}) | group | calls/step | ms/step | share |\n|---|---|---:|---:|---:|")
    for kernel in row["top_kernels"]:
        print(
            f"| {kernel['name'][:90]} | {kernel['group']} | {kernel['calls_per_step']:.0f} | "
            f"{kernel['ms_per_step']:.3f} | {100 * kernel['ms_per_step'] / span:.1f}% |"
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=["base:128x128", "base:32x128"])
    parser.add_argument(
        "--implementations",
        nargs="+",
        default=[DEFAULT, "albert_hf", "transformers"],
        choices=[DEFAULT, "albert_hf", "transformers"],
    )
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--out", default="profile_gpu.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_gpu.py: torch sees no CUDA device; the CPU's profile is benchmarks/profile_step.py")
    torch.backends.cuda.matmul.allow_tf32 = True
    device, report = (
        torch.device("cuda"),
        {"device_name": torch.cuda.get_device_name(), "torch": torch.__version__, "args": vars(args), "profiles": {}},
    )
    for text in args.shapes:
        shape = Shape.parse(text)
        config, runners = build(shape.preset, shape.seq, device)
        batches = batches_for(config, shape.batch, shape.seq, device)
        for name in args.implementations:
            title = f"{name}, {shape.name()}, bf16"
            runner = runner_for(name, runners, batches[0], torch.bfloat16)
            report["profiles"][title] = row = profile_runner(runner, batches, torch.bfloat16, args)
            if "no_kernels_seen" in row and name == DEFAULT:  # the same kernels, launched one by one
                title = f"{name} without its CUDA graph (compiled blocks), {shape.name()}, bf16"
                runner = compiled_runner(runners["albert_hf"], "default")
                report["profiles"][title] = row = profile_runner(runner, batches, torch.bfloat16, args)
            print_profile(title, row, args.top)
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        del runners, batches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
