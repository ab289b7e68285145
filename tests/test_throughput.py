"""What every logged row says of a run's cost and health: model TFLOP/s and MFU against a named peak, the gradient
norm the clipping used, the share of time spent waiting for data, peak memory; and the run's totals."""

import json
import math
import subprocess
import sys
import time

import pytest

from albert_hf.errors import InputError
from albert_hf.flops import training_flops_per_token
from albert_hf.runtime.hardware import Hardware, Peak, Precision, gpu_peak, mfu_peak
from albert_hf.runtime.throughput import Throughput
from pretraining_runs import FAST, metrics

QUIET = ["--tokenizer_sample_sentences", "2000", "--no_plots"]


def mem_total_gib() -> float:
    with open("/proc/meminfo") as meminfo:
        return int(next(line for line in meminfo if line.startswith("MemTotal")).split()[1]) / 2**20


@pytest.mark.parametrize(
    "name, mixed, tf32, tflops, source",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", True, 989.0, "H100 SXM, bf16 dense"),
        ("NVIDIA H100 80GB HBM3", "fp16", True, 989.0, "H100 SXM, fp16 dense"),
        ("NVIDIA H100 80GB HBM3", "no", True, 494.5, "H100 SXM, TF32 dense"),
        ("NVIDIA H100 80GB HBM3", "no", False, 67.0, "H100 SXM, fp32"),
        ("NVIDIA H100 PCIe", "bf16", True, 756.0, "H100 PCIe, bf16 dense"),
        ("NVIDIA H200", "bf16", True, 989.0, "H200 SXM, bf16 dense"),
        ("NVIDIA H200 NVL", "bf16", True, 835.0, "H200 NVL, bf16 dense"),
        ("NVIDIA A100-SXM4-80GB", "no", True, 156.0, "A100, TF32 dense"),
        ("NVIDIA L40S", "bf16", True, 362.0, "L40S, bf16 dense"),
        ("NVIDIA L4", "bf16", True, 121.0, "L4, bf16 dense"),
        ("Tesla T4", "fp16", False, 65.0, "T4, fp16 dense"),
        ("Tesla V100-SXM2-32GB", "no", False, 15.7, "V100 SXM, fp32"),
    ],
)
def test_a_gpu_peak_is_read_by_name_and_the_precision_in_use(name, mixed, tf32, tflops, source):
    assert gpu_peak(name, mixed, tf32) == Peak(tflops, source)


GPU = Hardware(
    "AMD EPYC", "AVX512", None, 16, gpu_name="NVIDIA H100 80GB HBM3", gpu_capability=(9, 0), gpu_bf16=True, gpu_count=8
)
UNKNOWN_GPU = Hardware(
    "AMD EPYC",
    "AVX512",
    None,
    16,
    gpu_name="NVIDIA GeForce RTX 4090",
    gpu_capability=(8, 9),
    gpu_bf16=True,
    gpu_count=1,
)
CPU = Hardware("AMD EPYC", "AVX2", None, 2)
BF16, FP32 = Precision("bf16", "the GPU has bf16 units"), Precision("no", "asked for")


@pytest.mark.parametrize(
    "hardware, precision, flag, peak, note",
    [
        (GPU, BF16, None, Peak(989.0, "H100 SXM, bf16 dense"), "MFU against 989 TFLOP/s (H100 SXM, bf16 dense)"),
        (GPU, BF16, 400.0, Peak(400.0, "--peak_tflops"), "MFU against 400 TFLOP/s (--peak_tflops)"),
        (
            UNKNOWN_GPU,
            BF16,
            None,
            None,
            "no MFU: the NVIDIA GeForce RTX 4090 is not in albert_hf's table of GPU peaks (--peak_tflops sets one)",
        ),
        (UNKNOWN_GPU, BF16, 82.6, Peak(82.6, "--peak_tflops"), "MFU against 82.6 TFLOP/s (--peak_tflops)"),
        (CPU, FP32, None, None, "no MFU: a CPU has no peak in albert_hf's table (--peak_tflops sets one)"),
        (CPU, FP32, 0.5, Peak(0.5, "--peak_tflops"), "MFU against 0.5 TFLOP/s (--peak_tflops)"),
    ],
)
def test_the_peak_is_the_flags_else_a_known_gpus_and_the_start_line_says_which(hardware, precision, flag, peak, note):
    assert mfu_peak(hardware, precision, flag) == (peak, note)


def test_rates_are_the_flops_times_the_tokens_and_mfu_divides_by_every_devices_peak():
    throughput = Throughput(flops_per_token=2e9, devices=4, peak=Peak(100.0, "x"))
    assert throughput.rates(5e4) == pytest.approx({"model_tflops_per_second": 100.0, "mfu": 0.25})
    assert throughput.totals(1e9, 100.0) == pytest.approx(
        {"total_tokens": 1e9, "total_model_flops": 2e18, "mean_model_tflops_per_second": 20000.0, "mean_mfu": 50.0}
    )
    unknown = Throughput(flops_per_token=2e9, devices=4, peak=None)
    assert unknown.rates(5e4) == pytest.approx({"model_tflops_per_second": 100.0})  # no mfu without a peak
    assert unknown.peak_said() == {} and throughput.peak_said() == {"mfu_peak": "100 TFLOP/s (x)"}


def test_a_cpus_peak_memory_is_the_processs_resident_high_water_mark():
    """In a fresh process: 512 MiB written and freed raise the mark by about that much, and it stays."""
    code = (
        "import numpy, torch\n"
        "from albert_hf.runtime.throughput import peak_memory_gib\n"
        "before = peak_memory_gib(torch.device('cpu'))\n"
        "block = numpy.ones(2**26)\n"  # 512 MiB, every page written
        "del block\n"
        "print(before, peak_memory_gib(torch.device('cpu')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    before, after = map(float, done.stdout.split())
    assert 0.05 < before < 2.0 and 0.45 < after - before < 0.6, (before, after)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_peak_that_is_not_a_positive_number_is_refused_in_one_line(tmp_path, value):
    from albert_hf.pretraining.resolution import parse_args

    with pytest.raises(InputError, match=rf"^--peak_tflops {value}: a device's peak must be a number above 0$"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--peak_tflops", value])
    from albert_hf.tasks.arguments import AlbertTrainingArguments

    with pytest.raises(InputError, match=rf"^--peak_tflops {value}: a device's peak must be a number above 0$"):
        AlbertTrainingArguments(output_dir=str(tmp_path / "tuned"), peak_tflops=float(value))


@pytest.mark.trains
def test_every_row_says_the_runs_flops_mfu_clipped_norm_data_wait_and_memory(
    tmp_path, monkeypatch, caplog, fresh_accelerate_state
):
    """--peak_tflops 0.5 and --max_grad_norm 1e-3 (every step clipped). Each training row's model TFLOP/s is the FLOP
    function times its token rate, its mfu that over 0.5; its grad_norm the norm the clipping was given at that
    step; the evaluation rows and all_results.json add up the tokens the steps really had."""
    import accelerate
    import torch

    from albert_hf.configuration_albert_hf import AlbertHFConfig
    from albert_hf.pretraining import job as pretraining
    from albert_hf.pretraining.training import loop

    clip, norms = accelerate.Accelerator.clip_grad_norm_, []

    def recorded_clip(self, parameters, max_norm, norm_type=2):
        norm = clip(self, parameters, max_norm, norm_type)
        norms.append(float(norm))
        return norm

    step, tokens = loop.optimizer_step, []

    def counted_step(run, micro_batches):
        tokens.append(sum(int(batch["attention_mask"].sum()) for batch in micro_batches))
        return step(run, micro_batches)

    monkeypatch.setattr(accelerate.Accelerator, "clip_grad_norm_", recorded_clip)
    monkeypatch.setattr(loop, "optimizer_step", counted_step)
    run = tmp_path / "run"
    with caplog.at_level("INFO", logger="albert_hf"):
        pretraining.main(
            [
                "--output_dir",
                str(run),
                *FAST,
                *QUIET,
                "--max_train_steps",
                "6",
                "--eval_steps",
                "3",
                "--peak_tflops",
                "0.5",
                "--max_grad_norm",
                "1e-3",
            ]
        )
    # 64 tokens and 15% of them masked: round(9.6) = 10 predicted positions (within max_predictions_per_seq 20)
    assert "model MFLOPs a token (10 of 64 predicted); MFU against 0.5 TFLOP/s (--peak_tflops)" in caplog.text
    flops = training_flops_per_token(AlbertHFConfig.from_pretrained(run), 64, 10)
    rows = metrics(run)
    train = [row for row in rows if "train_mlm_loss" in row]
    assert [row["step"] for row in train] == [2, 4, 6] and len(norms) == 6
    for row in train:
        assert row["model_tflops_per_second"] == pytest.approx(flops * row["tokens_per_second"] / 1e12, rel=1e-12)
        assert row["mfu"] == pytest.approx(row["model_tflops_per_second"] / 0.5, rel=1e-12)
        assert row["grad_norm"] == pytest.approx(norms[row["step"] - 1], rel=1e-6)  # the window's last step's
        assert math.isfinite(row["grad_norm"]) and row["grad_norm"] > 1e-3  # before clipping
        assert 0 <= row["data_wait"] < 1 and 0.05 < row["peak_memory_gib"] < mem_total_gib()
    evaluations = [row for row in rows if "eval_mlm_loss" in row]
    assert [row["step"] for row in evaluations] == [3, 6]
    for row in evaluations:  # the run's FLOPs up to its step, from the tokens each step had
        assert row["total_model_flops"] == pytest.approx(flops * sum(tokens[: row["step"]]), rel=1e-12)
        assert row["mean_mfu"] == pytest.approx(row["mean_model_tflops_per_second"] / 0.5, rel=1e-12)
    results = json.loads((run / "all_results.json").read_text())
    assert results["total_model_flops"] == pytest.approx(flops * sum(tokens), rel=1e-12)
    assert results["total_tokens"] == sum(tokens) and results["train_steps"] == 6
    assert results["mean_mfu"] == pytest.approx(results["mean_model_tflops_per_second"] / 0.5, rel=1e-12)
    assert results["mfu_peak"] == "0.5 TFLOP/s (--peak_tflops)"
    card = (run / "README.md").read_text()
    assert f"| model FLOPs | {results['total_model_flops']:.3g} |" in card
    assert f"| MFU (mean) | {results['mean_mfu']:.2%} of 0.5 TFLOP/s (--peak_tflops) a device |" in card
    assert "total_model_flops" not in card  # a training fact, not among the model's results
    assert torch.isfinite(torch.tensor(norms)).all()


@pytest.mark.trains
def test_data_wait_is_the_share_of_the_window_spent_waiting_for_batches(tmp_path, monkeypatch, fresh_accelerate_state):
    """A collator that takes 0.3 s a batch (in the training process: no workers) against a step of a few tens of
    ms: most of each window is spent waiting."""
    from albert_hf.pretraining import job as pretraining
    from albert_hf.pretraining.data.collator import DataCollatorForAlbertPretraining

    collate = DataCollatorForAlbertPretraining.__call__

    def slow(self, examples):
        time.sleep(0.3)
        return collate(self, examples)

    monkeypatch.setattr(DataCollatorForAlbertPretraining, "__call__", slow)
    run = tmp_path / "run"
    pretraining.main(
        [
            "--output_dir",
            str(run),
            *FAST,
            *QUIET,
            "--max_train_steps",
            "6",
            "--logging_steps",
            "3",
            "--eval_steps",
            "0",
            "--validation_split_percentage",
            "0",
            "--dataloader_num_workers",
            "0",
        ]
    )
    waits = [row["data_wait"] for row in metrics(run) if "data_wait" in row]
    assert len(waits) == 2 and all(0.5 < wait < 1 for wait in waits), waits


# ----------------------------------------------------------------------------------------------------------------
# Fine-tuning: Trainer's rows


class Clock:
    """Seconds that pass only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(
    "model_class, head, shape",
    [
        ("AlbertHFForSequenceClassification", "sequence_classification", (4, 16)),
        ("AlbertHFForMultipleChoice", "multiple_choice", (2, 3, 16)),
        ("AlbertHFForQuestionAnswering", "question_answering", (4, 24)),
        ("AlbertHFForTokenClassification", "token_classification", (4, 16)),
    ],
)
def test_the_callback_counts_the_flops_of_training_forwards_only_from_their_shapes(model_class, head, shape):
    import torch

    import albert_hf
    from albert_hf.flops import finetuning_flops_per_token
    from albert_hf.tasks.trainer import ModelFlopsCallback
    from helpers import tiny_config

    config = tiny_config(num_labels=3)
    model = getattr(albert_hf, model_class)(config)
    clock = Clock()
    callback = ModelFlopsCallback(model, clock=clock)
    assert callback.head == head
    callback.on_train_begin(None, None, None, model=model)
    ids = torch.randint(5, config.vocab_size, shape)
    model.train()
    model(input_ids=ids)
    model(ids)  # positionally too
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)  # evaluation is not training work
    clock.now += 2.0
    flops, seconds = callback.take()
    sequences = math.prod(shape[:-1])
    assert flops == 2 * sequences * shape[-1] * finetuning_flops_per_token(config, shape[-1], head, num_labels=3)
    assert seconds == 2.0 and callback.take() == (0.0, 0.0)  # a new window
    callback.on_train_end(None, None, None)
    model.train()
    model(input_ids=ids)
    assert callback.take()[0] == 0.0  # the hook is gone with training


@pytest.mark.trains
def test_fine_tuning_rows_carry_model_tflops_and_mfu_against_the_named_peak(tmp_path, tiny_checkpoint, caplog):
    from albert_hf.testing.glue_folders import write_glue_folders
    from helpers import run_script

    glue = write_glue_folders(tmp_path / "glue")
    out = tmp_path / "mrpc"
    with caplog.at_level("INFO"):
        run_script(
            "run_glue",
            [
                "--model_name_or_path",
                tiny_checkpoint,
                "--output_dir",
                out,
                "--task_name",
                "mrpc",
                "--data_dir",
                glue,
                "--do_train",
                "--max_steps",
                4,
                "--logging_steps",
                1,
                "--max_seq_length",
                32,
                "--per_device_train_batch_size",
                4,
                "--report_to",
                "none",
                "--save_strategy",
                "no",
                "--disable_tqdm",
                "true",
                "--dataloader_pin_memory",
                "false",
                "--peak_tflops",
                0.5,
            ],
        )
    assert "; MFU against 0.5 TFLOP/s (--peak_tflops)" in caplog.text  # in the start line
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    rows = [row for row in history if "loss" in row]
    assert len(rows) == 4
    for row in rows:
        assert row["model_tflops_per_second"] > 0 and math.isfinite(row["grad_norm"])
        assert row["mfu"] == pytest.approx(row["model_tflops_per_second"] / 0.5, rel=1e-12)


@pytest.mark.parametrize("distributed, said", [("NO", False), ("MULTI_GPU", False), ("DEEPSPEED", True)])
def test_the_start_line_says_when_the_rows_have_no_gradient_norm(tmp_path, distributed, said):
    """DeepSpeed clips inside its engine and returns no norm: the step logs none, and the start line says so."""
    from types import SimpleNamespace

    from accelerate.utils import DistributedType

    from albert_hf.pretraining.resolution import parse_args
    from albert_hf.pretraining.run import run_throughput
    from helpers import tiny_config

    args = parse_args(["--output_dir", str(tmp_path / "run"), "--max_seq_length", "64", "--peak_tflops", "2"])
    accelerator = SimpleNamespace(distributed_type=getattr(DistributedType, distributed), num_processes=2)
    throughput, note = run_throughput(args, tiny_config(), accelerator, CPU, FP32)
    assert throughput.devices == 2 and throughput.peak == Peak(2.0, "--peak_tflops")
    assert note.endswith(
        "MFU against 2 TFLOP/s (--peak_tflops)"
        + (
            "; no grad_norm in the logged rows: DeepSpeed clips inside its engine and does not return the norm"
            if said
            else ""
        )
    )
