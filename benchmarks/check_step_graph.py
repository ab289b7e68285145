"""run_pretraining.py on one GPU in up to three forms, same seed and data, at each of `--shapes`: eager
(`--torch_compile_mode none`), `--torch_compile_mode default` and the whole-step graph, which a run on a CUDA device
gets with no flag ("default step"). Checks that the captured step trains as the other form does (the logged
training losses, window by window: against the compiled run's, or eager's without it) and measures what each form
delivers (tokens/s of the logged windows after the first, which holds compilation and capture).

    python benchmarks/check_step_graph.py --train_files books/ --out check_step_graph.json
    python benchmarks/check_step_graph.py --train_files books/ --shapes 32x128 128x128 32x512 \
        --forms "default step" eager --steps 30 --logging_steps 5   # what gpu_session.sh runs

Writes one JSON file after each run and prints a table last; exits 1 if a run fails or the losses of the graph
differ from the other form's by more than `--tolerance` (relative) in any window.
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
FORMS = {"eager": ["--torch_compile_mode", "none"], "compiled": ["--torch_compile_mode", "default"], "default step": []}


def run(name: str, extra: list[str], shape: str, args) -> dict:
    batch, seq = shape.split("x")
    out = Path(args.work_dir) / f"{shape}_{name.replace(' ', '_')}"
    command = [
        sys.executable,
        str(REPO / "run_pretraining.py"),
        "--output_dir",
        str(out),
        "--overwrite_output_dir",
        "--model_config",
        args.preset,
        "--max_seq_length",
        seq,
        "--per_device_train_batch_size",
        batch,
        "--max_train_steps",
        str(args.steps),
        "--logging_steps",
        str(args.logging_steps),
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        "--seed",
        "0",
        *(["--train_files", *args.train_files] if args.train_files else []),
        *extra,
    ]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    seconds = time.perf_counter() - began
    lines = done.stderr.splitlines()
    result = {
        "command": " ".join(command[1:]),
        "returncode": done.returncode,
        "seconds": round(seconds, 1),
        "start_line": next((line for line in lines if " parameters; global batch " in line), None),
        "first_step": next((line for line in lines if "the first step took" in line), None),
        "eager_steps_line": next((line for line in lines if "runs eagerly" in line), None),
    }
    if done.returncode != 0:
        result["stderr_tail"] = done.stderr[-3000:]
        return result
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "train_mlm_loss" in row]
    result.update(
        losses=[(row["step"], row["train_mlm_loss"], row.get("train_sop_loss")) for row in rows],
        tokens_per_second=statistics.median(row["tokens_per_second"] for row in rows[1:]) if len(rows) > 1 else None,
    )
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train_files", nargs="*", default=None)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--shapes", nargs="+", default=["32x128"], help="BATCHxSEQ per device")
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=list(FORMS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--tolerance", type=float, default=2e-2, help="relative, per logged window (bf16 kernels)")
    parser.add_argument("--timeout", type=float, default=200, help="seconds per run")
    parser.add_argument("--work_dir", default="/tmp/check_step_graph")
    parser.add_argument("--out", default="check_step_graph.json")
    args = parser.parse_args(argv)
    report = {"args": vars(args), "runs": {}, "largest_relative_difference": {}}
    reference = "compiled" if "compiled" in args.forms else "eager"
    compare = "default step" in args.forms and reference in args.forms  # the check needs both forms
    for shape in args.shapes:
        runs = report["runs"][shape] = {}
        for name in args.forms:
            try:
                runs[name] = run(name, FORMS[name], shape, args)
            except subprocess.TimeoutExpired:
                runs[name] = {"returncode": None, "error": f"timed out after {args.timeout} s"}
            print(json.dumps({shape: {name: {k: v for k, v in runs[name].items() if k != "losses"}}}), flush=True)
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        if compare and all(runs[name].get("returncode") == 0 for name in ("default step", reference)):
            pairs = zip(runs[reference]["losses"], runs["default step"]["losses"])
            report["largest_relative_difference"][shape] = max(abs(a[1] - b[1]) / abs(a[1]) for a, b in pairs)
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print("| shape | form | tokens/s | run s | first logged MLM loss | last |\n|---|---|---:|---:|---:|---:|")
    failed = []
    for shape, runs in report["runs"].items():
        for name, result in runs.items():
            if result.get("returncode") != 0:
                failed.append(f"{shape} {name}")
                print(f"| {shape} | {name} | failed | {result.get('seconds', '-')} | | |")
                continue
            losses = result["losses"]
            print(
                f"| {shape} | {name} | {result['tokens_per_second'] or 0:,.0f} | {result['seconds']} | "
                f"{losses[0][1]:.4f} | {losses[-1][1]:.4f} |"
            )
    differences = report["largest_relative_difference"]
    print(f"default step against {reference}, largest relative difference of a window's MLM loss: {differences}")
    compared = not compare or len(differences) == len(args.shapes)
    sys.exit(1 if failed or not compared or any(d > args.tolerance for d in differences.values()) else 0)


if __name__ == "__main__":
    main()
