"""run_race.py and albert_hf/tasks/race/: reading RACE in its formats, the official input formatting, accuracy.

The end-to-end fixtures (tests/data_fixtures.py) are synthetic RACE files in the official layout whose correct option
is always the same phrase, so a few training steps teach a tiny model to find it and the expected accuracies can be
worked out by hand; a few gold answers are deliberately set to another option to make the per-subset numbers differ.
"""

import json
from pathlib import Path

import pytest
from datasets import Dataset

from albert_hf.errors import InputError
from albert_hf.tasks.race import data as race_data
from albert_hf.tasks.race import definition as race_definition
from albert_hf.tasks.race import features as race_features
from albert_hf.tasks.race.data import RaceDataArguments
from data_fixtures import DEV, RIGHT, TRAIN, article, write_official_layout
from helpers import (
    SHARED_DATA,
    check_best_checkpoint,
    check_seed_summary,
    check_tokenizer_loads_without_prompt,
    run_script,
    shared_data,
)

REPO = Path(__file__).resolve().parents[1]
SHARED_RACE = SHARED_DATA / "race"

TINY_ARGS = [
    "--max_seq_length",
    "64",
    "--max_qa_length",
    "16",
    "--report_to",
    "none",
    "--seed",
    "0",
    "--per_device_eval_batch_size",
    "8",
    "--dataloader_pin_memory",
    "false",
]


def hub_rows(levels: dict) -> list[dict]:
    """The Hub's flattened `race` rows (one per question, example_id = the article id)."""
    return [
        {
            "example_id": record["id"],
            "article": record["article"],
            "question": question,
            "options": options,
            "answer": answer,
        }
        for files in levels.values()
        for record in files.values()
        for question, options, answer in zip(record["questions"], record["options"], record["answers"])
    ]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def run_race(argv):
    return run_script("run_race", argv)


# ---------------------------------------------------------------------------------------------------------------
# Official input formatting, by hand


def test_fill_option_fills_every_blank_or_appends_the_option():
    assert (
        race_features.fill_option("The girls wear skirts in that _ .", "school")
        == "The girls wear skirts in that school ."
    )
    assert race_features.fill_option("_ is to _ as day is to night", "black") == "black is to black as day is to night"
    assert race_features.fill_option("What's the best title?", "New Rules") == "What's the best title? New Rules"


def test_choice_input_keeps_the_last_qa_tokens_and_cuts_the_passage_from_its_end():
    passage, qa = list(range(10, 20)), list(range(20, 26))
    ids, types = race_features.build_choice_input(passage, qa, cls_id=2, sep_id=3, max_seq_length=12, max_qa_length=4)
    # qa keeps its last 4 (22..25); the passage gets 12 - 3 - 4 = 5 tokens (10..14)
    assert ids == [2, 10, 11, 12, 13, 14, 3, 22, 23, 24, 25, 3]
    assert types == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
    ids, types = race_features.build_choice_input(
        [10, 11], [20], cls_id=2, sep_id=3, max_seq_length=12, max_qa_length=4
    )
    assert ids == [2, 10, 11, 3, 20, 3] and types == [0, 0, 0, 0, 1, 1]


def test_encoded_inputs_follow_the_official_layout_with_the_real_tokenizer(tiny_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    record = article("high1.txt", "B")
    record["options"][0][0] = "walked very slowly to the old school with many books " * 3  # longer than max_qa
    questions = Dataset.from_list(race_data.article_rows(record, "x", "high"))
    args = RaceDataArguments(max_seq_length=40, max_qa_length=12)
    encoded = race_features.encode_questions(questions, tokenizer, args)[0]
    passage = tokenizer(record["article"], add_special_tokens=False)["input_ids"]
    for choice, option in enumerate(record["options"][0]):
        qa = tokenizer(record["questions"][0].replace("_", option), add_special_tokens=False)["input_ids"][-12:]
        kept_passage = passage[: 40 - 3 - len(qa)]
        assert encoded["input_ids"][choice] == [
            tokenizer.cls_token_id,
            *kept_passage,
            tokenizer.sep_token_id,
            *qa,
            tokenizer.sep_token_id,
        ]
        assert encoded["token_type_ids"][choice] == [0] * (len(kept_passage) + 2) + [1] * (len(qa) + 1)
    assert len(encoded["input_ids"][0]) == 40  # the long option filled the qa budget: 12 tokens
    assert encoded["label"] == 1 and encoded["example_id"] == "high1.txt-0" and encoded["subset"] == "high"


@pytest.mark.parametrize("max_seq_length", [5, 6, 9, 16])
def test_short_inputs_cap_the_qa_part_so_one_passage_token_fits(max_seq_length):
    # The default --max_qa_length (128) with a short --max_seq_length: qa keeps its last max_seq_length - 4.
    for passage_length in (1, 3, 40):
        for qa_length in (1, 2, max_seq_length - 4, max_seq_length, 200):
            passage, qa = list(range(1000, 1000 + passage_length)), list(range(5000, 5000 + qa_length))
            ids, types = race_features.build_choice_input(
                passage, qa, cls_id=2, sep_id=3, max_seq_length=max_seq_length, max_qa_length=128
            )
            assert len(ids) == len(types) <= max_seq_length
            assert len(ids) == max_seq_length or (passage_length + qa_length + 3 <= max_seq_length)
            first_sep = ids.index(3)
            kept_passage, kept_qa = ids[1:first_sep], ids[first_sep + 1 : -1]
            assert ids[0] == 2 and ids[-1] == 3 and 3 not in kept_qa  # [CLS] passage [SEP] qa [SEP]
            assert kept_passage == passage[: len(kept_passage)] and len(kept_passage) >= 1
            assert kept_qa == qa[-len(kept_qa) :]  # the qa part keeps its LAST tokens
            assert len(kept_qa) == min(qa_length, max_seq_length - 4, 128)
            assert types == [0] * (len(kept_passage) + 2) + [1] * (len(kept_qa) + 1)


def test_short_max_seq_length_is_accepted_and_an_impossible_one_names_the_flags():
    assert RaceDataArguments(max_seq_length=128).max_qa_length == 128  # the defaults compose
    assert RaceDataArguments(max_seq_length=5, max_qa_length=300).max_seq_length == 5
    for length in (4, 1):
        with pytest.raises(
            ValueError,
            match=rf"^--max_seq_length {length} is too short for RACE: .*at least 5 "
            r"tokens \(--max_qa_length is capped at max_seq_length - 4",
        ):
            RaceDataArguments(max_seq_length=length)
    with pytest.raises(ValueError, match=r"--max_qa_length 0: "):
        RaceDataArguments(max_qa_length=0)


def test_a_capped_max_qa_length_is_logged_once(tiny_checkpoint, caplog):
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    record = article("high1.txt", "A")
    record["options"][0][1] = "walked very slowly to the old school with many books " * 3  # a long qa part
    questions = Dataset.from_list(race_data.article_rows(record, "x", "high"))
    args = RaceDataArguments(max_seq_length=12, max_qa_length=64)
    with caplog.at_level("INFO", logger="albert_hf"):
        fitted = race_features.fit_lengths(args, AutoConfig.from_pretrained(tiny_checkpoint))  # once, as run_race.py
        for _ in range(3):  # train, validation, test
            encoded = race_features.encode_questions(questions, tokenizer, fitted)
    capped = [entry for entry in caplog.records if "--max_qa_length 64" in entry.getMessage()]
    assert len(capped) == 1 and capped[0].levelname == "WARNING"
    assert "--max_seq_length 12" in capped[0].getMessage() and "last 8 tokens" in capped[0].getMessage()
    assert all(len(ids) <= 12 for ids in encoded[0]["input_ids"]) and len(encoded[0]["input_ids"][1]) == 12


def test_accuracy_overall_and_per_level_by_hand():
    metrics = race_definition.accuracy_by_subset(
        [0, 1, 2, 3, 0], [0, 1, 0, 3, 1], ["high", "high", "middle", "middle", ""]
    )
    assert metrics == {"accuracy": 0.6, "accuracy_high": 1.0, "num_high": 2, "accuracy_middle": 0.5, "num_middle": 2}
    assert race_definition.accuracy_by_subset([1, 2], [1, 1], ["", ""]) == {"accuracy": 0.5}


# ---------------------------------------------------------------------------------------------------------------
# Reading the formats


def test_official_layout_folder_and_hub_rows_give_the_same_questions(tmp_path):
    root = write_official_layout(tmp_path / "RACE")
    official = race_data.load_race_split(RaceDataArguments(data_dir=str(tmp_path)), "validation")  # holds RACE/
    flat = race_data.load_race_split(
        RaceDataArguments(validation_file=str(write_jsonl(tmp_path / "dev.jsonl", hub_rows(DEV)))), "validation"
    )
    folder = race_data.load_race_split(RaceDataArguments(validation_file=str(root / "dev")), "validation")
    articles = [record for files in DEV.values() for record in files.values()]
    article_lines = race_data.load_race_split(  # official fields, one article per line
        RaceDataArguments(validation_file=str(write_jsonl(tmp_path / "articles.jsonl", articles))), "validation"
    )
    for questions in (official, flat, folder, article_lines):
        rows = {row["example_id"]: row for row in questions}
        assert len(rows) == 8
        assert rows["middle7.txt-1"]["label"] == 1 and rows["middle7.txt-1"]["subset"] == "middle"
        assert rows["high5.txt-0"]["question"] == "The children went to the _ ."
        assert rows["high5.txt-2"]["options"][2] == RIGHT and rows["high5.txt-2"]["label"] == 2
        assert sorted(row["subset"] for row in questions) == ["high"] * 4 + ["middle"] * 4


def test_subset_selects_one_level_and_refuses_data_without_levels(tmp_path):
    write_official_layout(tmp_path)
    high = race_data.load_race_split(RaceDataArguments(data_dir=str(tmp_path), subset="high"), "validation")
    assert sorted(high["example_id"]) == ["high5.txt-0", "high5.txt-1", "high5.txt-2", "high6.txt-0"]
    middle = race_data.load_race_split(
        RaceDataArguments(validation_file=str(tmp_path / "dev"), subset="middle"), "validation"
    )
    assert set(middle["subset"]) == {"middle"} and len(middle) == 4
    no_levels = tmp_path / "nolevels"
    no_levels.mkdir()
    (no_levels / "a.json").write_text(json.dumps(article("asc001", "A")))
    with pytest.raises(ValueError, match=r"nolevels.*--subset high needs each question's level.*1 question"):
        race_data.load_race_split(RaceDataArguments(validation_file=str(no_levels), subset="high"), "validation")


def test_hub_dataset_name_loads_the_subset_config_and_split(monkeypatch):
    calls = []

    def fake_load_dataset(name, config, split, **kwargs):  # the Hub is unreachable in tests
        calls.append((name, config, split))
        return Dataset.from_list(hub_rows({"high": DEV["high"]}))

    monkeypatch.setattr(race_data, "load_dataset", fake_load_dataset)
    questions = race_data.load_race_split(RaceDataArguments(dataset_name="ehovy/race", subset="high"), "validation")
    assert calls == [("ehovy/race", "high", "validation")]
    assert questions["example_id"] == ["high5.txt-0", "high5.txt-1", "high5.txt-2", "high6.txt-0"]
    assert set(questions["subset"]) == {"high"} and questions["label"] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda record: record["answers"].__setitem__(1, "E"), r"question 1: answer 'E' is not one of A, B, C, D"),
        (lambda record: record["options"][0].pop(), r"question 0: 3 options; RACE questions have exactly 4"),
        (lambda record: record.pop("article"), r"missing field\(s\) \['article'\]"),
        (lambda record: record["answers"].pop(), r"3 questions, 3 option lists and 2 answers"),
    ],
)
def test_bad_articles_stop_with_the_file_named(tmp_path, change, message):
    write_official_layout(tmp_path)
    bad = tmp_path / "dev" / "middle" / "9.txt"
    record = article("middle9.txt", "ABC")
    change(record)
    bad.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{bad}.*{message}"):
        race_data.load_race_split(RaceDataArguments(data_dir=str(tmp_path)), "validation")


def test_bad_flat_rows_and_missing_folders_are_named(tmp_path):
    rows = hub_rows(DEV)
    rows[3]["answer"] = "AB"
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=rf"{path} row 3: answer 'AB' is not one of A, B, C, D"):
        race_data.load_race_split(RaceDataArguments(validation_file=str(path)), "validation")
    path = write_jsonl(tmp_path / "nocols.jsonl", [{"example_id": "x", "article": "a", "question": "q"}])
    with pytest.raises(ValueError, match=rf"{path}: missing column\(s\) \['options', 'answer'\]"):
        race_data.load_race_split(RaceDataArguments(validation_file=str(path)), "validation")
    (tmp_path / "dev" / "high").mkdir(parents=True)
    with pytest.raises(InputError, match=r"dev/middle: missing"):
        race_data.load_race_split(RaceDataArguments(data_dir=str(tmp_path)), "validation")


# ---------------------------------------------------------------------------------------------------------------
# End to end


@pytest.fixture(scope="module")
def trained_on_official_layout(tiny_checkpoint, tmp_path_factory):
    root = write_official_layout(tmp_path_factory.mktemp("race_data") / "RACE")
    out = tmp_path_factory.mktemp("race_out")
    results = run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--data_dir",
            root.parent,
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--output_dir",
            out,
            "--per_device_train_batch_size",
            "8",
            "--learning_rate",
            "3e-3",
            "--num_train_epochs",
            "8",
            "--warmup_steps",
            "0",
            "--logging_steps",
            "100",
            "--save_strategy",
            "no",
            *TINY_ARGS,
        ]
    )
    return root, out, results


def right_letters(levels: dict) -> dict:
    """Per question id, the letter of the fixture's RIGHT option (what a model that learned the fixture picks)."""
    return {
        f"{record['id']}-{i}": "ABCD"[options.index(RIGHT)]
        for files in levels.values()
        for record in files.values()
        for i, options in enumerate(record["options"])
    }


def gold_letters(levels: dict) -> dict:
    return {
        f"{record['id']}-{i}": answer
        for files in levels.values()
        for record in files.values()
        for i, answer in enumerate(record["answers"])
    }


def check_learned_and_scored(predictions: dict, metrics: dict, prefix: str, levels: dict = DEV):
    """The model learned the fixture (RIGHT picked for at least 7 of the 8 questions: a kernel's rounding may move
    a near-tie, not the lesson), and the reported accuracies are those of the written letters against the gold
    answers, overall and per level, worked out here from the files."""
    right, gold = right_letters(levels), gold_letters(levels)
    assert set(predictions) == set(gold) and set(predictions.values()) <= set("ABCD")
    assert sum(predictions[q] == right[q] for q in right) >= len(right) - 1, predictions
    for level in ("", "high", "middle"):
        ids = [q for q in gold if q.startswith(level)]
        if ids:
            key = f"{prefix}_accuracy_{level}" if level else f"{prefix}_accuracy"
            assert metrics[key] == pytest.approx(sum(predictions[q] == gold[q] for q in ids) / len(ids)), key
            if level:
                assert metrics[f"{prefix}_num_{level}"] == len(ids)


@pytest.mark.trains
@pytest.mark.rounding
def test_official_layout_trains_evaluates_and_writes_the_predicted_letters(trained_on_official_layout):
    root, out, results = trained_on_official_layout
    predictions = json.loads((out / "predictions_validation.json").read_text())
    # With every letter RIGHT the accuracy is 6 of 8: middle7.txt-1 and middle8.txt-0 have another gold answer.
    assert json.loads((out / "predictions_test.json").read_text()) == predictions
    # The dev set (--do_eval) as eval_*, the test set (--do_predict) as predict_*, as transformers' examples name them.
    for split, prefix in (("validation", "eval"), ("test", "predict")):
        metrics = results[split]
        check_learned_and_scored(predictions, metrics, prefix)
        assert metrics[f"{prefix}_samples"] == 8
    assert all(key.startswith(f"{prefix}_") for key in metrics)
    # The results files: flat, one per kind, and all_results.json with every one of them.
    files = {kind: json.loads((out / f"{kind}_results.json").read_text()) for kind in ("train", "eval", "predict")}
    assert files["eval"] == results["validation"] and files["predict"] == results["test"]
    assert files["train"]["train_samples"] == 24
    assert json.loads((out / "all_results.json").read_text()) == {**files["train"], **files["eval"], **files["predict"]}
    check_tokenizer_loads_without_prompt(out)


@pytest.mark.trains
def test_a_short_max_seq_length_runs_with_the_default_max_qa_length(tiny_checkpoint, tmp_path):
    # --max_seq_length 128 with the default --max_qa_length 128: the qa part is capped at 124, not refused.
    root = write_official_layout(tmp_path / "data" / "RACE")
    record = json.loads((root / "dev" / "high" / "6.txt").read_text())
    record["options"][0][2] = "walked very slowly to the old school with many books and friends " * 20  # > 128
    (root / "dev" / "high" / "6.txt").write_text(json.dumps(record))
    results = run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--data_dir",
            root.parent,
            "--do_train",
            "--do_eval",
            "--output_dir",
            tmp_path / "out",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--save_strategy",
            "no",
            "--max_seq_length",
            "128",
            "--report_to",
            "none",
            "--seed",
            "0",
            "--per_device_eval_batch_size",
            "8",
            "--dataloader_pin_memory",
            "false",
        ]
    )
    assert results["validation"]["eval_samples"] == 8 and 0 <= results["validation"]["eval_accuracy"] <= 1
    assert json.loads((tmp_path / "out" / "train_results.json").read_text())["train_samples"] == 24
    predictions = json.loads((tmp_path / "out" / "predictions_validation.json").read_text())
    assert len(predictions) == 8 and set(predictions.values()) <= set("ABCD")


OFFICIAL_OPTIMIZER = {"official_optimizer": True, "adam_epsilon": 1e-6, "weight_decay": 0.01, "max_grad_norm": 1.0}


def applied_recipe(tmp_path, *flags):
    from albert_hf.tasks.finetuning import parse_arguments
    from albert_hf.tasks.paper_hparams import apply_paper_hparams

    argv = ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--paper_hparams", *flags]
    model_args, data_args, training_args = parse_arguments(RaceDataArguments, argv)
    model_args, data_args, training_args, _ = apply_paper_hparams(
        *race_definition.paper_recipe(data_args), model_args, data_args, training_args, argv
    )
    return model_args, data_args, training_args, json.loads((tmp_path / "paper_hparams.json").read_text())


def test_paper_hparams_race_rows_for_v2_and_v1_models(tmp_path):
    # v2 models (the official run_race.py defaults and README): lr 1e-5, batch 32, 12000 steps, 1000 warm-up,
    # 512 tokens with the question+option at 128, ALBERT dropout 0 (hidden and attention), head dropout 0.1.
    model_args, data_args, args, written = applied_recipe(tmp_path)
    assert written == {
        "learning_rate": 1e-5,
        "per_device_train_batch_size": 32,
        "gradient_accumulation_steps": 1,
        "max_steps": 12000,
        "warmup_steps": 1000,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_seq_length": 512,
        "max_qa_length": 128,
        "classifier_dropout_prob": 0.1,
        **OFFICIAL_OPTIMIZER,
    }
    assert (args.learning_rate, args.max_steps, args.warmup_steps, args.official_optimizer) == (1e-5, 12000, 1000, True)
    assert (data_args.max_seq_length, data_args.max_qa_length, model_args.attention_probs_dropout_prob) == (
        512,
        128,
        0.0,
    )
    # v1 models (the paper's row): lr 2e-5 and ALBERT dropout 0.1; the batch 32 over 4 accumulation steps
    model_args, _, args, written = applied_recipe(tmp_path, "--race_recipe", "v1", "--gradient_accumulation_steps", "4")
    assert (
        written["learning_rate"],
        written["per_device_train_batch_size"],
        written["hidden_dropout_prob"],
        written["attention_probs_dropout_prob"],
        written["max_steps"],
    ) == (2e-5, 8, 0.1, 0.1, 12000)
    assert (args.learning_rate, model_args.hidden_dropout_prob, model_args.attention_probs_dropout_prob) == (
        2e-5,
        0.1,
        0.1,
    )


def test_race_recipe_without_paper_hparams_names_the_flag(tmp_path):
    with pytest.raises(
        InputError,
        match=r"^--race_recipe v1 chooses the row --paper_hparams applies: pass "
        r"--paper_hparams too$",
    ):
        run_race(
            [
                "--model_name_or_path",
                "m",
                "--data_dir",
                tmp_path,
                "--do_eval",
                "--output_dir",
                tmp_path / "out",
                "--race_recipe",
                "v1",
            ]
        )


@pytest.mark.trains
def test_paper_hparams_run_trains_with_the_recipe_dropouts_and_records_it(tiny_checkpoint, tmp_path):
    root = write_official_layout(tmp_path / "data" / "RACE")
    out = tmp_path / "out"
    run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--data_dir",
            root.parent,
            "--do_train",
            "--output_dir",
            out,
            "--paper_hparams",
            "--race_recipe",
            "v1",
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "8",
            "--save_strategy",
            "no",
            *TINY_ARGS,
        ]
    )
    config = json.loads((out / "config.json").read_text())  # the tiny model's own dropouts are 0
    assert (
        config["hidden_dropout_prob"],
        config["attention_probs_dropout_prob"],
        config["classifier_dropout_prob"],
    ) == (0.1, 0.1, 0.1)
    written = json.loads((out / "paper_hparams.json").read_text())
    assert (
        written["learning_rate"],
        written["max_steps"],
        written["per_device_train_batch_size"],
        written["max_seq_length"],
        written["max_qa_length"],
        written["warmup_steps"],
    ) == (2e-5, 2, 8, 64, 16, 1000)
    card = (out / "README.md").read_text()
    assert "ALBERT's fine-tuning recipe for RACE, v1 models" in card and "| max_qa_length | 16 (explicit) |" in card


@pytest.mark.trains
@pytest.mark.rounding
def test_flat_json_trains_and_evaluates_and_the_trained_model_agrees_across_formats(
    trained_on_official_layout, tiny_checkpoint, tmp_path
):
    root, trained, _ = trained_on_official_layout
    train_file = write_jsonl(tmp_path / "train.jsonl", hub_rows(TRAIN))
    dev_file = write_jsonl(tmp_path / "dev.jsonl", hub_rows(DEV))
    results = run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--train_file",
            train_file,
            "--validation_file",
            dev_file,
            "--do_train",
            "--do_eval",
            "--output_dir",
            tmp_path / "flat",
            "--per_device_train_batch_size",
            "8",
            "--learning_rate",
            "3e-3",
            "--num_train_epochs",
            "8",
            "--warmup_steps",
            "0",
            "--save_strategy",
            "no",
            *TINY_ARGS,
        ]
    )
    check_learned_and_scored(
        json.loads((tmp_path / "flat" / "predictions_validation.json").read_text()), results["validation"], "eval"
    )  # levels from the "middle7.txt" id prefix
    # The model trained on the official layout, evaluated on the flat rows with --subset middle only: the same
    # letters as it wrote for those questions from the official files.
    results = run_race(
        [
            "--model_name_or_path",
            trained,
            "--validation_file",
            dev_file,
            "--subset",
            "middle",
            "--do_eval",
            "--output_dir",
            tmp_path / "eval_only",
            *TINY_ARGS,
        ]
    )
    assert "eval_accuracy_high" not in results["validation"]
    middle = json.loads((tmp_path / "eval_only" / "predictions_validation.json").read_text())
    official = json.loads((trained / "predictions_validation.json").read_text())
    assert middle == {q: letter for q, letter in official.items() if q.startswith("middle")}
    gold = gold_letters(DEV)
    assert results["validation"]["eval_accuracy"] == pytest.approx(sum(middle[q] == gold[q] for q in middle) / 4)


# ---------------------------------------------------------------------------------------------------------------
# The real RACE files in ../shared/data/race


def real_accuracy(predictions: dict, folder: Path) -> float:
    """Accuracy recomputed from the predictions file and the raw RACE files (independently of albert_hf.tasks.race)."""
    gold = {}
    for path in folder.rglob("*"):
        if path.suffix in (".txt", ".json"):
            record = json.loads(path.read_text(encoding="utf-8"))
            gold.update({f"{record['id']}-{i}": answer for i, answer in enumerate(record["answers"])})
    return sum(gold[question] == letter for question, letter in predictions.items()) / len(predictions)


@pytest.mark.trains
def test_real_official_layout_sample_end_to_end(tiny_checkpoint, tmp_path):
    sample = shared_data("race", "official_layout_sample")
    results = run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--data_dir",
            sample,
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--output_dir",
            tmp_path,
            "--max_steps",
            "3",
            "--per_device_train_batch_size",
            "4",
            "--save_strategy",
            "no",
            *TINY_ARGS,
        ]
    )
    # dev: high73 (1) + high80 (5) questions; middle13 (5) + middle34 (4) + middle73 (2)
    assert (results["validation"]["eval_num_high"], results["validation"]["eval_num_middle"]) == (6, 11)
    # test: high98 (5) + high122 (3); middle1 (4) + middle70 (5) + middle9 (5)
    assert (results["test"]["predict_num_high"], results["test"]["predict_num_middle"]) == (8, 14)
    for split, folder, last_question, prefix in (
        ("validation", "dev", "high80.txt-4", "eval"),
        ("test", "test", "middle9.txt-4", "predict"),
    ):
        predictions = json.loads((tmp_path / f"predictions_{split}.json").read_text())
        assert len(predictions) == results[split][f"{prefix}_samples"] and last_question in predictions
        assert set(predictions.values()) <= set("ABCD")
        assert results[split][f"{prefix}_accuracy"] == pytest.approx(real_accuracy(predictions, sample / folder))


def test_real_reshuffled_folder_evaluates_and_refuses_a_level_it_cannot_know(tiny_checkpoint, tmp_path):
    dev = shared_data("race", "asc_reshuffled", "dev")
    results = run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--validation_file",
            dev,
            "--do_eval",
            "--max_eval_samples",
            "48",
            "--output_dir",
            tmp_path,
            *TINY_ARGS,
        ]
    )
    predictions = json.loads((tmp_path / "predictions_validation.json").read_text())
    assert len(predictions) == 48 and results["validation"]["eval_samples"] == 48
    assert all(question.startswith("asc") and question.rsplit("-", 1)[1].isdigit() for question in predictions)
    assert results["validation"]["eval_accuracy"] == pytest.approx(real_accuracy(predictions, dev))
    assert "eval_accuracy_high" not in results["validation"]  # ids like asc00000 say nothing about the level
    with pytest.raises(ValueError, match=r"asc_reshuffled/dev: --subset high needs each question's level"):
        race_data.load_race_split(RaceDataArguments(validation_file=str(dev), subset="high"), "validation")


@pytest.mark.trains
@pytest.mark.rounding
def test_two_seeds_summarise_accuracy_and_keep_the_best_checkpoint_by_accuracy(tiny_checkpoint, tmp_path):
    """--seeds on RACE: the summary of every script (helpers.check_seed_summary) with accuracy, chance (0.25) as
    the baseline, and --load_best_model_at_end choosing by accuracy without --metric_for_best_model."""
    from transformers import AutoModelForMultipleChoice

    root = write_official_layout(tmp_path / "data" / "RACE")
    out = tmp_path / "out"
    summary = run_race(
        [
            "--model_name_or_path",
            tiny_checkpoint,
            "--data_dir",
            root.parent,
            "--do_train",
            "--do_eval",
            "--output_dir",
            out,
            "--per_device_train_batch_size",
            "8",
            "--learning_rate",
            "3e-3",
            "--num_train_epochs",
            "8",
            "--warmup_steps",
            "0",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "6",
            "--save_strategy",
            "steps",
            "--save_steps",
            "6",
            "--load_best_model_at_end",
            "--seeds",
            "1",
            "2",
            *TINY_ARGS,
        ]
    )
    check_seed_summary(out, [1, 2], "eval_accuracy", AutoModelForMultipleChoice)
    assert summary["baseline"] == {"metric": "accuracy", "value": 0.25, "name": "chance (1 of 4 options)"}
    assert {"eval_accuracy", "eval_accuracy_high", "eval_accuracy_middle"} <= set(summary["metrics"])
    check_best_checkpoint(out / "seed_1", "eval_accuracy")
