"""run_pretraining.py end to end against the model-only step on the same batches, in tokens per second.

    python benchmarks/bench_end_to_end.py --train_files path/to/books/ [--steps 24 --warmup_steps 4]

1. run_pretraining.py runs as users run it (base, auto precision, seq 512, batch 8 by default; no evaluation or
   checkpoints inside the measured steps), in a subprocess; its throughput is read from its own metrics.jsonl
   (`tokens_per_second`: real tokens over wall time per logging window), windows after the warm-up.
2. In this process, the same arguments build the same run (`prepare`), the first batches are collated ahead of
   time, and only `training_step` is timed on them (forward, backward, clipping, LAMB, the schedule): the
   model-only step on exactly those batches.
The ratio end-to-end / model-only is what the data path, logging and the loop cost. Goal: >= 0.9.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench_model import cpu_description

REPO = Path(__file__).resolve().parent.parent


def run_arguments(args, output_dir, steps):
    return [
        "--output_dir",
        str(output_dir),
        "--train_files",
        *args.train_files,
        "--model_config",
        args.model_config,
        "--vocab_size",
        str(args.vocab_size),
        "--max_seq_length",
        str(args.max_seq_length),
        "--per_device_train_batch_size",
        str(args.batch_size),
        "--mixed_precision",
        args.mixed_precision,
        "--max_train_steps",
        str(steps),
        "--logging_steps",
        str(args.logging_steps),
        "--eval_steps",
        "0",
        "--checkpointing_steps",
        "0",
        "--validation_split_percentage",
        "0",
        "--dupe_factor",
        "1",
        "--seed",
        "1",
        *(["--torch_compile"] if args.torch_compile else []),
    ]


def end_to_end(args, workdir) -> list[float]:
    """tokens/s of each logging window after the warm-up, as run_pretraining.py logs it."""
    output_dir = workdir / "run"
    command = [sys.executable, str(REPO / "run_pretraining.py"), *run_arguments(args, output_dir, args.steps)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"run_pretraining.py failed:\n{done.stderr[-3000:]}")
    windows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [w["tokens_per_second"] for w in windows if "tokens_per_second" in w and w["step"] > args.warmup_steps]


def model_only(args, workdir) -> list[float]:
    """tokens/s of each training_step on batches collated beforehand, after the warm-up steps."""
    from albert_hf.pretraining.job import parse_args, prepare
    from albert_hf.pretraining.training.step import training_step

    run_args = parse_args(run_arguments(args, workdir / "model_only", args.steps))
    run = prepare(run_args)
    batches = []
    for batch in run.train_dataloader:
        batches.append(batch)
        if len(batches) == args.steps:
            break
    run.model.train()
    rates = []
    for i, batch in enumerate(batches):
        start = time.perf_counter()
        training_step(
            run.model, batch, run.optimizer, run.scheduler, run.accelerator, run_args.optimization.max_grad_norm
        )
        seconds = time.perf_counter() - start
        if i >= args.warmup_steps:
            rates.append(int(batch["attention_mask"].sum()) / seconds)
    return rates


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_files", nargs="+", required=True, help="text files or folders (real books)")
    parser.add_argument("--model_config", default="base")
    parser.add_argument("--vocab_size", type=int, default=30000)
    parser.add_argument("--max_seq_length", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument(
        "--mixed_precision",
        default="auto",
        choices=["auto", "no", "bf16"],
        help="as run_pretraining.py: auto picks bf16 where the CPU has bf16 units, else fp32",
    )
    parser.add_argument("--torch_compile", action="store_true")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup_steps", type=int, default=4)
    parser.add_argument("--logging_steps", type=int, default=4)
    args = parser.parse_args(argv)
    missing = [f for f in args.train_files if not Path(f).exists()]
    if missing:
        raise SystemExit(f"error: --train_files: no such file or folder: {', '.join(missing)}")
    print(cpu_description())
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.model_config}, seq "
        f"{args.max_seq_length}, batch {args.batch_size}, {args.mixed_precision}, "
        f"{'compile_blocks' if args.torch_compile else 'eager'}, {args.steps} steps ({args.warmup_steps} warm-up)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        e2e = end_to_end(args, workdir)  # first: it trains and caches the tokenizer the second part reuses
        alone = model_only(args, workdir)
    e2e_rate, alone_rate = statistics.median(e2e), statistics.median(alone)
    print(
        f"run_pretraining.py end to end: {e2e_rate:.0f} tokens/s (median of {len(e2e)} logging windows: "
        + ", ".join(f"{r:.0f}" for r in e2e)
        + ")"
    )
    print(f"model-only step, same batches: {alone_rate:.0f} tokens/s (median of {len(alone)} steps)")
    print(f"end to end / model-only: {e2e_rate / alone_rate:.2f} (goal >= 0.9)")


if __name__ == "__main__":
    main()
