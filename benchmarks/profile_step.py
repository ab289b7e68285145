"""Where albert_hf's training step spends its time outside the matmuls, forward and backward separately.

    python benchmarks/profile_step.py                          # base, bf16, seq 512 x 8 and 128 x 32, eager
    python benchmarks/profile_step.py --compile blocks --seqs 512

On a CPU without AMX the bf16 matmuls take most of the step. With AMX they run about three times faster and the
rest (attention's softmax, LayerNorms, GELU, residual adds, autocast's casts, dropout, the optimizer, Python) is
what decides the step. This profiles a few steps (`torch.profiler`, after warm-up) and splits each phase's time:
- matmul: the GEMM kernels (`mm`, `addmm`, `bmm`, `baddbmm`, ...), forward and backward;
- attention: SDPA's kernel (its own softmax and small matmuls) forward and backward;
- other: every other op, each listed with its milliseconds per step;
- glue: the phase's wall time minus its ops (Python, module calls, autograd bookkeeping).
Phases are ranges around forward, backward and optimizer (clipping + update); an op belongs to the phase it
starts in. The same steps are also timed without the profiler (the profiler adds its own overhead per op).
"""

import argparse
import bisect
import platform
import statistics
import time
from collections import defaultdict
from contextlib import nullcontext

import torch

from bench_model import MASKED_PER_SEQ, albert_flops, cpu_description, gemm_peak, make_batch, make_models

MATMUL_OPS = {
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::addbmm",
    "aten::_addmm_activation",
    "mkldnn::_linear_pointwise",
    "aten::mkldnn_linear",
}
ATTENTION_PREFIX = "aten::_scaled_dot_product"  # the flash kernel forward and its backward
PHASES = ("forward", "backward", "optimizer")


def step(model, optimizer, batch, profiled=False):
    """One bf16 training step in three named ranges; returns the wall seconds of each."""
    seconds = {}
    for phase in PHASES:
        start = time.perf_counter()
        with torch.profiler.record_function(phase) if profiled else nullcontext():
            if phase == "forward":
                with torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16):
                    loss = model(**batch).loss
            elif phase == "backward":
                loss.backward()
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        seconds[phase] = time.perf_counter() - start
    return seconds


def category(name: str) -> str:
    if name in MATMUL_OPS:
        return "matmul"
    if name.startswith(ATTENTION_PREFIX):
        return "attention"
    return "other"


def split_profile(prof, steps):
    """{phase: {"wall": ms, "matmul": ms, "attention": ms, "other": {op: ms}, "glue": ms}}, per step."""
    events = list(prof.events())
    ranges = [(e.name, e.time_range.start, e.time_range.end) for e in events if e.name in PHASES]
    result = {phase: {"wall": 0.0, "matmul": 0.0, "attention": 0.0, "other": defaultdict(float)} for phase in PHASES}
    for name, start, end in ranges:
        result[name]["wall"] += (end - start) / 1e3 / steps
    ranges.sort(key=lambda r: r[1])
    starts = [r[1] for r in ranges]
    for event in events:
        if event.name in PHASES or event.self_cpu_time_total <= 0:
            continue
        i = bisect.bisect_right(starts, event.time_range.start) - 1
        if i < 0 or event.time_range.start >= ranges[i][2]:
            continue  # outside the three phases (the profiler's own events)
        phase, kind = ranges[i][0], category(event.name)
        ms = event.self_cpu_time_total / 1e3 / steps
        if kind == "other":
            result[phase]["other"][event.name] += ms
        else:
            result[phase][kind] += ms
    for phase in PHASES:
        part = result[phase]
        part["glue"] = part["wall"] - part["matmul"] - part["attention"] - sum(part["other"].values())
    return result


def profile(preset, seq, batch_size, compile_blocks, steps, warmup, optimizer_name):
    from albert_hf.optimization import Lamb, parameter_groups

    config, model, _ = make_models(preset, seq, with_transformers=False)
    if compile_blocks:
        model.compile_blocks()
    model.train()
    params = parameter_groups(model)
    optimizer = Lamb(params, lr=1e-4) if optimizer_name == "lamb" else torch.optim.AdamW(params, lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    batches = [make_batch(config, batch_size, seq, generator) for _ in range(2)]
    for i in range(warmup):
        step(model, optimizer, batches[i % 2])
    plain = [step(model, optimizer, batches[i % 2]) for i in range(steps)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for i in range(steps):
            step(model, optimizer, batches[i % 2], profiled=True)
    unprofiled = {phase: 1e3 * statistics.median(s[phase] for s in plain) for phase in PHASES}
    return config, unprofiled, split_profile(prof, steps)


def report(config, seq, batch_size, unprofiled, parts, peak, top):
    total = sum(unprofiled.values())
    flops = albert_flops(config, batch_size, seq, MASKED_PER_SEQ)
    print(
        f"\nbatch {batch_size} x seq {seq}: step {total:.0f} ms unprofiled "
        f"({', '.join(f'{p} {unprofiled[p]:.0f}' for p in PHASES)}), {batch_size * seq / total * 1e3:.0f} tokens/s, "
        f"MFU {flops / (total / 1e3) / 1e12 / peak:.1%} of the same-run GEMM peak {peak:.2f} TFLOP/s"
    )
    profiled_total = sum(parts[p]["wall"] for p in PHASES)
    print(f"  profiled: {profiled_total:.0f} ms per step (the profiler's own cost included)")
    print(f"  {'ms per step':26} " + " ".join(f"{p:>10}" for p in PHASES) + f" {'total':>10}")
    rows = [
        ("matmul", lambda part: part["matmul"]),
        ("attention (SDPA)", lambda part: part["attention"]),
        ("other ops", lambda part: sum(part["other"].values())),
        ("glue (Python, autograd)", lambda part: part["glue"]),
    ]
    for label, get in rows:
        values = [get(parts[p]) for p in PHASES]
        print(f"  {label:26} " + " ".join(f"{v:10.1f}" for v in values) + f" {sum(values):10.1f}")
    outside = [parts[p]["wall"] - parts[p]["matmul"] for p in PHASES]
    print(f"  {'outside matmul':26} " + " ".join(f"{v:10.1f}" for v in outside) + f" {sum(outside):10.1f}")
    merged = defaultdict(lambda: [0.0, 0.0, 0.0])
    for i, phase in enumerate(PHASES):
        for name, ms in parts[phase]["other"].items():
            merged[name][i] += ms
    print(f"  largest other ops (ms per step, {', '.join(PHASES)}):")
    for name, values in sorted(merged.items(), key=lambda kv: -sum(kv[1]))[:top]:
        print(f"    {name:40} " + " ".join(f"{v:8.1f}" for v in values))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--seqs", nargs="+", type=int, default=[512, 128])
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step (batch = tokens / seq)")
    parser.add_argument("--compile", choices=["blocks"], default=None)
    parser.add_argument("--optimizer", choices=["lamb", "adamw"], default="lamb")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(cpu_description())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, Python {platform.python_version()}, "
        f"{'compile_blocks' if args.compile else 'eager'}, {args.optimizer}"
    )
    for seq in args.seqs:
        batch_size = args.tokens // seq
        config, unprofiled, parts = profile(
            args.preset, seq, batch_size, args.compile, args.steps, args.warmup, args.optimizer
        )
        peak = gemm_peak(config, tokens=args.tokens)["median"]
        report(config, seq, batch_size, unprofiled, parts, peak, args.top)


if __name__ == "__main__":
    main()
