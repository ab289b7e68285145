"""Saved checkpoints carry their code: a process without albert_hf loads every head with trust_remote_code."""

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import run_python, tiny_config
from huggingface_hub import HfApi, RepoUrl
from huggingface_hub.errors import EntryNotFoundError
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForQuestionAnswering

import albert_hf
from albert_hf.modeling_albert_hf import AUTO_MAP

REMOTE_FILES = {"configuration_albert_hf.py", "modeling_albert_hf.py"}
HEADS = {
    "AutoModel": "last_hidden_state",
    "AutoModelForPreTraining": "prediction_logits",
    "AutoModelForMaskedLM": "logits",
    "AutoModelForSequenceClassification": "logits",
    "AutoModelForMultipleChoice": "logits",
    "AutoModelForQuestionAnswering": "start_logits",
    "AutoModelForTokenClassification": "logits",
}

LOAD_EVERY_HEAD = """
import json, sys, torch, transformers
directory, expected_file = sys.argv[1], sys.argv[2]
expected = json.load(open(expected_file))
ids = torch.tensor(expected["input_ids"])
report = {}
for auto_name, field in expected["heads"].items():
    model = getattr(transformers, auto_name).from_pretrained(directory, trust_remote_code=True).eval()
    batch = ids.unsqueeze(0) if auto_name == "AutoModelForMultipleChoice" else ids
    with torch.no_grad():
        out = getattr(model(input_ids=batch), field)
    report[auto_name] = {"class": type(model).__name__, "module": type(model).__module__,
                         "values": out.flatten()[:50].tolist()}
print("REPORT" + json.dumps(report))
"""


def load_in_fresh_process(directory: Path, expected: dict, tmp_path: Path) -> dict:
    expected_file = tmp_path / "expected.json"
    expected_file.write_text(json.dumps(expected))
    code = LOAD_EVERY_HEAD.replace("sys.argv[1], sys.argv[2]", f"{str(directory)!r}, {str(expected_file)!r}")
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("REPORT", 1)[1])


def test_save_pretrained_writes_safetensors_code_and_full_auto_map(tmp_path):
    model = albert_hf.AlbertHFForPreTraining(tiny_config())
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"config.json", "model.safetensors"} | REMOTE_FILES <= files
    assert not any(name.endswith(".bin") for name in files)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == AUTO_MAP
    assert set(AUTO_MAP) == {"AutoConfig", *HEADS}
    # the shipped files import only torch, transformers and each other
    for name in REMOTE_FILES:
        imports = [line for line in (tmp_path / name).read_text().splitlines() if line.startswith(("import ", "from "))]
        assert all(line.split()[1].split(".")[0] in {"torch", "transformers", "", "collections", "dataclasses"}
                   for line in imports), imports


def test_fresh_process_without_albert_hf_loads_every_head(tmp_path):
    config = tiny_config(num_labels=3, num_hidden_groups=2)
    saved = tmp_path / "checkpoint"
    albert_hf.AlbertHFForPreTraining(config).save_pretrained(saved)
    ids = torch.randint(5, 1000, (2, 12))
    # heads not in the checkpoint are freshly initialised, so compare the backbone-only outputs exactly, and the
    # others by shape; every class must come from the shipped code, not from an installed albert_hf
    report = load_in_fresh_process(saved, {"input_ids": ids.tolist(), "heads": HEADS}, tmp_path)
    assert set(report) == set(HEADS)
    for auto_name, loaded in report.items():
        assert loaded["class"] == AUTO_MAP[auto_name].split(".")[1]
        assert loaded["module"].startswith("transformers_modules."), loaded["module"]
    reference = AutoModel.from_pretrained(saved).eval()
    with torch.no_grad():
        expected = reference(input_ids=ids).last_hidden_state.flatten()[:50]
    torch.testing.assert_close(torch.tensor(report["AutoModel"]["values"]), expected, rtol=0, atol=1e-5)
    pretraining = AutoModelForPreTraining.from_pretrained(saved).eval()
    with torch.no_grad():
        expected = pretraining(input_ids=ids).prediction_logits.flatten()[:50]
    torch.testing.assert_close(torch.tensor(report["AutoModelForPreTraining"]["values"]), expected, rtol=0, atol=1e-5)


def test_in_process_auto_classes_use_the_installed_package(tmp_path):
    albert_hf.AlbertHFForSequenceClassification(tiny_config(num_labels=2)).save_pretrained(tmp_path)
    model = AutoModel.from_pretrained(tmp_path)
    assert type(model) is albert_hf.AlbertHFModel


def test_push_to_hub_uploads_a_loadable_repo(tmp_path):
    """push_to_hub with the Hub API mocked: what would be uploaded is written to a local folder and loaded back."""
    fake_hub = tmp_path / "fake_hub"
    commits = []

    def create_repo(self, repo_id, **kwargs):
        (fake_hub / repo_id).mkdir(parents=True, exist_ok=True)
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, commit_message=None, **kwargs):
        commits.append({"repo_id": repo_id, "message": commit_message, "files": sorted(o.path_in_repo for o in operations)})
        for operation in operations:
            target = fake_hub / repo_id / operation.path_in_repo
            target.parent.mkdir(parents=True, exist_ok=True)
            source = operation.path_or_fileobj
            if isinstance(source, (str, Path)):
                shutil.copyfile(source, target)
            else:
                target.write_bytes(source if isinstance(source, bytes) else source.read())
        return mock.MagicMock(commit_url="fake", oid="0" * 40)

    model = albert_hf.AlbertHFForPreTraining(tiny_config())
    with mock.patch.object(HfApi, "create_repo", create_repo), mock.patch.object(
        HfApi, "create_commit", create_commit
    ), mock.patch("huggingface_hub.ModelCard.load", side_effect=EntryNotFoundError("no card")):
        model.push_to_hub("someone/tiny-albert", token="fake-token")

    assert len(commits) == 1 and commits[0]["repo_id"] == "someone/tiny-albert"
    assert {"config.json", "model.safetensors", "README.md"} | REMOTE_FILES <= set(commits[0]["files"])
    repo = fake_hub / "someone" / "tiny-albert"
    assert json.loads((repo / "config.json").read_text())["auto_map"] == AUTO_MAP
    ids = torch.randint(5, 1000, (1, 10))
    report = load_in_fresh_process(repo, {"input_ids": ids.tolist(), "heads": {"AutoModelForPreTraining": "sop_logits"}}, tmp_path)
    with torch.no_grad():
        expected = model.eval()(input_ids=ids).sop_logits.flatten()
    torch.testing.assert_close(torch.tensor(report["AutoModelForPreTraining"]["values"]), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("sharing", ["attention", "ffn"])
def test_partial_sharing_checkpoints_round_trip(tmp_path, sharing):
    model = albert_hf.AlbertHFForPreTraining(tiny_config(sharing=sharing)).eval()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForPreTraining.from_pretrained(tmp_path).eval()
    ids = torch.randint(5, 1000, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).prediction_logits, model(input_ids=ids).prediction_logits)


def test_answerability_head_checkpoint_loads_back_as_that_head(tmp_path):
    model = albert_hf.AlbertHFForQuestionAnsweringWithAnswerability(tiny_config(start_n_top=2, end_n_top=2)).eval()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForQuestionAnswering"].endswith("AlbertHFForQuestionAnsweringWithAnswerability")
    ids = torch.randint(5, 1000, (2, 12))
    in_process = AutoModelForQuestionAnswering.from_pretrained(tmp_path).eval()
    assert type(in_process) is albert_hf.AlbertHFForQuestionAnsweringWithAnswerability
    with torch.no_grad():
        expected = model(input_ids=ids).cls_logits
        torch.testing.assert_close(in_process(input_ids=ids).cls_logits, expected)
    report = load_in_fresh_process(
        tmp_path, {"input_ids": ids.tolist(), "heads": {"AutoModelForQuestionAnswering": "cls_logits"}}, tmp_path
    )
    assert report["AutoModelForQuestionAnswering"]["class"] == "AlbertHFForQuestionAnsweringWithAnswerability"
    torch.testing.assert_close(torch.tensor(report["AutoModelForQuestionAnswering"]["values"]), expected.flatten(),
                               rtol=0, atol=1e-5)
    # the plain head's checkpoints are unaffected
    albert_hf.AlbertHFForQuestionAnswering(tiny_config()).save_pretrained(tmp_path / "plain")
    plain = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "plain")
    assert type(plain) is albert_hf.AlbertHFForQuestionAnswering


def test_a_model_or_tokenizer_that_cannot_be_loaded_stops_with_the_argument_named(tmp_path):
    """Offline (as the tests run) a Hub name cannot be fetched, and an empty folder holds nothing: each stops with
    one line naming the flag and the value, not transformers' traceback."""
    from argparse import Namespace

    from huggingface_hub import constants

    from albert_hf.finetuning import ModelArguments, load_tokenizer_and_model
    from albert_hf.hub import loading
    from albert_hf.pretraining import build_model, load_tokenizer

    with pytest.raises(SystemExit, match=r"^error: --tokenizer_name someone/no-such-albert: cannot load it \(no local "
                                         r"folder by that name, so it was looked up on the Hub\)") as stopped:
        load_tokenizer(Namespace(tokenizer_name="someone/no-such-albert", trust_remote_code=False), None)
    assert ("HF_HUB_OFFLINE" in str(stopped.value)) == constants.HF_HUB_OFFLINE
    empty = tmp_path / "empty"
    empty.mkdir()
    # transformers alone would read the empty folder as a default config (hidden size 4096), silently
    with pytest.raises(SystemExit, match=r"--config_name .*empty: cannot load it \(a local folder, but .*holds no "
                                         r"config\.json"):
        build_model(Namespace(model_name_or_path=None, config_name=str(empty)), None)
    given = ModelArguments(model_name_or_path="m", tokenizer_name="t")
    assert (given.source("tokenizer"), given.source("config")) == (("--tokenizer_name", "t"),
                                                                   ("--model_name_or_path", "m"))
    with pytest.raises(SystemExit, match=r"--model_name_or_path albert/albert-base-v2: cannot load it"):
        load_tokenizer_and_model(ModelArguments(model_name_or_path="albert/albert-base-v2"),
                                 albert_hf.AlbertHFForSequenceClassification)
    with pytest.raises(ValueError, match="not an OSError"), loading("--x", "y"):
        raise ValueError("not an OSError")  # anything else passes through untouched
