"""run_pretraining.py on one GPU in three forms, same seed and data: eager (`--torch_compile_mode none`),
`--torch_compile_mode default` and the whole-step graph, which a run on a CUDA device gets with no flag. Checks
that the captured step trains as the compiled one does (the logged training losses, window by window) and measures
what each form delivers (tokens/s of the logged windows after the first, which holds compilation and capture).

    python benchmarks/check_step_graph.py --train_files books/ --out check_step_graph.json

Writes one JSON file after each run and prints a table last; exits 1 if a run fails or the losses of the graph
differ from the compiled run's by more than `--tolerance` (relative) in any window.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the whole-step graph as a run gets it with no flag (--torch_compile_mode auto on a CUDA device)
FORMS = {"eager": ["--torch_compile_mode", "none"], "compiled": ["--torch_compile_mode", "default"],
         "whole-step graph": []}


def run(name: str, extra: list[str], args) -> dict:
    out = Path(args.work_dir) / name.replace(" ", "_")
    command = [sys.executable, str(REPO / "run_pretraining.py"), "--output_dir", str(out), "--overwrite_output_dir",
               "--model_config", args.preset, "--max_seq_length", str(args.seq), "--per_device_train_batch_size",
               str(args.batch), "--max_train_steps", str(args.steps), "--logging_steps", str(args.logging_steps),
               "--eval_steps", "0", "--validation_split_percentage", "0", "--seed", "0",
               *(["--train_files", *args.train_files] if args.train_files else []), *extra]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    seconds = time.perf_counter() - began
    lines = done.stderr.splitlines()
    result = {"command": " ".join(command[1:]), "returncode": done.returncode, "seconds": round(seconds, 1),
              "start_line": next((line for line in lines if " parameters; global batch " in line), None),
              "first_step": next((line for line in lines if "the first step took" in line), None),
              "eager_steps_line": next((line for line in lines if "runs eagerly" in line), None)}
    if done.returncode != 0:
        result["stderr_tail"] = done.stderr[-3000:]
        return result
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "train_mlm_loss" in row]
    result.update(losses=[(row["step"], row["train_mlm_loss"], row.get("train_sop_loss")) for row in rows],
                  tokens_per_second=statistics.median(row["tokens_per_second"] for row in rows[1:]) if len(rows) > 1
                  else None)
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_files", nargs="*", default=None)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=2e-2, help="relative, per logged window (bf16 kernels)")
    parser.add_argument("--timeout", type=float, default=200, help="seconds per run")
    parser.add_argument("--work_dir", default="/tmp/check_step_graph")
    parser.add_argument("--out", default="check_step_graph.json")
    args = parser.parse_args(argv)
    report = {"args": vars(args), "runs": {}}
    for name, extra in FORMS.items():
        try:
            report["runs"][name] = run(name, extra, args)
        except subprocess.TimeoutExpired:
            report["runs"][name] = {"returncode": None, "error": f"timed out after {args.timeout} s"}
        print(json.dumps({name: {k: v for k, v in report["runs"][name].items() if k != "losses"}}), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    runs = report["runs"]
    failed = [name for name, result in runs.items() if result.get("returncode") != 0]
    if not failed:
        pairs = zip(runs["compiled"]["losses"], runs["whole-step graph"]["losses"])
        report["largest_relative_difference"] = max(abs(a[1] - b[1]) / abs(a[1]) for a, b in pairs)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("| form | tokens/s | run s | first logged MLM loss | last |\n|---|---:|---:|---:|---:|")
    for name, result in runs.items():
        if result.get("returncode") != 0:
            print(f"| {name} | failed | {result.get('seconds', '-')} | | |")
            continue
        losses = result["losses"]
        print(f"| {name} | {result['tokens_per_second'] or 0:,.0f} | {result['seconds']} | {losses[0][1]:.4f} | "
              f"{losses[-1][1]:.4f} |")
    difference = report.get("largest_relative_difference")
    print(f"whole-step graph against compiled, largest relative difference of a window's MLM loss: {difference}")
    sys.exit(1 if failed or difference is None or difference > args.tolerance else 0)


if __name__ == "__main__":
    main()
