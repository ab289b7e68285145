"""run_glue.py on a user's own labelled data (no --task_name; albert_hf/tasks/own_data/): columns and
labels read as transformers' run_glue.py reads them, label names kept through the saved folder and its pipeline,
classification and regression metrics, and one line for each kind of bad input."""

import json
import random

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

from albert_hf.errors import InputError
from albert_hf.metrics import classification_metrics, regression_metrics
from albert_hf.tasks.own_data.data import infer_task
from albert_hf.tasks.own_data.definition import OwnTask
from albert_hf.tasks.own_data.features import choose_text_columns, class_names
from data_fixtures import THINGS, reviews, write_csv
from helpers import finetuning_args, run_python, run_script

STARS = {"terrible": 1.0, "poor": 2.0, "fine": 3.0, "good": 4.0, "superb": 5.0}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def run_glue(argv):
    return run_script("run_glue", argv)


def args(checkpoint, output_dir, *extra):
    return finetuning_args(checkpoint, output_dir, *extra, learning_rate=2e-3)


# ---------------------------------------------------------------------------------------------------------------
# Columns, classes and the checkpoint's labels


def test_text_columns_follow_transformers_run_glue_and_skip_non_text_columns():
    pair = Dataset.from_dict({"id": [1], "sentence2": ["b"], "sentence1": ["a"], "label": ["x"]})
    assert choose_text_columns(pair, None, "f") == ("sentence1", "sentence2")
    with_id = Dataset.from_dict({"id": [7], "text": ["a"], "label": ["x"]})
    assert choose_text_columns(with_id, None, "f") == ("text",)  # transformers would take the id too
    three = Dataset.from_dict({"title": ["t"], "body": ["b"], "source": ["s"], "label": [1]})
    assert choose_text_columns(three, None, "f") == ("title", "body")
    assert choose_text_columns(three, "body, source", "f") == ("body", "source")
    with pytest.raises(InputError, match=r"--text_column_names bdy: f has no column\(s\) \['bdy'\]"):
        choose_text_columns(three, "bdy", "f")
    with pytest.raises(InputError, match="one or two columns"):
        choose_text_columns(three, "title,body,source", "f")
    with pytest.raises(InputError, match=r"f: no text column besides the label"):
        choose_text_columns(Dataset.from_dict({"n": [1], "label": [0]}), None, "f")


def test_classes_are_sorted_strings_or_integers_classlabel_names_or_none_for_floats():
    assert class_names(Dataset.from_dict({"label": ["pos", "neg", "pos", "mixed"]}), "f") == ("mixed", "neg", "pos")
    assert class_names(Dataset.from_dict({"label": [10, 2, 1, 2]}), "f") == ("1", "2", "10")  # numeric order
    labelled = Dataset.from_dict({"label": [1, 0]}, features=Features({"label": ClassLabel(names=["no", "yes"])}))
    assert class_names(labelled, "f") == ("no", "yes")
    assert class_names(Dataset.from_dict({"label": [0.5, 4.0]}), "f") is None
    with pytest.raises(InputError, match="f: row 1: no label"):
        class_names(Dataset.from_dict({"label": ["a", None]}), "f")


class Config:
    def __init__(self, id2label=None, problem_type=None):
        self.id2label = id2label or {0: "LABEL_0", 1: "LABEL_1"}
        self.problem_type = problem_type


def infer(train_labels, config, ignore=False, with_train=True):
    class DataArgs:
        text_column_names = None

    rows = {"text": ["a"] * len(train_labels), "label": train_labels}
    splits = DatasetDict({"train" if with_train else "validation": Dataset.from_dict(rows)})
    sources = {"train": "train.csv", "validation": "dev.csv"}
    return infer_task(splits, sources, DataArgs(), config, "ckpt", ignore)


def test_a_checkpoint_fine_tuned_on_the_same_classes_keeps_its_ids_and_other_classes_are_refused():
    assert infer(["neg", "pos"], Config()).label_names == ("neg", "pos")  # pretrained: the data's sorted classes
    assert infer(["neg", "pos"], Config({0: "pos", 1: "neg"})).label_names == ("pos", "neg")
    with pytest.raises(
        InputError,
        match=r"ckpt was fine-tuned on the classes \['a', 'b'\], and train.csv has the "
        r"classes \['neg', 'pos'\]: pass --ignore_mismatched_sizes",
    ):
        infer(["neg", "pos"], Config({0: "a", 1: "b"}))
    assert infer(["neg", "pos"], Config({0: "a", 1: "b"}), ignore=True).label_names == ("neg", "pos")
    with pytest.raises(InputError, match=r"fine-tuned on regression, and train.csv has the classes"):
        infer(["neg", "pos"], Config({0: "LABEL_0"}, "regression"))
    assert infer([1.5, 2.5], Config()).is_regression
    # No training data: the checkpoint's classes, or a stop when it has none.
    assert infer(["pos"], Config({0: "neg", 1: "pos"}), with_train=False).label_names == ("neg", "pos")
    with pytest.raises(InputError, match=r"ckpt has no classes of its own \(not fine-tuned\)"):
        infer(["pos"], Config(), with_train=False)


def test_labels_encode_to_the_task_ids_and_an_unknown_or_missing_label_names_file_and_row():
    task = OwnTask(("text",), ("neg", "pos"))
    encoded = task.encode_labels(Dataset.from_dict({"text": ["a", "b"], "label": ["pos", " neg"]}), "dev.csv")
    assert encoded["label"] == [1, 0]
    assert OwnTask(("t",), ("1", "2", "10")).encode_labels(Dataset.from_dict({"label": [10, 1]}), "x")["label"] == [
        2,
        0,
    ]
    with pytest.raises(
        InputError,
        match=r"dev.csv: row 1: label 'neutral' is not among the training labels "
        r"\['neg', 'pos'\]",
    ):
        task.encode_labels(Dataset.from_dict({"label": ["pos", "neutral"]}), "dev.csv")
    with pytest.raises(InputError, match="dev.csv: row 0: label 'high' is not a number"):
        OwnTask(("t",), None).encode_labels(Dataset.from_dict({"label": ["high"]}), "dev.csv")


def test_metrics_hand_worked():
    # Classes 0: F1 1; 1: TP 1, FP 1 -> 2/3; 2: TP 1, FN 1 -> 2/3. Macro mean 7/9; accuracy 3/4.
    found = classification_metrics(np.array([0, 1, 1, 2]), np.array([0, 1, 2, 2]))
    assert found["accuracy"] == pytest.approx(0.75) and found["macro_f1"] == pytest.approx(7 / 9)
    # A class only predicted counts too (F1 0): classes 0 (F1 2/3) and 1 (F1 0).
    assert classification_metrics(np.array([0, 1]), np.array([0, 0]))["macro_f1"] == pytest.approx(1 / 3)
    found = regression_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]))
    # Pearson: centred x (-1, 0, 1), y (-4/3, -1/3, 5/3): 3 / sqrt(2 * 14/3).
    assert found["pearson"] == pytest.approx(3 / np.sqrt(2 * 14 / 3))
    assert found["spearmanr"] == pytest.approx(1.0) and found["mse"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------------------------
# End to end


@pytest.mark.trains
@pytest.mark.rounding
def test_a_csv_trains_with_its_label_names_into_config_predictions_card_and_a_pipeline_without_albert_hf(
    tiny_checkpoint, tmp_path
):
    train = write_csv(tmp_path / "train.csv", reviews(200, 0))
    dev = write_csv(tmp_path / "dev.csv", reviews(60, 1))
    test_rows = reviews(20, 2)
    test = write_csv(tmp_path / "test.csv", test_rows, columns=("sentence",))
    out = tmp_path / "out"
    run_glue(
        args(
            tiny_checkpoint,
            out,
            "--train_file",
            train,
            "--validation_file",
            dev,
            "--test_file",
            test,
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--num_train_epochs",
            15,
        )
    )
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_accuracy"] >= 0.9 and results["eval_macro_f1"] >= 0.9, results
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "negative", "1": "positive"}
    assert config["label2id"] == {"negative": 0, "positive": 1}
    lines = (out / "predict_results.txt").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 21
    predicted = [line.split("\t")[1] for line in lines[1:]]
    assert set(predicted) <= {"positive", "negative"}
    assert sum(p == row["label"] for p, row in zip(predicted, test_rows)) >= 18
    card = (out / "README.md").read_text()
    assert "['negative', 'positive']" in card and "- glue" not in card and "`train.csv`" in card
    # A fresh process without albert_hf: the pipeline answers with the names, as the predictions file does.
    code = (
        "from transformers import pipeline\n"
        f"classify = pipeline('text-classification', model={str(out)!r}, trust_remote_code=True)\n"
        f"print('LABELS', [r['label'] for r in classify({[row['sentence'] for row in test_rows]!r})])\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("LABELS ")[1].strip() == str(predicted)

    # Evaluating that folder again keeps its ids, whatever order the new file's labels come in.
    dev_reordered = write_csv(tmp_path / "dev2.csv", sorted(reviews(60, 1), key=lambda row: row["label"]))
    again = tmp_path / "again"
    run_glue(args(out, again, "--validation_file", dev_reordered, "--do_eval"))
    assert json.loads((again / "all_results.json").read_text())["eval_accuracy"] == results["eval_accuracy"]


@pytest.mark.trains
@pytest.mark.rounding
def test_float_labels_in_json_are_regression_with_pearson_spearman_and_mse(tiny_checkpoint, tmp_path):
    rng = random.Random(0)

    def rows(count):
        words = [rng.choice(list(STARS)) for _ in range(count)]
        return [
            {"review": f"The {rng.choice(THINGS)} was {w}.", "id": i, "stars": STARS[w]} for i, w in enumerate(words)
        ]

    train, dev = write_jsonl(tmp_path / "train.jsonl", rows(200)), write_jsonl(tmp_path / "dev.jsonl", rows(60))
    out = tmp_path / "out"
    run_glue(
        args(
            tiny_checkpoint,
            out,
            "--train_file",
            train,
            "--validation_file",
            dev,
            "--label_column_name",
            "stars",
            "--do_train",
            "--do_eval",
            "--num_train_epochs",
            15,
        )
    )
    results = json.loads((out / "all_results.json").read_text())
    assert {"eval_pearson", "eval_spearmanr", "eval_mse"} <= set(results)
    assert results["eval_pearson"] > 0.8 and results["eval_mse"] < 1.0, results
    config = json.loads((out / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1


@pytest.mark.trains
def test_a_dataset_folder_from_save_to_disk_with_classlabels(tiny_checkpoint, tmp_path):
    features = Features({"text": Value("string"), "label": ClassLabel(names=["negative", "positive"])})

    def split(count, seed):
        return Dataset.from_list(
            [{"text": r["sentence"], "label": int(r["label"] == "positive")} for r in reviews(count, seed)],
            features=features,
        )

    DatasetDict({"train": split(120, 0), "validation": split(40, 1)}).save_to_disk(tmp_path / "reviews")
    out = tmp_path / "out"
    run_glue(
        args(
            tiny_checkpoint,
            out,
            "--dataset_name",
            tmp_path / "reviews",
            "--do_train",
            "--do_eval",
            "--num_train_epochs",
            2,
        )
    )
    assert json.loads((out / "config.json").read_text())["id2label"] == {"0": "negative", "1": "positive"}
    assert "eval_macro_f1" in json.loads((out / "all_results.json").read_text())


def bad(tiny_checkpoint, tmp_path, *extra):
    with pytest.raises(InputError) as error:
        run_glue(args(tiny_checkpoint, tmp_path / "out", *extra))
    message = str(error.value)
    assert "\n" not in message
    return message


def test_bad_own_data_stops_with_one_line(tiny_checkpoint, tmp_path):
    train = write_csv(tmp_path / "train.csv", reviews(20, 0))
    dev_new_label = write_csv(tmp_path / "dev.csv", reviews(5, 1) + [{"sentence": "Meh.", "label": "neutral"}])
    assert (
        bad(
            tiny_checkpoint,
            tmp_path,
            "--train_file",
            train,
            "--validation_file",
            dev_new_label,
            "--do_train",
            "--do_eval",
        )
        == f"{dev_new_label} (validation): row 5: label 'neutral' is not among the training "
        "labels ['negative', 'positive']"
    )
    no_label = write_csv(tmp_path / "nolabel.csv", reviews(5, 0), columns=("sentence",))
    assert "no label column 'label' (--label_column_name)" in bad(
        tiny_checkpoint, tmp_path, "--train_file", no_label, "--do_train"
    )
    assert "no label column 'rating'" in bad(
        tiny_checkpoint, tmp_path, "--train_file", train, "--do_train", "--label_column_name", "rating"
    )
    assert "has no column(s) ['review']" in bad(
        tiny_checkpoint, tmp_path, "--train_file", train, "--do_train", "--text_column_names", "review"
    )
    empty = tmp_path / "empty.csv"
    empty.write_text("\n")
    assert bad(tiny_checkpoint, tmp_path, "--train_file", empty, "--do_train") == f"{empty}: the file is empty"
    mixed = write_jsonl(tmp_path / "mixed.jsonl", [{"text": "a", "label": 1}, {"text": "b", "label": "positive"}])
    assert (
        bad(tiny_checkpoint, tmp_path, "--train_file", mixed, "--do_train")
        == f"{mixed}: the labels mix types: row 0 is int, row 1 is str (strings or integers for classes, floats for "
        "regression)"
    )
    assert "needs validation data: none in --validation_file" in bad(
        tiny_checkpoint, tmp_path, "--train_file", train, "--do_train", "--do_eval"
    )
    assert bad(tiny_checkpoint, tmp_path, "--do_train").startswith("no data: pass --task_name")
    assert "unsupported extension" in bad(tiny_checkpoint, tmp_path, "--train_file", tmp_path / "x.xlsx", "--do_train")
    assert "--data_dir reads the original GLUE folders" in bad(
        tiny_checkpoint, tmp_path, "--data_dir", tmp_path, "--do_train"
    )
    assert "--paper_hparams is the paper's recipe for a GLUE --task_name" in bad(
        tiny_checkpoint, tmp_path, "--train_file", train, "--do_train", "--paper_hparams"
    )
    assert "--text_column_names is for your own data" in bad(
        tiny_checkpoint,
        tmp_path,
        "--task_name",
        "sst2",
        "--train_file",
        train,
        "--do_train",
        "--text_column_names",
        "sentence",
    )
    assert "offline?" in bad(tiny_checkpoint, tmp_path, "--dataset_name", "someone/reviews", "--do_train")


def test_the_docs_example_data_reads_as_the_docs_say(tmp_path):
    """examples/own_data.py writes what docs/your_data.md fine-tunes on, in the formats the scripts read."""
    import importlib.util

    from albert_hf.tasks.ner.data import read_conll
    from albert_hf.tasks.own_data.data import read_file
    from helpers import REPO

    spec = importlib.util.spec_from_file_location("own_data", REPO / "examples" / "own_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([str(tmp_path)])
    reviews = read_file(tmp_path / "reviews_train.csv")
    assert reviews.column_names == ["sentence", "label"] and set(reviews["label"]) == {"positive", "negative"}
    assert read_file(tmp_path / "reviews_test.csv").column_names == ["sentence"]
    assert class_names(read_file(tmp_path / "ratings_train.jsonl").rename_column("stars", "label"), "f") is None
    people = read_conll(tmp_path / "people_dev.conll")
    assert len(people) == 200 and "I-LOC" in {tag for tags in people["ner_tags"] for tag in tags}
    assert read_conll(tmp_path / "people_test.conll").column_names == ["tokens"]
    from datasets import load_from_disk

    assert load_from_disk(str(tmp_path / "reviews_dataset"))["train"].features["label"].names == [
        "negative",
        "positive",
    ]


def test_tsv_and_parquet_files_read_like_csv(tmp_path):
    from albert_hf.tasks.own_data.data import read_file

    rows = reviews(5, 0)
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{r['sentence']}\t{r['label']}\n" for r in rows))
    Dataset.from_list(rows).to_parquet(tmp_path / "train.parquet")
    for name in ("train.tsv", "train.parquet"):
        found = read_file(tmp_path / name)
        assert found.column_names == ["sentence", "label"] and found["label"] == [r["label"] for r in rows], name
