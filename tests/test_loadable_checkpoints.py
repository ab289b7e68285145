"""Every complete step_N loads as a model (AutoModel, AutoTokenizer, a fill-mask pipeline, run_glue.py), its model
files hard links to the run's one copy; one written without them is refused in one line naming the command that
makes it loadable, and that command does so without unchecking it."""

import json
import os
import shutil

import pytest

from helpers import run_python, run_script
from pretraining_runs import pretrain

STEPS = ["--max_train_steps", "4", "--checkpointing_steps", "2", "--eval_steps", "0", "--no_plots"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("loadable") / "run"
    pretrain(out, *STEPS)
    return out


LOAD = """
import torch, transformers
from safetensors.torch import load_file
transformers.logging.set_verbosity_error()
folder = {folder!r}
model = transformers.AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True)
base = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True)
saved, loaded = load_file(folder + "/model.safetensors"), model.state_dict()
same = all(torch.equal(loaded[name], saved[name]) for name in saved)
tied = model.predictions.decoder.weight.data_ptr() == model.albert.embeddings.word_embeddings.weight.data_ptr()
fill = transformers.pipeline("fill-mask", model=folder, trust_remote_code=True)
guesses = fill("the " + fill.tokenizer.mask_token + " is here.")
print("LOADED", type(model).__name__, type(base).__name__, same, tied, len(guesses))
"""


@pytest.mark.trains
def test_every_checkpoint_loads_as_a_model_without_albert_hf(run, tmp_path):
    for step in (2, 4):
        done = run_python(LOAD.format(folder=str(run / f"step_{step}")), cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "LOADED AlbertHFForPreTraining AlbertHFModel True True 5" in done.stdout
    # the last checkpoint holds the final weights
    assert (run / "step_4" / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()


@pytest.mark.trains
def test_a_checkpoints_model_files_are_links_to_the_runs_one_copy(run):
    shared = run / ".model_files"
    names = sorted(path.name for path in shared.iterdir())
    assert {
        "config.json",
        "configuration_albert_hf.py",
        "modeling_albert_hf.py",
        "tokenizer.json",
        "tokenizer_config.json",
    } <= set(names)
    for step in (2, 4):
        for name in names:
            assert os.path.samefile(shared / name, run / f"step_{step}" / name), name  # no bytes added
    config = json.loads((shared / "config.json").read_text())
    assert config["architectures"] == ["AlbertHFForPreTraining"]
    assert (
        config["auto_map"]["AutoModelForSequenceClassification"]
        == "modeling_albert_hf.AlbertHFForSequenceClassification"
    )


@pytest.mark.trains
def test_glue_fine_tunes_a_checkpoint(run, tmp_path):
    from albert_hf.testing.glue_folders import write_glue_folders

    glue = write_glue_folders(tmp_path / "glue")
    out = tmp_path / "mrpc"
    run_script(
        "run_glue",
        [
            "--model_name_or_path",
            run / "step_2",
            "--output_dir",
            out,
            "--task_name",
            "mrpc",
            "--data_dir",
            glue,
            "--do_train",
            "--do_eval",
            "--max_steps",
            2,
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
        ],
    )
    assert "eval_accuracy" in json.loads((out / "all_results.json").read_text())


@pytest.mark.trains
def test_a_checkpoint_without_model_files_is_refused_in_one_line_and_the_command_makes_it_loadable(run, tmp_path):
    from albert_hf.errors import InputError
    from albert_hf.pretraining.output.checkpoints import StepCheckpoints
    from albert_hf.pretraining.output.loadable import main as make_loadable
    from albert_hf.runtime import checkpoint_files
    from albert_hf.testing.glue_folders import write_glue_folders

    old = tmp_path / "run" / "step_2"  # as checkpoints were written before they held the model files
    shutil.copytree(run / "step_2", old)
    for name in os.listdir(run / ".model_files"):
        (old / name).unlink()
    checkpoint_files.write_record(old, "files.json")
    with pytest.raises(
        InputError,
        match=rf"^--model_name_or_path {old}: a run_pretraining.py checkpoint written "
        rf"without the model's files \(config, tokenizer, code\); make it loadable "
        rf"with: python -m albert_hf.pretraining.output.loadable {old}$",
    ):
        run_script(
            "run_glue",
            [
                "--model_name_or_path",
                old,
                "--output_dir",
                tmp_path / "mrpc",
                "--task_name",
                "mrpc",
                "--data_dir",
                write_glue_folders(tmp_path / "glue"),
                "--do_eval",
                "--report_to",
                "none",
            ],
        )
    # the run's final folder is beside it (no .model_files there): the command takes the files from it
    for name in (
        "config.json",
        "configuration_albert_hf.py",
        "modeling_albert_hf.py",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        shutil.copy(run / name, tmp_path / "run" / name)
    assert make_loadable([str(old)]) == 0
    assert StepCheckpoints.damage(old) is None  # recorded again, still checked when resumed
    done = run_python(LOAD.format(folder=str(old)), cwd=tmp_path)
    assert "LOADED AlbertHFForPreTraining AlbertHFModel True True 5" in done.stdout, done.stderr[-3000:]
    assert make_loadable([str(old)]) == 0  # a second time: nothing to add


@pytest.mark.trains
def test_the_command_refuses_a_changed_checkpoint_and_one_without_files_to_take(run, tmp_path):
    from albert_hf.errors import InputError
    from albert_hf.pretraining.output.loadable import make_loadable
    from albert_hf.runtime import checkpoint_files

    old = tmp_path / "run" / "step_2"
    shutil.copytree(run / "step_2", old)
    for name in os.listdir(run / ".model_files"):
        (old / name).unlink()
    with pytest.raises(InputError, match=rf"^{old}: config.json: missing$"):  # the record names files now gone
        make_loadable(old)
    checkpoint_files.write_record(old, "files.json")  # intact again, and no model files beside it
    with pytest.raises(
        InputError,
        match=rf"^{old}: neither {old.parent / '.model_files'} nor {old.parent} \(the "
        r"run's final folder\) holds the model's files",
    ):
        make_loadable(old)


def test_the_command_names_a_folder_that_is_not_a_checkpoint_in_one_line(tmp_path):
    from albert_hf.errors import InputError
    from albert_hf.pretraining.output.loadable import make_loadable

    with pytest.raises(InputError, match=rf"^{tmp_path / 'step_9'}: no such folder$"):
        make_loadable(tmp_path / "step_9")
    (tmp_path / "step_3").mkdir()
    with pytest.raises(InputError, match=rf"^{tmp_path / 'step_3'}: not a complete checkpoint"):
        make_loadable(tmp_path / "step_3")


@pytest.mark.trains
def test_shards_of_another_model_are_refused_in_one_line(run, tmp_path):
    import re

    import torch
    import torch.distributed.checkpoint as dcp

    from albert_hf.errors import InputError
    from albert_hf.pretraining.output.loadable import FSDP_SHARDS, gathered_weights

    dcp.save({"model": {"other.weight": torch.ones(2)}}, checkpoint_id=tmp_path / FSDP_SHARDS, no_dist=True)
    with pytest.raises(
        InputError,
        match=rf"^{re.escape(str(tmp_path / FSDP_SHARDS))}: its tensors \(1\) are not "
        r"those of the model of .*config\.json \(\d+\), e\.g\. \S+$",
    ):
        gathered_weights(tmp_path, run / ".model_files")
    assert not (tmp_path / "model.safetensors").exists()
