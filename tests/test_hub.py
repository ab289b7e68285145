"""Saved checkpoints carry their code: a process without albert_hf loads every head with trust_remote_code."""

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
from huggingface_hub import HfApi, RepoUrl
from huggingface_hub.errors import EntryNotFoundError
from transformers import AutoModel, AutoModelForPreTraining, AutoModelForQuestionAnswering

import albert_hf
from albert_hf.errors import InputError
from albert_hf.modeling_albert_hf import AUTO_MAP
from helpers import run_python, run_script, shared_data, tiny_config

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
        assert all(
            line.split()[1].split(".")[0] in {"torch", "transformers", "", "collections", "dataclasses"}
            for line in imports
        ), imports


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
        commits.append(
            {"repo_id": repo_id, "message": commit_message, "files": sorted(o.path_in_repo for o in operations)}
        )
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
    with (
        mock.patch.object(HfApi, "create_repo", create_repo),
        mock.patch.object(HfApi, "create_commit", create_commit),
        mock.patch("huggingface_hub.ModelCard.load", side_effect=EntryNotFoundError("no card")),
    ):
        model.push_to_hub("someone/tiny-albert", token="fake-token")

    assert len(commits) == 1 and commits[0]["repo_id"] == "someone/tiny-albert"
    assert {"config.json", "model.safetensors", "README.md"} | REMOTE_FILES <= set(commits[0]["files"])
    repo = fake_hub / "someone" / "tiny-albert"
    assert json.loads((repo / "config.json").read_text())["auto_map"] == AUTO_MAP
    ids = torch.randint(5, 1000, (1, 10))
    heads = {"AutoModelForPreTraining": "sop_logits"}
    report = load_in_fresh_process(repo, {"input_ids": ids.tolist(), "heads": heads}, tmp_path)
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
    torch.testing.assert_close(
        torch.tensor(report["AutoModelForQuestionAnswering"]["values"]), expected.flatten(), rtol=0, atol=1e-5
    )
    # the plain head's checkpoints are unaffected
    albert_hf.AlbertHFForQuestionAnswering(tiny_config()).save_pretrained(tmp_path / "plain")
    plain = AutoModelForQuestionAnswering.from_pretrained(tmp_path / "plain")
    assert type(plain) is albert_hf.AlbertHFForQuestionAnswering


def test_a_model_or_tokenizer_that_cannot_be_loaded_stops_with_the_argument_named(tmp_path):
    """Offline (as the tests run) a Hub name cannot be fetched, and an empty folder holds nothing: each stops with
    one line naming the flag and the value, not transformers' traceback."""
    from huggingface_hub import constants

    from albert_hf.hub.loading import loading
    from albert_hf.pretraining.arguments import DataArgs, ModelArgs
    from albert_hf.pretraining.data.inputs import load_tokenizer
    from albert_hf.pretraining.training.model import resolve_config
    from albert_hf.tasks.arguments import ModelArguments
    from albert_hf.tasks.inputs import load_tokenizer_and_model

    with pytest.raises(
        InputError,
        match=r"^--tokenizer_name someone/no-such-albert: cannot load it \(no local "
        r"folder by that name, so it was looked up on the Hub\)",
    ) as stopped:
        load_tokenizer(DataArgs(tokenizer_name="someone/no-such-albert"), None, None)
    assert ("HF_HUB_OFFLINE" in str(stopped.value)) == constants.HF_HUB_OFFLINE
    empty = tmp_path / "empty"
    empty.mkdir()
    # transformers alone would read the empty folder as a default config (hidden size 4096), silently
    with pytest.raises(
        InputError,
        match=r"--config_name .*empty: cannot load it \(a local folder, but .*holds no "
        r"config\.json",
    ):
        resolve_config(ModelArgs(config_name=str(empty)))
    given = ModelArguments(model_name_or_path="m", tokenizer_name="t")
    assert (given.source("tokenizer"), given.source("config")) == (
        ("--tokenizer_name", "t"),
        ("--model_name_or_path", "m"),
    )
    with pytest.raises(InputError, match=r"--model_name_or_path albert/albert-base-v2: cannot load it"):
        load_tokenizer_and_model(
            ModelArguments(model_name_or_path="albert/albert-base-v2"), albert_hf.AlbertHFForSequenceClassification
        )
    with pytest.raises(ValueError, match="not an OSError"), loading("--x", "y"):
        raise ValueError("not an OSError")  # anything else passes through untouched


# ---------------------------------------------------------------------------------------------------------------
# Model cards: written with huggingface_hub's ModelCard, read back with ModelCard.load, offline


def load_card(folder: Path):
    from huggingface_hub import ModelCard

    return ModelCard.load(folder / "README.md")  # a local file: read directly, no Hub lookup


def card_metrics(card) -> dict:
    """{(task type, dataset type, config, split, metric name): value} of the card's model-index."""
    return {
        (r.task_type, r.dataset_type, r.dataset_config, r.dataset_split, r.metric_name): r.metric_value
        for r in card.data.eval_results or []
    }


def check_usage(card, auto_class: str, remote_code: bool = True):
    """The card shows how to load the tokenizer and the model (with trust_remote_code for albert_hf code). An
    albert_hf folder's tokenizer is shown as AlbertTokenizer: AutoTokenizer would ask about the config's code."""
    assert ("AlbertTokenizer" if remote_code else "AutoTokenizer") + ".from_pretrained(" in card.text
    trust = ", trust_remote_code=True" if remote_code else ""
    assert f'{auto_class}.from_pretrained("<this repo or folder>"{trust})' in card.text


@pytest.fixture
def hub_unreachable(monkeypatch):
    """Online as far as huggingface_hub and transformers can tell, but any HTTP request fails the test."""
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    def refuse(self, request, *args, **kwargs):
        raise AssertionError(f"a card was written with a request to {request.url}")

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(type(_http.default_client_factory()), "send", refuse)
    monkeypatch.setattr(type(_http.default_async_client_factory()), "send", refuse)


@pytest.fixture
def fresh_pretraining_state():
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


@pytest.mark.trains
def test_pretraining_card_metadata_and_model_index_come_from_all_results(tmp_path, fresh_pretraining_state):
    """The card of a real (tiny) run: pipeline tag, tags, no dataset (the embedded corpus is none), and every
    eval metric of all_results.json in the model-index, losses included."""
    from albert_hf.pretraining.job import main

    out = tmp_path / "run"
    main(
        [
            "--output_dir",
            str(out),
            "--vocab_size",
            "500",
            "--max_seq_length",
            "64",
            "--per_device_train_batch_size",
            "8",
            "--dupe_factor",
            "1",
            "--max_eval_samples",
            "64",
            "--seed",
            "7",
            "--max_train_steps",
            "2",
            "--eval_steps",
            "0",
        ]
    )
    results = json.loads((out / "all_results.json").read_text())
    card = load_card(out)
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "fill-mask"
    assert {"albert", "albert_hf", "pretraining", "sop"} <= set(card.data.tags)
    assert card.data.datasets is None and card.data.license is None and card.data.base_model is None
    held_out = "embedded corpus (5% of the documents held out for evaluation)"
    assert {r.dataset_name for r in card.data.eval_results} == {held_out}
    assert card_metrics(card) == {
        ("fill-mask", "local", None, "held-out", "MLM accuracy"): results["eval_mlm_accuracy"],
        ("fill-mask", "local", None, "held-out", "MLM loss"): results["eval_mlm_loss"],
        ("text-classification", "local", None, "held-out", "SOP accuracy"): results["eval_sop_accuracy"],
        ("text-classification", "local", None, "held-out", "SOP loss"): results["eval_sop_loss"],
    }
    assert card.data.eval_results[0].task_name == "Masked language modelling"
    check_usage(card, "AutoModelForPreTraining")
    for section in ("## Configuration", "## Data", "## Training", "## Results", "embedded corpus"):
        assert section in card.text


def test_pretraining_card_lists_a_hub_dataset_license_and_base_model_without_going_online(tmp_path, hub_unreachable):
    from albert_hf.pretraining.arguments import DataArgs
    from albert_hf.pretraining.output.final_folder import save_final_model
    from albert_hf.pretraining.output.pretraining_card import CardFacts, corpus_card_dataset
    from data_fixtures import tokenizer

    data = DataArgs(dataset_name="Salesforce/wikitext", dataset_config_name="wikitext-2-raw-v1")
    facts = CardFacts(
        dataset=corpus_card_dataset(data),
        task="nsp",
        max_ngram=3,
        max_train_steps=1500,
        max_seq_length=128,
        micro_batch="32 a process x 1 accumulation",
        optimizer="lamb",
        learning_rate=0.01,
        num_warmup_steps=0,
        mixed_precision="auto",
        seed=12345,
        architecture="tiny",
        base_model="albert/albert-base-v2",
        hub_model_id=None,
        license="apache-2.0",
        output_dir=str(tmp_path),
    )
    metrics = {"eval_mlm_accuracy": 0.25, "eval_mlm_loss": 4.5, "eval_nsp_accuracy": 0.75, "eval_nsp_loss": 0.5}
    tok = tokenizer()
    save_final_model(
        albert_hf.AlbertHFForPreTraining(tiny_config(vocab_size=len(tok))), tok, tmp_path, facts, metrics, 32, 1
    )
    assert json.loads((tmp_path / "all_results.json").read_text()) == metrics
    card = load_card(tmp_path)
    assert card.data.datasets == ["Salesforce/wikitext"] and card.data.license == "apache-2.0"
    assert card.data.base_model == "albert/albert-base-v2"
    assert card_metrics(card) == {
        ("fill-mask", "Salesforce/wikitext", "wikitext-2-raw-v1", "train", "MLM accuracy"): 0.25,
        ("fill-mask", "Salesforce/wikitext", "wikitext-2-raw-v1", "train", "MLM loss"): 4.5,
        ("text-classification", "Salesforce/wikitext", "wikitext-2-raw-v1", "train", "NSP accuracy"): 0.75,
        ("text-classification", "Salesforce/wikitext", "wikitext-2-raw-v1", "train", "NSP loss"): 0.5,
    }
    assert {r.task_name for r in card.data.eval_results} == {"Masked language modelling", "Next-sentence prediction"}
    assert "next-sentence prediction" in card.text and "sentence-order" not in card.text


@pytest.mark.trains
def test_glue_card_pushed_is_ours_with_the_mnli_results_of_both_dev_sets(tiny_checkpoint, tmp_path):
    """run_glue.py on the original-layout MNLI files with --push_to_hub (Hub API mocked): the uploaded README.md is
    our card, not the one Trainer.push_to_hub would write, and its model-index holds all_results.json's numbers
    for the matched and the mismatched dev set."""
    from huggingface_hub import RepoUrl

    from albert_hf.testing.glue_folders import write_glue_folders
    from helpers import glue_args

    uploads = []

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, repo_id, folder_path, **kwargs):
        uploads.append((repo_id, (Path(folder_path) / "README.md").read_text()))
        return mock.MagicMock(commit_url="https://huggingface.co/fake/commit")

    root = write_glue_folders(tmp_path / "glue")
    out = tmp_path / "out"
    with mock.patch.object(HfApi, "create_repo", create_repo), mock.patch.object(HfApi, "upload_folder", upload_folder):
        run_script(
            "run_glue",
            glue_args(
                tiny_checkpoint,
                out,
                "--task_name",
                "mnli",
                "--data_dir",
                root,
                "--do_train",
                "--do_eval",
                "--max_steps",
                2,
                "--push_to_hub",
                "--hub_model_id",
                "someone/albert-mnli",
                "--hub_token",
                "x",
            ),
        )
    assert uploads and uploads[-1] == ("someone/albert-mnli", (out / "README.md").read_text())
    results = json.loads((out / "all_results.json").read_text())
    card = load_card(out)
    assert card.data.pipeline_tag == "text-classification" and card.data.library_name == "transformers"
    assert card.data.datasets == ["nyu-mll/glue"] and card.data.language == "en"
    assert {"albert", "albert_hf", "text-classification", "glue", "mnli"} <= set(card.data.tags)
    assert card.data.base_model is None and "a local checkpoint, the folder `tiny_albert" in card.text
    assert card_metrics(card) == {
        ("text-classification", "nyu-mll/glue", "mnli", "validation_matched", "accuracy"): results["eval_accuracy"],
        ("text-classification", "nyu-mll/glue", "mnli", "validation_mismatched", "accuracy"): results[
            "eval_accuracy_mm"
        ],
    }
    assert card.data.eval_results[0].dataset_name == "GLUE MNLI"
    assert card.data.model_name == "albert-mnli"
    assert (
        'AutoModelForSequenceClassification.from_pretrained("someone/albert-mnli", trust_remote_code=True)' in card.text
        and 'AlbertTokenizer.from_pretrained("someone/albert-mnli")' in card.text
    )
    for section in ("## Configuration", "## Data", "## Training", "## Results", "original GLUE TSV files"):
        assert section in card.text


@pytest.mark.trains
def test_squad_card_names_its_data_and_holds_the_exact_match_and_f1(tiny_checkpoint, tmp_path):
    """Trainer's card said "fine-tuned ... on the None dataset" with `results: []`. A 3-question file in the
    official JSON format is not SQuAD itself: the card describes the file and lists no dataset."""
    from data_fixtures import SQUAD_V1, write_json
    from helpers import squad_args

    path = write_json(tmp_path / "train-v1.1.json", SQUAD_V1)
    out = tmp_path / "out"
    run_script(
        "run_squad",
        [
            "--train_file",
            path,
            "--validation_file",
            path,
            "--do_train",
            "--do_eval",
            *squad_args(tiny_checkpoint, out, steps=4),
        ],
    )
    results = json.loads((out / "all_results.json").read_text())
    card = load_card(out)
    assert "None dataset" not in card.text and "`train-v1.1.json`" in card.text
    assert card.data.pipeline_tag == "question-answering" and card.data.datasets is None
    assert card_metrics(card) == {
        ("question-answering", "local", None, "validation", "exact match"): results["eval_exact_match"],
        ("question-answering", "local", None, "validation", "f1"): results["eval_f1"],
    }
    assert {r.metric_type for r in card.data.eval_results} == {"exact_match", "f1"}
    assert card.data.eval_results[0].dataset_name == "SQuAD v1.1 (local files)"
    check_usage(card, "AutoModelForQuestionAnswering")


def test_finish_writes_a_race_card_with_license_base_model_and_test_results_without_going_online(
    tmp_path, hub_unreachable
):
    """finish() on a trainer whose base is a Hub name (never loaded here): base_model, the license argument, the
    Hub dataset by its current id, and eval_/predict_ results as the validation/test splits of the subset."""
    from albert_hf.tasks.arguments import AlbertTrainingArguments
    from albert_hf.tasks.finetuning import parse_arguments
    from albert_hf.tasks.outputs import finish
    from albert_hf.tasks.race.data import RaceDataArguments
    from albert_hf.tasks.trainer import AlbertTrainer

    model_args = parse_arguments(
        RaceDataArguments,
        ["--model_name_or_path", "albert/albert-base-v2", "--license", "apache-2.0", "--output_dir", str(tmp_path)],
    )[0]
    training_args = AlbertTrainingArguments(output_dir=str(tmp_path), do_eval=True, do_predict=True, report_to="none")
    data_args = RaceDataArguments(dataset_name="race", subset="middle")
    results = {
        "eval_accuracy": 0.625,
        "eval_accuracy_middle": 0.625,
        "eval_num_middle": 8,
        "eval_loss": 1.25,
        "eval_runtime": 0.5,
        "eval_samples": 8,
        "predict_accuracy": 0.5,
        "predict_samples": 8,
        "epoch": 1.0,
    }
    (tmp_path / "all_results.json").write_text(json.dumps(results))
    trainer = AlbertTrainer(model=albert_hf.AlbertHFForMultipleChoice(tiny_config()), args=training_args)
    finish(trainer, model_args, training_args, data_args)
    card = load_card(tmp_path)
    assert card.data.pipeline_tag == "multiple-choice" and card.data.license == "apache-2.0"
    assert card.data.base_model == "albert/albert-base-v2" and card.data.datasets == ["ehovy/race"]
    assert card_metrics(card) == {
        ("multiple-choice", "ehovy/race", "middle", "validation", "accuracy"): 0.625,
        ("multiple-choice", "ehovy/race", "middle", "validation", "accuracy middle"): 0.625,
        ("multiple-choice", "ehovy/race", "middle", "test", "accuracy"): 0.5,
    }
    assert "[albert/albert-base-v2](https://huggingface.co/albert/albert-base-v2)" in card.text
    check_usage(card, "AutoModelForMultipleChoice")


def test_card_datasets_are_hub_data_or_its_official_files_only(tmp_path):
    """`datasets` lists a Hub dataset when the data came from the Hub or is that dataset's own files in their
    official format; other local files are described in the text instead."""
    from albert_hf.tasks.arguments import AlbertTrainingArguments
    from albert_hf.tasks.glue.data import GlueDataArguments
    from albert_hf.tasks.inputs import wanted_splits
    from albert_hf.tasks.race.data import RaceDataArguments
    from albert_hf.tasks.squad.evaluation import SquadDataArguments
    from data_fixtures import SQUAD_V1, write_json

    train_eval = AlbertTrainingArguments(output_dir=str(tmp_path), do_train=True, do_eval=True, report_to="none")

    def finetuning_card_dataset(data_args, training_args):
        return data_args.card_dataset(wanted_splits(training_args))

    def dataset(data_args):
        found = finetuning_card_dataset(data_args, train_eval)
        return found.hub_id, found.config

    assert dataset(GlueDataArguments(task_name="mrpc")) == ("nyu-mll/glue", "mrpc")  # the Hub, by task name
    assert dataset(GlueDataArguments(task_name="rte", dataset_name="glue")) == ("nyu-mll/glue", "rte")
    assert dataset(GlueDataArguments(task_name="cola", data_dir=str(tmp_path))) == ("nyu-mll/glue", "cola")
    local = finetuning_card_dataset(
        GlueDataArguments(task_name="mrpc", train_file="a.csv", validation_file="b.jsonl"), train_eval
    )
    assert (local.hub_id, local.config) == (None, None) and "`a.csv`" in local.description
    assert dataset(SquadDataArguments(dataset_name="squad_v2", version_2_with_negative=True)) == (
        "rajpurkar/squad_v2",
        None,
    )
    small = write_json(tmp_path / "dev-v1.1.json", SQUAD_V1)  # the official format, but 3 questions
    assert dataset(SquadDataArguments(train_file=str(small), validation_file=str(small))) == (None, None)
    assert dataset(RaceDataArguments(data_dir=str(tmp_path))) == ("ehovy/race", "all")
    assert dataset(RaceDataArguments(train_file=str(tmp_path), validation_file="rows.jsonl")) == (None, None)


def test_the_card_lists_squad_for_its_complete_official_dev_set_only(tmp_path):
    from albert_hf.tasks.arguments import AlbertTrainingArguments
    from albert_hf.tasks.inputs import wanted_splits
    from albert_hf.tasks.squad.evaluation import SquadDataArguments

    dev = shared_data("squad", "v1.1_dev", "dev-v1.1.json")  # the complete official dev set
    half = shared_data("squad", "v2.0_dev_half", "dev-v2.0.json")  # version "v2.0", but 16 of 35 articles
    eval_only = wanted_splits(AlbertTrainingArguments(output_dir=str(tmp_path), do_eval=True, report_to="none"))
    assert SquadDataArguments(validation_file=str(dev)).card_dataset(eval_only).hub_id == "rajpurkar/squad"
    assert (
        SquadDataArguments(validation_file=str(half), version_2_with_negative=True).card_dataset(eval_only).hub_id
        is None
    )


def test_convert_writes_a_card_carrying_the_source_card_and_a_license(tmp_path, hub_unreachable):
    from huggingface_hub import EvalResult, ModelCard, ModelCardData
    from transformers import AlbertConfig, AlbertForSequenceClassification

    from albert_hf.convert import main as convert_main
    from albert_hf.convert.converted_card import write_converted_card

    source = tmp_path / "theirs"
    AlbertForSequenceClassification(
        AlbertConfig(
            vocab_size=100,
            embedding_size=8,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
        )
    ).save_pretrained(source)
    (source / "tokenizer_config.json").write_text("{}")
    result = EvalResult(
        task_type="text-classification",
        dataset_type="nyu-mll/glue",
        dataset_name="GLUE MRPC",
        dataset_config="mrpc",
        dataset_split="validation",
        metric_type="accuracy",
        metric_value=0.8,
    )
    data = ModelCardData(license="mit", datasets=["nyu-mll/glue"], model_name="theirs", eval_results=[result])
    ModelCard(f"---\n{data.to_yaml()}\n---\n# theirs\n").save(source / "README.md")

    convert_main([str(source), str(tmp_path / "ours"), "--license", "apache-2.0"])
    card = load_card(tmp_path / "ours")
    assert card.data.pipeline_tag == "text-classification" and card.data.library_name == "transformers"
    assert card.data.license == "apache-2.0" and card.data.datasets == ["nyu-mll/glue"]  # --license wins
    assert card_metrics(card) == {("text-classification", "nyu-mll/glue", "mrpc", "validation", None): 0.8}
    assert card.data.base_model is None and {"albert", "albert_hf"} <= set(card.data.tags)
    check_usage(card, "AutoModelForSequenceClassification")

    convert_main([str(tmp_path / "ours"), str(tmp_path / "back")])  # back to transformers' format
    card = load_card(tmp_path / "back")
    assert card.data.license == "apache-2.0" and card_metrics(card)
    check_usage(card, "AutoModelForSequenceClassification", remote_code=False)

    # a Hub source is the base model; without tokenizer files beside the weights, its tokenizer is the one to load
    model = albert_hf.AlbertHFForPreTraining(tiny_config())
    (tmp_path / "from_hub").mkdir()
    write_converted_card(
        tmp_path / "from_hub", source="albert/albert-base-v2", target="albert_hf", model=model, tokenizer_copied=False
    )
    card = load_card(tmp_path / "from_hub")
    assert card.data.base_model == "albert/albert-base-v2" and card.data.pipeline_tag == "fill-mask"
    assert 'AlbertTokenizer.from_pretrained("albert/albert-base-v2")' in card.text
