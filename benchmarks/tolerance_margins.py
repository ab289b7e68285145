"""How close each `torch.testing.assert_close` of the tests comes to its tolerance: the evidence for which tests
belong in `make test`'s AVX2-capped pass (marker `rounding`).

A pytest plugin: every assert_close records, per test, the largest |actual - expected| / (atol + rtol * |expected|)
it saw (1 is the edge of the tolerance). Run the tests once on this CPU's kernels and once with the AVX2 caps, then
compare:

    CLEAN="env -i PATH=$PATH HOME=$HOME LANG=C.UTF-8 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONPATH=benchmarks"
    RUN=".venv/bin/python -m pytest -p tolerance_margins -n 2 --dist loadfile -m rounding tests"
    $CLEAN MARGINS_OUT=native.jsonl $RUN
    $CLEAN ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 MARGINS_OUT=capped.jsonl $RUN
    python benchmarks/tolerance_margins.py native.jsonl capped.jsonl

A comparison that stays far below 1 under both kernel sets (a few ulps of fp32) cannot be flipped by the kernels'
rounding; one near 1 under either can. Comparisons made in a launched or started process are not seen (the tests
compare the saved weights in the test's own process, which is seen).
"""

import collections
import json
import os
import sys

_RECORDING = {"test": None}


def _record(actual, expected, rtol, atol) -> None:
    import torch

    if not (
        isinstance(actual, torch.Tensor)
        and isinstance(expected, torch.Tensor)
        and actual.is_floating_point()
        and actual.numel()
    ):
        return
    if rtol is None or atol is None:  # torch's defaults for the dtype
        rtol, atol = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float64: (1e-7, 1e-7)}.get(
            actual.dtype, (1.3e-6, 1e-5)
        )
    got, want = actual.detach().double().cpu(), expected.detach().double().cpu()
    ratio = ((got - want).abs() / (atol + rtol * want.abs())).max().item()
    with open(os.environ["MARGINS_OUT"], "a") as out:
        out.write(json.dumps({"test": _RECORDING["test"], "ratio": ratio}) + "\n")


def pytest_configure(config):
    import torch

    original = torch.testing.assert_close

    def assert_close(actual, expected, *args, rtol=None, atol=None, **kwargs):
        try:
            _record(actual, expected, rtol, atol)
        except Exception:  # noqa: BLE001 - the measurement never changes a test's outcome
            pass
        return original(actual, expected, *args, rtol=rtol, atol=atol, **kwargs)

    torch.testing.assert_close = assert_close


def pytest_runtest_setup(item):
    _RECORDING["test"] = item.nodeid


def worst(path: str) -> dict:
    found = collections.defaultdict(float)
    with open(path) as records:
        for line in records:
            record = json.loads(line)
            found[record["test"]] = max(found[record["test"]], record["ratio"])
    return found


def main(paths: list[str]) -> None:
    runs = [worst(path) for path in paths]
    tests = sorted(set().union(*runs), key=lambda test: -max(run.get(test, 0.0) for run in runs))
    print("| test | " + " | ".join(os.path.basename(path) for path in paths) + " |")
    print("|---|" + "---:|" * len(paths))
    for test in tests:
        print(f"| {test} | " + " | ".join(f"{run[test]:.2g}" if test in run else "-" for run in runs) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
