"""A run that diverges stops with one line, and leaves no non-finite tensor on disk
(albert_hf/pretraining/divergence.py); a non-finite checkpoint of an older version is passed over by
--resume_from_checkpoint latest."""

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from albert_hf.pretraining import job as pretraining
from albert_hf.pretraining.divergence import Diverged, check_losses, checkpoint_finite, stop_line, weights_finite
from test_pretraining import FAST, metrics, pretrain

QUIET = ["--eval_steps", "0", "--validation_split_percentage", "0"]


def non_finite_tensors(folder: Path) -> list[str]:
    """Every floating tensor of every safetensors file under `folder` that is not finite."""
    return [f"{file.relative_to(folder)}:{name}" for file in folder.rglob("*.safetensors")
            for name, tensor in load_file(file).items() if tensor.is_floating_point() and not tensor.isfinite().all()]


def nan_at(monkeypatch, step: int):
    """From optimizer step `step` on, one weight of the model is NaN (a step that diverged)."""
    real = pretraining.optimizer_step
    done = []

    def poisoned(run, micro_batches):
        counts = real(run, micro_batches)
        done.append(1)
        if len(done) == step:
            with torch.no_grad():
                next(run.model.parameters()).view(-1)[0] = math.nan
        return counts

    monkeypatch.setattr(pretraining, "optimizer_step", poisoned)


def test_a_learning_rate_typo_stops_at_the_first_logged_window_with_nothing_non_finite_on_disk(tmp_path):
    run = tmp_path / "run"
    done = pretrain(run, "--learning_rate", "1e4", "--max_train_steps", "40", "--logging_steps", "10",
                    "--checkpointing_steps", "10", "--checkpoints_total_limit", "2", *QUIET, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    # warm-up 1 step, then the official linear decay: 1e4 x (1 - 10/40) at step 10
    assert re.match(r"error: step 10: the training mlm_loss is (nan|inf) at learning rate 7\.5e\+03: the run has "
                    r"diverged; ", last), last
    assert last.endswith("no checkpoint was written before it: start over with a lower --learning_rate")
    assert metrics(run)[-1]["step"] == 10  # the row that showed it is logged; nothing after it
    assert not list(run.glob("step_*")) and not (run / "model.safetensors").exists()
    assert non_finite_tensors(run) == []


def test_non_finite_weights_are_not_checkpointed_and_the_line_names_the_last_finite_checkpoint(
        tmp_path, monkeypatch, fresh_accelerate_state):
    run = tmp_path / "run"
    nan_at(monkeypatch, 7)
    with pytest.raises(Diverged) as stop:  # logged every 100: only the checkpoint's check can see it
        pretraining.main(["--output_dir", str(run), *FAST, "--max_train_steps", "20", "--logging_steps", "100",
                          "--checkpointing_steps", "5", *QUIET])
    assert str(stop.value).startswith("step 10: a weight is not finite, so the step-10 checkpoint was not written "
                                      "at learning rate ")
    assert str(stop.value).endswith(f"the newest checkpoint, {run / 'step_5'}, has finite weights: run again with "
                                    f"--resume_from_checkpoint {run / 'step_5'} and a lower --learning_rate")
    assert sorted(p.name for p in run.glob("step_*")) == ["step_5"] and non_finite_tensors(run) == []
    assert not (run / "_albert_hf_run.lock").exists()  # released on the way out


def test_a_non_finite_held_out_loss_stops_the_run(tmp_path, monkeypatch, fresh_accelerate_state):
    run = tmp_path / "run"
    nan_at(monkeypatch, 3)
    with pytest.raises(Diverged) as stop:
        pretraining.main(["--output_dir", str(run), *FAST, "--max_train_steps", "20", "--logging_steps", "100",
                          "--eval_steps", "4"])
    assert str(stop.value).startswith("step 4: the held-out eval_mlm_loss is nan at learning rate ")
    assert not (run / "model.safetensors").exists()


def test_resume_latest_passes_over_a_non_finite_checkpoint_and_writes_its_own(tmp_path, caplog):
    run = tmp_path / "run"
    pretrain(run, "--max_train_steps", "10", "--checkpointing_steps", "5", *QUIET)
    weights = load_file(run / "step_10" / "model.safetensors")  # as a run that diverged before this check wrote it
    first = next(name for name, tensor in weights.items() if tensor.is_floating_point())
    weights[first] = torch.full_like(weights[first], math.nan)
    save_file(weights, run / "step_10" / "model.safetensors")
    assert checkpoint_finite(run / "step_10") is False and checkpoint_finite(run / "step_5") is True
    done = pretrain(run, "--max_train_steps", "12", "--checkpointing_steps", "5", "--resume_from_checkpoint",
                    "latest", *QUIET)
    assert "step_10 held non-finite weights (a run that diverged): renamed *.non-finite; resuming from step_5" in \
        done.stderr
    assert f"Resumed from {run / 'step_5'}: step 5" in done.stderr
    assert (run / "step_10.non-finite").is_dir() and checkpoint_finite(run / "step_10") is True
    assert non_finite_tensors(run / "step_10") == [] and (run / "model.safetensors").exists()


def test_resume_latest_with_only_non_finite_checkpoints_stops_in_one_line(tmp_path):
    run = tmp_path / "run"
    pretrain(run, "--max_train_steps", "5", "--checkpointing_steps", "5", *QUIET)
    weights = {name: torch.full_like(tensor, math.nan) if tensor.is_floating_point() else tensor
               for name, tensor in load_file(run / "step_5" / "model.safetensors").items()}
    save_file(weights, run / "step_5" / "model.safetensors")
    done = pretrain(run, "--max_train_steps", "8", "--resume_from_checkpoint", "latest", *QUIET, check=False)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == (
        f"error: --resume_from_checkpoint latest: every checkpoint in {run} holds non-finite weights (a run that "
        "diverged): pass --overwrite_output_dir to start over")


def test_the_checks_themselves():
    assert stop_line(3, "the training mlm_loss is nan", 0.5, None) == (
        "step 3: the training mlm_loss is nan at learning rate 0.5: the run has diverged; no checkpoint was "
        "written before it: start over with a lower --learning_rate")
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
