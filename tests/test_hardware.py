"""The hardware record and the precision chosen from it (albert_hf/runtime/hardware.py): every branch of the choice
under made-up hardware, detection against /proc/cpuinfo on this machine, and run_pretraining.py's start line, warning,
all_results.json and card on a CPU without bf16 units (oneDNN capped at AVX2, as on most cloud VMs and laptops)."""

import json
import os
import platform
import re
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch

from albert_hf.errors import InputError
from albert_hf.runtime import hardware
from albert_hf.runtime.hardware import Hardware, bf16_trainer_warning, choose_precision
from helpers import ANY_PORT, REPO, THREADS_SAID, run_bounded, subprocess_env, tiny_config

AVX2 = Hardware("AMD EPYC 7B13", "AVX2", None, 2)
AVX512 = Hardware("Intel Xeon Gold 6148", "AVX512", None, 2)  # Skylake: AVX-512 without bf16
AVX512_BF16 = Hardware("AMD EPYC 9B14", "AVX512", "AVX512_BF16", 2)
AMX = Hardware("Intel Xeon Platinum 8481C", "AVX512", "AMX", 2)
GRAVITON3 = Hardware("ARM Neoverse V1", "SVE256", "Arm BF16", 2)
V100 = Hardware("Intel Xeon", "AVX512", None, 8, gpu_name="Tesla V100-SXM2-16GB", gpu_capability=(7, 0), gpu_count=1)
T4 = Hardware("Intel Xeon", "AVX2", None, 4, gpu_name="Tesla T4", gpu_capability=(7, 5), gpu_count=1)
A100 = Hardware(
    "AMD EPYC", "AVX2", None, 8, gpu_name="NVIDIA A100-SXM4-40GB", gpu_capability=(8, 0), gpu_bf16=True, gpu_count=8
)
H100 = Hardware(
    "Intel Xeon",
    "AVX512",
    "AMX",
    16,
    gpu_name="NVIDIA H100 80GB HBM3",
    gpu_capability=(9, 0),
    gpu_bf16=True,
    gpu_count=1,
)

# hardware, --mixed_precision, the launcher's mixed_precision -> mode, reason (a piece of it), warns, TF32
CHOICES = [
    # auto: the hardware decides
    (AVX2, "auto", None, "no", "this CPU has no bf16 units (AVX2)", False, False),
    (AVX512, "auto", None, "no", "this CPU has no bf16 units (AVX512)", False, False),
    (AVX512_BF16, "auto", None, "bf16", "this CPU has AVX512_BF16 bf16 units", False, False),
    (AMX, "auto", None, "bf16", "this CPU has AMX bf16 units", False, False),
    (GRAVITON3, "auto", None, "bf16", "this CPU has Arm BF16 bf16 units", False, False),
    (V100, "auto", None, "fp16", "Tesla V100-SXM2-16GB (compute capability 7.0) has no bf16 units", False, False),
    (T4, "auto", None, "fp16", "compute capability 7.5) has no bf16 units", False, False),
    (A100, "auto", None, "bf16", "the NVIDIA A100-SXM4-40GB has bf16 units", False, True),
    (H100, "auto", None, "bf16", "the NVIDIA H100 80GB HBM3 has bf16 units", False, True),
    # the launcher's "no" is accelerate's default: no preference, and the line says how to insist on fp32
    (AMX, "auto", "no", "bf16", "--mixed_precision no insists on fp32", False, False),
    (AVX2, "auto", "no", "no", "this CPU has no bf16 units (AVX2)", False, False),
    # an accelerate config's bf16 or fp16 is taken as asked
    (AVX2, "auto", "bf16", "bf16", "asked for by the accelerate config's mixed_precision bf16", True, False),
    (AMX, "auto", "bf16", "bf16", "asked for by the accelerate config's mixed_precision bf16", False, False),
    (A100, "auto", "fp16", "fp16", "asked for by the accelerate config's mixed_precision fp16", False, True),
    # a flag wins over everything
    (AVX2, "bf16", None, "bf16", "asked for by --mixed_precision bf16", True, False),
    (AVX512, "bf16", None, "bf16", "asked for by --mixed_precision bf16", True, False),
    (AMX, "bf16", None, "bf16", "asked for by --mixed_precision bf16", False, False),
    (AMX, "no", "bf16", "no", "asked for by --mixed_precision no", False, False),
    (AVX2, "fp16", None, "fp16", "asked for by --mixed_precision fp16", True, False),
    (V100, "bf16", None, "bf16", "asked for by --mixed_precision bf16", True, False),
    (A100, "bf16", "fp16", "bf16", "asked for by --mixed_precision bf16", False, True),
    (H100, "no", None, "no", "asked for by --mixed_precision no", False, True),
    (V100, "no", None, "no", "asked for by --mixed_precision no", False, False),
]


@pytest.mark.parametrize("machine, flag, launcher, mode, reason, warns, tf32", CHOICES)
def test_the_precision_follows_the_request_then_the_hardware(machine, flag, launcher, mode, reason, warns, tf32):
    precision = choose_precision(machine, flag, launcher)
    assert precision.mixed_precision == mode
    assert reason in precision.reason
    assert (precision.warning is not None) == warns
    assert precision.tf32 == tf32


def test_an_explicit_bf16_without_bf16_units_warns_in_one_line_naming_the_slowdown_and_the_way_out():
    # the flag that avoids it: auto for a flag; for a config's request (which wins over auto) an explicit flag
    for source, precision, fix in (
        ("--mixed_precision bf16", choose_precision(AVX2, "bf16"), "--mixed_precision auto (or no) trains in fp32"),
        (
            "the accelerate config's mixed_precision bf16",
            choose_precision(AVX2, "auto", "bf16"),
            "--mixed_precision no trains in fp32",
        ),
    ):
        warning = precision.warning
        assert "\n" not in warning and warning.startswith(source) and warning.endswith(fix)
        assert "CPU without bf16 units (AVX2)" in warning and "slower than fp32" in warning
        assert choose_precision(AVX2, "no", "bf16").mixed_precision == "no"  # that flag does win over the config
    assert "--mixed_precision auto (fp16 with loss scaling)" in choose_precision(V100, "bf16").warning
    assert choose_precision(V100, "auto", "bf16").warning.endswith("--mixed_precision fp16 avoids it")
    assert "fp16 matmul units" in choose_precision(AVX2, "fp16").warning
    amx_fp16 = Hardware("Intel Xeon 6", "AVX512", "AMX", 2, cpu_fp16_units=True)
    assert choose_precision(amx_fp16, "fp16").warning is None


def test_tf32_is_on_where_the_gpu_has_it_unless_turned_off():
    assert choose_precision(A100, "no").tf32 and choose_precision(A100, "auto").tf32
    assert not choose_precision(A100, "no", tf32=False).tf32
    assert not choose_precision(V100, "no", tf32=True).tf32  # no TF32 units before Ampere
    assert not choose_precision(AMX, "no", tf32=True).tf32
    assert choose_precision(A100, "no").describe() == "fp32 (TF32 matmuls): asked for by --mixed_precision no"


def test_fp8_from_an_accelerate_config_stops_with_one_line():
    with pytest.raises(InputError, match="mixed_precision fp8, which albert_hf does not run"):
        choose_precision(H100, "auto", "fp8")


def test_the_start_line_pieces_name_the_device_the_kind_the_threads_and_the_reason():
    assert AVX2.describe() == "cpu: AMD EPYC 7B13, AVX2, 2 threads"
    assert AMX.describe() == "cpu: Intel Xeon Platinum 8481C, AMX, 2 threads"
    assert Hardware("x", "AVX2", None, 1).describe() == "cpu: x, AVX2, 1 thread"
    assert H100.describe() == "cuda: NVIDIA H100 80GB HBM3, compute capability 9.0"
    assert choose_precision(AVX2).describe() == "fp32: this CPU has no bf16 units (AVX2)"
    assert choose_precision(V100).describe() == (
        "fp16 autocast with loss scaling: the Tesla V100-SXM2-16GB (compute capability 7.0) has no bf16 units"
    )
    assert AVX2.fast_precisions == ("fp32",) and AMX.fast_precisions == ("bf16", "fp32")
    assert V100.fast_precisions == ("fp16", "fp32") and H100.fast_precisions == ("bf16", "fp16", "tf32", "fp32")


def test_torch_compile_start_line_names_the_mode_and_what_the_gpu_measured():
    from albert_hf.pretraining.training.model import compile_note

    assert compile_note(torch.device("cpu"), None) == (
        "torch.compile (mode default, dynamic shapes) of each distinct block and the MLM head with its loss"
    )
    # the default mode on a GPU: no faster than eager where the host limits the step, and where to go instead
    note = compile_note(torch.device("cuda", 0), None)
    assert note.startswith("torch.compile (mode default, static shapes)")
    assert "no faster than eager" in note and note.endswith(
        "--torch_compile_mode whole-step-graph removes the host's share"
    )
    assert compile_note(torch.device("cuda", 0), "reduce-overhead") == (
        "torch.compile (mode reduce-overhead, static shapes) of each distinct block and the MLM head with its loss"
    )
    note = compile_note(torch.device("cuda", 0), "whole-step-graph")
    assert note.startswith("torch.compile (mode default, static shapes)")
    assert "the whole training step (forward, backward, clipping, the update) captured as one CUDA graph" in note


def test_fine_tuning_warns_for_bf16_only_where_the_hardware_lacks_it():
    assert bf16_trainer_warning(AVX2).startswith("--bf16 on a CPU without bf16 units (AVX2)")
    assert bf16_trainer_warning(AVX2).endswith("without --bf16 it trains in fp32")
    assert bf16_trainer_warning(V100).endswith("--fp16 avoids it")
    assert bf16_trainer_warning(AVX512) is not None and bf16_trainer_warning(V100) is not None
    for machine in (AMX, AVX512_BF16, A100):
        assert bf16_trainer_warning(machine) is None


# ---------------------------------------------------------------------------------------------------------------
# Detection


def cpuinfo_flags() -> set:
    text = Path("/proc/cpuinfo").read_text()
    return set(re.search(r"^flags\s*:(.*)$", text, re.M).group(1).split())


@pytest.mark.skipif(
    platform.machine() != "x86_64" or not Path("/proc/cpuinfo").is_file(), reason="reads the x86 flags of /proc/cpuinfo"
)
def test_detection_agrees_with_the_cpu_flags_and_an_isa_cap_removes_the_bf16_units():
    flags = cpuinfo_flags()
    expected = "AMX" if "amx_bf16" in flags else "AVX512_BF16" if "avx512_bf16" in flags else None
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in ("AVX2", "AVX512_CORE")  # as an AVX2 CPU, say
    found = hardware.detect()
    assert found.cpu_bf16_units == (None if capped else expected)
    assert found.cpu_capability == torch.backends.cpu.get_cpu_capability()
    assert found.threads == torch.get_num_threads() and found.device == ("cuda" if torch.cuda.is_available() else "cpu")
    model = re.search(r"^model name\s*:\s*(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).strip()
    assert found.cpu_model == " ".join(model.replace("(R)", "").replace("(TM)", "").split())
    assert hardware.cpu_bf16_units({"ONEDNN_MAX_CPU_ISA": "AVX2"}) is None
    assert hardware.cpu_bf16_units({"ONEDNN_MAX_CPU_ISA": "avx512_core"}) is None
    assert hardware.cpu_bf16_units({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == expected


def test_detection_of_a_cuda_device_and_of_arm_bf16_units():
    with (
        mock.patch.object(torch.cuda, "is_available", return_value=True),
        mock.patch.object(torch.cuda, "current_device", return_value=0),
        mock.patch.object(torch.cuda, "device_count", return_value=4),
        mock.patch.object(torch.cuda, "get_device_name", return_value="Tesla T4"),
        mock.patch.object(torch.cuda, "get_device_capability", return_value=(7, 5)),
        mock.patch.object(torch.cuda, "is_bf16_supported", return_value=False),
    ):
        found = hardware.detect()
    assert (found.device, found.gpu_name, found.gpu_capability, found.gpu_bf16, found.gpu_count) == (
        "cuda",
        "Tesla T4",
        (7, 5),
        False,
        4,
    )
    assert choose_precision(found).mixed_precision == "fp16"
    with (
        mock.patch.object(platform, "machine", return_value="aarch64"),
        mock.patch.object(hardware, "cpu_flags", return_value={"fp", "asimd", "sve", "bf16"}),
        mock.patch.object(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", return_value=True),
    ):
        assert hardware.cpu_bf16_units({}) == "Arm BF16"
    with (
        mock.patch.object(platform, "machine", return_value="aarch64"),
        mock.patch.object(hardware, "cpu_flags", return_value={"fp", "asimd"}),
    ):
        assert hardware.cpu_bf16_units({}) is None


def test_the_shipped_cpu_configs_leave_the_precision_to_the_hardware():
    """Launched with a shipped CPU config, the run trains in fp32 on an AVX2 CPU and in bf16 on an AMX one."""
    from accelerate_configs import launcher_environment

    for name in ("cpu_two_processes.yaml", "fsdp_cpu.yaml"):
        launched = launcher_environment(REPO / "examples" / "accelerate_configs" / name)["ACCELERATE_MIXED_PRECISION"]
        assert launched == "no", name
        assert choose_precision(AVX2, "auto", launched).mixed_precision == "no"
        assert choose_precision(AMX, "auto", launched).mixed_precision == "bf16"


# ---------------------------------------------------------------------------------------------------------------
# run_pretraining.py on a CPU without bf16 units

NO_BF16_UNITS = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}  # what an AVX2 CPU gives torch


@pytest.mark.trains
def test_run_pretraining_on_a_cpu_without_bf16_units_says_what_it_chose_and_warns_for_explicit_bf16(tmp_path):
    from pretraining_runs import pretrain_runs

    # One process for both runs (its environment caps the kernels before torch is imported), with its own
    # torch.compile cache: torch does not key that cache on ATEN_CPU_CAPABILITY.
    tiny = ["--max_train_steps", "2", "--eval_steps", "0", "--max_eval_samples", "16", "--no_plots"]
    auto, explicit = tmp_path / "auto", tmp_path / "bf16"
    results, done = pretrain_runs(
        [
            (auto, [*tiny, "--mixed_precision", "auto"]),
            (explicit, [*tiny, "--max_train_steps", "1", "--mixed_precision", "bf16"]),
        ],
        steps_only=False,
        process_env={**NO_BF16_UNITS, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
    )
    assert [result["status"] for result in results] == [0, 0], results
    auto_start, explicit_start = [line for line in done.stderr.splitlines() if "parameters; global batch" in line]
    assert re.search(
        rf"; one process \(cpu: [^,]+, AVX2, {THREADS_SAID}\); fp32: this CPU has no bf16 units \(AVX2\); "
        r"attention: [^;]+; [0-9.]+ model MFLOPs a token \(10 of 64 predicted\); no MFU: a CPU has no "
        r"peak in albert_hf's table \(--peak_tflops sets one\)$",
        auto_start,
    ), auto_start
    results = json.loads((auto / "all_results.json").read_text())
    assert results["mixed_precision"] == "no" and results["precision"] == "fp32: this CPU has no bf16 units (AVX2)"
    assert results["hardware"].endswith(f", AVX2, {THREADS_SAID}") and results["fast_precisions"] == "fp32"
    card = (auto / "README.md").read_text()
    assert "fp32: this CPU has no bf16 units (AVX2)" in card and results["hardware"] in card
    assert f"AVX2, {THREADS_SAID} |" not in card.split("## Results", 1)[-1].split("##", 1)[0]  # not among the metrics

    # the one warning of the two runs is the explicit bf16 run's (the auto run warns of nothing)
    warnings = [line for line in done.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1 and "--mixed_precision bf16 on a CPU without bf16 units (AVX2)" in warnings[0]
    assert "--mixed_precision auto (or no) trains in fp32" in warnings[0]
    assert "; bf16 autocast: asked for by --mixed_precision bf16" in explicit_start


@pytest.mark.trains
@pytest.mark.launched
def test_a_launched_run_whose_config_asks_for_bf16_without_bf16_units_warns_once(tmp_path):
    """Two processes from a config written by `accelerate config`'s questions (bf16 answered): the run trains in
    bf16 as asked, and only the first process prints the warning."""
    from accelerate_configs import write_config
    from pretraining_runs import FAST, SCRIPT

    config = tmp_path / "ddp_bf16.yaml"
    write_config(
        config,
        {
            "type of machine": "multi-GPU",
            "How many different machines": "1",
            "How many GPU(s)": "2",
            "FullyShardedDataParallel": "no",
            "mixed precision": "bf16",
        },
    )
    env = subprocess_env(**NO_BF16_UNITS, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "ind"))
    fast = [arg for arg in FAST if arg not in ("--mixed_precision", "no")]  # the config decides
    done = run_bounded(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(config),
            *ANY_PORT,
            SCRIPT,
            "--output_dir",
            str(tmp_path / "out"),
            *fast,
            "--max_train_steps",
            "1",
            "--eval_steps",
            "0",
            "--validation_split_percentage",
            "0",
            "--no_plots",
        ],
        300,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if " WARNING albert_hf" in line]
    assert len(warnings) == 1, warnings
    assert "the accelerate config's mixed_precision bf16 on a CPU without bf16 units (AVX2)" in warnings[0]
    assert warnings[0].endswith("--mixed_precision no trains in fp32")
    assert re.search(
        rf"DDP over 2 processes on 1 machine \(gloo, cpu: [^)]+, AVX2, {THREADS_SAID}\); bf16 autocast: "
        r"asked for by the accelerate config's mixed_precision bf16",
        done.stderr,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without CUDA")
@pytest.mark.trains
def test_fine_tuning_with_bf16_on_a_cpu_runs_there_and_warns_once_where_it_is_slow(tmp_path, caplog):
    """transformers refuses --bf16 without a bf16 GPU unless --use_cpu is given (a ValueError traceback): on a
    machine without CUDA the scripts train on the CPU, and setup() warns where the CPU has no bf16 units."""
    import logging

    from albert_hf.tasks import finetuning
    from albert_hf.tasks.arguments import AlbertTrainingArguments

    args = AlbertTrainingArguments(output_dir=str(tmp_path / "out"), bf16=True, report_to="none")
    assert args.use_cpu and args.bf16
    for machine, expected in ((AVX2, 1), (AMX, 0)):
        caplog.clear()
        with mock.patch.object(finetuning, "detect", return_value=machine), caplog.at_level(logging.WARNING):
            finetuning.setup(args)
        assert len([r for r in caplog.records if "--bf16 on a CPU without bf16 units" in r.getMessage()]) == expected


def test_the_start_line_names_the_attention_kernel_torch_picks():
    from albert_hf import AlbertHFModel
    from albert_hf.runtime.hardware import attention_kernel

    def model_config(**overrides):  # as a built model resolves it (sdpa unless asked otherwise)
        return AlbertHFModel(tiny_config(max_position_embeddings=512, **overrides)).config

    cpu = torch.device("cpu")
    config = model_config(attention_probs_dropout_prob=0.0)
    assert attention_kernel(config, cpu, torch.bfloat16, 128) == (
        "attention: matmul + softmax (SDPA's stand-in when training on a CPU at up to 256 tokens)"
    )
    # past 256 tokens, and in evaluation, SDPA itself: torch's CPU flash kernel takes a padding mask, no dropout
    assert attention_kernel(config, cpu, torch.bfloat16, 512) == "attention: SDPA's flash kernel"
    assert attention_kernel(config, cpu, torch.float32, 128, training=False) == "attention: SDPA's flash kernel"
    dropout = model_config(attention_probs_dropout_prob=0.1)
    assert attention_kernel(dropout, cpu, torch.float32, 512) == "attention: SDPA's math (unfused) kernel"
    eager = model_config(attn_implementation="eager")
    assert attention_kernel(eager, cpu, torch.float32, 128) == "attention: eager"
