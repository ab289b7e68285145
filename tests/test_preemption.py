"""A scheduler's stop signal (SIGTERM, SIGUSR1, Ctrl-C's SIGINT) ends run_pretraining.py after the current step with a
complete checkpoint and status 75, and `--resume_from_checkpoint latest` continues to the weights and log of the
uninterrupted run; also with two processes where only one of them is signalled. The fine-tuning scripts likewise,
through Trainer's checkpoint-N."""

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from albert_hf.pretraining.output.checkpoints import STATE_FILE
from albert_hf.runtime.preemption import PREEMPTED
from helpers import DDP, LAUNCH, REPO, run_bounded, signal_job, start_process, subprocess_env
from preloaded import launched_rank
from pretraining_runs import check_same_weights_and_curve, metrics, pretrain, signal_once_training, stopped_step

pytestmark = pytest.mark.trains

# 40 steps, logged every 2, no periodic checkpoints: the only checkpoint is the one the signal causes.
ARGS = ["--max_train_steps", "40", "--eval_steps", "0", "--validation_split_percentage", "0", "--mixed_precision", "no"]


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


@pytest.mark.parametrize("signum, repeat", [(signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGUSR1, False)])
def test_a_stop_signal_saves_the_step_and_resuming_equals_the_uninterrupted_run(tmp_path, reference, signum, repeat):
    run = tmp_path / "run"
    process = pretrain(run, *ARGS, started=tmp_path)
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
@pytest.mark.launched
def test_two_processes_stop_after_the_same_step_whichever_process_is_signalled(tmp_path, ddp_reference, target):
    """Only rank 1 signalled (the launcher and rank 0 get nothing), or only the launcher (which forwards the signal
    to its workers and gives them 30 s, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, before SIGKILL). The rank-1 stop is resumed
    to the uninterrupted weights; the launcher's leaves the same complete checkpoint, whose resume under DDP is
    rank 1's here and test_a_group_signal_to_a_launched_run_stops_both_processes_after_the_same_step's."""
    run = tmp_path / "run"

    def targets():
        if target == "launcher":
            return [psutil.Process(launcher.pid)]
        return [child for child in psutil.Process(launcher.pid).children(recursive=True) if launched_rank(child) == "1"]

    launcher = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=DDP, started=tmp_path)
    assert signal_once_training(run, launcher, targets, signal.SIGTERM) == 1
    stderr = (tmp_path / "stderr.txt").read_text()
    assert launcher.returncode != 0  # the launcher reports a signal, or its workers' status 75, as its own failure
    if target == "rank 1":
        assert f"exitcode  : {PREEMPTED}" in stderr
    line = next(line for line in stderr.splitlines() if line.startswith("Stopped by SIGTERM after step "))
    step = int(line.split(" after step ")[1].split(" ")[0])
    # both processes wrote their part of the same step's checkpoint (each saves its own random states)
    assert {path.name for path in (run / f"step_{step}").iterdir()} >= {
        "random_states_0.pkl",
        "random_states_1.pkl",
        STATE_FILE,
    }
    assert [path.name for path in run.iterdir() if "step_" in path.name] == [f"step_{step}"]
    assert not (run / "model.safetensors").exists()
    if target == "launcher":
        return
    done = pretrain(
        run, *ARGS, "--per_device_train_batch_size", "4", "--resume_from_checkpoint", "latest", launcher=DDP
    )
    assert f"Resumed from {run / f'step_{step}'}: step {step}" in done.stderr
    check_same_weights_and_curve(run, ddp_reference, after_step=0)


def test_stop_on_signal_restores_the_previous_handlers():
    from albert_hf.runtime.preemption import StopOnSignal

    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal() as stop:
        assert signal.getsignal(signal.SIGTERM) != before
        assert stop.shared_signal() is None
        signal.raise_signal(signal.SIGUSR1)  # recorded, not fatal
        signal.raise_signal(signal.SIGTERM)  # a second one: the first stays the reason
        assert stop.shared_signal() == signal.SIGUSR1 and stop.name == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) == before


# The signal goes at the first logged step and stops the run a step or two later: 60 steps leave a wide margin.
FINE_TUNING_STEPS = 60


def glue_command(checkpoint, data_dir, output_dir, launcher=None):
    return [
        *(launcher or [sys.executable]),
        str(REPO / "run_glue.py"),
        "--model_name_or_path",
        str(checkpoint),
        "--task_name",
        "rte",
        "--data_dir",
        str(data_dir),
        "--do_train",
        "--max_steps",
        str(FINE_TUNING_STEPS),
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--seed",
        "0",
        "--dataloader_pin_memory",
        "false",
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
        "--output_dir",
        str(output_dir),
    ]


ENV = subprocess_env()


@pytest.fixture(scope="module")
def glue_launchers(tmp_path_factory):
    """The launcher of each mode; FSDP2's config is `accelerate config`'s answers to FSDP, version 2 and 2
    processes, every other question at its default (transformer-based wrapping with no class named, resharding
    after forward, CPU-RAM-efficient loading)."""
    from accelerate_configs import fsdp_config

    config = fsdp_config(tmp_path_factory.mktemp("config") / "fsdp.yaml")
    return {"one process": None, "DDP": DDP, "FSDP2": [*LAUNCH, "--config_file", config]}


@pytest.fixture(scope="module")
def rte_folder(tmp_path_factory):
    from albert_hf.testing.glue_folders import write_glue_folders

    return write_glue_folders(tmp_path_factory.mktemp("glue")) / "RTE"


@pytest.fixture(scope="module")
def glue_reference(tmp_path_factory, tiny_checkpoint, rte_folder, glue_launchers):
    """mode -> (output folder, stderr) of an uninterrupted run_glue.py run in that mode (run once, on first use)."""
    runs = {}

    def reference(mode):
        if mode not in runs:
            out = tmp_path_factory.mktemp("glue_reference") / "run"
            done = run_bounded(glue_command(tiny_checkpoint, rte_folder, out, glue_launchers[mode]), 300, env=ENV)
            assert done.returncode == 0, done.stderr[-3000:]
            # every process freed its process group before exiting (finetuning.run_script): a gloo worker left to
            # the interpreter's exit can abort it
            assert "process group is still alive at exit" not in done.stderr
            runs[mode] = out, done.stderr
        return runs[mode]

    return reference


# Not `rounding`: fp32, the two sides within 6.7e-7 of each other here and 1.1e-7 under the AVX2 caps, against the 1e-5
# asserted (BENCHMARKS.md, "Tolerance margins under the AVX2 caps").
@pytest.mark.launched
def test_fine_tuning_under_the_fsdp_config_shards_and_ends_with_the_ddp_weights(glue_reference):
    """run_glue.py launched with an FSDP config from `accelerate config` gets FSDP2 over gloo (Trainer alone would
    train one independent copy per process on CPUs), says so, and saves the full model: the same weights as under
    the DDP config. The config's CPU-RAM-efficient loading (transformers then loads the checkpoint on the first
    process only) is completed by sending the first process's weights to the other."""
    (ddp, ddp_stderr), (fsdp, fsdp_stderr) = glue_reference("DDP"), glue_reference("FSDP2")
    assert "Fine-tuning: DDP over 2 processes on 1 machine (gloo, cpu: " in ddp_stderr
    start = next(line for line in fsdp_stderr.splitlines() if "Fine-tuning: " in line)
    assert re.search(
        r"FSDP2 over 2 processes on 1 machine \(gloo, cpu: [^)]+\): this process holds 50.0% of the "
        r"parameters",
        start,
    )
    assert "the config's auto-wrap policy TRANSFORMER_BASED_WRAP" in start
    assert "fsdp_cpu_ram_efficient_loading: the first process's weights were sent to the others" in start
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in ddp_stderr + fsdp_stderr
    # the final folder: the full model, its tokenizer and our remote code, nothing of torch's FSDP sources
    assert {"model.safetensors", "tokenizer.json", "modeling_albert_hf.py"} <= {p.name for p in fsdp.iterdir()}
    assert not list(fsdp.glob("_fsdp*.py"))
    expected, got = load_file(ddp / "model.safetensors"), load_file(fsdp / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("mode", ["DDP", "FSDP2"])
@pytest.mark.launched
def test_fine_tuning_stopped_by_a_signal_leaves_a_checkpoint_that_the_same_command_resumes(
    tmp_path, tiny_checkpoint, rte_folder, glue_launchers, glue_reference, mode
):
    """run_glue.py (any fine-tuning script: the callback is in finetuning.train) over 2 processes: SIGTERM to rank 1
    only saves checkpoint-N and exits 75; the same command resumes from it and ends with the uninterrupted run's
    weights. One process: test_fine_tuning_with_dataloader_workers_stopped_by_a_group_signal_resumes."""
    launcher, env = glue_launchers[mode], ENV
    reference, run = glue_reference(mode)[0], tmp_path / "run"

    process = start_process(
        glue_command(tiny_checkpoint, rte_folder, run, launcher),
        env=env,
        stdout=tmp_path / "stdout.txt",
        stderr=tmp_path / "stderr.txt",
    )

    def targets():
        return [child for child in psutil.Process(process.pid).children(recursive=True) if launched_rank(child) == "1"]

    deadline = time.time() + 300
    # the first step's log: every process is in the training loop, its handlers in place
    while "'loss'" not in (tmp_path / "stdout.txt").read_text():
        assert process.poll() is None and time.time() < deadline, (tmp_path / "stderr.txt").read_text()[-3000:]
        time.sleep(0.02)
    for target in targets():
        target.send_signal(signal.SIGTERM)
    process.wait(timeout=300)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert process.returncode != 0 and f"exitcode  : {PREEMPTED}" in stderr
    assert f"Fine-tuning: {mode} over 2 processes on 1 machine (gloo, cpu: " in stderr
    line = next(line for line in stderr.splitlines() if line.startswith("Stopped by SIGTERM after step "))
    step = int(line.split(" after step ")[1].split(" ")[0])
    assert 1 <= step < FINE_TUNING_STEPS
    assert [path.name for path in run.glob("checkpoint-*")] == [f"checkpoint-{step}"]
    assert not (run / "model.safetensors").exists()
    assert "process group is still alive at exit" not in stderr  # freed before the exit with status 75 too

    done = run_bounded(glue_command(tiny_checkpoint, rte_folder, run, launcher), 300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Resuming from {run / f'checkpoint-{step}'}" in done.stderr
    expected, got = load_file(reference / "model.safetensors"), load_file(run / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------------------------------------------
# Signals as schedulers deliver them: every process of the job (SLURM's job step, `timeout`, a terminal's process
# group), DataLoader and preprocessing workers included. The runs start in sessions of their own (`new_session`)
# and `signal_job` signals every process group of the job.

WORKERS = ["--dataloader_num_workers", "2"]


def wait_until(condition, process, folder, what: str, timeout: float = 300):
    deadline = time.time() + timeout
    while not condition():
        assert process.poll() is None, f"the run ended before {what}: " + (folder / "stderr.txt").read_text()[-3000:]
        assert time.time() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.02)


def stopped_job(process, folder) -> str:
    """The stderr of a job once it has ended (status 75, no traceback), its last line the stop line."""
    try:
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):  # the job's group (its own session), so that none is left
            os.killpg(process.pid, signal.SIGKILL)
        pytest.fail("the run was still running 300 s after the signal")
    stderr = (folder / "stderr.txt").read_text()
    assert process.returncode == PREEMPTED, stderr[-3000:]
    assert "Traceback" not in stderr and "Error" not in stderr.strip().splitlines()[-1], stderr[-3000:]
    return stderr


def checkpoints(run) -> list[str]:
    return sorted((path.name for path in run.glob("step_*")), key=lambda name: int(name.split("_")[1]))


def test_workers_forked_under_stop_on_signal_leave_the_decision_to_their_parent(tmp_path):
    """A worker forked while a StopOnSignal is active survives SIGTERM, SIGUSR1 and SIGINT from any other process
    and ends on its parent's SIGTERM (DataLoader's and multiprocessing's `terminate`); one forked outside it dies of
    the first signal as before."""
    import multiprocessing

    from albert_hf.runtime.preemption import StopOnSignal

    context = multiprocessing.get_context("fork")

    def sender(pid, signum):  # another process, as a scheduler or `kill` is
        subprocess.run(["kill", f"-{signal.Signals(signum).name[3:]}", str(pid)], check=True)

    with StopOnSignal():
        shielded = context.Process(target=time.sleep, args=(60,), daemon=True)
        shielded.start()
    plain = context.Process(target=time.sleep, args=(60,), daemon=True)
    plain.start()
    time.sleep(0.5)  # both running their target
    for signum in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        sender(shielded.pid, signum)
    sender(plain.pid, signal.SIGTERM)
    plain.join(10)
    assert plain.exitcode == -signal.SIGTERM
    time.sleep(0.5)
    assert shielded.is_alive()
    shielded.terminate()  # the parent's SIGTERM
    shielded.join(10)
    assert shielded.exitcode == 0


def test_a_worker_whose_parents_sigterm_was_absorbed_ends_and_one_that_may_hold_a_lock_waits(monkeypatch):
    """A scheduler's SIGTERM to the whole group reaches a pool worker and its parent; the parent, interrupted, ends
    the pool with its own SIGTERM, which one still pending absorbs (a pending signal is not queued twice): the
    worker sees the scheduler's only, and the pool's terminate waited for it for ever (1 of 4 suites, alone).
    - A SIGTERM from another process taken after the parent's interruption may hide the parent's: the worker ends
      when the grace period passes without it (here 1 s; the parent's is never sent).
    - One taken before cannot: the worker waits for its parent's, however long (a worker that ended at once could
      hold the pool's queue lock, which the terminate takes first: the hang of a first fix).
    - A later run's workers, in the same interpreter, start shielded again."""
    import multiprocessing

    from albert_hf.runtime import preemption
    from albert_hf.runtime.preemption import StopOnSignal, Stopped

    monkeypatch.setattr(preemption, "ABSORBED_SIGTERM_GRACE", 1.0)  # read by the workers forked below
    context = multiprocessing.get_context("fork")

    def forked():
        worker = context.Process(target=time.sleep, args=(60,), daemon=True)
        worker.start()
        time.sleep(0.5)
        return worker

    def from_the_scheduler(worker):
        subprocess.run(["kill", "-TERM", str(worker.pid)], check=True)

    with pytest.raises(Stopped):
        with StopOnSignal("building the pairs"):
            absorbed, waits = forked(), forked()
            from_the_scheduler(waits)  # taken before the parent is interrupted
            time.sleep(0.5)
            signal.raise_signal(signal.SIGTERM)  # the scheduler's, to the parent
    from_the_scheduler(absorbed)
    absorbed.join(5)
    assert absorbed.exitcode == 0
    time.sleep(1.5)
    assert waits.is_alive()
    waits.terminate()  # the parent's SIGTERM
    waits.join(10)
    assert waits.exitcode == 0
    with StopOnSignal():
        later = forked()
    from_the_scheduler(later)
    time.sleep(2.5)
    assert later.is_alive()
    later.terminate()
    later.join(10)
    assert later.exitcode == 0


@pytest.mark.quick
def test_a_stop_before_the_first_step_interrupts_and_one_swallowed_on_its_way_stops_the_next_stage(monkeypatch):
    """Before anything is saved a signal raises Stopped at once, naming the stage; raised inside a finalizer (which
    Python would print with its traceback, and go on from), it prints nothing and is raised again when the next stage
    begins or the first step ends. Other errors in finalizers are reported as before."""
    from albert_hf.runtime.preemption import StopOnSignal, Stopped, at_stage, stop_line

    reported = []  # what reaches the hook in place before the run's (Python's own prints it, with a traceback)
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: reported.append(type(unraisable.exc_value)))

    with pytest.raises(Stopped, match="^SIGUSR1 while reading the corpus$"):
        with StopOnSignal("starting"):
            at_stage("reading the corpus")
            signal.raise_signal(signal.SIGUSR1)
            pytest.fail("the signal did not interrupt")
    assert stop_line() == (
        "Stopped by SIGUSR1 while reading the corpus, before the first optimizer step: there was "
        "nothing to save. Run the same command again"
    )

    class SignalledWhileFinalized:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    class FailsWhileFinalized:
        def __del__(self):
            raise ValueError("a library's own error in a finalizer")

    for next_step in (lambda stop: at_stage("building the pairs"), lambda stop: stop.saving()):
        with pytest.raises(Stopped, match="^SIGTERM while training the tokenizer$"):
            with StopOnSignal("training the tokenizer") as stop:
                SignalledWhileFinalized()  # finalized at once: the Stopped raised in __del__ is swallowed, not raised
                FailsWhileFinalized()
                next_step(stop)
    assert reported == [ValueError, ValueError]


FORK_SIGNALLED = """
import os, signal, sys, time
fire = []
def hook():  # a library's at-fork hook (logging releases its lock in one), registered before albert_hf's
    if fire:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
os.register_at_fork(after_in_parent=hook)
from albert_hf.runtime.preemption import StopOnSignal, Stopped
try:
    with StopOnSignal("building the training pairs"):
        fire.append(1)
        if os.fork() == 0:
            os._exit(0)
        fire.clear()
        time.sleep(10)
        print("not stopped")
except Stopped as stopped:
    print("stopped:", stopped)
"""


def test_a_signal_during_a_forks_hooks_stops_the_run_just_after_them_without_a_traceback(tmp_path):
    """A pool's fork runs the libraries' at-fork hooks; a Stopped raised inside one is printed by Python with its
    traceback and goes no further (seen once in a run signalled as datasets' pool started). It is raised in the
    main thread once the hooks are done instead."""
    script = tmp_path / "fork_signalled.py"
    script.write_text(FORK_SIGNALLED)
    began = time.monotonic()
    done = run_bounded([sys.executable, str(script)], timeout=60, env=subprocess_env())
    assert done.stdout.strip() == "stopped: SIGTERM while building the training pairs", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert time.monotonic() - began < 9  # at once, not after the sleep


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_group_signal_that_reaches_the_dataloader_workers_stops_after_a_step_and_the_run_resumes(
    tmp_path, reference, signum
):
    run = tmp_path / "run"
    process = pretrain(run, *ARGS, *WORKERS, started=tmp_path, new_session=True)
    # the DataLoader workers, in the job's process group (started again at each epoch: wait for them)
    wait_until(
        lambda: (run / "metrics.jsonl").exists() and len(psutil.Process(process.pid).children()) == 2,
        process,
        tmp_path,
        "the workers after a logged step",
    )
    signal_job(process.pid, signum)
    stderr = stopped_job(process, tmp_path)
    step = stopped_step(stderr)
    assert f"Stopped by {signal.Signals(signum).name} after step {step} of 40" in stderr
    assert checkpoints(run) == [f"step_{step}"] and (run / f"step_{step}" / STATE_FILE).is_file()
    assert not (run / "model.safetensors").exists()

    done = pretrain(run, *ARGS, *WORKERS, "--resume_from_checkpoint", "latest")
    assert f"Resumed from {run / f'step_{step}'}: step {step}" in done.stderr
    check_same_weights_and_curve(run, reference, after_step=0)


def test_a_group_signal_while_the_dataloader_workers_start_stops_with_one_line(tmp_path):
    """The signal as the first DataLoader worker appears, before the first step: the workers' start completes (cut
    short, torch could not shut them down, a traceback at exit), then the run stops with the line."""
    run = tmp_path / "run"
    process = pretrain(run, *ARGS, *WORKERS, started=tmp_path, new_session=True)
    wait_until(lambda: psutil.Process(process.pid).children(), process, tmp_path, "a DataLoader worker", timeout=120)
    signal_job(process.pid, signal.SIGTERM)
    stderr = stopped_job(process, tmp_path)
    assert "Exception ignored" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        "Stopped by SIGTERM while taking the first step, before the first optimizer step: there was nothing to save. "
        "Run the same command again"
    )
    assert checkpoints(run) == []


def test_a_group_signal_while_preprocessing_workers_build_the_pairs_stops_with_one_line(tmp_path, reference):
    """--preprocessing_num_workers 2 on an empty cache: the signal reaches the main process and datasets' pool
    (its workers and manager) while the documents are tokenized. One line names the stage; nothing is saved; the
    same command then builds the data and trains to the uninterrupted run's weights."""
    run, cache = tmp_path / "run", {"HF_HOME": str(tmp_path / "hf_home")}
    process = pretrain(run, *ARGS, "--preprocessing_num_workers", "2", started=tmp_path, new_session=True, env=cache)
    wait_until(
        lambda: len(psutil.Process(process.pid).children()) >= 3, process, tmp_path, "the pool's workers", timeout=120
    )
    signal_job(process.pid, signal.SIGTERM)
    stderr = stopped_job(process, tmp_path)
    assert re.search(
        r"^Stopped by SIGTERM while building the (training|held-out) pairs, before the first optimizer "
        r"step: there was nothing to save\. Run the same command again$",
        stderr,
        re.MULTILINE,
    ), stderr[-2000:]
    assert checkpoints(run) == [] and not (run / "model.safetensors").exists()

    pretrain(run, *ARGS, "--preprocessing_num_workers", "2", env=cache)
    check_same_weights_and_curve(run, reference, after_step=0)


@pytest.mark.compiles
def test_a_group_signal_while_torch_compile_compiles_the_first_step_stops_with_one_line(tmp_path):
    run = tmp_path / "run"
    process = pretrain(run, *ARGS, *WORKERS, "--torch_compile_mode", "default", started=tmp_path, new_session=True)
    # the workers start with the first step's batches, and the step compiles for seconds
    wait_until(lambda: len(psutil.Process(process.pid).children()) == 2, process, tmp_path, "the DataLoader workers")
    time.sleep(0.5)
    signal_job(process.pid, signal.SIGTERM)
    stderr = stopped_job(process, tmp_path)
    assert stderr.strip().splitlines()[-1] == (
        "Stopped by SIGTERM while compiling the model (the first step), before the first optimizer step: there was "
        "nothing to save. Run the same command again"
    )
    assert "torch.compile: the first step took" not in stderr
    assert checkpoints(run) == []


@pytest.mark.launched
def test_a_group_signal_to_a_launched_run_stops_both_processes_after_the_same_step(tmp_path, ddp_reference):
    """The launcher, its 2 workers and their DataLoader workers all get SIGTERM (the launcher forwards it too):
    both processes stop after the same step with one complete checkpoint, and the same command resumes to the
    uninterrupted run's weights."""
    run, args = tmp_path / "run", [*ARGS, "--per_device_train_batch_size", "4", "--dataloader_num_workers", "1"]
    launcher = pretrain(run, *args, launcher=DDP, started=tmp_path, new_session=True)
    wait_until(lambda: (run / "metrics.jsonl").exists(), launcher, tmp_path, "a logged step")
    assert signal_job(launcher.pid, signal.SIGTERM) == 3  # the launcher's group and each worker's own session
    launcher.wait(timeout=300)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert launcher.returncode != 0  # torch's launcher reports a signal it received as its own failure
    # the only traceback is the launcher's own report of the signal (torch.distributed.run's SignalException)
    assert stderr.count("Traceback") <= 1 and stderr.count("Traceback") == stderr.count("SignalException: Process")
    step = int(
        next(line for line in stderr.splitlines() if line.startswith("Stopped by SIGTERM after step "))
        .split(" after step ")[1]
        .split(" ")[0]
    )
    assert checkpoints(run) == [f"step_{step}"]
    assert {path.name for path in (run / f"step_{step}").iterdir()} >= {
        "random_states_0.pkl",
        "random_states_1.pkl",
        STATE_FILE,
    }
    done = pretrain(run, *args, "--resume_from_checkpoint", "latest", launcher=DDP)
    assert f"Resumed from {run / f'step_{step}'}: step {step}" in done.stderr
    check_same_weights_and_curve(run, ddp_reference, after_step=0)


def test_fine_tuning_with_dataloader_workers_stopped_by_a_group_signal_resumes(
    tmp_path, tiny_checkpoint, rte_folder, glue_reference
):
    """run_glue.py in one process with 2 DataLoader workers, SIGTERM to the job: checkpoint-N, status 75, one line;
    the same command resumes from it to the uninterrupted run's weights."""
    run, command = tmp_path / "run", [*glue_command(tiny_checkpoint, rte_folder, tmp_path / "run"), *WORKERS]
    process = start_process(
        command, env=ENV, stdout=tmp_path / "stdout.txt", stderr=tmp_path / "stderr.txt", new_session=True
    )
    # 8 examples make an epoch of 2 steps, and Trainer starts its workers again at each epoch: wait for them
    wait_until(
        lambda: "'loss'" in (tmp_path / "stdout.txt").read_text() and len(psutil.Process(process.pid).children()) == 2,
        process,
        tmp_path,
        "the workers after a loss",
    )
    signal_job(process.pid, signal.SIGTERM)
    stderr = stopped_job(process, tmp_path)
    step = int(stderr.strip().splitlines()[-1].split(" after step ")[1].split(" ")[0])
    assert 1 <= step < FINE_TUNING_STEPS
    assert [path.name for path in run.glob("checkpoint-*")] == [f"checkpoint-{step}"]
    assert not (run / "model.safetensors").exists()

    done = run_bounded(command, 300, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Resuming from {run / f'checkpoint-{step}'}" in done.stderr
    expected, got = (
        load_file(glue_reference("one process")[0] / "model.safetensors"),
        load_file(run / "model.safetensors"),
    )
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


def test_group_signals_at_random_moments_lose_no_checkpoint_and_runs_resume_to_the_uninterrupted_weights(
    tmp_path, reference
):
    """SIGTERM to the job (2 DataLoader workers, a checkpoint every 10 steps) at random moments of its run, the data
    stage included, until 10 runs were stopped (a run that finished first is drawn again), each stopped run then
    started again with the same command: every stop ends with status 75 and one line, never a traceback; the
    checkpoints of every 10 steps before the stop and the stop's own are there and complete; each resumed run ends
    with the uninterrupted run's weights."""
    rng = random.Random(67)  # fixed moments: a failure can be rerun as it happened (on a machine as busy)
    args = [*ARGS, *WORKERS, "--checkpointing_steps", "10", "--resume_from_checkpoint", "latest"]
    began = time.time()
    pretrain(tmp_path / "uninterrupted", *args)
    duration = time.time() - began
    check_same_weights_and_curve(tmp_path / "uninterrupted", reference, after_step=0)  # workers and checkpoints
    stops, finished = [], 0
    for attempt in range(25):
        if len(stops) == 10:
            break
        run, folder = tmp_path / f"run_{attempt}", tmp_path / f"attempt_{attempt}"
        folder.mkdir()
        moment = rng.uniform(0, duration)
        started = time.time()
        process = pretrain(run, *args, started=folder, new_session=True)
        try:
            process.wait(timeout=moment)
        except subprocess.TimeoutExpired:
            signal_job(process.pid, signal.SIGTERM)
        process.wait(timeout=300)
        if process.returncode == 0:  # a run takes this long now (the machine's load changes): later moments within it
            duration = min(duration, time.time() - started)
        stderr = (folder / "stderr.txt").read_text()
        what = f"attempt {attempt}, SIGTERM {moment:.2f} s after the start of a {duration:.2f} s run"
        assert "Traceback" not in stderr, (what, stderr[-3000:])
        if process.returncode == 0:  # it finished first
            assert (run / "model.safetensors").is_file()
            finished += 1
            continue
        if process.returncode == -signal.SIGTERM:  # before the script's first line: the signal's own default action
            assert not run.exists() and stderr == "", what
            finished += 1
            continue
        assert process.returncode == PREEMPTED, (what, stderr[-3000:])
        last = stderr.strip().splitlines()[-1]
        if " after step " in last:  # a step to save: the checkpoints of every 10 steps, and the stop's own
            step = stopped_step(stderr)
            assert checkpoints(run) == [f"step_{n}" for n in sorted({*range(10, step + 1, 10), step})], what
            assert all((run / name / STATE_FILE).is_file() for name in checkpoints(run)), what
        else:  # stopped before the first step
            assert re.fullmatch(
                r"Stopped by SIGTERM while [a-z ()-]+, before the first optimizer step: there was "
                r"nothing to save\. Run the same command again",
                last,
            ), (what, last)
            step = 0
            assert checkpoints(run) == [], what
        stops.append(step)
        pretrain(run, *args)
        check_same_weights_and_curve(run, reference, after_step=0)
    assert len(stops) == 10, (stops, finished)


# A SIGTERM sent by the run to itself as a stage begins (once): what a scheduler's signal at that moment does. The
# stage is replaced in the module that calls it (`owner`: loop for the loop's parts, job for the final folder).
SIGNALLED_STAGE = """
import os, signal, sys
from albert_hf.pretraining import job
from albert_hf.pretraining.training import loop
from albert_hf.runtime.cli import run_entry_point

real, sent = getattr({owner}, {stage!r}), []

def signalled(*args, **kwargs):
    if not sent:
        sent.append(os.kill(os.getpid(), signal.SIGTERM))
    return real(*args, **kwargs)

setattr({owner}, {stage!r}, signalled)
sys.argv = [{script!r}, *{argv!r}]
run_entry_point(job.main, stage="starting")
"""


@pytest.mark.parametrize(
    "owner, stage, extra",
    [
        ("loop", "evaluate_and_log", ["--validation_split_percentage", "5", "--eval_steps", "10"]),
        ("loop", "save_checkpoint", ["--checkpointing_steps", "10"]),
        ("job", "write_final_folder", []),
    ],
)
def test_a_signal_during_an_evaluation_a_checkpoint_or_the_final_folder_lets_it_complete(tmp_path, owner, stage, extra):
    """During the held-out evaluation or a checkpoint (at step 10) the run finishes it and stops after that step
    with a complete step_10 and status 75; during the final folder it completes the folder and exits with 0, saying
    the signal came after the run completed."""
    from pretraining_runs import FAST, SCRIPT

    run = tmp_path / "run"
    argv = ["--output_dir", str(run), *FAST, *ARGS, *extra]
    code = SIGNALLED_STAGE.format(owner=owner, stage=stage, script=SCRIPT, argv=argv)
    done = run_bounded([sys.executable, "-c", code], 300, env=ENV, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    if stage == "write_final_folder":
        assert done.returncode == 0, done.stderr[-3000:]
        assert last == f"SIGTERM received while the final folder was written: the run is complete in {run}"
        assert (run / "model.safetensors").is_file() and (run / "config.json").is_file()
        return
    assert done.returncode == PREEMPTED, done.stderr[-3000:]
    assert stopped_step(done.stderr) == 10
    assert checkpoints(run) == ["step_10"] and (run / "step_10" / STATE_FILE).is_file()
    assert not (run / "model.safetensors").exists()
