"""How close `run_pretraining.py --dry_run` comes to the run it plans: its peak memory of a training step and its
tokens/s against a real run of the same arguments, on this machine.

    python benchmarks/bench_plan.py                 # the demo recipe's model, and base at 128 tokens
    python benchmarks/bench_plan.py --cases demo    # one of them

Per case: the dry run in a fresh process (its plan's numbers), then the real run (a few steps, no evaluation or
checkpoints) in another, whose anonymous memory (Pss_Anon of the process tree, /proc/PID/smaps_rollup) is sampled
every 20 ms from its start line on, that is over its training steps: reading the corpus and training the tokenizer
before them are the data path's, which the plan leaves out. Its tokens/s is the median of its logged windows.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_data import tree_memory
from bench_model import cpu_description

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "demo": ["--model_config", "small", "--max_seq_length", "64", "--per_device_train_batch_size", "32"],
    # the embedded corpus holds too few pieces for a 30k vocabulary: the default 4,000 ((30,000 - 4,000) x 128 =
    # 3.3 M embedding parameters fewer than the released base's 11.7 M)
    "base-128": ["--model_config", "base", "--max_seq_length", "128", "--per_device_train_batch_size", "32"],
}
COMMON = ["--eval_steps", "0", "--validation_split_percentage", "0", "--no_plots", "--logging_steps", "2"]


def planned(case: list[str], out: Path) -> dict:
    code = (
        "import json, sys; from albert_hf.pretraining.job import main; print('PLAN ' + json.dumps(main(sys.argv[1:])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "--output_dir", str(out), *case, *COMMON, "--dry_run"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return json.loads(next(line[5:] for line in done.stdout.splitlines() if line.startswith("PLAN ")))


def measured(case: list[str], out: Path, steps: int) -> dict:
    """The real run's peak Pss_Anon from its start line on, and its median tokens/s."""
    log = out.with_suffix(".stderr")
    with open(log, "w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "run_pretraining.py",
                "--output_dir",
                str(out),
                *case,
                *COMMON,
                "--max_train_steps",
                str(steps),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        peak, training = 0, False
        while process.poll() is None:
            training = training or "parameters; global batch" in log.read_text()
            if training:
                peak = max(peak, tree_memory(process.pid)[0])
            time.sleep(0.02)
    if process.returncode:
        raise SystemExit(f"the real run failed: {log.read_text()[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [row["tokens_per_second"] for row in rows if "tokens_per_second" in row][1:]
    return {"peak_bytes": peak, "tokens_per_second": statistics.median(rates)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=sorted(CASES))
    parser.add_argument("--steps", type=int, default=12, help="steps of each real run")
    args = parser.parse_args()
    print(cpu_description())
    print("| case | plan: peak | run: peak | plan / run | plan: tokens/s | run: tokens/s | plan / run |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="bench_plan_") as folder:
        for name in args.cases:
            plan = planned(CASES[name], Path(folder) / f"{name}-plan")
            run = measured(CASES[name], Path(folder) / f"{name}-run", args.steps)
            print(
                f"| {name} | {plan['peak_bytes'] / 2**20:,.0f} MiB | {run['peak_bytes'] / 2**20:,.0f} MiB | "
                f"{plan['peak_bytes'] / run['peak_bytes']:.2f} | {plan['tokens_per_second']:,.0f} | "
                f"{run['tokens_per_second']:,.0f} | {plan['tokens_per_second'] / run['tokens_per_second']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
