"""One run per output folder (albert_hf/runtime/output_lock.py): a second run is refused in one line naming the holder,
the first goes on; a lock left by a killed run is taken over; one of another host is honoured unless told."""

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from albert_hf.errors import InputError
from albert_hf.runtime import output_lock
from albert_hf.runtime.output_lock import LOCK_FILE
from albert_hf.testing.glue_folders import write_glue_folders
from helpers import run_script, subprocess_env
from pretraining_runs import metrics, pretrain

HOLD = (
    "import sys, time\nfrom albert_hf.runtime import output_lock\n"
    "output_lock.acquire(sys.argv[1], '--output_dir')\nprint('held', flush=True)\ntime.sleep(120)\n"
)


@pytest.fixture
def holder(tmp_path):
    """Another process of this host holding the lock of tmp_path/run."""
    folder = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    assert process.stdout.readline().strip() == "held"
    yield folder, process
    process.kill()
    process.wait()


def ended_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def write_lock(folder, **record):
    folder.mkdir(parents=True, exist_ok=True)
    lock = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": output_lock.process_start(os.getpid()),
        "started": "2026-01-01 00:00:00 UTC",
        "command": "run_pretraining.py --output_dir x",
        **record,
    }
    (folder / LOCK_FILE).write_text(json.dumps(lock))
    return lock


def test_a_live_holder_is_named_and_its_lock_kept(holder):
    folder, process = holder
    with pytest.raises(InputError) as refused:
        output_lock.acquire(folder, "--output_dir")
    message = str(refused.value)
    assert message.startswith(f"--output_dir {folder} is in use by ")
    assert f"(host {socket.gethostname()}, PID {process.pid}, since " in message and "\n" not in message
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == process.pid


def test_the_lock_is_made_whole_and_released_only_by_its_holder(tmp_path):
    folder = tmp_path / "run"
    output_lock.acquire(folder, "--output_dir")
    record = json.loads((folder / LOCK_FILE).read_text())
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert sorted(p.name for p in folder.iterdir()) == [LOCK_FILE]  # no draft left beside it
    output_lock.acquire(folder, "--output_dir")  # this process again: it holds it already
    output_lock.release_all()
    assert not (folder / LOCK_FILE).exists()
    output_lock.acquire(folder, "--output_dir")
    write_lock(folder, pid=12345678)  # someone else's lock now stands there: not ours to remove
    output_lock.release_all()
    assert (folder / LOCK_FILE).exists()


@pytest.mark.parametrize("left_by", ["an ended process", "a reused PID", "an unreadable file"])
def test_a_lock_of_an_ended_run_of_this_host_is_taken_over_with_a_line(tmp_path, caplog, left_by):
    folder = tmp_path / "run"
    if left_by == "an ended process":
        write_lock(folder, pid=ended_pid())
    elif left_by == "a reused PID":  # this very PID, but a process that started at another time
        write_lock(folder, process_start="1")
    else:
        folder.mkdir()
        (folder / LOCK_FILE).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        output_lock.acquire(folder, "--output_dir")
    assert json.loads((folder / LOCK_FILE).read_text())["process_start"] == output_lock.process_start(os.getpid())
    assert caplog.text.count(f"--output_dir {folder}: took over the lock of ") == 1


def test_a_lock_of_another_host_is_honoured_unless_taken_over(tmp_path, caplog):
    folder = tmp_path / "run"
    write_lock(folder, host="node-17", pid=4242)
    with pytest.raises(InputError) as refused:
        output_lock.acquire(folder, "--output_dir")
    assert str(refused.value) == (
        f"--output_dir {folder} is locked by run_pretraining.py --output_dir x (host node-17, PID 4242, since "
        "2026-01-01 00:00:00 UTC), on another host, which cannot be checked from here; if that run has ended, pass "
        "--take_over_lock"
    )
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        output_lock.acquire(folder, "--output_dir", take_over=True)
    assert "on another host, taken over as asked" in caplog.text
    assert json.loads((folder / LOCK_FILE).read_text())["host"] == socket.gethostname()


def test_a_second_pretraining_run_on_a_folder_in_use_is_refused_and_the_first_goes_on(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    first = pretrain(
        run,
        "--max_train_steps",
        "400",
        "--logging_steps",
        "2",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        started=tmp_path,
    )
    deadline = time.time() + 300
    while not (run / "metrics.jsonl").exists():  # training: the lock is held
        assert first.poll() is None and time.time() < deadline, (tmp_path / "stderr.txt").read_text()[-3000:]
        time.sleep(0.05)
    for flags in (["--overwrite_output_dir"], ["--resume_from_checkpoint", "latest"], []):  # whatever it asks
        second = pretrain(run, *flags, "--max_train_steps", "4", check=False)
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-3000:]
        assert second.stderr.strip().splitlines()[-1].startswith(f"error: --output_dir {run} is in use by ")
        assert f"PID {first.pid}, since " in second.stderr
    first.send_signal(signal.SIGTERM)  # the first run stops at a step boundary, with its checkpoint
    assert first.wait(timeout=300) == 75, (tmp_path / "stderr.txt").read_text()[-3000:]
    steps = [row["step"] for row in metrics(run)]
    assert steps and steps == sorted(set(steps))  # nothing of the second run in the first's log
    assert not (run / LOCK_FILE).exists()  # released on the way out after SIGTERM too


def test_after_kill_9_the_next_start_takes_the_lock_over_and_resumes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    # wsd: the resume below shortens the run, which the official schedule's rates (tied to the length) refuse
    wsd = ["--lr_scheduler_type", "wsd", "--decay_steps", "2"]
    args = [
        *wsd,
        "--max_train_steps",
        "400",
        "--checkpointing_steps",
        "4",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
    ]
    first = pretrain(run, *args, started=tmp_path)
    deadline = time.time() + 300
    while not list(run.glob("step_*")):
        assert first.poll() is None and time.time() < deadline, (tmp_path / "stderr.txt").read_text()[-3000:]
        time.sleep(0.05)
    first.kill()
    first.wait(timeout=60)
    assert (run / LOCK_FILE).exists()
    done = pretrain(
        run,
        "--resume_from_checkpoint",
        "latest",
        *wsd,
        "--max_train_steps",
        "12",
        "--checkpointing_steps",
        "4",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"--output_dir {run}: took over the lock of " in done.stderr and "which has ended" in done.stderr
    assert f"Resumed from {run / 'step_'}" in done.stderr
    assert [row["step"] for row in metrics(run)][-1] == 12
    assert not (run / LOCK_FILE).exists()


def test_a_fine_tuning_run_on_a_folder_in_use_is_refused_in_one_line(holder, tiny_checkpoint, capsys):
    folder, process = holder
    glue = write_glue_folders(folder.parent / "glue")
    with pytest.raises(InputError) as refused:
        run_script(
            "run_glue",
            [
                "--model_name_or_path",
                tiny_checkpoint,
                "--task_name",
                "rte",
                "--data_dir",
                glue / "RTE",
                "--do_train",
                "--max_steps",
                "2",
                "--output_dir",
                folder,
                "--report_to",
                "none",
                "--save_strategy",
                "no",
            ],
        )
    assert str(refused.value).startswith(f"--output_dir {folder} is in use by ")
    assert f"PID {process.pid}" in str(refused.value)
    assert not list(folder.glob("checkpoint-*"))


def test_a_launched_runs_other_processes_see_their_own_runs_lock_as_free(holder, monkeypatch):
    """Under accelerate launch the first process takes the lock; the others, checking the folder after it, must not
    take it for another run's (every launched run failed so)."""
    folder, process = holder
    assert output_lock.in_use(folder, "--output_dir").startswith(f"--output_dir {folder} is in use by ")
    monkeypatch.setenv("RANK", "1")
    assert output_lock.in_use(folder, "--output_dir") is None
