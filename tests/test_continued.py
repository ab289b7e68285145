"""Continued pretraining (--model_name_or_path): the start line's account of what was loaded from each kind of
folder (transformers' AlbertForMaskedLM and AlbertForPreTraining, albert_hf's, a TF checkpoint converted), the
step-0 evaluation of the loaded model (equal to a separate evaluation of it), the change since step 0 at the end,
forgetting named, and an exact resume."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
import transformers
from safetensors.torch import load_file

from albert_hf.convert import from_tf_checkpoint
from albert_hf.errors import InputError
from albert_hf.pretraining.training.evaluation import since_start
from data_fixtures import embedded
from helpers import REPO, in_hub_cache
from pretraining_runs import metrics, pretrain_runs

TF_FIXTURE = REPO / "tests" / "fixtures" / "tf_albert" / "all_shared"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_checkpoint):
    """The four kinds of folder a run continues from, and a corpus."""
    root = tmp_path_factory.mktemp("continued_sources")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "albert_hf.convert",
            str(tiny_checkpoint),
            str(root / "pretraining"),
            "--to",
            "transformers",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    transformers.AlbertForMaskedLM.from_pretrained(root / "pretraining").save_pretrained(root / "masked_lm")
    transformers.AutoTokenizer.from_pretrained(root / "pretraining").save_pretrained(root / "masked_lm")
    from_tf_checkpoint(TF_FIXTURE, root / "from_tf")
    from albert_hf import AlbertHFForPreTraining

    nsp = AlbertHFForPreTraining.from_pretrained(tiny_checkpoint)  # a folder whose 2-way head learned NSP
    nsp.config.pretraining_task = "nsp"
    nsp.save_pretrained(root / "nsp")
    transformers.AutoTokenizer.from_pretrained(tiny_checkpoint).save_pretrained(root / "nsp")
    for name, rows in (("corpus", range(300)), ("general", range(300, 500))):
        with open(root / f"{name}.jsonl", "w") as f:
            for row in embedded().select(rows):
                f.write(json.dumps({"text": row["text"]}) + "\n")
    return {
        "albert_hf": tiny_checkpoint,
        "pretraining": root / "pretraining",
        "masked_lm": root / "masked_lm",
        "from_tf": root / "from_tf",
        "nsp": root / "nsp",
        "corpus": root / "corpus.jsonl",
        "general": root / "general.jsonl",
        "root": root,
    }


@pytest.fixture(scope="module")
def continued_runs(folders):
    """One run a kind of folder (one step), and a continued run with evaluations and checkpoints, then resumed."""
    root = folders["root"]
    one_step = [
        "--train_files",
        str(folders["corpus"]),
        "--max_train_steps",
        "1",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
    ]
    continued = [
        "--model_name_or_path",
        str(folders["albert_hf"]),
        "--train_files",
        str(folders["corpus"]),
        "--max_train_steps",
        "6",
        "--eval_steps",
        "3",
        "--checkpointing_steps",
        "3",
        "--num_warmup_steps",
        "2",
    ]
    runs = [
        (
            root / f"run_{kind}",
            ["--model_name_or_path", str(folders[kind]), *one_step]
            + (["--max_seq_length", "16"] if kind == "from_tf" else []),
            {},
            True,
        )
        for kind in ("masked_lm", "pretraining", "albert_hf", "from_tf", "nsp")
    ]
    # the albert_hf folder as a Hub repo (the tests' offline cache), evaluated at step 0 as the local folder is
    hub = [
        "--model_name_or_path",
        in_hub_cache("stand-in/tiny-albert", folders["albert_hf"]),
        *continued[2:4],
        "--max_train_steps",
        "2",
        "--eval_steps",
        "3",
        "--num_warmup_steps",
        "2",
    ]
    # no replay: the general corpus held out only (weight 0), evaluated beside the domain and never trained on
    no_replay = [
        "--model_name_or_path",
        str(folders["albert_hf"]),
        "--sources",
        f"name=domain,weight=1,train_files={folders['corpus']}",
        f"name=general,weight=0,train_files={folders['general']}",
        "--max_train_steps",
        "4",
        "--eval_steps",
        "4",
    ]
    runs += [(root / "no_replay", no_replay, {}, False)]
    runs += [
        (root / "from_hub", hub, {}, True),
        (root / "continued", continued, {}, False),
        (root / "resumed", [*continued, "--resume_from_checkpoint", str(root / "continued" / "step_3")], {}, False),
    ]
    results, done = pretrain_runs(runs)
    assert [r["status"] for r in results] == [0] * len(runs), results
    return {
        "stderr": done.stderr,
        "stdout": done.stdout,
        "continued": root / "continued",
        "resumed": root / "resumed",
        "from_hub": root / "from_hub",
        "no_replay": root / "no_replay",
    }


def accounts(stderr: str, folder) -> list[str]:
    return re.findall(rf"continued from {re.escape(str(folder))} .*?\(--num_warmup_steps\)", stderr)


def account(stderr: str, folder) -> str:
    found = accounts(stderr, folder)
    assert found, stderr[-3000:]
    return found[0]


@pytest.mark.trains
def test_the_start_line_says_what_each_kind_of_folder_gave_and_what_starts_fresh(folders, continued_runs):
    stderr = continued_runs["stderr"]
    assert account(stderr, folders["masked_lm"]) == (
        f"continued from {folders['masked_lm']} (saved as AlbertForMaskedLM): encoder, MLM head loaded; pooler and "
        "SOP head initialised fresh: not in this folder: transformers' AlbertForMaskedLM folders carry none; the "
        "original TF checkpoints do (python -m albert_hf.convert --from_tf); the optimizer starts fresh and the "
        "learning rate warms up again over 0 steps (--num_warmup_steps)"
    )
    for kind, saved_as in (
        ("pretraining", "AlbertForPreTraining"),
        ("albert_hf", "AlbertHFForPreTraining"),
        ("from_tf", "AlbertHFForPreTraining"),
    ):
        assert account(stderr, folders[kind]) == (
            f"continued from {folders[kind]} (saved as {saved_as}): encoder, pooler, MLM head, SOP head loaded; the "
            "optimizer starts fresh and the learning rate warms up again over 0 steps (--num_warmup_steps)"
        ), kind
    assert any("warms up again over 2 steps" in line for line in accounts(stderr, folders["albert_hf"]))
    assert account(stderr, folders["nsp"]) == (
        f"continued from {folders['nsp']} (saved as AlbertHFForPreTraining): encoder, pooler, MLM head, SOP head "
        "loaded; its 2-way head was trained for NSP and is trained for SOP from here (--task); the optimizer starts "
        "fresh and the learning rate warms up again over 0 steps (--num_warmup_steps)"
    )
    # what this run's own folder records for a run that continues it
    assert json.loads((continued_runs["continued"] / "config.json").read_text())["pretraining_task"] == "sop"


@pytest.mark.trains
def test_step_0_is_the_loaded_models_own_evaluation_and_the_end_says_the_change(
    folders, continued_runs, tmp_path, fresh_accelerate_state
):
    from albert_hf.pretraining import job
    from albert_hf.pretraining.training.evaluation import evaluate
    from pretraining_runs import FAST

    rows = metrics(continued_runs["continued"])
    start = next(row for row in rows if row["step"] == 0)
    # the same model and held-out pairs, evaluated here apart from any run
    args = job.parse_args(
        [
            "--output_dir",
            str(tmp_path / "apart"),
            *FAST,
            "--model_name_or_path",
            str(folders["albert_hf"]),
            "--train_files",
            str(folders["corpus"]),
        ]
    )
    run = job.prepare(args)
    apart = evaluate(run.model, run.eval_dataloader, run.accelerator, "sop")
    assert {key: start[key] for key in apart} == pytest.approx(apart, rel=1e-12)
    results = json.loads((continued_runs["continued"] / "all_results.json").read_text())
    assert results["eval_mlm_accuracy_step_0"] == start["eval_mlm_accuracy"]
    end = [row for row in rows if "eval_mlm_loss" in row][-1]
    line = (
        f"    overall: mlm_accuracy {start['eval_mlm_accuracy']:.4f} → {end['eval_mlm_accuracy']:.4f} "
        f"({end['eval_mlm_accuracy'] - start['eval_mlm_accuracy']:+.4f})"
    )
    assert "  since step 0 (the loaded model):" in continued_runs["stdout"] and line in continued_runs["stdout"]


@pytest.mark.trains
def test_a_hub_repo_is_continued_and_measured_at_step_0_as_its_folder_is(continued_runs):
    assert account(continued_runs["stderr"], "stand-in/tiny-albert") == (
        "continued from stand-in/tiny-albert (saved as AlbertHFForPreTraining): encoder, pooler, MLM head, SOP head "
        "loaded; the optimizer starts fresh and the learning rate warms up again over 2 steps (--num_warmup_steps)"
    )
    from_hub, from_folder = (
        next(row for row in metrics(continued_runs[name]) if row["step"] == 0) for name in ("from_hub", "continued")
    )
    measured = [key for key in from_folder if key.startswith("eval_")]
    assert "eval_mlm_accuracy" in measured and "eval_sop_accuracy" in measured
    assert {key: from_hub[key] for key in measured} == {key: from_folder[key] for key in measured}


@pytest.mark.trains
def test_a_source_of_weight_0_is_evaluated_from_step_0_and_never_trained_on(continued_runs):
    """A run on a domain alone measures what it does to general text: the general source held out only."""
    rows = metrics(continued_runs["no_replay"])
    start, end = (row for row in rows if "eval_mlm_loss" in row)
    assert [start["step"], end["step"]] == [0, 4]
    for row in (start, end):
        assert "eval_general_mlm_accuracy" in row and "eval_general_sop_accuracy" in row
        assert row["eval_mlm_accuracy"] == row["eval_domain_mlm_accuracy"]  # the overall figures: the trained mix
    trained = [row for row in rows if "train_mlm_loss" in row]
    assert trained and all("pairs_general" not in row and row["pairs_domain"] > 0 for row in trained)
    results = json.loads((continued_runs["no_replay"] / "all_results.json").read_text())
    assert "source_general_pairs" not in results and results["eval_general_mlm_accuracy_step_0"] == pytest.approx(
        start["eval_general_mlm_accuracy"]
    )
    stdout, stderr = continued_runs["stdout"], continued_runs["stderr"]
    assert "Mixing 1 source (and 1 held out only), weights as given: domain: weight 1, " in stderr
    assert "; general: weight 0, held out only (evaluated, never trained on)" in stderr
    general = (
        f"    general: mlm_accuracy {start['eval_general_mlm_accuracy']:.4f} → {end['eval_general_mlm_accuracy']:.4f} "
    )
    assert general in stdout
    fell = end["eval_general_mlm_accuracy"] < start["eval_general_mlm_accuracy"]
    assert ("forgetting: the held-out MLM accuracy of general fell since step 0" in stdout) == fell


@pytest.mark.trains
def test_a_continued_run_resumes_to_the_uninterrupted_weights(continued_runs):
    expected, got = (load_file(continued_runs[name] / "model.safetensors") for name in ("continued", "resumed"))
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # the step-0 evaluation is the run's start's: a resumed run does not measure it again
    assert [row["step"] for row in metrics(continued_runs["resumed"]) if "eval_mlm_loss" in row] == [6]
    assert [row["step"] for row in metrics(continued_runs["continued"]) if "eval_mlm_loss" in row] == [0, 3, 6]


@pytest.mark.quick
def test_forgetting_names_each_source_whose_held_out_accuracy_fell():
    start = {
        "eval_mlm_accuracy": 0.40,
        "eval_books_mlm_accuracy": 0.50,
        "eval_domain_mlm_accuracy": 0.30,
        "eval_mlm_loss": 3.0,
        "eval_books_mlm_loss": 2.5,
        "eval_domain_mlm_loss": 3.5,
    }
    end = {
        "eval_mlm_accuracy": 0.42,
        "eval_books_mlm_accuracy": 0.45,
        "eval_domain_mlm_accuracy": 0.39,
        "eval_mlm_loss": 2.9,
        "eval_books_mlm_loss": 2.7,
        "eval_domain_mlm_loss": 3.1,
    }
    lines, forgot = since_start(start, end, ("books", "domain"))
    assert forgot == ["books"]
    assert lines[1] == "books: mlm_accuracy 0.5000 → 0.4500 (-0.0500), mlm_loss 2.5000 → 2.7000 (+0.2000)"
    assert since_start(start, {**end, "eval_books_mlm_accuracy": 0.5}, ("books", "domain"))[1] == []


@pytest.mark.trains
def test_checkpoint_evals_start_from_the_source_model_and_fine_tune_the_continued_folder(
    folders, continued_runs, glue_root, tmp_path
):
    """run_checkpoint_evals.py --source_model: the model the run continued as step 0, then each checkpoint and the
    continued final folder, fine-tuned by run_glue.py as any other."""
    from albert_hf.checkpoint_evals import job
    from helpers import REPO, run_bounded, subprocess_env

    run = tmp_path / "continued"
    shutil.copytree(continued_runs["continued"], run)
    job.main(
        [
            str(run),
            "--tasks",
            "rte",
            "--data_dir",
            str(glue_root),
            "--seeds",
            "1",
            "--source_model",
            str(folders["albert_hf"]),
            "--max_steps",
            "2",
            "--max_seq_length",
            "32",
            "--per_device_train_batch_size",
            "4",
            "--dataloader_pin_memory",
            "false",
        ],
        scripts=REPO,
        run_process=lambda command, env: run_bounded(command, 300, env=subprocess_env()),
    )
    rows = [json.loads(line) for line in (run / "downstream" / "results.jsonl").read_text().splitlines()]
    accuracy = {row["step"]: row["value"] for row in rows if row["metric"] == "accuracy"}
    assert sorted(accuracy) == [0, 3, 6] and all(0 <= value <= 1 for value in accuracy.values())
    assert next(row["tokens"] for row in rows if row["step"] == 0) == 0
    with pytest.raises(InputError, match=r"^--source_model and --baseline random_init are both step 0: pass one"):
        job.parse_args([str(run), "--tasks", "rte", "--source_model", "x", "--baseline", "random_init"])


@pytest.mark.quick
def test_a_pair_head_of_another_shape_is_refused_in_one_line(tiny_checkpoint, tmp_path):
    from safetensors.torch import save_file

    from albert_hf import AlbertHFConfig
    from albert_hf.pretraining.training.model import build_model
    from data_fixtures import tokenizer

    folder = tmp_path / "three_way"
    shutil.copytree(tiny_checkpoint, folder)
    weights = load_file(folder / "model.safetensors")
    hidden = weights["sop_classifier.classifier.weight"].shape[1]
    weights.update(
        {"sop_classifier.classifier.weight": torch.zeros(3, hidden), "sop_classifier.classifier.bias": torch.zeros(3)}
    )
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError) as raised:
        build_model(AlbertHFConfig.from_pretrained(folder), str(folder), tokenizer(), "sop")
    assert str(raised.value) == (
        f"--model_name_or_path {folder}: its pair head has another shape (sop_classifier.classifier.bias: (3,) in the "
        "folder) than the SOP or NSP head pretraining trains ((2,)); continue from an ALBERT pretraining or masked-LM "
        "folder"
    )
