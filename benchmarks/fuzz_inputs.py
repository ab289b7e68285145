#!/usr/bin/env python
"""Fuzz every input kind the scripts read, thousands of cases, and report the counts.

    python benchmarks/fuzz_inputs.py --cases_per_kind 200          # 18 kinds x 200 = 3,600 cases
    python benchmarks/fuzz_inputs.py --kinds glue_tsv race --cases_per_kind 1000 --first_seed 5000

Each case writes a valid input, mutates it with seeded edits (benchmarks/fuzzing.py: byte edits, and
structural edits of JSON files) and runs what a script runs on it. Outcomes: run, skip (a logged skip with a count),
refusal (one InputError line), traceback (any other exception: a bug) and hang (over the time limit). Failing cases are
printed with their seed and stay on disk for reproduction. Exit status 1 when any case failed.
"""

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="albert_hf_fuzz_home_"))
os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = os.environ["TRANSFORMERS_OFFLINE"] = "1"

from fuzzing import KINDS, OUTCOMES, Resources, quiet_libraries, run_cases  # noqa: E402


def tiny_checkpoint(directory: Path) -> Path:
    """The tests' tiny checkpoint: a random tiny AlbertHFForPreTraining with a 1000-piece tokenizer."""
    import torch

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from data_fixtures import tokenizer

    tok = tokenizer()
    torch.manual_seed(0)
    AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", vocab_size=len(tok))).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", choices=sorted(KINDS), default=sorted(KINDS))
    parser.add_argument("--cases_per_kind", type=int, default=200)
    parser.add_argument("--first_seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="where cases are written (default: a temporary folder)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="albert_hf_fuzz_"))
    resources = Resources(tiny_checkpoint(workdir / "tiny"), workdir)
    print(
        f"{cpu_model()}; {len(args.kinds)} kinds x {args.cases_per_kind} cases, "
        f"seeds from {args.first_seed}; cases in {workdir}"
    )
    seeds = range(args.first_seed, args.first_seed + args.cases_per_kind)
    header = f"| kind | {' | '.join(OUTCOMES)} | s |"
    print(header + "\n|---" + "|---:" * (len(OUTCOMES) + 1) + "|")
    totals, failures, start_all = {outcome: 0 for outcome in OUTCOMES}, [], time.perf_counter()
    for kind in args.kinds:
        start = time.perf_counter()
        with quiet_libraries():
            counts, failed = run_cases(resources, [kind], seeds)
        failures += failed
        for outcome in OUTCOMES:
            totals[outcome] += counts[kind, outcome]
        print(
            f"| {kind} | {' | '.join(f'{counts[kind, o]:,}' for o in OUTCOMES)} | {time.perf_counter() - start:.0f} |",
            flush=True,
        )
    print(f"| all | {' | '.join(f'{totals[o]:,}' for o in OUTCOMES)} | {time.perf_counter() - start_all:.0f} |")
    for case in failures[:10]:
        print(f"\n{case.kind} seed {case.seed}: {case.outcome}\n{case.detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
