"""run_pretraining.py as the tests run it: tiny and fast flags, one run in a process (`pretrain`) or several
in one process or launch (`pretrain_runs`), its metrics, the check that a run ends as a reference did, and a run
stopped by a signal (`signal_once_training`, `stopped_step`)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from helpers import REPO, run_bounded, start_process, subprocess_env

SCRIPT = str(REPO / "run_pretraining.py")


# Tiny and fast: the embedded corpus, a 500-piece tokenizer (trained once, cached in the test HF_HOME).
FAST = [
    "--vocab_size",
    "500",
    "--max_seq_length",
    "64",
    "--per_device_train_batch_size",
    "8",
    "--dupe_factor",
    "1",
    "--max_eval_samples",
    "64",
    "--logging_steps",
    "2",
    "--seed",
    "7",
    "--mixed_precision",
    "no",
]  # fp32 whatever the CPU: the precision choice has its own tests (test_hardware)
# FAST without the flags that shape the pairs: a run on a --prepared_data folder takes those from its manifest
FAST_TRAINING = ["--per_device_train_batch_size", "8", "--logging_steps", "2", "--seed", "7", "--mixed_precision", "no"]


def pretrain(
    out, *extra, launcher=None, check=True, timeout=300, started: Path | None = None, env=None, new_session=False
):
    """The script run to its end (the finished process), or with `started` (a folder for its stdout.txt and
    stderr.txt) only started (the running process; with `new_session`, as a scheduler's job: `signal_job`)."""
    command = (launcher or [sys.executable]) + [SCRIPT, "--output_dir", str(out), *FAST, *extra]
    env = subprocess_env(**(env or {}))
    if started:
        return start_process(
            command,
            env=env,
            cwd=out.parent,
            stdout=started / "stdout.txt",
            stderr=started / "stderr.txt",
            new_session=new_session,
        )
    done = run_bounded(command, timeout, env=env, cwd=out.parent)
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def pretrain_runs(
    runs, launcher=None, timeout=300, steps_only=False, process_env=None
) -> tuple[list[dict], subprocess.CompletedProcess]:
    """Several `pretrain` runs, each (output folder, extra arguments[, environment[, steps_only[, hooks[, fast]]]]),
    one after the other in one process or one launch (tests/launched_runs.py: a launch costs more than a tiny run),
    each with FAST's flags (`fast` False: FAST_TRAINING's, for a run on a --prepared_data folder). Per run:
    "status" (0, 2 or "traceback") and "line" (its error line), and the finished process. With `steps_only` (the
    default for runs that do not say), prepare and fit only (no final save). `process_env`: set for the whole
    process, before torch is imported (a run's own environment is set after)."""
    spec = [
        {
            "argv": ["--output_dir", str(out), *(FAST if len(rest) < 4 or rest[3] else FAST_TRAINING), *extra],
            "env": rest[0] if rest else {},
            "steps_only": rest[1] if len(rest) > 1 else steps_only,
            "hooks": rest[2] if len(rest) > 2 else {},
        }
        for out, extra, *rest in runs
    ]
    folder = Path(runs[0][0]).parent
    path = folder / f"runs-{Path(runs[0][0]).name}.json"
    path.write_text(json.dumps(spec))
    command = (launcher or [sys.executable]) + [str(REPO / "tests" / "launched_runs.py"), str(path)]
    env = subprocess_env(**(process_env or {}))
    done = run_bounded(command, timeout, env=env, cwd=folder)
    results = Path(f"{path}.results")
    assert done.returncode == 0 and results.is_file(), done.stderr[-4000:]
    return json.loads(results.read_text()), done


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# the logged fields measured in time or memory: equal runs differ there
TIMED = (
    "tokens_per_second",
    "model_tflops_per_second",
    "mfu",
    "data_wait",
    "peak_memory_gib",
    "mean_model_tflops_per_second",
    "mean_mfu",
)


def untimed(rows):
    """`rows` of metrics.jsonl without the fields measured in time or memory (TIMED)."""
    return [{k: v for k, v in row.items() if k not in TIMED} for row in rows]


RESUME_ARGS = [
    "--max_train_steps",
    "12",
    "--checkpointing_steps",
    "3",
    "--eval_steps",
    "0",
    "--validation_split_percentage",
    "0",
]  # checkpoints at 3, 6, 9, 12; logging every 2 steps (FAST)


def check_same_weights_and_curve(run, reference, after_step):
    expected, got = load_file(reference / "model.safetensors"), load_file(run / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # the resumed run continues the same curve: it logs the same steps, with the same losses, after the resume point
    reference_rows = [row for row in metrics(reference) if row["step"] > after_step]
    rows = [row for row in metrics(run) if row["step"] > after_step]
    assert [row["step"] for row in rows] == [row["step"] for row in reference_rows] and rows
    for row, expected_row in zip(rows, reference_rows):
        for key in ("train_mlm_loss", "train_mlm_accuracy", "train_sop_loss", "train_sop_accuracy"):
            assert row[key] == pytest.approx(expected_row[key], abs=1e-7), (row["step"], key)
        # the gradient norm of the window's last step, the same where the weights are
        assert row["grad_norm"] == pytest.approx(expected_row["grad_norm"], rel=1e-5, abs=1e-7), row["step"]
    # the run's tokens travel with its checkpoints: a resumed run counts the model FLOPs of the whole run
    total = [json.loads((folder / "all_results.json").read_text())["total_model_flops"] for folder in (run, reference)]
    assert total[0] == pytest.approx(total[1], rel=1e-12) and total[0] > 0


def signal_once_training(run, process, targets, signum, repeat_until_exit=False):
    """Sends `signum` to `targets()` (processes) once the run has logged its first training row; with
    `repeat_until_exit`, again every 20 ms until the run has exited (signals arriving during the save)."""
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists():
        assert process.poll() is None, "the run ended before it could be signalled"
        assert time.time() < deadline
        time.sleep(0.02)
    sent = 0
    while process.poll() is None and (sent == 0 or repeat_until_exit):
        for target in targets():
            try:
                target.send_signal(signum)
                sent += 1
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.02)
    try:
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run was still running 300 s after {sent} signal(s)")
    assert sent, "the run ended before a signal reached it: nothing here tested its handling"
    return sent


def stopped_step(stderr: str) -> int:
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Stopped by ") and last.endswith(
        "run the same command with --resume_from_checkpoint latest"
    ), stderr[-3000:]
    return int(last.split(" after step ")[1].split(" ")[0])
