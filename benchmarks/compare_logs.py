"""The training losses two runs logged (their metrics.jsonl), window by window after step `--after`: a run and the
same run resumed from its checkpoint at that step must log the same (on a GPU, to bf16 kernels' tolerance).

    python benchmarks/compare_logs.py RUN_DIR RESUMED_DIR --after 10 --out resume.json

Writes the losses and the largest relative difference; exits 1 when a window is missing from either or the
difference exceeds `--tolerance`.
"""

import argparse
import json
import sys
from pathlib import Path


def train_losses(run: Path) -> dict:
    """{step: (MLM loss, pair loss)} of the logged training windows."""
    path = run / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {row["step"]: (row["train_mlm_loss"], row.get("train_sop_loss")) for row in rows if "train_mlm_loss" in row}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("resumed", type=Path)
    parser.add_argument("--after", type=int, required=True, help="the step the resumed run started from")
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    run, resumed = train_losses(args.run), train_losses(args.resumed)
    steps = sorted(step for step in run if step > args.after)
    missing = [step for step in steps if step not in resumed]
    compared = [step for step in steps if step in resumed]
    differences = {
        step: max(abs(a - b) / abs(a) for a, b in zip(run[step], resumed[step]) if a is not None) for step in compared
    }
    largest = max(differences.values(), default=None)
    result = {
        "run": {str(k): v for k, v in run.items()},
        "resumed": {str(k): v for k, v in resumed.items()},
        "steps_compared": compared,
        "missing": missing,
        "largest_relative_difference": largest,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"steps compared {compared}, missing {missing}, largest relative difference {largest}")
    sys.exit(1 if missing or not compared or largest > args.tolerance else 0)


if __name__ == "__main__":
    main()
