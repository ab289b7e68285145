"""Where `make test`'s time goes: the per-test durations of a pytest run (`--durations=0` output), summed by file
and by kind (the markers launched, compiles, trains and rounding; real data: the tests whose source reads the shared
data folder; subprocess: the tests that start a script or a launcher).

    CLEAN="env -i PATH=$PATH HOME=$HOME LANG=C.UTF-8"
    $CLEAN .venv/bin/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --durations=0 tests > pass1.txt
    python benchmarks/suite_time.py pass1.txt [pass2.txt ...]

Prints two markdown tables: seconds per file (setup, call and teardown summed), and per kind. A test counts in every
kind it has; the seconds are worker seconds (two workers share the wall time).
"""

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKERS = ("launched", "compiles", "trains", "rounding")
LINE = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(\S+)")


def durations(path: Path) -> dict:
    """{test id: seconds} of one run's durations list."""
    seconds = collections.Counter()
    for line in path.read_text().splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    return seconds


def marked(marker: str) -> set:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m", marker, "tests"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def source_kinds() -> dict:
    """{file::function: {"real data", "subprocess"}} from each test function's source."""
    kinds = {}
    for path in sorted((REPO / "tests").glob("test_*.py")):
        text = path.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                body = ast.get_source_segment(text, node)
                found = set()
                if re.search(r"SHARED|shared_corpus|real_|_real\b|GLUE_DATA|SHARED_RACE", body + node.name):
                    found.add("real data")
                if re.search(r"pretrain\(|pretrain_runs|run_bounded|start_process|LAUNCH|subprocess|_command\(", body):
                    found.add("subprocess")
                kinds[f"tests/{path.name}::{node.name}"] = found
    return kinds


def main(argv=None):
    paths = [Path(p) for p in (argv or sys.argv[1:])]
    markers = {marker: marked(marker) for marker in MARKERS}
    by_source = source_kinds()
    for path in paths:
        seconds = durations(path)
        per_file, per_kind, counts = collections.Counter(), collections.Counter(), collections.Counter()
        for test, value in seconds.items():
            per_file[test.split("::")[0]] += value
            kinds = {marker for marker, tests in markers.items() if test in tests}
            kinds |= by_source.get(test.split("[")[0], set())
            for kind in kinds or {"none of these"}:
                per_kind[kind] += value
                counts[kind] += 1
        print(f"\n{path}: {sum(seconds.values()):.0f} worker seconds, {len(seconds)} tests\n")
        print("| file | seconds |\n|---|---:|")
        for name, value in per_file.most_common():
            if value >= 1:
                print(f"| {name} | {value:.0f} |")
        print("\n| kind | tests | seconds |\n|---|---:|---:|")
        for name, value in per_kind.most_common():
            print(f"| {name} | {counts[name]} | {value:.0f} |")


if __name__ == "__main__":
    main()
