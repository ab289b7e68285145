"""benchmarks/gpu_check.py, the first command to run on a GPU, runs every part here on the CPU with the tiny preset."""

import json
import math
import sys

import pytest

from helpers import REPO, run_bounded, subprocess_env


@pytest.mark.trains
@pytest.mark.rounding
def test_gpu_check_runs_every_part_on_the_cpu_and_writes_its_report(tmp_path):
    out = tmp_path / "check.json"
    done = run_bounded(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--steps",
            "4",
            "--out",
            str(out),
        ],
        600,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failed"] == [] and "Traceback" not in done.stderr
    assert [path.name for path in tmp_path.iterdir()] == ["check.json"]  # the parts' work folder removed
    assert report["machine"]["device"] == "cpu" and report["machine"]["hardware"].startswith("cpu: ")
    parity = report["parity"]
    assert parity["passed"] and len([k for k in parity if k.startswith("AlbertHF")]) == 8
    pretraining = report["pretraining"]
    assert pretraining["steps"] == 4 and pretraining["tokens_per_s"] > 0 and 0 < pretraining["mfu"] < 1
    # 4 steps take the held-out MLM loss below ln 1000 = 6.91, where an untrained model's random logits sit (at or
    # above guessing uniformly over the 1000 pieces); measured 6.81 on AMX
    assert pretraining["eval_mlm_loss"] < math.log(1000) and pretraining["precision"]
    against = report["against_transformers"]
    assert set(against["tokens_per_s"]) == {"transformers", "albert_hf"} and against["ratio"] > 0
    # an accuracy over the 64 dev rows gpu_check writes: a whole number of them right
    right = report["fine_tuning"]["eval_accuracy"] * 64
    assert abs(right - round(right)) < 1e-6 and report["fine_tuning"]["steps"] == 2
    fsdp = report["fsdp2_one_process"]
    assert fsdp["passed"] and len(fsdp["losses"]["fsdp2"]) == 3


def test_gpu_check_without_a_gpu_says_so_in_one_line(monkeypatch):
    import gpu_check

    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--device", "cuda"])
    assert str(stop.value).startswith("gpu_check.py: --device cuda, but torch sees no CUDA device")
