"""Memory per process of run_pretraining.py in one process, 2-process DDP and 2-process FSDP2, on this machine.

    python benchmarks/bench_distributed.py                      # xxlarge (223M parameters), ~10 min on 2 cores
    python benchmarks/bench_distributed.py --preset base --steps 3

Each setting runs the real script (`accelerate launch ... run_pretraining.py`) for a few steps at batch 1 x 64
tokens, so activations are small and the weights, gradients and LAMB moments (4 copies of the parameters in fp32)
dominate. The peak resident memory of every worker is sampled from outside every 0.1 s; it includes the Python,
torch and tokenizer footprint (printed first: a process that has imported everything and built nothing).
FSDP2 shards parameters, gradients and optimizer state; a layer is gathered whole while it runs, and with all
layers shared that one layer is most of ALBERT's parameters. Prints the CPU model and a table; --json writes it.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "accelerate_configs"
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--mixed_precision", "no", "--dynamo_backend", "no"]
SETTINGS = {
    "1 process": [sys.executable],
    "DDP, 2 processes": [*LAUNCH, "--multi_gpu", "--num_processes", "2", "--num_machines", "1"],
    "FSDP2, 2 processes": [*LAUNCH, "--config_file", str(CONFIGS / "fsdp_cpu.yaml")],  # reshard_after_forward false
    "FSDP2, 2 processes, reshard_after_forward": [
        *LAUNCH,
        "--config_file",
        str(CONFIGS / "fsdp_cpu.yaml"),
        "--fsdp_reshard_after_forward",
        "true",
    ],
}
IDLE = (
    "import torch, transformers, accelerate, datasets, tokenizers, albert_hf.pretraining.job, psutil; "
    "print(psutil.Process().memory_info().rss / 2**30)"
)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


PHASES = ("setup", "training", "end")  # building data and model / the optimizer steps / gathering, saving, reloading


def peak_rss_of_workers(command, cwd, out: Path, steps: int, workers: int) -> tuple[dict, str]:
    """Runs `command`; returns {phase: [peak RSS in GiB of each of its `workers` largest processes]} and its stderr.

    Training starts at the run's start line (logged after `accelerator.prepare`) and ends when metrics.jsonl holds
    the last step; the workers are the largest processes (not the launcher and torchrun's agent)."""
    peaks = {phase: {} for phase in PHASES}
    with tempfile.NamedTemporaryFile("w+") as err:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=err,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        root = psutil.Process(process.pid)
        phase = "setup"
        while process.poll() is None:
            if phase == "setup" and "parameters; global batch" in Path(err.name).read_text():
                phase = "training"
            metrics = out / "metrics.jsonl"
            if phase == "training" and metrics.exists() and f'"step": {steps},' in metrics.read_text():
                phase = "end"
            try:
                for proc in [root, *root.children(recursive=True)]:
                    peaks[phase][proc.pid] = max(peaks[phase].get(proc.pid, 0.0), proc.memory_info().rss / 2**30)
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.1)
        stderr = Path(err.name).read_text()
    if process.returncode != 0:
        raise SystemExit(f"error: {' '.join(command[:6])} ... failed:\n{stderr[-3000:]}")
    return {phase: sorted(by_pid.values(), reverse=True)[:workers] for phase, by_pid in peaks.items()}, stderr


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="xxlarge", help="run_pretraining.py --model_config")
    parser.add_argument("--sharing", default="all", help="run_pretraining.py --sharing (none: BERT-like layers)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    print(f"CPU: {cpu_model()}; {psutil.cpu_count()} cores; {psutil.virtual_memory().total / 2**30:.0f} GiB")
    results = {
        "cpu": cpu_model(),
        "preset": args.preset,
        "sharing": args.sharing,
        "steps": args.steps,
        "peak_rss_gib": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        idle = float(subprocess.run([sys.executable, "-c", IDLE], capture_output=True, text=True, check=True).stdout)
        results["idle_rss_gib"] = idle
        print(f"  a process that has imported everything and built nothing: {idle:.2f} GiB")
        for name, launcher in SETTINGS.items():
            out = Path(tmp) / f"run_{len(results['peak_rss_gib'])}"
            command = [
                *launcher,
                str(REPO / "run_pretraining.py"),
                "--output_dir",
                str(out),
                "--model_config",
                args.preset,
                "--sharing",
                args.sharing,
                "--vocab_size",
                "3000",
                "--max_seq_length",
                "64",
                "--per_device_train_batch_size",
                "1",
                "--max_train_steps",
                str(args.steps),
                "--validation_split_percentage",
                "0",
                "--eval_steps",
                "0",
                "--dupe_factor",
                "1",
                "--mixed_precision",
                "no",
                "--logging_steps",
                "1",
            ]
            workers = 1 if launcher == [sys.executable] else 2
            peaks, stderr = peak_rss_of_workers(command, tmp, out, args.steps, workers)
            start_line = next((line for line in stderr.splitlines() if "parameters; global batch" in line), "")
            results["peak_rss_gib"][name] = peaks
            print(f"  {name}: {start_line.split('INFO albert_hf.pretraining.run: ')[-1]}")
    print(
        f"\nPeak resident memory per process (GiB), {args.preset}, sharing {args.sharing}, batch 1 x 64, fp32, "
        f"LAMB, {args.steps} steps"
    )
    print("(setup: data, tokenizer, model; training: the steps; end: gathering, saving and reloading the model)")
    print("| setting | " + " | ".join(PHASES) + " |\n|---|" + "---|" * len(PHASES))
    for name, peaks in results["peak_rss_gib"].items():
        print(f"| {name} | " + " | ".join(" / ".join(f"{p:.2f}" for p in peaks[phase]) for phase in PHASES) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
