"""A scheduler's stop signal (SIGTERM, SIGUSR1, Ctrl-C's SIGINT) ends run_pretraining.py after the current step with a
complete checkpoint and status 75, and `--resume_from_checkpoint latest` continues to the weights and log of the
uninterrupted run; also with two processes where only one of them is signalled. The fine-tuning scripts likewise,
through Trainer's checkpoint-N."""

import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch
from safetensors.torch import load_file

from albert_hf.pretraining.checkpoints import STATE_FILE
from albert_hf.runtime.preemption import PREEMPTED
from helpers import REPO, run_bounded, start_process, subprocess_env
from test_distributed import LAUNCH
from test_pretraining import check_same_weights_and_curve, metrics, pretrain

pytestmark = pytest.mark.trains

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
    try:
        process.wait(timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run was still running 300 s after {sent} signal(s)")
    assert sent, "the run ended before a signal reached it: nothing here tested its handling"
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
    to its workers and gives them 30 s, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, before SIGKILL)."""
    run = tmp_path / "run"

    def targets():
        if target == "launcher":
            return [psutil.Process(launcher.pid)]
        return [child for child in psutil.Process(launcher.pid).children(recursive=True)
                if child.environ().get("RANK") == "1"]

    launcher = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=DDP, started=tmp_path)
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
    from albert_hf.runtime.preemption import StopOnSignal

    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal() as stop:
        assert signal.getsignal(signal.SIGTERM) != before
        assert stop.agreed() is None
        signal.raise_signal(signal.SIGUSR1)  # recorded, not fatal
        signal.raise_signal(signal.SIGTERM)  # a second one: the first stays the reason
        assert stop.agreed() == signal.SIGUSR1 and stop.name == "SIGUSR1"
    assert signal.getsignal(signal.SIGTERM) == before


# The signal goes at the first logged step and stops the run a step or two later: 60 steps leave a wide margin.
FINE_TUNING_STEPS = 60


def glue_command(checkpoint, data_dir, output_dir, launcher=None):
    return [*(launcher or [sys.executable]), str(REPO / "run_glue.py"), "--model_name_or_path", str(checkpoint),
            "--task_name", "rte", "--data_dir", str(data_dir), "--do_train", "--max_steps", str(FINE_TUNING_STEPS),
            "--max_seq_length", "32", "--per_device_train_batch_size", "4", "--learning_rate", "1e-3",
            "--report_to", "none", "--save_strategy", "no", "--seed", "0", "--dataloader_pin_memory", "false",
            "--disable_tqdm", "true", "--logging_steps", "1", "--output_dir", str(output_dir)]


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


@pytest.mark.launched
def test_fine_tuning_under_the_fsdp_config_shards_and_ends_with_the_ddp_weights(glue_reference):
    """run_glue.py launched with an FSDP config from `accelerate config` gets FSDP2 over gloo (Trainer alone would
    train one independent copy per process on CPUs), says so, and saves the full model: the same weights as under
    the DDP config. The config's CPU-RAM-efficient loading (transformers then loads the checkpoint on the first
    process only) is completed by sending the first process's weights to the other."""
    (ddp, ddp_stderr), (fsdp, fsdp_stderr) = glue_reference("DDP"), glue_reference("FSDP2")
    assert "Fine-tuning: DDP over 2 processes on 1 machine (gloo, cpu: " in ddp_stderr
    start = next(line for line in fsdp_stderr.splitlines() if "Fine-tuning: " in line)
    assert re.search(r"FSDP2 over 2 processes on 1 machine \(gloo, cpu: [^)]+\): this process holds 50.0% of the "
                     r"parameters", start)
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


@pytest.mark.parametrize("mode", ["one process", *(pytest.param(mode, marks=pytest.mark.launched)
                                                    for mode in ("DDP", "FSDP2"))])
def test_fine_tuning_stopped_by_a_signal_leaves_a_checkpoint_that_the_same_command_resumes(
        tmp_path, tiny_checkpoint, rte_folder, glue_launchers, glue_reference, mode):
    """run_glue.py (any fine-tuning script: the callback is in finetuning.train): SIGTERM to one process (with 2,
    rank 1 only) saves checkpoint-N and exits 75; the same command resumes from it and ends with the uninterrupted
    run's weights."""
    processes = 1 if mode == "one process" else 2
    launcher, env = glue_launchers[mode], ENV
    reference, run = glue_reference(mode)[0], tmp_path / "run"

    process = start_process(glue_command(tiny_checkpoint, rte_folder, run, launcher), env=env,
                            stdout=tmp_path / "stdout.txt", stderr=tmp_path / "stderr.txt")

    def targets():
        if processes == 1:
            return [psutil.Process(process.pid)]
        return [child for child in psutil.Process(process.pid).children(recursive=True)
                if child.environ().get("RANK") == "1"]

    deadline = time.time() + 300
    # the first step's log: every process is in the training loop, its handlers in place
    while "'loss'" not in (tmp_path / "stdout.txt").read_text():
        assert process.poll() is None and time.time() < deadline, (tmp_path / "stderr.txt").read_text()[-3000:]
        time.sleep(0.02)
    for target in targets():
        target.send_signal(signal.SIGTERM)
    process.wait(timeout=300)
    stderr = (tmp_path / "stderr.txt").read_text()
    if processes == 1:
        assert process.returncode == PREEMPTED, stderr[-3000:]
        assert "Traceback" not in stderr
    else:
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
