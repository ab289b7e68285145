"""Exact resume of run_pretraining.py: from a checkpoint inside a logging window, after SIGKILL, with DataLoader
workers; partial or unusable checkpoints never resumed from; the same collective save path on every process."""

import json
import signal
import time
from unittest import mock

import pytest

from albert_hf.errors import InputError
from albert_hf.pretraining.output.checkpoints import STATE_FILE, StepCheckpoints, remove_partial
from albert_hf.pretraining.resolution import parse_args
from albert_hf.pretraining.training.state import checked_position
from helpers import DDP, run_bounded, subprocess_env
from pretraining_runs import RESUME_ARGS, check_same_weights_and_curve, metrics, pretrain, pretrain_runs


@pytest.mark.parametrize("step", [3, 9])
@pytest.mark.trains
def test_resume_from_a_checkpoint_inside_a_logging_window_logs_the_uninterrupted_curve(tmp_path, reference_run, step):
    """Checkpoints at odd steps fall inside a 2-step logging window: the window's sums travel with the checkpoint,
    so the first row logged after the resume covers the same steps as the uninterrupted run's."""
    resumed = tmp_path / "resumed"
    done = pretrain(resumed, *RESUME_ARGS, "--resume_from_checkpoint", str(reference_run / f"step_{step}"))
    assert f"Resumed from {reference_run / f'step_{step}'}: step {step}" in done.stderr
    check_same_weights_and_curve(resumed, reference_run, after_step=step)


@pytest.mark.trains
def test_dataloader_workers_change_nothing_but_the_speed(tmp_path, reference_run):
    """Two DataLoader workers mask and batch the pairs: the uninterrupted run's weights and curve, and again
    when resumed from one of its checkpoints (masks are keyed on seed, epoch and example, not on a worker)."""
    workers = [*RESUME_ARGS, "--dataloader_num_workers", "2"]
    resumed = [*workers, "--resume_from_checkpoint", str(reference_run / "step_6")]
    results, done = pretrain_runs([(tmp_path / "workers", workers), (tmp_path / "resumed", resumed)], steps_only=False)
    assert [result["status"] for result in results] == [0, 0], results
    assert done.stderr.count("; 2 DataLoader workers") == 2  # in each start line
    for row in metrics(tmp_path / "workers"):  # the main process waits on the workers' batches
        if "data_wait" in row:
            assert 0 <= row["data_wait"] < 1 and 0.05 < row["peak_memory_gib"] < 64, row
    check_same_weights_and_curve(tmp_path / "workers", reference_run, after_step=0)
    check_same_weights_and_curve(tmp_path / "resumed", reference_run, after_step=6)


@pytest.mark.trains
def test_sigkill_mid_run_then_resume_ends_with_the_same_weights(tmp_path, reference_run):
    interrupted = tmp_path / "interrupted"
    process = pretrain(interrupted, *RESUME_ARGS, started=tmp_path)
    deadline = time.time() + 300
    while not (interrupted / "step_6" / STATE_FILE).exists():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (interrupted / "model.safetensors").exists()  # it really died before the end
    resumed_from = max(int(path.name[5:]) for path in interrupted.glob("step_*") if (path / STATE_FILE).exists())
    done = pretrain(interrupted, *RESUME_ARGS, "--resume_from_checkpoint", "latest")
    assert f"Resumed from {interrupted / f'step_{resumed_from}'}" in done.stderr
    # wherever the kill landed, the log holds one series: rows logged after the checkpoint were dropped on resume
    steps = [row["step"] for row in metrics(interrupted)]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) == 6
    check_same_weights_and_curve(interrupted, reference_run, after_step=0)


def test_partial_checkpoints_are_never_resumed_from(tmp_path):
    accelerator = mock.MagicMock(is_main_process=True)
    for name in ("step_3", "step_6", "step_9", ".tmp-step_12"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_3" / STATE_FILE).write_text("{}")
    (tmp_path / "step_6" / STATE_FILE).write_text("{}")
    # step_9 has no state file: a save killed before it was renamed into place would never be called step_9,
    # but a folder copied by hand might; .tmp-step_12 is what a killed save leaves
    checkpoints = StepCheckpoints(tmp_path, accelerator)
    assert checkpoints.resolve("latest") == tmp_path / "step_6"
    with pytest.raises(InputError, match="not a complete checkpoint"):
        checkpoints.resolve(str(tmp_path / "step_9"))
    remove_partial(tmp_path, accelerator)
    assert not (tmp_path / ".tmp-step_12").exists() and (tmp_path / "step_6").exists()
    assert StepCheckpoints(tmp_path / "missing", accelerator).resolve("latest") is None


def test_a_training_state_is_checked_once_on_load_position_and_window_alike(tmp_path):
    from albert_hf.pretraining.training.step import COUNTS

    position = {"step": 4, "epoch": 0, "batches_in_epoch": 4}
    window = {"window": [1.0] * COUNTS, "window_tokens": 512, "window_seconds": 0.5}
    for name, state, problem in (
        ("good", {**position, **window}, None),
        ("no_window", position, None),
        ("short", {**position, **window, "window": [1.0] * (COUNTS - 1)}, "the logging window"),
        ("text", {**position, **window, "window_tokens": "512"}, "the logging window"),
        ("negative", {**position, "step": -1}, "does not hold the loop's position"),
        ("totals", {**position, **window, "window_data_wait": 0.1, "run_tokens": 1e6, "run_seconds": 3}, None),
        ("nan_seconds", {**position, "run_seconds": float("nan")}, "the run's totals"),
        ("negative_wait", {**position, **window, "window_data_wait": -0.1}, "the run's totals"),
        ("text_tokens", {**position, "run_tokens": "1e6"}, "the run's totals"),
    ):
        if problem is None:
            assert checked_position(tmp_path / name, state, COUNTS) == state
        else:
            with pytest.raises(InputError, match=f"^--resume_from_checkpoint {tmp_path / name}: .*{problem}"):
                checked_position(tmp_path / name, state, COUNTS)


def test_a_checkpoint_that_cannot_be_resumed_stops_with_one_line_naming_the_flag(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(InputError, match=f"--resume_from_checkpoint {missing}: no such folder"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(missing)])
    incomplete = tmp_path / "step_5"
    incomplete.mkdir()
    with pytest.raises(InputError, match=f"--resume_from_checkpoint {incomplete}: not a complete checkpoint"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(incomplete)])

    # a folder that looks complete but lacks the saved state: found out when loading, still one line
    (incomplete / STATE_FILE).write_text(json.dumps({"step": 5, "epoch": 0, "batches_in_epoch": 5}))
    done = pretrain(
        tmp_path / "run",
        "--max_train_steps",
        "6",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        "--resume_from_checkpoint",
        str(incomplete),
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: --resume_from_checkpoint {incomplete}: random_states_0.pkl: missing")
    )
    assert not (tmp_path / "run" / "model.safetensors").exists()


DELAYED_SAVE = """
import sys, time
import torch
from accelerate import Accelerator
from albert_hf.pretraining.output.checkpoints import StepCheckpoints
from albert_hf.runtime.distributed import end_distributed

accelerator = Accelerator(cpu=True)
model = accelerator.prepare(torch.nn.Linear(2, 2))
checkpoints = StepCheckpoints(sys.argv[1], accelerator)
for step in (1, 1, 2):  # step 1 twice: the second save finds the checkpoint already there
    if accelerator.process_index == 1:
        time.sleep(2)  # the slow process looks only after the main process has renamed step_N into place
    checkpoints.save(step, {"step": step})
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), "sum")  # the next collective call
    with open(f"{sys.argv[2]}/rank_{accelerator.process_index}.txt", "a") as log:  # one file each: no interleaving
        log.write(f"rank {accelerator.process_index} step {step} total {total.item()}\\n")
del model  # then the process group is freed before the exit, as in run_pretraining (no abort in teardown)
assert end_distributed(accelerator) == 0
"""


@pytest.mark.launched
def test_checkpoint_save_takes_the_same_collective_path_on_every_process(tmp_path):
    """A slower process must not decide alone that a checkpoint exists and skip the collective calls the others
    make: it would leave them waiting forever (seen: a 2-process run hung at its first checkpoint)."""
    script = tmp_path / "delayed_save.py"
    script.write_text(DELAYED_SAVE)
    env = subprocess_env()
    done = run_bounded(DDP + [str(script), str(tmp_path / "out"), str(tmp_path)], timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for rank in (0, 1) for line in (tmp_path / f"rank_{rank}.txt").read_text().splitlines())
    assert lines == [f"rank {rank} step {step} total 3.0" for rank in (0, 1) for step in (1, 1, 2)]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["step_1", "step_2"]
    for step in ("step_1", "step_2"):  # each process's own random states made it into the renamed folder
        assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in (tmp_path / "out" / step).iterdir()}
