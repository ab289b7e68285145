"""Faults of the machine (albert_hf/runtime/storage.py): a full disk or a refused folder ends a run in one line naming
what is intact, leaves no temporary folder, and the run resumes exactly once space is free. Full disks are simulated
(tests/failing_writes.py makes the writes of one path fail with ENOSPC partway through) and, where the tests run as root
on Linux, real: a small tmpfs."""

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.pretraining.output.checkpoints import STATE_FILE
from albert_hf.runtime.storage import fault_of
from helpers import REPO, glue_args, run_bounded, subprocess_env
from pretraining_runs import FAST, RESUME_ARGS, SCRIPT, check_same_weights_and_curve, pretrain

FAILING_WRITES = str(REPO / "tests" / "failing_writes.py")


def test_full_disks_and_refused_folders_are_recognised_whatever_raises_them():
    assert fault_of(OSError(errno.ENOSPC, "No space left on device")) == "no space left"
    assert fault_of(OSError(errno.EROFS, "Read-only file system")) == "read-only file system"
    assert fault_of(PermissionError(errno.EACCES, "Permission denied")) == "permission denied"
    # what torch's zip writer and safetensors raise when the disk fills (seen on a full filesystem)
    assert (
        fault_of(RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 6989376 vs 6989264"))
        == "no space left"
    )
    assert (
        fault_of(Exception("Error while serializing: I/O error: No space left on device (os error 28)"))
        == "no space left"
    )
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as cause:
            raise RuntimeError("save failed") from cause
    except RuntimeError as wrapped:
        assert fault_of(wrapped) == "no space left"
    assert fault_of(ValueError("a bad value")) is None and fault_of(FileNotFoundError(errno.ENOENT, "x")) is None


def failing_run(pattern: str, script: str, *argv, cwd) -> subprocess.CompletedProcess:
    done = run_bounded(
        [sys.executable, FAILING_WRITES, pattern, script, *map(str, argv)], 300, cwd=cwd, env=subprocess_env()
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def error_line(done) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


@pytest.mark.trains
def test_a_checkpoint_the_disk_cannot_hold_stops_in_one_line_and_the_run_resumes_exactly(tmp_path, reference_run):
    run = tmp_path / "run"
    keep_one = [*RESUME_ARGS, "--checkpoints_total_limit", "1"]  # step_3 may go only once step_6 is complete
    done = failing_run(".tmp-step_6", SCRIPT, "--output_dir", run, *FAST, *keep_one, cwd=tmp_path)
    line = error_line(done)
    assert line.startswith("error: no space left on ") and "writing the step-6 checkpoint" in line, line
    assert " needed, " in line and " free)" in line, line  # the space needed and free
    assert line.endswith("step_3 is complete: free space (or fix the folder), then --resume_from_checkpoint latest")
    assert not list(run.glob(".tmp-*")) and not (run / "step_6").exists()  # nothing partial left holding space
    assert (run / "step_3" / STATE_FILE).is_file()
    pretrain(run, *keep_one, "--resume_from_checkpoint", "latest")
    check_same_weights_and_curve(run, reference_run, after_step=3)
    assert sorted(path.name for path in run.glob("step_*")) == ["step_12"]  # the limit, once each was complete


@pytest.mark.trains
def test_a_final_folder_the_disk_cannot_hold_stops_in_one_line_and_the_last_checkpoint_finishes_it(
    tmp_path, reference_run
):
    run = tmp_path / "run"
    done = failing_run(".tmp-final", SCRIPT, "--output_dir", run, *FAST, *RESUME_ARGS, cwd=tmp_path)
    line = error_line(done)
    assert "writing the final model folder" in line and line.endswith(
        "step_12 is complete: free space (or fix the folder), then --resume_from_checkpoint latest"
    ), line
    assert not list(run.glob(".tmp-*")) and not (run / "model.safetensors").exists()
    pretrain(run, *RESUME_ARGS, "--resume_from_checkpoint", "latest")
    expected, got = load_file(reference_run / "model.safetensors"), load_file(run / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.trains
def test_a_fine_tuning_checkpoint_the_disk_cannot_hold_stops_in_one_line(tmp_path, tiny_checkpoint, glue_root):
    out = tmp_path / "rte"
    argv = glue_args(
        tiny_checkpoint,
        out,
        "--task_name",
        "rte",
        "--data_dir",
        glue_root,
        "--do_train",
        "--max_steps",
        4,
        "--save_strategy",
        "steps",
        "--save_steps",
        2,
    )
    done = failing_run("checkpoint-4", str(REPO / "run_glue.py"), *argv, cwd=tmp_path)
    line = error_line(done)
    assert "writing the step-4 checkpoint" in line and line.endswith(
        "checkpoint-2 is complete: free space (or fix the folder), then run the same command again: it resumes "
        "from there"
    ), line
    assert sorted(path.name for path in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert (out / "checkpoint-2" / "trainer_state.json").is_file()


@pytest.fixture
def small_tmpfs(tmp_path):
    """A mount of a tmpfs of the size asked for (root on Linux only), unmounted afterwards."""
    mounted = []

    def mount(size: int, read_only: bool = False):
        if os.geteuid() != 0 or not shutil.which("mount"):
            pytest.skip("a real small filesystem needs root (mount -t tmpfs)")
        folder = tmp_path / f"fs{len(mounted)}"
        folder.mkdir()
        options = f"size={size}" + (",ro" if read_only else "")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True
        )
        if done.returncode != 0:
            pytest.skip(f"mount -t tmpfs refused here: {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.trains
def test_on_a_real_small_filesystem_the_start_and_the_second_checkpoint_stop_in_one_line(
    tmp_path, small_tmpfs, reference_run
):
    # a checkpoint's own files; its model files are links to the run's one copy, written once
    shared = {f.name for f in (reference_run / ".model_files").iterdir()}
    one_checkpoint = sum(
        f.stat().st_size for f in (reference_run / "step_3").rglob("*") if f.is_file() and f.name not in shared
    )
    model_files = sum(f.stat().st_size for f in (reference_run / ".model_files").iterdir())
    # Too small for one checkpoint: refused at the start, before the corpus is read.
    tiny = small_tmpfs(one_checkpoint // 4)
    done = run_bounded(
        [sys.executable, SCRIPT, "--output_dir", tiny / "run", *FAST, *RESUME_ARGS],
        300,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    line = error_line(done)
    assert done.returncode == 2 and "less than one checkpoint needs" in line, done.stderr[-2000:]
    assert "Pair building" not in done.stderr and "tokenizer" not in done.stderr  # nothing read or trained
    # Room for one checkpoint and a half: the second fails for real (torch's or safetensors' own full-disk error).
    room = small_tmpfs(model_files + int(one_checkpoint * 1.5))
    done = run_bounded(
        [sys.executable, SCRIPT, "--output_dir", room / "run", *FAST, *RESUME_ARGS],
        300,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    line = error_line(done)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert line.startswith(f"error: no space left on {room} writing the step-6 checkpoint"), line
    assert line.endswith("step_3 is complete: free space (or fix the folder), then --resume_from_checkpoint latest")
    assert not list((room / "run").glob(".tmp-*")) and (room / "run" / "step_3" / STATE_FILE).is_file()
    # A read-only folder: one line at the start.
    read_only = small_tmpfs(1_000_000, read_only=True)
    done = run_bounded(
        [sys.executable, SCRIPT, "--output_dir", read_only / "run", *FAST, *RESUME_ARGS],
        300,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert done.returncode == 2 and error_line(done) == (
        f"error: --output_dir {read_only / 'run'}: read-only file system on {read_only}; choose a folder this "
        "process can write"
    )


@pytest.mark.trains
def test_fine_tuning_into_a_read_only_folder_stops_in_one_line_before_reading_data(
    tmp_path, small_tmpfs, tiny_checkpoint, glue_root
):
    read_only = small_tmpfs(1_000_000, read_only=True)
    argv = glue_args(
        tiny_checkpoint,
        read_only / "rte",
        "--task_name",
        "rte",
        "--data_dir",
        glue_root,
        "--do_train",
        "--max_steps",
        2,
    )
    done = run_bounded(
        [sys.executable, str(REPO / "run_glue.py"), *map(str, argv)], 300, cwd=tmp_path, env=subprocess_env()
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert error_line(done) == (
        f"error: --output_dir {read_only / 'rte'}: read-only file system on {read_only}; "
        "choose a folder this process can write"
    )
    assert " rows from " not in done.stderr  # no data was read


def test_an_unloadable_checkpoint_names_the_newest_earlier_intact_one(tmp_path):
    """Intact: complete, and its files as its record says (step_6's record names a file that is not there)."""
    from albert_hf.pretraining.output.checkpoints import RECORD, RECORD_FILE, StepCheckpoints

    for step in (3, 6, 9):
        (tmp_path / f"step_{step}").mkdir()
        (tmp_path / f"step_{step}" / STATE_FILE).write_text(json.dumps({"step": step}))
    assert StepCheckpoints.earlier_than(tmp_path / "step_9") == (
        f"; the newest earlier intact checkpoint is {tmp_path / 'step_6'}: --resume_from_checkpoint "
        f"{tmp_path / 'step_6'}"
    )
    assert StepCheckpoints.earlier_than(tmp_path / "step_3") == "; no earlier intact checkpoint is beside it"
    (tmp_path / "step_6" / STATE_FILE).write_text(json.dumps({"step": 6, RECORD: RECORD_FILE}))
    (tmp_path / "step_6" / RECORD_FILE).write_text(
        json.dumps({"files": {"model.safetensors": {"bytes": 1, "sha256": "0" * 64}}})
    )
    assert StepCheckpoints.earlier_than(tmp_path / "step_9") == (
        f"; the newest earlier intact checkpoint is {tmp_path / 'step_3'}: --resume_from_checkpoint "
        f"{tmp_path / 'step_3'}"
    )


@pytest.mark.parametrize(
    "mode, failing",
    [
        ("DDP", ".tmp-step_6/model"),  # only the first process writes it
        ("FSDP", ".tmp-step_6/random_states_1"),
    ],
)  # only the second does
@pytest.mark.trains
@pytest.mark.launched
def test_under_ddp_and_fsdp_every_process_stops_at_the_failed_checkpoint_and_none_waits(tmp_path, mode, failing):
    from helpers import DDP, FSDP

    launcher = {"DDP": DDP, "FSDP": FSDP}[mode]
    run = tmp_path / "run"
    done = run_bounded(
        [
            *launcher,
            FAILING_WRITES,
            failing,
            SCRIPT,
            "--output_dir",
            run,
            *FAST,
            *RESUME_ARGS,
            "--per_device_train_batch_size",
            "4",
        ],
        300,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert done.returncode != 0
    line = error_line(done)  # one line, from the first process, whichever process failed
    assert "writing the step-6 checkpoint" in line and line.endswith(
        "step_3 is complete: free space (or fix the folder), then --resume_from_checkpoint latest"
    ), line
    assert "[rank" not in done.stderr, done.stderr[-3000:]  # no worker traceback
    assert not list(run.glob(".tmp-*")) and (run / "step_3" / STATE_FILE).is_file()


def test_any_other_refused_write_reaching_an_entry_point_is_one_line_with_the_file_and_free_space(tmp_path, capsys):
    """Writes no writer of ours reports with its context (a results file, prepared data): the entry point's line."""
    from albert_hf.runtime.cli import run_entry_point

    target = tmp_path / "eval_results.json"

    def full_disk():
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    with pytest.raises(SystemExit) as stop:
        run_entry_point(full_disk)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: no space left on ") and f" writing {target} (" in line and line.endswith(" free)")

    def a_bug():
        raise OSError(errno.ENOENT, "No such file or directory", str(target))

    with pytest.raises(FileNotFoundError):  # not a machine's refusal: a bug keeps its traceback
        run_entry_point(a_bug)


def test_a_file_removed_while_a_folder_is_measured_counts_nothing(tmp_path, monkeypatch):
    """Another process may remove a failed checkpoint's folder while this one measures it (seen under DDP): a file
    listed but gone by its stat counts 0 instead of ending the process."""
    from pathlib import Path

    from albert_hf.runtime.storage import folder_bytes

    (tmp_path / "kept.bin").write_bytes(b"x" * 10)
    gone = tmp_path / "gone.bin"
    listed = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: [*listed(self, pattern), gone])
    real_is_file = Path.is_file
    monkeypatch.setattr(Path, "is_file", lambda self: self == gone or real_is_file(self))
    assert folder_bytes(tmp_path) == 10
