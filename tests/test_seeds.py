"""--seeds / --num_seeds in the fine-tuning scripts (albert_hf/tasks/seeds.py): one folder per seed, the summary over
the seeds that learned, the best seed's model on top, a seed that never learned caught and replaced, a bad seed
list refused before any work, and an interrupted run resumed with the seeds still missing. run_squad, run_race and
run_ner's --seeds runs are in their own test files."""

import json
import logging
import os
import signal
import statistics

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from albert_hf.errors import InputError, NothingProduced
from albert_hf.runtime.preemption import PREEMPTED
from albert_hf.tasks import trainer
from albert_hf.tasks.paper_hparams import recipe_arguments
from albert_hf.tasks.seeds import Baseline, majority_class, statistics_of
from data_fixtures import reviews, write_csv
from helpers import check_best_checkpoint, check_seed_summary, finetuning_args, run_script


def test_statistics_by_hand():
    s = statistics_of({1: 0.5, 2: 0.9, 3: 0.7, 4: 0.6})
    assert (s["n"], s["median"], s["median_seeds"]) == (4, pytest.approx(0.65), [4, 3])
    assert s["mean"] == pytest.approx(0.675)
    # sample standard deviation of (0.5, 0.9, 0.7, 0.6): sqrt(0.0875 / 3); its standard error: that / 2
    assert s["standard_error"] == pytest.approx((0.0875 / 3) ** 0.5 / 2)
    assert (s["min"], s["min_seed"], s["max"], s["max_seed"]) == (0.5, 1, 0.9, 2)
    # Equal values: the first seed run is named, as the best seed is chosen (max() keeps the first).
    ties = statistics_of({5: 0.8, 2: 0.6, 9: 0.8, 1: 0.6})
    assert (ties["max_seed"], ties["min_seed"], ties["median_seeds"]) == (5, 2, [1, 5])
    one = statistics_of({7: 0.25})
    assert (one["median"], one["median_seeds"], one["standard_error"]) == (0.25, [7], None)


def test_baselines_by_hand():
    # 7 of 10 dev labels are class 1: always answering it is right 7 times in 10
    baseline = majority_class([1, 0, 1, 1, 0, 1, 1, 0, 1, 1], ("no", "yes"))
    assert (baseline.metric, baseline.value, baseline.name) == ("accuracy", 0.7, "the majority class (yes)")
    assert not baseline.learned({"eval_accuracy": 0.7}) and baseline.learned({"eval_accuracy": 0.71})
    with pytest.raises(ValueError, match="eval_accuracy"):
        baseline.learned({"eval_f1": 0.9})
    from datasets import Dataset

    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.definition import baseline as glue_baseline
    from albert_hf.tasks.squad.definition import baseline as squad_baseline

    assert glue_baseline(TASKS["cola"], None) == Baseline("matthews_correlation", 0.0, "a constant prediction")
    assert glue_baseline(TASKS["stsb"], None).value == 0.1
    # SQuAD v2.0: 1 of 4 questions has no answer, so answering "no answer" everywhere scores F1 25
    questions = Dataset.from_dict(
        {"answers": [{"text": ["a"], "answer_start": [0]}] * 3 + [{"text": [], "answer_start": []}]}
    )
    assert squad_baseline(questions, True).value == 25.0 and squad_baseline(questions, False).value == 0.0


def test_paper_recipes_score_checkpoints_on_dev_when_the_run_has_a_dev_set_and_no_schedule_of_its_own():
    recipe = {"learning_rate": 1e-5, "best_checkpoint_every": 200}
    assert recipe_arguments(recipe, set(), 1, None, with_dev_set=False) == {"learning_rate": 1e-5}
    assert recipe_arguments(recipe, set(), 1, None, with_dev_set=True) == {
        "learning_rate": 1e-5,
        "eval_strategy": "steps",
        "eval_steps": 200,
        "save_strategy": "steps",
        "save_steps": 200,
        "load_best_model_at_end": True,
        "save_total_limit": 2,
    }
    # A schedule flag of the user's makes the schedule theirs, as given: none of the recipe's is added.
    for flag in ("save_strategy", "eval_steps", "load_best_model_at_end"):
        assert recipe_arguments(recipe, {flag}, 1, None, with_dev_set=True) == {"learning_rate": 1e-5}


def run_glue(argv):
    return run_script("run_glue", argv)


def dev_rows():
    """40 reviews, and 16 whose word is in neither list, labelled alternately: seeds that learned the lists score
    above the majority class and differ on these."""
    neutral = [
        {"sentence": f"The {thing} was {word} and I said so.", "label": ["positive", "negative"][i % 2]}
        for i, (thing, word) in enumerate(
            (t, w) for t in ("film", "book", "meal", "trip") for w in ("fine", "okay", "long", "new")
        )
    ]
    return reviews(40, 1) + neutral


def data(tmp_path):
    return (write_csv(tmp_path / "train.csv", reviews(200, 0)), write_csv(tmp_path / "dev.csv", dev_rows()))


def seed_args(checkpoint, out, train, dev, *extra):
    args = finetuning_args(
        checkpoint,
        out,
        "--train_file",
        train,
        "--validation_file",
        dev,
        "--do_train",
        "--do_eval",
        "--num_train_epochs",
        12,
        *extra,
        learning_rate=2e-3,
    )
    args.remove("--overwrite_output_dir")
    return args


# Scored on dev every 40 steps, the best checkpoint loaded at the end, without --metric_for_best_model.
BEST_CHECKPOINT = [
    "--eval_strategy",
    "steps",
    "--eval_steps",
    40,
    "--save_strategy",
    "steps",
    "--save_steps",
    40,
    "--load_best_model_at_end",
]


BAD_SEEDS = [
    (["--seeds", 1, 2, 1], "--seeds: 1 given twice"),
    (["--seeds", 1, "--num_seeds", 2], "--seeds and --num_seeds both choose the seeds"),
    (["--num_seeds", 0], "--num_seeds 0: pass 1 or more"),
    (["--retry_failed_seeds", 1], "--retry_failed_seeds replaces seeds of a --seeds / --num_seeds run"),
    (["--seeds", 1, 2, "--retry_failed_seeds", -1], "--retry_failed_seeds -1: pass 0 or more"),
    (["--seeds", 1, 2, "--resume_from_checkpoint", "x"], "--resume_from_checkpoint names one run's checkpoint"),
]


@pytest.mark.parametrize("extra,message", BAD_SEEDS)
def test_a_bad_seed_list_is_refused_in_one_line_before_any_work(tmp_path, extra, message):
    out = tmp_path / "out"
    with pytest.raises(InputError, match=message):
        run_glue(seed_args("no-such-model", out, "train.csv", "dev.csv", *extra))
    assert not out.exists()


def test_seed_lists_argparse_and_files_refuse_with_the_flag_named(tmp_path, capsys):
    out = tmp_path / "out"
    for extra, message in [
        (["--seeds", 1, "two"], "argument --seeds: invalid int value: 'two'"),
        (["--seeds"], "argument --seeds: expected at least one argument"),
    ]:
        with pytest.raises(SystemExit) as stop:
            run_glue(seed_args("no-such-model", out, "train.csv", "dev.csv", *extra))
        assert stop.value.code == 2 and message in capsys.readouterr().err
    for seeds, message in [([], "--seeds: no seed given"), ([1, 2.5], "seeds: [1, 2.5] is not of type")]:
        path = tmp_path / "args.json"
        path.write_text(
            json.dumps(
                {
                    "model_name_or_path": "m",
                    "output_dir": str(out),
                    "train_file": "t.csv",
                    "validation_file": "d.csv",
                    "do_train": True,
                    "do_eval": True,
                    "seeds": seeds,
                }
            )
        )
        with pytest.raises((InputError, SystemExit)) as stop:
            run_glue([path])
        said = str(stop.value) if stop.type is InputError else capsys.readouterr().err
        assert message in said
    # Seeds are compared on the dev set: a run that does not train and evaluate is refused.
    with pytest.raises(InputError, match="pass --do_train and --do_eval"):
        run_glue(
            ["--model_name_or_path", "m", "--output_dir", out, "--train_file", "t.csv", "--do_train", "--seeds", 1, 2]
        )
    assert not out.exists()


@pytest.mark.trains
@pytest.mark.rounding
def test_three_seeds_give_a_summary_the_best_model_on_top_and_a_collapsed_seed_is_replaced(
    tiny_checkpoint, tmp_path, monkeypatch, caplog
):
    """Seed 2 is made to collapse (a test hook: after training its head answers the dev set's majority class
    whatever the input, as ALBERT's failed runs do): it is marked `did not learn`, seed 4 replaces it, and the
    statistics are over 1, 3 and 4."""
    train, dev = data(tmp_path)
    dev_labels = [row["label"] for row in dev_rows()]
    majority = statistics.mode(dev_labels)
    train_one = transformers.Trainer.train

    def collapse_seed_2(self, *args, **kwargs):
        result = train_one(self, *args, **kwargs)
        if self.args.seed == 2:
            with torch.no_grad():
                self.model.classifier.weight.zero_()
                self.model.classifier.bias.copy_(torch.tensor([0.0, 0.0]))
                self.model.classifier.bias[self.model.config.label2id[majority]] = 5.0
        return result

    monkeypatch.setattr(transformers.Trainer, "train", collapse_seed_2)
    caplog.set_level(logging.INFO, logger="albert_hf")
    out = tmp_path / "out"
    summary = run_glue(
        seed_args(tiny_checkpoint, out, train, dev, "--seeds", 1, 2, 3, "--retry_failed_seeds", 1, *BEST_CHECKPOINT)
    )
    sentences = [row["sentence"] for row in dev_rows()]
    check_seed_summary(out, [1, 2, 3, 4], "eval_accuracy", AutoModelForSequenceClassification)
    assert summary["did_not_learn"] == [2] and summary["learned"] == 3
    assert summary["baseline"] == {
        "metric": "accuracy",
        "value": dev_labels.count(majority) / len(dev_labels),
        "name": f"the majority class ({majority})",
    }
    assert [run["learned"] for run in summary["runs"]] == [True, False, True, True]
    share = dev_labels.count(majority) / len(dev_labels)
    assert f"Seed 2 did not learn: dev accuracy {share:.4g} is at or below {share:.4g}" in caplog.text
    assert "replaced by seed 4 (retry 1 of 1)" in caplog.text
    assert "3 of 4 seeds learned; did not learn: seed 2" in caplog.text
    for seed in (1, 2, 3, 4):
        assert (out / f"seed_{seed}" / "config.json").is_file() and (out / f"seed_{seed}" / "README.md").is_file()
    # The model on top scores, on the dev file, the accuracy its seed's results file says.
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForSequenceClassification.from_pretrained(out, trust_remote_code=True).eval()
    with torch.no_grad():
        logits = model(**tokenizer(sentences, truncation=True, max_length=32, padding=True, return_tensors="pt")).logits
    predicted = [model.config.id2label[i] for i in logits.argmax(-1).tolist()]
    accuracy = float(np.mean([p == gold for p, gold in zip(predicted, dev_labels)]))
    assert accuracy == pytest.approx(json.loads((out / "eval_results.json").read_text())["eval_accuracy"])
    assert accuracy > dev_labels.count(majority) / len(dev_labels)
    # Within each seed, --load_best_model_at_end kept the checkpoint best on dev accuracy, not on the loss.
    check_best_checkpoint(out / "seed_1", "eval_accuracy")
    card = (out / "README.md").read_text()
    assert f"This is seed {summary['best_seed']}, the best by dev `eval_accuracy` among 3 seeds" in card
    assert "| eval_accuracy |" in card


def test_an_interrupted_run_resumes_with_the_seeds_still_missing(
    tiny_checkpoint, tmp_path, monkeypatch, caplog, capsys
):
    """SIGTERM during seed 2's training: seed 1 is done, seed 2 leaves a checkpoint and the run exits PREEMPTED.
    The same command then keeps seed 1 as it is, resumes seed 2 and runs seed 3."""
    train, dev = data(tmp_path)
    out = tmp_path / "out"
    argv = seed_args(tiny_checkpoint, out, train, dev, "--seeds", 1, 2, 3, "--num_train_epochs", 2)
    step_end = trainer.StopOnSignalCallback.on_step_end

    def sigterm_in_seed_2(self, args, state, control, **kwargs):
        if args.seed == 2 and state.global_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return step_end(self, args, state, control, **kwargs)

    monkeypatch.setattr(trainer.StopOnSignalCallback, "on_step_end", sigterm_in_seed_2)
    with pytest.raises(SystemExit) as stop:
        run_glue(argv)
    assert stop.value.code == PREEMPTED
    said = capsys.readouterr().err
    assert "To continue, run the same command" in said and "--resume_from_checkpoint" not in said
    assert json.loads((out / "all_seeds_results.json").read_text())["seeds"] == [1]
    assert (out / "seed_2" / "checkpoint-3").is_dir() and not (out / "seed_3").exists()
    seed_1_model = (out / "seed_1" / "model.safetensors").stat().st_mtime_ns

    monkeypatch.setattr(trainer.StopOnSignalCallback, "on_step_end", step_end)
    caplog.set_level(logging.INFO)
    try:
        summary = run_glue(argv)
    except NothingProduced:  # whether these tiny seeds learn is not this test's subject
        summary = json.loads((out / "all_seeds_results.json").read_text())
    assert summary["seeds"] == [1, 2, 3]
    assert "Seed 1: done in an earlier run" in caplog.text
    assert f"Resuming from {out / 'seed_2' / 'checkpoint-3'}" in caplog.text
    assert (out / "seed_1" / "model.safetensors").stat().st_mtime_ns == seed_1_model
    state = json.loads((out / "seed_2" / "trainer_state.json").read_text())
    assert state["global_step"] == 26  # 200 rows in batches of 16 (13), 2 epochs: resumed, not started over


def fake_seed_run(scores: dict, baseline: Baseline):
    """A script's main for run_seeds without training: the seed's folder gets a model file and eval_results.json
    with the score `scores` gives that seed."""

    def main(argv, seed_run):
        seed, folder = seed_run.seed, seed_run.output_dir
        os.makedirs(folder, exist_ok=True)
        metrics = {"eval_accuracy": scores[seed], "eval_runtime": 1.0}
        with open(os.path.join(folder, "eval_results.json"), "w") as file:
            json.dump(metrics, file)
        with open(os.path.join(folder, "model.safetensors"), "w") as file:
            file.write(f"weights of seed {seed}")
        return {"validation": metrics, "baseline": baseline}

    return main


class Arguments:
    """What run_seeds reads of a script's parsed arguments."""

    def __init__(self, output_dir, seeds, retries=0, world_size=1):
        self.output_dir, self.seed_list, self.retry_failed_seeds = str(output_dir), seeds, retries
        self.world_size, self.should_log = world_size, True
        self.take_over_lock = self.overwrite_output_dir = self.push_to_hub = False
        self.metric_for_best_model_given = self.greater_is_better_given = False


def test_retries_take_the_next_unused_seeds_and_no_model_goes_on_top_when_none_learned(tmp_path, caplog):
    from albert_hf.tasks.seeds import run_seeds

    coin = Baseline("accuracy", 0.5, "the majority class (yes)")
    out = tmp_path / "out"
    # Seeds 3 and 9 fail; two retries take 10 and 11 (after every seed used), 10 fails too and stays failed.
    summary = run_seeds(
        fake_seed_run({3: 0.5, 9: 0.4, 5: 0.8, 10: 0.5, 11: 0.7}, coin), [], Arguments(out, [3, 9, 5], retries=2)
    )
    assert summary["seeds"] == [3, 9, 5, 10, 11] and summary["did_not_learn"] == [3, 9, 10]
    assert summary["best_seed"] == 5 and summary["metrics"]["eval_accuracy"]["median"] == pytest.approx(0.75)
    assert "eval_runtime" not in summary["metrics"]
    assert (out / "model.safetensors").read_text() == "weights of seed 5"
    assert "replaced by seed 10 (retry 1 of 2)" in caplog.text and "replaced by seed 11 (retry 2 of 2)" in caplog.text
    # None learned: the summary says so, and nothing is put on top.
    out = tmp_path / "none"
    with pytest.raises(NothingProduced, match=f"^No seed learned: {out / 'all_seeds_results.json'} holds the runs"):
        run_seeds(fake_seed_run({1: 0.5, 2: 0.3}, coin), [], Arguments(out, [1, 2]))
    summary = json.loads((out / "all_seeds_results.json").read_text())
    assert summary["best_seed"] is None and summary["learned"] == 0 and summary["metrics"] == {}
    assert summary["did_not_learn"] == [1, 2] and not (out / "model.safetensors").exists()
    # Several processes are refused in one line.
    with pytest.raises(InputError, match="run the seeds one after another in one process"):
        run_seeds(fake_seed_run({}, coin), [], Arguments(tmp_path / "launched", [1, 2], world_size=2))
    # A folder holding another run's model is not taken over.
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "model.safetensors").write_text("someone else's")
    with pytest.raises(InputError, match="already holds a trained model"):
        run_seeds(fake_seed_run({1: 0.9}, coin), [], Arguments(tmp_path / "taken", [1]))


def test_push_to_hub_uploads_the_best_seed_once_without_the_seed_folders(tmp_path):
    """With --push_to_hub the top folder is pushed once, at the end, without the seed folders (the seeds' own runs
    push nothing: AlbertTrainingArguments turns it off in them, see test_a_seed_run_parses_its_own_seed_...)."""
    from unittest import mock

    from huggingface_hub import HfApi, RepoUrl

    from albert_hf.tasks.seeds import run_seeds

    uploads = []

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, repo_id, folder_path, ignore_patterns=(), **kwargs):
        uploads.append((repo_id, folder_path, list(ignore_patterns), sorted(os.listdir(folder_path))))
        return mock.MagicMock(commit_url="https://huggingface.co/fake/commit")

    arguments = Arguments(tmp_path / "out", [1, 2])
    arguments.push_to_hub, arguments.hub_model_id, arguments.hub_token, arguments.hub_private_repo = (
        True,
        "someone/reviews",
        "x",
        None,
    )
    with mock.patch.object(HfApi, "create_repo", create_repo), mock.patch.object(HfApi, "upload_folder", upload_folder):
        run_seeds(fake_seed_run({1: 0.7, 2: 0.9}, Baseline("accuracy", 0.5, "the majority class (yes)")), [], arguments)
    assert len(uploads) == 1
    repo, folder, ignored, files = uploads[0]
    assert (repo, folder) == ("someone/reviews", str(tmp_path / "out")) and {"seed_*", "seed_*/**"} <= set(ignored)
    assert "model.safetensors" in files and (tmp_path / "out" / "model.safetensors").read_text() == "weights of seed 2"


def test_a_seed_run_parses_its_own_seed_and_folder_and_pushes_nothing(tmp_path):
    """Given its SeedRun, every parse of the script's arguments (--paper_hparams parses them twice) gives the seed's
    --seed and --output_dir, no seed list and no push: whatever --hub_strategy asks, Trainer pushes nothing while the
    seeds train (it pushes only with push_to_hub), and the best seed's folder goes up once at the end."""
    from albert_hf.tasks.arguments import SeedRun
    from albert_hf.tasks.finetuning import parse_arguments
    from albert_hf.tasks.glue.data import GlueDataArguments
    from albert_hf.tasks.paper_hparams import apply_paper_hparams

    argv = [
        "--model_name_or_path",
        "m",
        "--task_name",
        "mrpc",
        "--output_dir",
        str(tmp_path),
        "--seeds",
        "1",
        "7",
        "--retry_failed_seeds",
        "1",
        "--do_train",
        "--do_eval",
        "--push_to_hub",
        "--hub_model_id",
        "someone/x",
        "--report_to",
        "none",
        "--hub_strategy",
        "checkpoint",
        "--load_best_model_at_end",
        "--eval_strategy",
        "steps",
        "--save_steps",
        "500",
    ]
    seed_run = SeedRun(7, str(tmp_path / "seed_7"))
    model_args, data_args, args = parse_arguments(GlueDataArguments, argv, seed_run)
    recipe_args = apply_paper_hparams(*data_args.task_data.paper_recipe(), model_args, data_args, args, argv, seed_run)[
        2
    ]
    for parsed in (args, recipe_args):
        assert (parsed.seed, parsed.output_dir, parsed.seed_list, parsed.retry_failed_seeds, parsed.push_to_hub) == (
            7,
            str(tmp_path / "seed_7"),
            None,
            0,
            False,
        )
        # Trainer's own choice (the loss) is not taken for the user's: the task's main metric still replaces it
        assert not parsed.metric_for_best_model_given and not parsed.greater_is_better_given


def test_a_run_that_produced_nothing_ends_with_its_line_and_status_1(capsys):
    """What the scripts' entry point makes of NothingProduced (no seed learned): a pipeline sees a failure."""
    from albert_hf.runtime.cli import run_entry_point

    def main():
        raise NothingProduced("No seed learned: out/all_seeds_results.json holds the runs")

    with pytest.raises(SystemExit) as ended:
        run_entry_point(main)
    assert ended.value.code == 1
    assert capsys.readouterr().err == "error: No seed learned: out/all_seeds_results.json holds the runs\n"
