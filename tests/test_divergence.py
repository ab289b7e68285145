"""A run that diverges stops with one line, and leaves no non-finite tensor on disk
(albert_hf/pretraining/training/divergence.py);
a non-finite checkpoint (saved by a run that did not check its weights) is
passed over by --resume_from_checkpoint latest."""

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from albert_hf.errors import InputError
from albert_hf.pretraining import job as pretraining
from albert_hf.pretraining.output.checkpoints import RECORD, STATE_FILE
from albert_hf.pretraining.training import loop
from albert_hf.pretraining.training.divergence import (
    Diverged,
    check_losses,
    checkpoint_finite,
    stop_line,
    weights_finite,
)
from helpers import DDP, FSDP
from pretraining_runs import FAST, metrics, pretrain, pretrain_runs, untimed

QUIET = ["--eval_steps", "0", "--validation_split_percentage", "0"]


def non_finite_tensors(folder: Path) -> list[str]:
    """Every floating tensor of every safetensors file under `folder` that is not finite."""
    return [
        f"{file.relative_to(folder)}:{name}"
        for file in folder.rglob("*.safetensors")
        for name, tensor in load_file(file).items()
        if tensor.is_floating_point() and not tensor.isfinite().all()
    ]


def nan_at(monkeypatch, step: int):
    """From optimizer step `step` on, one weight of the model is NaN (a step that diverged)."""
    real = loop.optimizer_step
    done = []

    def poisoned(run, micro_batches):
        counts = real(run, micro_batches)
        done.append(1)
        if len(done) == step:
            with torch.no_grad():
                next(run.model.parameters()).view(-1)[0] = math.nan
        return counts

    monkeypatch.setattr(loop, "optimizer_step", poisoned)  # where fit looks it up


def test_a_learning_rate_typo_stops_after_the_skip_limit_with_nothing_non_finite_on_disk(tmp_path):
    """The first step's update (finite gradients, a learning rate 10^8 too high) sends the weights where every
    later step's gradients are not finite: each is skipped, and --max_consecutive_skips of them stop the run. The
    checkpoints written meanwhile hold those weights, so the line names none of them."""
    run = tmp_path / "run"
    done = pretrain(
        run,
        "--learning_rate",
        "1e4",
        "--max_train_steps",
        "40",
        "--logging_steps",
        "10",
        "--checkpointing_steps",
        "10",
        "--checkpoints_total_limit",
        "2",
        "--max_consecutive_skips",
        "8",
        *QUIET,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    match = re.match(
        r"error: step (\d+): 8 steps in a row \(from step (\d+)\) were skipped, their loss or gradients "
        r"not finite \(8 skipped in all\) at learning rate [0-9.e+]+: the run has diverged; no "
        r"checkpoint was written before it: start over with a lower --learning_rate$",
        last,
    )
    assert match, last
    stopped, first = int(match.group(1)), int(match.group(2))
    assert stopped == first + 7 and first <= 3  # within the limit of the first skipped step
    rows = metrics(run)
    assert rows[-1]["step"] == stopped and sum(row.get("skipped_steps", 0) for row in rows) == 8
    # skipped steps add no NaN; the norm of a window's last step, skipped, is null rather than a number
    assert all(math.isfinite(value) for row in rows for key, value in row.items() if key != "grad_norm")
    assert rows[-1]["grad_norm"] is None and all(
        row["grad_norm"] is None or math.isfinite(row["grad_norm"]) for row in rows if "grad_norm" in row
    )
    assert not (run / "model.safetensors").exists() and non_finite_tensors(run) == []


@pytest.mark.trains
@pytest.mark.launched
@pytest.mark.parametrize("setup", ["one process", "DDP", "FSDP2"])
def test_a_nan_gradient_in_one_micro_batch_is_skipped_everywhere_as_if_the_step_were_dropped(tmp_path, setup):
    """A NaN in the gradient of one micro-batch of one process at step 4 (of 6, 2 micro-batches a step) is skipped
    by every process: the run goes on, logs skipped_steps 1, and ends with the weights and training losses of a run
    that dropped step 4's batches (took them and advanced the schedule, nothing else)."""
    launcher, rank = {"one process": (None, 0), "DDP": (DDP, 1), "FSDP2": (FSDP, 1)}[setup]
    common = [
        "--max_train_steps",
        "6",
        "--gradient_accumulation_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--logging_steps",
        "3",
        *QUIET,
        "--no_plots",
    ]
    skipped, dropped = tmp_path / "skipped", tmp_path / "dropped"
    results, done = pretrain_runs(
        [
            (skipped, common, {}, False, {"nan_gradient_at": {"step": 4, "rank": rank, "accumulation": 2}}),
            (dropped, common, {}, False, {"dropped_step_at": 4}),
        ],
        launcher=launcher,
    )
    assert [result["status"] for result in results] == [0, 0], (results, done.stderr[-3000:])
    rows = {run: untimed(metrics(run)) for run in (skipped, dropped)}
    assert [row.get("skipped_steps") for row in rows[skipped]] == [None, 1]
    assert [{k: v for k, v in row.items() if k != "skipped_steps"} for row in rows[skipped]] == rows[dropped]
    ours, reference = load_file(skipped / "model.safetensors"), load_file(dropped / "model.safetensors")
    assert ours.keys() == reference.keys()
    assert all(torch.equal(ours[name], reference[name]) for name in ours)


def test_non_finite_weights_are_not_checkpointed_and_the_line_names_the_last_finite_checkpoint(
    tmp_path, monkeypatch, fresh_accelerate_state
):
    run = tmp_path / "run"
    nan_at(monkeypatch, 7)
    with pytest.raises(Diverged) as stop:  # logged every 100: only the checkpoint's check can see it
        pretraining.main(
            [
                "--output_dir",
                str(run),
                *FAST,
                "--max_train_steps",
                "20",
                "--logging_steps",
                "100",
                "--checkpointing_steps",
                "5",
                *QUIET,
            ]
        )
    assert str(stop.value).startswith(
        "step 10: a weight is not finite, so the step-10 checkpoint was not written at learning rate "
    )
    assert str(stop.value).endswith(
        f"the newest checkpoint, {run / 'step_5'}, has finite weights: run again with "
        f"--resume_from_checkpoint {run / 'step_5'} and a lower --learning_rate"
    )
    assert sorted(p.name for p in run.glob("step_*")) == ["step_5"] and non_finite_tensors(run) == []
    assert not (run / "_albert_hf_run.lock").exists()  # released on the way out


@pytest.mark.trains
# fp16: the loss scaler's first scale must not overflow the gradients too (AVX-512 FP16 and AVX2 compute them apart)
@pytest.mark.parametrize("precision", ["no", "bf16", pytest.param("fp16", marks=pytest.mark.rounding)])
def test_a_nan_gradient_is_skipped_and_counted_once_in_every_precision(
    tmp_path, monkeypatch, fresh_accelerate_state, precision
):
    """fp32, bf16 autocast, and fp16 with loss scaling (whose scaler skips the step too: still one count)."""
    from albert_hf.pretraining.training import step

    real, calls = step.weighted_loss, []

    def poisoned(outputs, batch, weights):
        calls.append(1)
        return real(outputs, batch, weights) * (math.nan if len(calls) == 4 else 1.0)

    monkeypatch.setattr(step, "weighted_loss", poisoned)
    run = tmp_path / "run"
    pretraining.main(
        [
            "--output_dir",
            str(run),
            *FAST,
            "--max_train_steps",
            "8",
            "--logging_steps",
            "4",
            *QUIET,
            "--no_plots",
            "--mixed_precision",
            precision,
        ]
    )
    rows = metrics(run)
    assert [row.get("skipped_steps") for row in rows] == [1, None]
    # step 4, skipped, ends the first window: its norm is null, not a number
    assert rows[0]["grad_norm"] is None and rows[1]["grad_norm"] > 0 and math.isfinite(rows[1]["grad_norm"])
    assert all(math.isfinite(value) for row in rows for key, value in row.items() if key != "grad_norm")
    assert (run / "model.safetensors").exists() and non_finite_tensors(run) == []


def test_with_rollback_a_diverged_run_goes_back_to_the_checkpoint_before_and_ends_finite(
    tmp_path, monkeypatch, fresh_accelerate_state, caplog
):
    """A weight turns NaN after step 7: steps 8 and 9 are skipped, the skip limit (2) is reached at step 9, and
    --on_divergence rollback loads step_5 (the newest finite checkpoint before step 8) and goes on with the batches
    after step 9, to the end, with finite weights; metrics.jsonl keeps one series with the rollback's row."""
    run = tmp_path / "run"
    nan_at(monkeypatch, 7)
    with caplog.at_level("WARNING", logger="albert_hf"):
        pretraining.main(
            [
                "--output_dir",
                str(run),
                *FAST,
                "--max_train_steps",
                "16",
                "--logging_steps",
                "2",
                "--checkpointing_steps",
                "5",
                "--max_consecutive_skips",
                "2",
                "--on_divergence",
                "rollback",
                *QUIET,
                "--no_plots",
            ]
        )
    rows = metrics(run)
    steps = [row["step"] for row in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 16, steps  # one series, to the end
    assert {"step": 5, "rollback": 1, "rolled_back_from_step": 9} in rows
    assert not any("skipped_steps" in row for row in rows if row["step"] > 5)
    said = [record.getMessage() for record in caplog.records if "rolled back" in record.getMessage()]
    assert len(said) == 1 and said[0].startswith("step 9: 2 steps in a row (from step 8) were skipped")
    assert (
        f"rolled back to {run / 'step_5'} (rollback 1 of at most 3): training goes on from step 5 with the "
        "batches after step 9" in said[0]
    )
    assert (run / "model.safetensors").exists() and non_finite_tensors(run) == []


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--on_divergence", "rollback"], "--on_divergence rollback needs --checkpointing_steps"),
        (
            ["--on_divergence", "rollback", "--checkpointing_steps", "5", "--max_rollbacks", "0"],
            "--max_rollbacks must be at least 1 with --on_divergence rollback",
        ),
        (
            ["--on_divergence", "rollback", "--checkpointing_steps", "5", "--torch_compile_mode", "whole-step-graph"],
            "--on_divergence rollback with --torch_compile_mode whole-step-graph: loading a checkpoint replaces",
        ),
        (["--max_consecutive_skips", "-1"], "--max_consecutive_skips must be 0"),
    ],
)
def test_what_the_divergence_flags_cannot_do_is_refused_in_one_line(tmp_path, flags, message):
    with pytest.raises(InputError) as refused:
        pretraining.parse_args(["--output_dir", str(tmp_path / "run"), *flags])
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


def test_a_non_finite_held_out_loss_stops_the_run(tmp_path, monkeypatch, fresh_accelerate_state):
    run = tmp_path / "run"
    nan_at(monkeypatch, 3)
    with pytest.raises(Diverged) as stop:
        pretraining.main(
            ["--output_dir", str(run), *FAST, "--max_train_steps", "20", "--logging_steps", "100", "--eval_steps", "4"]
        )
    assert str(stop.value).startswith("step 4: the held-out eval_mlm_loss is nan at learning rate ")
    assert not (run / "model.safetensors").exists()


def drop_the_record(checkpoint: Path):
    """As versions that wrote non-finite checkpoints wrote them: without the record of their files."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    del state[RECORD]
    (checkpoint / STATE_FILE).write_text(json.dumps(state))


def test_resume_latest_passes_over_a_non_finite_checkpoint_and_writes_its_own(tmp_path, caplog):
    run = tmp_path / "run"
    pretrain(run, "--max_train_steps", "10", "--checkpointing_steps", "5", *QUIET)
    weights = load_file(run / "step_10" / "model.safetensors")  # as a diverged run that does not check saves it
    first = next(name for name, tensor in weights.items() if tensor.is_floating_point())
    weights[first] = torch.full_like(weights[first], math.nan)
    save_file(weights, run / "step_10" / "model.safetensors")
    drop_the_record(run / "step_10")
    assert checkpoint_finite(run / "step_10") is False and checkpoint_finite(run / "step_5") is True
    done = pretrain(
        run, "--max_train_steps", "10", "--checkpointing_steps", "5", "--resume_from_checkpoint", "latest", *QUIET
    )
    assert (
        "step_10 held non-finite weights (a run that diverged): renamed *.non-finite; resuming from step_5"
        in done.stderr
    )
    assert f"Resumed from {run / 'step_5'}: step 5" in done.stderr
    assert (run / "step_10.non-finite").is_dir() and checkpoint_finite(run / "step_10") is True
    assert non_finite_tensors(run / "step_10") == [] and (run / "model.safetensors").exists()


def test_resume_latest_with_only_non_finite_checkpoints_stops_in_one_line(tmp_path):
    run = tmp_path / "run"
    pretrain(run, "--max_train_steps", "5", "--checkpointing_steps", "5", *QUIET)
    weights = {
        name: torch.full_like(tensor, math.nan) if tensor.is_floating_point() else tensor
        for name, tensor in load_file(run / "step_5" / "model.safetensors").items()
    }
    save_file(weights, run / "step_5" / "model.safetensors")
    drop_the_record(run / "step_5")
    done = pretrain(run, "--max_train_steps", "8", "--resume_from_checkpoint", "latest", *QUIET, check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"error: --resume_from_checkpoint latest: every checkpoint in {run} holds non-finite weights (a run that "
        "diverged): pass --overwrite_output_dir to start over"
    )


def test_the_checks_themselves():
    assert stop_line(3, "the training mlm_loss is nan", 0.5, None) == (
        "step 3: the training mlm_loss is nan at learning rate 0.5: the run has diverged; no checkpoint was "
        "written before it: start over with a lower --learning_rate"
    )

    def nothing_to_read():
        raise AssertionError("the checkpoints are read only when the run stops")

    check_losses({"mlm_loss": 2.0, "mlm_accuracy": math.nan, "lr": math.inf}, 1, 0.1, nothing_to_read, "training")
    with pytest.raises(Diverged, match="the training sop_loss is inf"):
        check_losses({"mlm_loss": 2.0, "sop_loss": math.inf}, 1, 0.1, lambda: None, "training")
    accelerator = SimpleNamespace(device=torch.device("cpu"), reduce=lambda tensor, reduction: tensor)
    model = torch.nn.Linear(3, 2)
    assert weights_finite(model, accelerator)
    with torch.no_grad():
        model.bias[1] = math.inf
    assert not weights_finite(model, accelerator)
