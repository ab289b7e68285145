"""run_checkpoint_evals.py: each checkpoint of a tiny run fine-tuned on a tiny GLUE folder and on CSV files of one's
own over 2 seeds; the rows, the table, the card and the plot's data; nothing computed again on a rerun; SQuAD v1.1,
v2.0 and RACE through their scripts; --watch on a folder the run starts later; the Hub's step-N branches; one line
for a damaged checkpoint."""

import csv
import json
import logging
import shutil
import statistics
import threading
import time

import pytest

from helpers import REPO, run_bounded, subprocess_env
from pretraining_runs import pretrain

RUN_ARGS = ["--max_train_steps", "6", "--checkpointing_steps", "2", "--eval_steps", "0", "--no_plots"]
FINE_TUNING = [
    "--max_steps",
    "1",
    "--max_seq_length",
    "32",
    "--per_device_train_batch_size",
    "4",
    "--dataloader_pin_memory",
    "false",
]


def preloaded(command, env):
    """Each fine-tuning as the tests run scripts: forked from an interpreter that has the stack imported."""
    return run_bounded(
        command, 300, env={**subprocess_env(), **{k: v for k, v in env.items() if k == "CUDA_VISIBLE_DEVICES"}}
    )


def evaluate(argv):
    from albert_hf.checkpoint_evals import job

    return job.main([str(a) for a in argv], scripts=REPO, run_process=preloaded)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("evals") / "run"
    pretrain(out, *RUN_ARGS)  # step_2, step_4, step_6 and the final folder (step 6)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from albert_hf.testing.glue_folders import PAIRS, write_glue_folders

    root = tmp_path_factory.mktemp("data")
    write_glue_folders(root / "glue")
    for split in ("train", "dev"):
        with open(root / f"{split}.csv", "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["sentence", "label"])
            writer.writerows((a, ("yes", "no")[i % 2]) for i, (a, _) in enumerate(PAIRS * 2))
    (root / "squad").mkdir()
    for version, names in (
        ("1.1", ("train-v1.1.json", "dev-v1.1.json")),
        ("v2.0", ("train-v2.0.json", "dev-v2.0.json")),
    ):
        for name in names:
            (root / "squad" / name).write_text(json.dumps(squad_file(version)))
    for split in ("train", "dev"):
        for number, level in enumerate(("high", "middle")):
            (root / "RACE" / split / level).mkdir(parents=True)
            (root / "RACE" / split / level / f"{number}.txt").write_text(json.dumps(race_article(number)))
    return root


CONTEXT = "The quick brown fox jumps over the lazy dog near the river bank in Paris."


def squad_file(version: str) -> dict:
    """Official SQuAD JSON of 4 questions about one paragraph (v2.0: one of them unanswerable)."""
    questions = [
        ("Who jumps over the dog?", "quick brown fox", 4),
        ("Where is the river bank?", "Paris", 67),
        ("What does the fox jump over?", "the lazy dog", 26),
        ("What colour is the cat?", None, None),
    ]
    qas = [
        {
            "id": f"q{i}",
            "question": question,
            "is_impossible": text is None,
            "answers": [] if text is None else [{"text": text, "answer_start": start}],
        }
        for i, (question, text, start) in enumerate(questions[: 4 if version == "v2.0" else 3])
    ]
    return {"version": version, "data": [{"title": "Fixture", "paragraphs": [{"context": CONTEXT, "qas": qas}]}]}


def race_article(number: int) -> dict:
    """An article of the official RACE layout with two questions."""
    return {
        "id": f"{number}.txt",
        "article": CONTEXT,
        "questions": ["Who jumps?", "Where is the bank?"],
        "options": [["the fox", "the dog", "a cat", "a bird"], ["Rome", "Paris", "Oslo", "Bern"]],
        "answers": ["A", "B"],
    }


def rows_of(folder):
    return [json.loads(line) for line in (folder / "downstream" / "results.jsonl").read_text().splitlines()]


@pytest.mark.trains
def test_every_checkpoint_task_and_seed_becomes_rows_a_table_a_plot_and_the_cards_section(run, data, tmp_path, caplog):
    from albert_hf.checkpoint_evals import report

    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    argv = [
        folder,
        "--tasks",
        "mrpc",
        "--data_dir",
        data / "glue",
        "--train_file",
        data / "train.csv",
        "--validation_file",
        data / "dev.csv",
        "--seeds",
        1,
        2,
        *FINE_TUNING,
    ]
    evaluate(argv)
    rows = rows_of(folder)
    assert {(row["step"], row["task"], row["seed"]) for row in rows} == {
        (step, task, seed) for step in (2, 4, 6) for task in ("mrpc", "own_data") for seed in (1, 2)
    }
    assert {row["metric"] for row in rows if row["task"] == "mrpc"} >= {"accuracy", "f1"}
    tokens = {row["step"]: row["tokens"] for row in rows}
    state = json.loads((folder / "step_2" / "training_state.json").read_text())
    assert tokens[2] == state["run_tokens"] + state["window_tokens"] > 0  # what the checkpoint had seen
    assert tokens[6] == json.loads((folder / "all_results.json").read_text())["total_tokens"] > tokens[4] > tokens[2]
    table = (folder / "downstream" / "by_step.md").read_text()
    assert table.startswith("| step | tokens | mrpc (accuracy) | own_data (accuracy) |")
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| 2", "| 4", "| 6"]
    card = (folder / "README.md").read_text()
    assert "## Downstream by step" in card and table.strip() in card
    # the plot's data: each task's median, minimum and maximum over the seeds, against the tokens seen
    drawn = report.plot(
        report.read_rows(folder / "downstream"), {"mrpc": "accuracy", "own_data": "accuracy"}, tmp_path / "plot.png"
    )
    for task in ("mrpc", "own_data"):
        values = {
            step: [
                row["value"] for row in rows if (row["task"], row["step"], row["metric"]) == (task, step, "accuracy")
            ]
            for step in (2, 4, 6)
        }
        assert drawn[task] == {
            "x": [tokens[2], tokens[4], tokens[6]],
            "median": [statistics.median(values[step]) for step in (2, 4, 6)],
            "min": [min(values[step]) for step in (2, 4, 6)],
            "max": [max(values[step]) for step in (2, 4, 6)],
        }
    assert (folder / "downstream" / "by_step.png").stat().st_size > 1000
    # the same command again: every row is there, nothing is fine-tuned
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="albert_hf.checkpoint_evals"):
        evaluate(argv)
    assert "fine-tuning" not in caplog.text and rows_of(folder) == rows
    assert card == (folder / "README.md").read_text()


@pytest.mark.trains
def test_squad_and_race_fine_tune_through_their_scripts_each_with_the_flags_it_takes(run, data, tmp_path, caplog):
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    for step in (2, 4):  # the final folder (step 6) alone
        shutil.rmtree(folder / f"step_{step}")
    with caplog.at_level(logging.INFO, logger="albert_hf"):
        evaluate(
            [
                folder,
                "--tasks",
                "squad",
                "squad_v2",
                "race",
                "--squad_dir",
                data / "squad",
                "--race_dir",
                data / "RACE",
                "--seeds",
                1,
                "--doc_stride",
                8,
                "--max_query_length",
                8,
                "--max_qa_length",
                8,
                *FINE_TUNING,
            ]
        )
    metrics = {
        task: {row["metric"] for row in rows_of(folder) if row["task"] == task}
        for task in ("squad", "squad_v2", "race")
    }
    assert {"exact_match", "f1"} <= metrics["squad"] and "HasAns_f1" not in metrics["squad"]
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1"} <= metrics["squad_v2"] and "HasAns_total" not in metrics["squad_v2"]
    assert {"accuracy", "accuracy_high", "accuracy_middle"} <= metrics["race"] and "num_high" not in metrics["race"]
    assert "features" not in metrics["squad"]
    assert {row["step"] for row in rows_of(folder)} == {6}
    table = (folder / "downstream" / "by_step.md").read_text()
    assert table.startswith("| step | tokens | squad (f1) | squad_v2 (f1) | race (accuracy) |")
    assert "run_race.py: not given --doc_stride, --max_query_length (it has no such flag)" in caplog.text
    assert "run_squad.py: not given --max_qa_length (it has no such flag)" in caplog.text
    # each ran on the files asked for: the SQuAD predictions name the fixture's question ids
    predictions = json.loads(
        (folder / "downstream" / "runs" / "step_6" / "squad_v2" / "seed_1" / "predictions.json").read_text()
    )
    assert sorted(predictions) == ["q0", "q1", "q2", "q3"]


@pytest.mark.trains
def test_a_damaged_checkpoint_gets_one_line_and_the_others_are_evaluated(run, data, tmp_path, caplog):
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    weights = folder / "step_4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with caplog.at_level(logging.INFO, logger="albert_hf.checkpoint_evals"):
        evaluate(
            [
                folder,
                "--tasks",
                "mrpc",
                "--data_dir",
                data / "glue",
                "--seeds",
                1,
                "--baseline",
                "random_init",
                "--with_tracking",
                *FINE_TUNING,
            ]
        )
    accuracy = {row["step"]: row["value"] for row in rows_of(folder) if row["metric"] == "accuracy"}
    assert sorted(accuracy) == [0, 2, 6]
    # --with_tracking: a TensorBoard scalar at each pretraining step, in the run's own tracker folder
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points = []
    for path in (folder / "runs").rglob("events.out.tfevents*"):
        events = EventAccumulator(str(path))
        events.Reload()
        points += [(event.step, event.value) for event in events.Scalars("downstream/mrpc")]
    assert [step for step, _ in sorted(points)] == [0, 2, 6]
    assert [value for _, value in sorted(points)] == pytest.approx([accuracy[step] for step in (0, 2, 6)])
    damaged = [record.getMessage() for record in caplog.records if "damaged" in record.getMessage()]
    assert damaged == [
        f"{folder / 'step_4'}: damaged (model.safetensors: changed since it was written (its "
        "sha256 differs from the record)): not evaluated"
    ]


@pytest.mark.trains
def test_watch_waits_for_a_run_started_after_it_and_ends_after_its_final_folder(data, tmp_path, caplog):
    folder = tmp_path / "later"
    done = {}

    def watch():
        try:
            evaluate(
                [
                    folder,
                    "--watch",
                    "--watch_interval",
                    "0.5",
                    "--tasks",
                    "mrpc",
                    "--data_dir",
                    data / "glue",
                    "--seeds",
                    1,
                    *FINE_TUNING,
                ]
            )
            done["ok"] = True
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            done["error"] = error

    with caplog.at_level(logging.INFO, logger="albert_hf.checkpoint_evals"):
        watcher = threading.Thread(target=watch)
        watcher.start()
        time.sleep(2)  # the watcher waits on a folder that holds only its own
        assert watcher.is_alive() and not (folder / "step_3").exists()
        pretrain(folder, "--max_train_steps", "6", "--checkpointing_steps", "3", "--eval_steps", "0", "--no_plots")
        watcher.join(timeout=300)
    assert done == {"ok": True}, done
    assert sorted(row["step"] for row in rows_of(folder) if row["metric"] == "accuracy") == [3, 6]


@pytest.mark.trains
def test_the_hubs_step_branches_are_evaluated(data, tmp_path, fresh_accelerate_state):
    from albert_hf.pretraining.job import main as pretrain_in_process
    from fake_hub import FakeHub
    from pretraining_runs import FAST

    hub = FakeHub(tmp_path / "hub")
    with hub.patched():
        pretrain_in_process(
            [
                "--output_dir",
                str(tmp_path / "run"),
                *FAST,
                "--max_train_steps",
                "4",
                "--checkpointing_steps",
                "2",
                "--eval_steps",
                "0",
                "--no_plots",
                "--push_to_hub",
                "--hub_model_id",
                "someone/tiny",
                "--hub_strategy",
                "all_checkpoints",
            ]
        )
        out = tmp_path / "evals"
        evaluate(
            [
                "hub:someone/tiny",
                "--output_dir",
                out,
                "--tasks",
                "mrpc",
                "--data_dir",
                data / "glue",
                "--seeds",
                1,
                *FINE_TUNING,
            ]
        )
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(row["step"] for row in rows if row["metric"] == "accuracy") == [2, 4]
    # each branch's tokens: what its checkpoint had seen (the branch's all_results.json, pushed with it)
    for step in (2, 4):
        state = json.loads((tmp_path / "run" / f"step_{step}" / "training_state.json").read_text())
        assert {row["tokens"] for row in rows if row["step"] == step} == {state["run_tokens"] + state["window_tokens"]}
    assert 0 < rows[0]["tokens"] < rows[-1]["tokens"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tasks", "mnli2"], "--tasks mnli2: not a task here"),
        (
            ["--tasks", "squad", "--squad_dir", "."],
            r"--squad_dir \.: no train-v1.1.json nor dev-v1.1.json \(task squad\)",
        ),
        (["--tasks", "race", "--race_dir", "nowhere"], "--race_dir nowhere: no such folder"),
        (["--tasks", "mrpc", "--doc_stride", "8"], "--doc_stride: not a flag of run_glue.py$"),
        (["--tasks", "mrpc", "squad", "--max_steps", "x"], r"--max_steps: invalid int value: 'x' \(run_glue.py\)"),
        (["--tasks", "squad", "--version_2_with_negative"], "--version_2_with_negative: run_checkpoint_evals.py sets"),
        (["--tasks", "mrpc", "--train_file", "t.csv"], "--train_file and --validation_file go together"),
        ([], "nothing to evaluate"),
        (["--tasks", "mrpc", "--seeds", "1", "1"], "--seeds: a seed is given twice"),
        (["--tasks", "mrpc", "--seed", "3"], "--seed: run_checkpoint_evals.py sets it for each fine-tuning"),
    ],
)
def test_what_cannot_be_done_is_refused_in_one_line(tmp_path, argv, message):
    from albert_hf.checkpoint_evals.job import parse_args
    from albert_hf.errors import InputError

    with pytest.raises(InputError, match=f"^{message}"):
        parse_args([str(tmp_path), *argv])


@pytest.mark.parametrize(
    "device, flag, visible", [(None, None, None), ("cpu", "--use_cpu", None), ("cuda:1", None, "1")]
)
def test_device_keeps_the_fine_tuning_off_the_training_gpu(tmp_path, device, flag, visible):
    from albert_hf.checkpoint_evals.job import finetune_command, parse_args

    args = parse_args(
        [str(tmp_path), "--tasks", "rte", *(["--device", device] if device else []), "--learning_rate", "1e-5"]
    )
    command, env = finetune_command(args, REPO, tmp_path / "step_2", "rte", 3, tmp_path / "out")
    assert command[2:4] == ["--model_name_or_path", str(tmp_path / "step_2")] and command[-2:] != ["--seed", "3"]
    assert ["--task_name", "rte"] == command[command.index("--task_name") : command.index("--task_name") + 2]
    assert "--learning_rate" in command and (flag in command if flag else "--use_cpu" not in command)
    if visible:
        assert env["CUDA_VISIBLE_DEVICES"] == visible


@pytest.mark.trains
def test_a_second_job_on_the_same_run_is_refused_and_the_runs_own_lock_is_not_taken(data, tmp_path):
    import subprocess
    import sys

    from albert_hf.errors import InputError

    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from albert_hf.runtime import output_lock\n"
            f"output_lock.acquire({str(folder / 'downstream')!r}, '--output_dir')\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            InputError,
            match=rf"^--output_dir of the evaluations {folder / 'downstream'} is in use "
            r"by .*: wait for it to end",
        ):
            evaluate([folder, "--tasks", "mrpc", "--data_dir", data / "glue", *FINE_TUNING])
    finally:
        holder.kill()
        holder.wait()
    assert not (folder / "_albert_hf_run.lock").exists()  # the pretraining run's lock stays the run's to take


def test_a_checkpoint_rotated_away_before_its_turn_is_skipped_with_a_line(tmp_path):
    from albert_hf.checkpoint_evals.job import Evaluations, parse_args
    from albert_hf.checkpoint_evals.sources import Source

    jobs = Evaluations(parse_args([str(tmp_path), "--tasks", "mrpc"]), REPO)
    gone = Source(4, 100.0, tmp_path / "step_4")
    assert jobs.unusable(gone) == f"{tmp_path / 'step_4'}: removed before its turn (--checkpoints_total_limit): skipped"
    assert jobs.evaluate(gone) == 0 and (tmp_path / "downstream" / "results.jsonl").exists() is False
