"""A scheduler's stop signal (SIGTERM, SIGUSR1, Ctrl-C's SIGINT) ends run_pretraining.py after the current step with a
complete checkpoint and status 75, and `--resume_from_checkpoint latest` continues to the weights and log of the
uninterrupted run; also with two processes where only one of them is signalled."""

import signal
import subprocess
import time

import psutil
import pytest
from test_distributed import LAUNCH
from test_pretraining import check_same_weights_and_curve, metrics, pretrain

from albert_hf.checkpointing import STATE_FILE
from albert_hf.preemption import PREEMPTED

# 40 steps, logged every 2, no periodic checkpoints: the only checkpoint is the one the signal causes.
ARGS = ["--max_train_steps", "40", "--eval_steps", "0", "--validation_split_percentage", "0", "--mixed_precision", "no"]
DDP = [*LAUNCH, "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run = tmp_path_factory.mktemp("reference") / "run"
    pretrain(run, *ARGS)
    return run


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    run = tmp_path_factory.mktemp("ddp_reference") / "run"
    pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=DDP)
    return run


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
    assert process.wait(timeout=300) is not None
    return sent


def stopped_step(stderr: str) -> int:
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("Stopped by ") and last.endswith("run the same command with --resume_from_checkpoint "
                                                             "latest"), stderr[-3000:]
    return int(last.split(" after step ")[1].split(" ")[0])


@pytest.mark.parametrize("signum, repeat", [(signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGUSR1, False)])
def test_a_stop_signal_saves_the_step_and_resuming_equals_the_uninterrupted_run(tmp_path, reference, signum,
                                                                                 repeat):
    run = tmp_path / "run"
    with open(tmp_path / "stderr.txt", "w") as err:
        process = pretrain(run, *ARGS, stdout=subprocess.DEVNULL, stderr=err)
        sent = signal_once_training(run, process, lambda: [psutil.Process(process.pid)], signum, repeat)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert process.returncode == PREEMPTED, stderr[-3000:]
    assert "Traceback" not in stderr
    step = stopped_step(stderr)
    assert 2 <= step < 40
    assert f"Stopped by {signal.Signals(signum).name} after step {step} of 40" in stderr
    # the one checkpoint is the signal's, complete; nothing half-written, no final model
    assert sorted(path.name for path in run.iterdir() if "step_" in path.name) == [f"step_{step}"]
    assert (run / f"step_{step}" / STATE_FILE).is_file()
    assert not (run / "model.safetensors").exists()
    if repeat:  # signals kept coming while it saved and exited (how many landed in the save varies)
        assert sent > 1

    done = pretrain(run, *ARGS, "--resume_from_checkpoint", "latest")
    assert f"Resumed from {run / f'step_{step}'}: step {step}" in done.stderr
    assert [row["step"] for row in metrics(run)] == list(range(2, 41, 2))
    check_same_weights_and_curve(run, reference, after_step=0)


@pytest.mark.parametrize("target", ["rank 1", "launcher"])
def test_two_processes_stop_after_the_same_step_whichever_process_is_signalled(tmp_path, ddp_reference, target):
    """Only rank 1 signalled (the launcher and rank 0 get nothing), or only the launcher (which forwards the signal
    to its workers and gives them 30 s, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, before SIGKILL)."""
    run = tmp_path / "run"

    def targets():
        if target == "launcher":
            return [psutil.Process(launcher.pid)]
        return [child for child in psutil.Process(launcher.pid).children(recursive=True)
                if child.environ().get("RANK") == "1"]

    with open(tmp_path / "stderr.txt", "w") as err:
        launcher = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=DDP,
                            stdout=subprocess.DEVNULL, stderr=err)
        assert signal_once_training(run, launcher, targets, signal.SIGTERM) == 1
    stderr = (tmp_path / "stderr.txt").read_text()
    assert launcher.returncode != 0  # the launcher reports a signal, or its workers' status 75, as its own failure
    if target == "rank 1":
        assert f"exitcode  : {PREEMPTED}" in stderr
    line = next(line for line in stderr.splitlines() if line.startswith("Stopped by SIGTERM after step "))
    step = int(line.split(" after step ")[1].split(" ")[0])
    # both processes wrote their part of the same step's checkpoint (each saves its own random states)
    assert {path.name for path in (run / f"step_{step}").iterdir()} >= {"random_states_0.pkl", "random_states_1.pkl",
                                                                          STATE_FILE}
    assert [path.name for path in run.iterdir() if "step_" in path.name] == [f"step_{step}"]
    assert not (run / "model.safetensors").exists()

    done = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", "--resume_from_checkpoint", "latest",
                    launcher=DDP)
    assert f"Resumed from {run / f'step_{step}'}: step {step}" in done.stderr
    check_same_weights_and_curve(run, ddp_reference, after_step=0)


def test_stop_on_signal_restores_the_previous_handlers():
    from albert_hf.preemption import StopOnSignal

    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal() as stop:
        assert signal.getsignal(signal.SIGTERM) != before
        assert stop.agreed() is None
        signal.raise_signal(signal.SIGUSR1)  # recorded, not fatal
        signal.raise_signal(signal.SIGTERM)  # a second one: the first stays the reason
        assert stop.agreed() == signal.SIGUSR1 and stop.name == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) == before
