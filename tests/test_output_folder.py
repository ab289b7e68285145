"""run_pretraining.py's output folder: an earlier run refused, then cleared with --overwrite_output_dir; the
folder checked before any work."""

import pytest

from albert_hf.errors import InputError
from albert_hf.pretraining.output.checkpoints import STATE_FILE
from albert_hf.pretraining.resolution import parse_args
from pretraining_runs import metrics, pretrain


def test_an_earlier_run_in_output_dir_is_refused_then_cleared_with_overwrite_output_dir(tmp_path, tiny_checkpoint):
    out = tmp_path / "run"
    common = ["--tokenizer_name", str(tiny_checkpoint), "--eval_steps", "0"]
    first = pretrain(out, *common, "--max_train_steps", "4", "--checkpointing_steps", "2")  # 5% held out
    assert "fill-mask (held-out sentences" in first.stdout and (out / "fill_mask_examples.json").is_file()
    (out / "my_notes.txt").write_text("not ours")
    weights, log = (out / "model.safetensors").read_bytes(), (out / "metrics.jsonl").read_text()

    common += ["--validation_split_percentage", "0"]
    again = pretrain(out, *common, "--max_train_steps", "2", check=False)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    message = again.stderr.strip().splitlines()[-1]
    assert str(out) in message and "--overwrite_output_dir" in message and "--resume_from_checkpoint latest" in message
    assert (out / "model.safetensors").read_bytes() == weights and (out / "metrics.jsonl").read_text() == log  # kept

    done = pretrain(out, *common, "--max_train_steps", "2", "--overwrite_output_dir")
    assert not list(out.glob("step_*"))  # the old run's checkpoints would otherwise be resumed by `latest`
    assert [row["step"] for row in metrics(out)] == [2]  # one series, the new run's
    assert (out / "model.safetensors").read_bytes() != weights
    # nothing held out: no examples, and the earlier run's would mislead
    assert "fill-mask" not in done.stdout
    assert not (out / "fill_mask_examples.json").exists()
    assert (out / "my_notes.txt").read_text() == "not ours"  # only what a run writes is cleared


def test_output_dir_checks_before_any_work(tmp_path):
    out = tmp_path / "run"
    assert parse_args(["--output_dir", str(out)]).output.output_dir == str(out)  # a new folder
    out.mkdir()
    (out / "notes.txt").write_text("a user's file")
    parse_args(["--output_dir", str(out)])  # unrelated files are no earlier run
    (out / "metrics.jsonl").write_text('{"step": 2}\n')
    with pytest.raises(
        InputError,
        match="holds an earlier run .*no complete step_N checkpoint for "
        "--resume_from_checkpoint latest; pass --overwrite_output_dir",
    ):
        parse_args(["--output_dir", str(out)])
    # `latest` with nothing to continue from would silently start over on top of the earlier run
    with pytest.raises(InputError, match="no complete step_N checkpoint"):
        parse_args(["--output_dir", str(out), "--resume_from_checkpoint", "latest"])
    (out / "step_2").mkdir()
    (out / "step_2" / STATE_FILE).write_text("{}")
    with pytest.raises(
        InputError,
        match="pass --resume_from_checkpoint latest to continue it; pass --overwrite_output_dir to start over",
    ):
        parse_args(["--output_dir", str(out)])
    assert parse_args(["--output_dir", str(out), "--resume_from_checkpoint", "latest"]).output.resume_from_checkpoint
    with pytest.raises(InputError, match="not both"):
        parse_args(["--output_dir", str(out), "--resume_from_checkpoint", "latest", "--overwrite_output_dir"])
