"""run_pretraining.py beyond one process, for real on this CPU machine: FSDP2 (sharded, equal to DDP, killed and
resumed), the FSDP configs `accelerate config` writes, two machines on localhost, and the configs that cannot run
here stopping with one line (also for the fine-tuning scripts)."""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from albert_hf.pretraining.arguments import build_parser
from albert_hf.pretraining.output.checkpoints import STATE_FILE, StepCheckpoints
from albert_hf.pretraining.resolution import parse_args
from helpers import BLOCK_ALBERT_HF, DDP, FSDP, LAUNCH, REPO, THREADS_SAID, run_bounded, subprocess_env
from pretraining_runs import RESUME_ARGS, check_same_weights_and_curve, metrics, pretrain, pretrain_runs

ARGS = [*RESUME_ARGS, "--mixed_precision", "no"]  # 12 steps, a checkpoint every 3; fp32 for the comparisons


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("ddp") / "run"
    done = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=DDP)
    assert re.search(
        rf"DDP over 2 processes on 1 machine \(gloo, cpu: [^)]+, {THREADS_SAID}\); fp32: asked for by "
        r"--mixed_precision no",
        done.stderr,
    )
    assert "process group is still alive at exit" not in done.stderr  # both processes freed it (end_distributed)
    return run


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("fsdp") / "run"
    done = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=FSDP)
    return run, done


# Not `rounding`: fp32 on both sides, which differ by 1-2 ulps (at most 2.4e-7 against the 1e-5 asserted) under
# this CPU's kernels and under the AVX2 caps alike (BENCHMARKS.md, "Tolerance margins under the AVX2 caps").
@pytest.mark.trains
@pytest.mark.launched
def test_fsdp_really_shards_and_ends_with_the_ddp_weights(fsdp_run, ddp_run):
    run, done = fsdp_run
    assert re.search(
        r"FSDP2 over 2 processes on 1 machine \(gloo, cpu: [^)]+\): this process holds 50.0% of the "
        r"parameters",
        done.stderr,
    )
    # each process wrote its own shard of the model and of the optimizer state into the checkpoint
    for part in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in (run / "step_6" / part).iterdir()}
    expected, got = load_file(ddp_run / "model.safetensors"), load_file(run / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:  # the gathered full weights, as plain tensors
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)
    # the logged gradient norm is the whole model's, not this process's shard's (which would be about 1/sqrt(2) of it)
    norms = [[row["grad_norm"] for row in metrics(folder) if "grad_norm" in row] for folder in (run, ddp_run)]
    assert len(norms[0]) == 6 and norms[0] == pytest.approx(norms[1], rel=1e-4)
    assert "AutoModel -> AlbertHFModel" in done.stdout  # the final folder reloaded in the run itself
    assert "process group is still alive at exit" not in done.stderr  # both processes freed it (end_distributed)


@pytest.mark.trains
@pytest.mark.launched
def test_a_checkpoint_of_a_ddp_or_fsdp2_run_loads_as_the_model_without_albert_hf(tmp_path, ddp_run, fsdp_run):
    """Under FSDP2 the checkpoint's weights are shards: the gathered full weights are written beside them."""
    code = (
        "import torch, transformers\n"
        "transformers.logging.set_verbosity_error()\n"
        "for run in {runs!r}:\n"
        "    model = transformers.AutoModelForPreTraining.from_pretrained(run + '/step_6',\n"
        "                                                                 trust_remote_code=True)\n"
        "    torch.save(model.state_dict(), run + '.step_6.pt')\n"
        "    print('LOADED', type(model).__name__)\n"
    )
    runs = [str(ddp_run), str(fsdp_run[0])]
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_ALBERT_HF + code.format(runs=runs)],
        cwd=tmp_path,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.count("LOADED AlbertHFForPreTraining") == 2, done.stderr[-3000:]
    assert (fsdp_run[0] / "step_6" / "pytorch_model_fsdp_0").is_dir()  # the shards, for a resume
    ddp, fsdp = (torch.load(run + ".step_6.pt", weights_only=True) for run in runs)
    for name in ddp:  # the same training, split alike: the same weights at step 6
        torch.testing.assert_close(fsdp[name], ddp[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.trains
def test_an_fsdp_checkpoint_of_shards_only_is_made_loadable_with_the_gathered_weights(tmp_path, fsdp_run):
    """A checkpoint written before checkpoints held the model: the command reads its shards in one process, as
    data, into the weights the run gathered."""
    from albert_hf.pretraining.output.loadable import main as make_loadable
    from albert_hf.runtime import checkpoint_files

    run = fsdp_run[0]
    old = tmp_path / "run" / "step_6"
    shutil.copytree(run / "step_6", old)
    for name in [*os.listdir(run / ".model_files"), "model.safetensors"]:
        (old / name).unlink()
    checkpoint_files.write_record(old, "files.json")
    assert make_loadable([str(old), "--model_files", str(run)]) == 0
    expected, got = load_file(run / "step_6" / "model.safetensors"), load_file(old / "model.safetensors")
    assert expected.keys() == got.keys() and all(torch.equal(got[name], expected[name]) for name in expected)
    assert StepCheckpoints.damage(old) is None  # recorded with the weights it gained


@pytest.mark.trains
def test_the_checkpoints_of_an_fsdp_run_average_and_shards_alone_are_refused_with_the_way_out(tmp_path, fsdp_run):
    """An FSDP checkpoint holds its gathered weights beside the shards: averaged as any other; one of shards only
    (written before checkpoints held the model) names the command that makes it averageable."""
    from albert_hf.average import average_checkpoints

    run = fsdp_run[0]
    average_checkpoints(tmp_path / "average", [run / "step_9", run / "step_12"])
    averaged, a, b = (
        load_file(folder / "model.safetensors") for folder in (tmp_path / "average", run / "step_9", run / "step_12")
    )
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor.double(), (a[name].double() + b[name].double()) / 2, rtol=0, atol=1e-6)
    shards_only = tmp_path / "step_6"
    shutil.copytree(run / "step_6", shards_only, ignore=shutil.ignore_patterns("model.safetensors", "files.json"))
    with pytest.raises(
        InputError, match=rf"without its gathered weights; .*albert_hf.pretraining.output.loadable {shards_only}"
    ):
        average_checkpoints(tmp_path / "other", [shards_only, run / "step_9"])


@pytest.mark.trains
@pytest.mark.launched
def test_fsdp_killed_mid_run_resumes_from_latest_to_the_uninterrupted_weights(tmp_path, fsdp_run):
    reference, _ = fsdp_run
    interrupted = tmp_path / "interrupted"
    launcher = pretrain(interrupted, *ARGS, "--per_device_train_batch_size", "4", launcher=FSDP, started=tmp_path)
    deadline = time.time() + 300
    while not (interrupted / "step_6" / STATE_FILE).exists():
        assert launcher.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    # the workers run in sessions of their own: kill the launcher and every process under it
    processes = [psutil.Process(launcher.pid), *psutil.Process(launcher.pid).children(recursive=True)]
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    launcher.wait()
    # gone, not dying: a process killed a moment ago still holds its lock on the output folder
    assert not psutil.wait_procs(processes, timeout=30)[1]
    assert not (interrupted / "model.safetensors").exists()  # it really died before the end
    resumed_from = max(int(path.name[5:]) for path in interrupted.glob("step_*") if (path / STATE_FILE).exists())
    done = pretrain(
        interrupted, *ARGS, "--per_device_train_batch_size", "4", "--resume_from_checkpoint", "latest", launcher=FSDP
    )
    assert f"Resumed from {interrupted / f'step_{resumed_from}'}" in done.stderr
    assert [row["step"] for row in metrics(interrupted)] == [2, 4, 6, 8, 10, 12]
    check_same_weights_and_curve(interrupted, reference, after_step=0)


@pytest.mark.trains
@pytest.mark.launched
def test_two_machines_on_localhost_end_with_the_two_process_weights(tmp_path, ddp_run):
    run = tmp_path / "run"
    machines = [
        *LAUNCH,
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "2",
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(free_port()),
    ]
    other = pretrain(
        run, *ARGS, "--per_device_train_batch_size", "4", launcher=[*machines, "--machine_rank", "1"], started=tmp_path
    )
    try:
        done = pretrain(run, *ARGS, "--per_device_train_batch_size", "4", launcher=[*machines, "--machine_rank", "0"])
        assert other.wait(timeout=60) == 0
    finally:
        if other.poll() is None:
            other.kill()
    assert "DDP over 2 processes on 2 machines (gloo, cpu: " in done.stderr
    check_same_weights_and_curve(run, ddp_run, after_step=0)


IMPOSSIBLE_MODES = [
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "error: the accelerate config asks for DeepSpeed, which needs CUDA GPUs"),
    (
        {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
        "error: the accelerate config asks for FSDP, but this run is one process: start it with `accelerate launch",
    ),
    # version 1 with sync_module_states makes accelerate itself fail on a machine without GPUs, before our check
    (
        {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "FSDP_SYNC_MODULE_STATES": "true"},
        "error: the accelerate config asks for FSDP, but this run is one process: start it with `accelerate launch",
    ),
    (
        {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1", "FSDP_RESHARD_AFTER_FORWARD": "no_shard"},
        "error: the accelerate config asks for FSDP version 1 with NO_SHARD, which replicates the model as DDP does",
    ),
]


@pytest.fixture(scope="module")
def impossible_mode_runs(tmp_path_factory):
    """What `accelerate launch` exports from such configs, given to plain runs (one process for the four)."""
    root = tmp_path_factory.mktemp("impossible")
    outs = [root / f"run{i}" for i in range(len(IMPOSSIBLE_MODES))]
    results, done = pretrain_runs([(out, [], env) for out, (env, _) in zip(outs, IMPOSSIBLE_MODES)])
    return outs, results, done


@pytest.mark.parametrize("case", range(len(IMPOSSIBLE_MODES)))
def test_a_mode_that_cannot_be_had_stops_with_one_line_before_any_work(impossible_mode_runs, case):
    outs, results, done = impossible_mode_runs
    assert results[case]["status"] == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert results[case]["line"].startswith(IMPOSSIBLE_MODES[case][1])
    assert not outs[case].exists()


# What `accelerate config` writes when the FSDP questions are answered so (other questions: its defaults, which include
# fsdp_cpu_ram_efficient_loading true and, for version 2, fsdp_reshard_after_forward true); what the run then does.
TRANSFORMER_CLASS = {
    "auto wrap policy": "TRANSFORMER_BASED_WRAP",
    "_no_split_modules": "no",
    "transformer layer class names": "AlbertHFLayer",
}
REPLACED = "is replaced by ALBERT's units: each distinct AlbertHFLayer, the word table with the MLM head, the root"
GENERATED_CONFIGS = [
    (
        TRANSFORMER_CLASS,
        [
            "FSDP2",
            "reshard True",
            f"auto-wrap policy TRANSFORMER_BASED_WRAP (AlbertHFLayer) {REPLACED}",
            "fsdp_cpu_ram_efficient_loading: nothing to load (no --model_name_or_path)",
        ],
    ),
    (
        {"auto wrap policy": "TRANSFORMER_BASED_WRAP", "_no_split_modules": "yes"},
        [f"auto-wrap policy TRANSFORMER_BASED_WRAP (_no_split_modules) {REPLACED}"],
    ),
    (
        {"auto wrap policy": "SIZE_BASED_WRAP"},
        [f"auto-wrap policy SIZE_BASED_WRAP (min_num_params 100000000) {REPLACED}"],
    ),
    ({"auto wrap policy": "NO_WRAP", "CPU RAM efficient": "no"}, ["no notes"]),
    ({"activation checkpointing": "yes"}, ["fsdp_activation_checkpointing: the model's gradient checkpointing is on"]),
    ({"offload parameters": "yes"}, ["fsdp_offload_params: nothing to offload on a machine without GPUs"]),
    ({"FSDP version": "1"}, ["the config's FSDP version 1 (FULL_SHARD) runs as FSDP2 with reshard_after_forward true"]),
    (
        {"FSDP version": "1", "sharding strategy": "SHARD_GRAD_OP"},
        ["reshard False", "the config's FSDP version 1 (SHARD_GRAD_OP) runs as FSDP2 with reshard_after_forward false"],
    ),
    (
        {"FSDP version": "1", "sharding strategy": "NO_SHARD"},
        [
            "the accelerate config asks for FSDP version 1 with NO_SHARD, which replicates the model as DDP does: "
            "use a DDP config (distributed_type: MULTI_GPU) instead"
        ],
    ),
    (
        {"FSDP version": "1", "sharding strategy": "HYBRID_SHARD"},
        [
            "the accelerate config asks for FSDP version 1 with HYBRID_SHARD, which shards within a machine and "
            "replicates across machines"
        ],
    ),
]


@pytest.mark.parametrize("answers, expected", GENERATED_CONFIGS)
def test_every_fsdp_config_accelerate_config_writes_is_read_into_what_runs_or_one_line(tmp_path, answers, expected):
    from unittest import mock

    from accelerate_configs import fsdp_config, launcher_environment
    from albert_hf.runtime.distributed import fsdp_plugin_from_launcher

    environment = launcher_environment(fsdp_config(tmp_path / "config.yaml", **answers))
    with mock.patch.dict(os.environ, environment):
        try:
            plugin, request = fsdp_plugin_from_launcher()
        except InputError as stop:
            assert str(stop).startswith(expected[0]) and len(expected) == 1
            return
    assert plugin.fsdp_version == 2 and plugin.auto_wrap_policy is None and not plugin.activation_checkpointing
    assert not plugin.cpu_ram_efficient_loading  # carried out by albert_hf, when there is a checkpoint to load
    described = f"FSDP{plugin.fsdp_version}; reshard {plugin.reshard_after_forward}; " + "; ".join(request.notes)
    for text in expected:
        if text == "no notes":
            assert not request.notes, request.notes
        elif "offload" in text:  # decided where the machine is known
            assert environment["FSDP_OFFLOAD_PARAMS"] == "true"
        elif "nothing to load" in text:
            assert request.ram_efficient_loading
        else:
            assert text in described, described
    assert request.activation_checkpointing == ("activation checkpointing" in answers)


# Not `rounding`: fp32 on both sides, which differ by 1-2 ulps (at most 2.4e-7 against the 1e-5 asserted) under
# this CPU's kernels and under the AVX2 caps alike (BENCHMARKS.md, "Tolerance margins under the AVX2 caps").
@pytest.mark.trains
@pytest.mark.launched
def test_a_generated_fsdp_config_with_policy_and_activation_checkpointing_ends_with_the_ddp_weights(tmp_path, ddp_run):
    """The first policy `accelerate config` offers, with the class named, plus activation checkpointing and its
    defaults (resharding after forward, CPU-RAM-efficient loading): it trains, and says what it did instead."""
    from accelerate_configs import fsdp_config

    config = fsdp_config(tmp_path / "fsdp.yaml", **TRANSFORMER_CLASS, **{"activation checkpointing": "yes"})
    run = tmp_path / "run"
    done = pretrain(
        run,
        *ARGS,
        "--global_batch_size",
        "8",
        "--per_device_train_batch_size",
        "4",
        launcher=[*LAUNCH, "--config_file", config],
    )
    start = next(line for line in done.stderr.splitlines() if "parameters; global batch" in line)
    assert "global batch 8 = 2 processes x 4 x 1 accumulation" in start  # --global_batch_size split for the launch
    assert re.search(
        r"FSDP2 over 2 processes on 1 machine \(gloo, cpu: [^)]+\): this process holds 50.0% of the "
        r"parameters",
        start,
    )
    assert f"auto-wrap policy TRANSFORMER_BASED_WRAP (AlbertHFLayer) {REPLACED}" in start
    assert "fsdp_activation_checkpointing: the model's gradient checkpointing is on" in start
    assert "fsdp_cpu_ram_efficient_loading: nothing to load (no --model_name_or_path)" in start
    expected, got = load_file(ddp_run / "model.safetensors"), load_file(run / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.trains
@pytest.mark.launched
def test_fsdp_version_1_with_ram_efficient_loading_reads_on_the_first_process_and_shards_exactly(tmp_path, ddp_run):
    """accelerate 1.x's default FSDP config (version 1, FULL_SHARD, sync_module_states, use_orig_params, full state
    dicts) with --model_name_or_path: the first process reads the checkpoint, the second builds on the meta device
    and receives its shards. At learning rate 0 the gathered final weights are the checkpoint's, bit for bit."""
    from accelerate_configs import fsdp_config

    config = fsdp_config(tmp_path / "fsdp1.yaml", **{"FSDP version": "1"})
    run = tmp_path / "run"
    done = pretrain(
        run,
        *ARGS,
        "--per_device_train_batch_size",
        "4",
        "--model_name_or_path",
        str(ddp_run),
        "--max_train_steps",
        "3",
        "--learning_rate",
        "0",
        launcher=[*LAUNCH, "--config_file", config],
    )
    start = next(line for line in done.stderr.splitlines() if "parameters; global batch" in line)
    assert "FSDP2 over 2 processes" in start
    assert "the config's FSDP version 1 (FULL_SHARD) runs as FSDP2 with reshard_after_forward true" in start
    assert (
        "fsdp_cpu_ram_efficient_loading: the first process read --model_name_or_path, the others received their shards"
    ) in start
    assert (run / "step_3" / STATE_FILE).is_file()  # a full-state-dict checkpoint, as the config asks
    expected, got = load_file(ddp_run / "model.safetensors"), load_file(run / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


SHARDING = """
import sys
import torch
import torch.distributed as dist
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import Shard, distribute_tensor

from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
from albert_hf.runtime.distributed import end_distributed, local_share, shard_for_fsdp2
from albert_hf.modeling_albert_hf import AlbertHFLayer
from albert_hf.optimization import Lamb

dist.init_process_group("gloo")
rank = dist.get_rank()
report = []


def check_units(sharing):
    torch.manual_seed(0)
    model = AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", sharing=sharing))
    shard_for_fsdp2(model, FullyShardedDataParallelPlugin(fsdp_version=2))
    ids = torch.randint(5, 100, (2, 16))
    model(input_ids=ids, labels=ids, sentence_order_label=torch.tensor([0, 1])).loss.backward()  # units are valid
    layers = {id(m): m for m in model.modules() if isinstance(m, AlbertHFLayer)}.values()
    tied = isinstance(model.get_input_embeddings(), FSDPModule) and isinstance(model.predictions, FSDPModule)
    report.append(f"{sharing}: {len(layers)} layers, sharded {all(isinstance(m, FSDPModule) for m in layers)}, "
                  f"tied {tied}, root {isinstance(model, FSDPModule)}, share {local_share(model):.2f}")


# One model per process: torch 2.13 keeps a second FSDP2 model of a process (and so its process group) alive after
# the last reference to it goes, and end_distributed could not free the group.
check_units(sys.argv[2])


# Rows 0-2 (process 0's shard) carry most of ||w||, rows 3-5 (process 1's) most of the update: a trust ratio from a
# shard's norms would be far off the full tensor's on both processes.
w0 = torch.arange(1.0, 19.0, dtype=torch.float64).reshape(6, 3)
w0[3:] /= 100
g = torch.linspace(-1, 1, 18, dtype=torch.float64).reshape(6, 3)
g[:3] /= 100
rows = slice(3 * rank, 3 * rank + 3)
mesh = init_device_mesh("cpu", (2,))
for foreach in (False, True):
    full = torch.nn.Parameter(w0.clone())
    full.grad = g.clone()
    Lamb([full], lr=0.1, weight_decay=0.01, foreach=foreach).step()
    shard_alone = torch.nn.Parameter(w0[rows].clone())  # what LAMB on a shard's own norms would give
    shard_alone.grad = g[rows].clone()
    Lamb([shard_alone], lr=0.1, weight_decay=0.01, foreach=foreach).step()
    # sharded over the processes by rows, as fully_shard shards a parameter (a second FSDP model in the process
    # would stay alive, see above)
    sharded = torch.nn.Parameter(distribute_tensor(w0, mesh, [Shard(0)]))
    sharded.grad = distribute_tensor(g, mesh, [Shard(0)])
    local_rows = sharded.to_local().shape[0]
    Lamb([sharded], lr=0.1, weight_decay=0.01, foreach=foreach).step()
    error = (sharded.full_tensor() - full.detach()).abs().max().item()
    shard_error = (shard_alone.detach() - full.detach()[rows]).abs().max().item()
    report.append(f"lamb foreach={foreach}: {local_rows} local rows, error {error:.1e}, "
                  f"shard-norm error {shard_error:.1e}")
# End as run_pretraining does: every process done with its collectives, its own references to sharded modules
# dropped, then end_distributed. The group must really be freed, or a gloo worker can abort the exiting process.
del mesh, sharded
dist.barrier()
report.append(f"process groups alive after end_distributed: {end_distributed()}")
with open(f"{sys.argv[1]}/{sys.argv[2]}_rank_{rank}.txt", "w") as f:
    f.write("\\n".join(report) + "\\n")
"""


@pytest.mark.trains
@pytest.mark.launched
def test_fsdp2_units_and_lamb_full_norms_under_sharding(tmp_path):
    script = tmp_path / "sharding.py"
    script.write_text(SHARDING)
    for sharing in ("all", "none"):
        done = run_bounded(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                "2",
                str(script),
                str(tmp_path),
                sharing,
            ],
            timeout=180,
            cwd=tmp_path,
            env=subprocess_env(),
        )
        assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        for sharing, layers in (("all", 1), ("none", 4)):
            lines = (tmp_path / f"{sharing}_rank_{rank}.txt").read_text().splitlines()
            # one unit per distinct layer (the shared one, or each of 4), the tied word table with the MLM head,
            # the root
            assert lines[0].startswith(f"{sharing}: {layers} layers, sharded True, tied True, root True, share 0.5")
            for line in lines[1:3]:
                local_rows = int(line.split(": ")[1].split(" local rows")[0])
                error = float(line.split("error ")[1].split(",")[0])
                shard_error = float(line.split("shard-norm error ")[1])
                assert local_rows == 3 and error < 1e-12 and shard_error > 1e-3, line
            # the group is freed before the process exits (left to the exit, 3 of 174 FSDP runs aborted)
            assert lines[3:] == ["process groups alive after end_distributed: 0"]


def test_every_shipped_accelerate_config_loads_and_is_in_the_docs_table():
    from accelerate.commands.config.config_args import load_config_from_file

    page = (REPO / "docs" / "distributed.md").read_text()
    table = page[page.index("## Beyond one machine") :]
    expected = {
        "cpu_two_processes.yaml": "MULTI_GPU",
        "fsdp_cpu.yaml": "FSDP",
        "fsdp.yaml": "FSDP",
        "multi_node.yaml": "MULTI_GPU",
        "deepspeed_zero2.yaml": "DEEPSPEED",
    }
    configs = sorted((REPO / "examples" / "accelerate_configs").glob("*.yaml"))
    assert sorted(path.name for path in configs) == sorted(expected)
    for path in configs:
        config = load_config_from_file(str(path))
        assert config.distributed_type.value == expected[path.name], path.name
        assert path.name in table
        if config.distributed_type.value == "FSDP":  # what run_pretraining.py accepts
            assert config.fsdp_config["fsdp_version"] == 2 and not config.fsdp_config["fsdp_cpu_ram_efficient_loading"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--gradient_accumulation_steps", "2", "--optimizer", "adamw"],
            "--gradient_accumulation_steps under DeepSpeed",
        ),
        (
            [],
            "--optimizer lamb under DeepSpeed: ZeRO and DeepSpeed's mixed-precision optimizers hand the optimizer one "
            "flat partition per parameter group",
        ),
    ],
)
def test_what_deepspeed_would_change_is_refused_in_one_line(flags, message):
    from albert_hf.runtime.distributed import check_deepspeed

    with pytest.raises(InputError) as refused:
        optimization = parse_args(["--output_dir", "unused", *flags]).optimization
        check_deepspeed(optimization.gradient_accumulation_steps, optimization.optimizer)
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    if "lamb" in message:
        assert "use --optimizer adamw" in str(refused.value)


def test_the_shipped_deepspeed_config_agrees_with_what_the_script_accepts():
    from accelerate.commands.config.config_args import load_config_from_file

    from albert_hf.runtime.distributed import check_deepspeed

    path = REPO / "examples" / "accelerate_configs" / "deepspeed_zero2.yaml"
    config = load_config_from_file(str(path)).deepspeed_config
    usage = path.read_text().split("run_pretraining.py \\\n#", 1)[1].split("...")[0].split()
    args = parse_args(
        ["--output_dir", "unused", *usage, "--gradient_accumulation_steps", str(config["gradient_accumulation_steps"])]
    )
    optimization = args.optimization
    check_deepspeed(optimization.gradient_accumulation_steps, optimization.optimizer)  # raises on a refusal
    assert config["gradient_clipping"] == optimization.max_grad_norm and optimization.optimizer == "adamw"


@pytest.mark.parametrize(
    "env, message",
    [
        (
            {"ACCELERATE_USE_DEEPSPEED": "true"},
            "error: the accelerate config asks for DeepSpeed, which needs CUDA GPUs",
        ),
        (
            {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"},
            "error: the accelerate config asks for FSDP, but this run is one process: start it with `accelerate launch",
        ),
    ],
)
def test_fine_tuning_refuses_a_mode_that_cannot_be_had_with_one_line(tmp_path, tiny_checkpoint, env, message):
    from albert_hf.testing.glue_folders import write_glue_folders

    rte = write_glue_folders(tmp_path / "glue") / "RTE"
    out = tmp_path / "out"
    command = [
        sys.executable,
        str(REPO / "run_glue.py"),
        "--model_name_or_path",
        str(tiny_checkpoint),
        "--task_name",
        "rte",
        "--data_dir",
        str(rte),
        "--do_train",
        "--max_steps",
        "2",
        "--report_to",
        "none",
        "--output_dir",
        str(out),
    ]
    done = run_bounded(command, timeout=120, cwd=tmp_path, env=subprocess_env(**env))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(message)
    assert not (out / "model.safetensors").exists()


def test_the_slurm_example_is_valid_bash_and_uses_only_real_flags():
    script = REPO / "examples" / "slurm_pretraining.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "#SBATCH --signal=B:TERM@120" in text and "--resume_from_checkpoint latest" in text
    known = {option for action in build_parser()._actions for option in action.option_strings}
    used = {word for word in text.split("run_pretraining.py", 1)[1].split() if word.startswith("--")}
    assert used and used <= known, used - known
    assert "examples/slurm_pretraining.sh" in (REPO / "README.md").read_text()


@pytest.mark.parametrize(
    "ending, requeued",
    [
        ("signal to the script", True),  # --signal=B:TERM: the script passes it on, the run saves and stops
        ("signal to every process", True),  # a preemption or --signal without B:, the script not signalled
        ("finished", False),
        ("failed without progress", False),  # a run that fails again at once is not queued forever
    ],
)
def test_the_slurm_example_queues_itself_again_after_a_stop_however_the_signal_arrives(tmp_path, ending, requeued):
    """examples/slurm_pretraining.sh with stand-ins for srun, scontrol and accelerate: the run (accelerate's
    stand-in) leaves the folder as a stop, a finished run or a failure would; the job asks for a requeue exactly
    when the run is unfinished and wrote a newer checkpoint."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    (out / "step_1000").mkdir(parents=True)  # an earlier job's checkpoint
    stubs = {
        "srun": 'exec "$@"',
        "scontrol": 'if [ "$1" = requeue ]; then echo "$2" >> "$LOG"; else echo node1; fi',
        # the run: a stop writes step_2000 and exits 1, as the launcher does after its processes exit with 75
        "accelerate": {
            "signal to the script": 'trap \'mkdir "$OUTPUT_DIR/step_2000"; exit 1\' TERM; touch "$READY"; '
            "while :; do sleep 0.05; done",
            "signal to every process": 'mkdir "$OUTPUT_DIR/step_2000"; exit 1',
            "finished": 'mkdir "$OUTPUT_DIR/step_2000"; touch "$OUTPUT_DIR/model.safetensors"; exit 0',
            "failed without progress": "exit 1",
        }[ending],
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "OUTPUT_DIR": str(out),
        "LOG": str(tmp_path / "log"),
        "READY": str(tmp_path / "ready"),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_NNODES": "1",
        "SLURM_NODEID": "0",
    }
    job = subprocess.Popen(
        ["bash", str(REPO / "examples" / "slurm_pretraining.sh")],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def script_ready():  # the run started and the script's trap set (SLURM signals long after the start)
        status = Path(f"/proc/{job.pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return (tmp_path / "ready").exists() and caught & (1 << (signal.SIGTERM - 1))

    try:
        if ending == "signal to the script":
            deadline = time.time() + 30
            while not script_ready():
                assert time.time() < deadline and job.poll() is None
                time.sleep(0.02)
            job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)  # whatever is left of the job's stand-ins
    asked = (tmp_path / "log").read_text().split() if (tmp_path / "log").exists() else []
    assert asked == (["42"] if requeued else []), stderr
