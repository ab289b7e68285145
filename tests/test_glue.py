"""run_glue.py and albert_hf/tasks/glue/: GLUE readers, metrics, --paper_hparams, end-to-end runs with a tiny
model."""

import csv
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from albert_hf.errors import InputError
from albert_hf.testing.glue_folders import PAIRS, write_glue_folders, write_tsv
from helpers import SHARED_DATA, check_tokenizer_loads_without_prompt, glue_args, run_glue, shared_data

REPO = Path(__file__).resolve().parents[1]

GLUE_DATA = SHARED_DATA / "glue"


def read_tsv_columns(path, columns, has_header=True):
    """An independent reader for the tests: plain split on tabs (these files have no embedded tabs)."""
    lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    if has_header:
        header, lines = lines[0].split("\t"), lines[1:]
        positions = [header.index(name) for name in columns]
    else:
        positions = columns
    rows = [line.split("\t") for line in lines if line]
    return [[row[p] for row in rows] for p in positions]


def glue_metric(task):
    from albert_hf.metrics import load_glue_metric

    return load_glue_metric(task)


# ------------------------------------------------------------------------------------------------------------
# Metrics: hand-worked, then against sklearn/scipy on the labels of the real dev files.


def test_metric_hand_worked_examples():
    # preds 1,0,1,1 vs gold 1,1,0,1: TP=2, FP=1, FN=1 -> F1 = 4/6; 2 of 4 correct.
    result = glue_metric("mrpc").compute(predictions=[1, 0, 1, 1], references=[1, 1, 0, 1])
    assert result == pytest.approx({"accuracy": 0.5, "f1": 2 / 3})
    # Binary MCC: TP=1, TN=1, FP=1, FN=0 -> (1*1 - 1*0) / sqrt(2*1*2*1) = 0.5.
    assert glue_metric("cola").compute(predictions=[0, 1, 1], references=[0, 1, 0]) == pytest.approx(
        {"matthews_correlation": 0.5}
    )
    # Nothing predicted positive: F1 and MCC are 0 by convention, not nan.
    assert glue_metric("qqp").compute(predictions=[0, 0], references=[1, 0])["f1"] == 0.0
    assert glue_metric("cola").compute(predictions=[1, 1], references=[1, 0])["matthews_correlation"] == 0.0
    # Pearson of (1,2,3) and (1,2,4): r = 1.5/sqrt(2*4.6667) = 0.98198; ranks equal -> Spearman 1.
    result = glue_metric("stsb").compute(predictions=[1.0, 2.0, 3.0], references=[1.0, 2.0, 4.0])
    assert result["pearson"] == pytest.approx(0.9819805, abs=1e-6)
    assert result["spearmanr"] == pytest.approx(1.0)
    # 3-class MCC (AX): a perfect prediction is 1; c=2, s=3, p=t=(1,1,1)... worked: preds 0,1,2,0 vs gold 0,1,2,2:
    # c=3, s=4, p=(2,1,1), t=(1,1,2): (3*4 - (2+1+2)) / sqrt((16-6)*(16-6)) = 7/10.
    assert glue_metric("ax").compute(predictions=[0, 1, 2, 0], references=[0, 1, 2, 2])[
        "matthews_correlation"
    ] == pytest.approx(0.7)
    assert glue_metric("rte").compute(predictions=[0, 1, 1], references=[0, 1, 0]) == pytest.approx({"accuracy": 2 / 3})
    with pytest.raises(KeyError, match="Unknown GLUE metric configuration 'sts'"):
        glue_metric("sts")


def test_metrics_match_sklearn_on_real_mrpc_and_cola_dev():
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    labels, first, second = read_tsv_columns(
        shared_data("glue", "MRPC", "dev.tsv"), ["Quality", "#1 String", "#2 String"]
    )
    gold = np.array([int(label) for label in labels])
    # Fixed predictions built independently of the labels: "paraphrase" when the lengths are close.
    predicted = np.array([int(abs(len(a) - len(b)) < 20) for a, b in zip(first, second)])
    assert len(gold) == 408 and 0 < predicted.sum() < len(predicted)
    result = glue_metric("mrpc").compute(predictions=predicted, references=gold)
    assert result["accuracy"] == pytest.approx(accuracy_score(gold, predicted), abs=1e-12)
    assert result["f1"] == pytest.approx(f1_score(gold, predicted), abs=1e-12)  # positive class = 1

    _, cola_labels, _, sentences = read_tsv_columns(
        shared_data("glue", "CoLA", "dev.tsv"), [0, 1, 2, 3], has_header=False
    )
    gold = np.array([int(label) for label in cola_labels])
    predicted = np.array([int(len(sentence.split()) < 9) for sentence in sentences])
    assert len(gold) == 1043
    result = glue_metric("cola").compute(predictions=predicted, references=gold)
    assert result["matthews_correlation"] == pytest.approx(matthews_corrcoef(gold, predicted), abs=1e-12)
    assert result["matthews_correlation"] != 0.0

    (rte_labels,) = read_tsv_columns(shared_data("glue", "RTE", "dev.tsv"), ["label"])
    gold = np.array([["entailment", "not_entailment"].index(label) for label in rte_labels])
    predicted = np.arange(len(gold)) % 3 == 0
    assert glue_metric("rte").compute(predictions=predicted.astype(int), references=gold)["accuracy"] == pytest.approx(
        accuracy_score(gold, predicted.astype(int)), abs=1e-12
    )


def test_stsb_metric_matches_scipy_on_real_dev():
    from scipy.stats import pearsonr, spearmanr

    scores, first, second = read_tsv_columns(
        shared_data("glue", "STS-B", "dev.tsv"), ["score", "sentence1", "sentence2"]
    )
    gold = np.array([float(score) for score in scores])
    # Word-overlap (Jaccard) x 5, rounded to one decimal so that many predictions tie (tests tied ranks).
    predicted = np.array(
        [
            round(
                5
                * len(set(a.lower().split()) & set(b.lower().split()))
                / len(set(a.lower().split()) | set(b.lower().split())),
                1,
            )
            for a, b in zip(first, second)
        ]
    )
    assert len(gold) == 1500 and len(np.unique(predicted)) < len(predicted) / 10
    result = glue_metric("stsb").compute(predictions=predicted, references=gold)
    assert result["pearson"] == pytest.approx(pearsonr(predicted, gold)[0], abs=1e-12)
    assert result["spearmanr"] == pytest.approx(spearmanr(predicted, gold)[0], abs=1e-12)


# ------------------------------------------------------------------------------------------------------------
# Readers: fixtures in every original layout, then the real files.


@pytest.mark.parametrize(
    "task_name,split,expected",
    [
        ("cola", "train.tsv", {"sentence": PAIRS[1][0], "label": "1"}),
        ("cola", "test.tsv", {"sentence": PAIRS[1][0], "idx": 11}),
        ("sst2", "train.tsv", {"sentence": PAIRS[1][0] + " ", "label": "1"}),
        ("mrpc", "dev.tsv", {"sentence1": PAIRS[1][0], "sentence2": PAIRS[1][1], "label": "1"}),
        ("mrpc", "test.tsv", {"sentence1": PAIRS[1][0], "sentence2": PAIRS[1][1], "idx": 11}),
        ("stsb", "train.tsv", {"sentence1": PAIRS[1][0], "sentence2": PAIRS[1][1], "label": "0.600", "idx": 1}),
        ("qqp", "dev.tsv", {"question1": PAIRS[1][0], "question2": PAIRS[1][1], "label": "1", "idx": 7}),
        ("qnli", "train.tsv", {"question": PAIRS[1][0], "sentence": PAIRS[1][1], "label": "not_entailment", "idx": 1}),
        ("rte", "dev.tsv", {"sentence1": PAIRS[1][0], "sentence2": PAIRS[1][1], "label": "not_entailment", "idx": 1}),
        ("wnli", "train.tsv", {"sentence1": PAIRS[1][0], "sentence2": PAIRS[1][1], "label": "1", "idx": 1}),
        (
            "mnli",
            "dev_mismatched.tsv",
            {"premise": PAIRS[1][0], "hypothesis": PAIRS[1][1], "label": "neutral", "idx": 1},
        ),
        ("mnli", "test_matched.tsv", {"premise": PAIRS[1][0], "hypothesis": PAIRS[1][1], "idx": 1}),
        ("ax", "diagnostic.tsv", {"premise": PAIRS[1][0], "hypothesis": PAIRS[1][1], "idx": 11}),
    ],
)
def test_read_glue_tsv_every_original_layout(glue_root, task_name, split, expected):
    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.files import read_glue_tsv

    task = TASKS[task_name]
    dataset = read_glue_tsv(glue_root / task.folder / split, task)
    # Only the Hub's columns survive (ids, parses, genres, annotator labels dropped), with the file's values.
    assert dataset[1] == expected
    assert len(dataset) == (4 if "test" in split or "diagnostic" in split else 8)


def test_real_files_read_completely_with_quotes_and_bom():
    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.files import read_glue_tsv

    mrpc_dev = read_glue_tsv(shared_data("glue", "MRPC", "dev.tsv"), TASKS["mrpc"])
    assert len(mrpc_dev) == 408  # 409 lines with the header
    # Row 0 of dev.tsv starts its second sentence with an unbalanced quote: it must survive verbatim.
    assert mrpc_dev[0] == {
        "label": "1",
        "sentence1": "He said the foodservice pie business doesn 't fit the company 's long-term growth strategy .",
        "sentence2": '" The foodservice pie business does not fit our long-term growth strategy .',
    }
    assert len(read_glue_tsv(shared_data("glue", "MRPC", "train.tsv"), TASKS["mrpc"])) == 3667
    cola_train = read_glue_tsv(shared_data("glue", "CoLA", "train.tsv"), TASKS["cola"])
    assert len(cola_train) == 8551 and cola_train[0]["sentence"].startswith("Our friends won't buy this")
    cola_test = read_glue_tsv(shared_data("glue", "CoLA", "test.tsv"), TASKS["cola"])
    assert len(cola_test) == 1063 and cola_test[0] == {"idx": 0, "sentence": "Bill whistled past the house."}
    stsb_dev = read_glue_tsv(shared_data("glue", "STS-B", "dev.tsv"), TASKS["stsb"])
    assert len(stsb_dev) == 1500 and stsb_dev[1]["label"] == "4.750"
    assert len(read_glue_tsv(shared_data("glue", "diagnostic", "diagnostic.tsv"), TASKS["ax"])) == 1104
    mnli_dev = read_glue_tsv(shared_data("glue", "format_samples_mnli_qqp", "MNLI", "dev_matched.tsv"), TASKS["mnli"])
    (gold,) = read_tsv_columns(GLUE_DATA / "format_samples_mnli_qqp" / "MNLI" / "dev_matched.tsv", ["gold_label"])
    assert mnli_dev["label"] == gold and set(mnli_dev.column_names) == {"premise", "hypothesis", "label", "idx"}


def test_label_encoding_accepts_file_values_hub_names_and_ids():
    from datasets import Dataset

    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.files import encode_labels

    dataset = Dataset.from_dict({"label": ["contradiction", "entailment", "neutral"]})
    assert encode_labels(dataset, TASKS["mnli"], "f")["label"] == [2, 0, 1]  # the Hub's order e/n/c
    dataset = Dataset.from_dict({"label": ["equivalent", "0", "1"]})
    assert encode_labels(dataset, TASKS["mrpc"], "f")["label"] == [1, 0, 1]
    assert encode_labels(Dataset.from_dict({"label": [1, 0]}), TASKS["cola"], "f")["label"] == [1, 0]
    assert encode_labels(Dataset.from_dict({"label": ["4.750", "2"]}), TASKS["stsb"], "f")["label"] == [4.75, 2.0]


# ------------------------------------------------------------------------------------------------------------
# Bad input


BAD_FILES = [  # task, flag, file name, content, the one line it stops with
    pytest.param(
        "mrpc",
        "train_file",
        "train.csv",
        "sentence1,sentence2\na,b\n",
        r"train\.csv \(train\): missing the label column 'label'.*Quality",
        id="no-label-column",
    ),
    pytest.param(
        "mnli",
        "validation_file",
        "dev.jsonl",
        '{"premise": "a", "hypothesis": "b", "label": "entailment"}\n'
        '{"premise": "a", "hypothesis": "b", "label": "maybe"}\n',
        r"dev\.jsonl \(validation_matched\): row 1: unknown label 'maybe'",
        id="unknown-label",
    ),
    pytest.param(
        "cola",
        "validation_file",
        "dev.csv",
        "sentence,label\nok,1\nbad,2\n",
        r"dev\.csv \(validation\): row 1: unknown label 2",
        id="label-out-of-range",
    ),
    pytest.param(
        "sst2",
        "train_file",
        "nt.csv",
        "text,label\na,1\n",
        r"nt\.csv \(train\): missing column\(s\) \['sentence'\]",
        id="no-text-column",
    ),
    pytest.param(
        "stsb",
        "train_file",
        "sts.csv",
        "sentence1,sentence2,label\na,b,high\n",
        r"sts\.csv \(train\): row 0: label 'high' is not a similarity score",
        id="not-a-score",
    ),
    pytest.param(
        "stsb",
        "train_file",
        "sts.csv",
        "sentence1,sentence2,label\na,b,4.2\nc,d,7.5\n",
        r"sts\.csv \(train\): row 1: label 7\.5 is not a similarity score \(a number, 0-5\)",
        id="score-out-of-range",
    ),
    pytest.param("rte", "train_file", "empty.tsv", "", r"empty\.tsv: the file is empty", id="empty-tsv"),
    pytest.param("rte", "train_file", "empty.csv", "\n", r"empty\.csv: the file is empty", id="empty-csv"),
    pytest.param("rte", "train_file", "empty.jsonl", "  \n", r"empty\.jsonl: the file is empty", id="empty-jsonl"),
    pytest.param(
        "sst2",
        "train_file",
        "broken.jsonl",
        '{"sentence": "fine", "label": 1}\n{"sentence": "no closing brace"\n',
        r"broken\.jsonl: could not be read as json",
        id="broken-json",
    ),
    pytest.param(
        "sst2",
        "train_file",
        "latin1.tsv",
        "sentence\tlabel\ncaf\xe9 au lait\t1\n".encode("latin-1"),
        r"latin1\.tsv: not UTF-8 text",
        id="not-utf8",
    ),
]


@pytest.mark.parametrize("task_name, flag, name, content, message", BAD_FILES)
def test_bad_input_stops_with_file_and_field(tmp_path, task_name, flag, name, content, message):
    from albert_hf.tasks.glue.data import GlueDataArguments
    from albert_hf.tasks.glue.files import load_raw_splits, prepare_splits

    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError, match=message):
        data_args = GlueDataArguments(task_name=task_name, **{flag: str(path)})
        task = data_args.task_data.task
        prepare_splits(*load_raw_splits(data_args, task, {flag.split("_")[0]}), task)


def test_a_bad_task_extension_or_header_only_file_stops_with_its_name(tmp_path):
    from albert_hf.tasks.glue.data import GlueDataArguments
    from albert_hf.tasks.glue.definition import get_task
    from albert_hf.tasks.glue.files import read_glue_tsv

    header_only = tmp_path / "header.tsv"
    header_only.write_text("index\tsentence1\tsentence2\tlabel\n")
    with pytest.raises(ValueError, match=r"header\.tsv: no data rows"):
        read_glue_tsv(header_only, get_task("rte"))
    with pytest.raises(ValueError, match=r"Unknown GLUE task 'sst-5'.*cola, sst2"):
        get_task("sst-5")
    with pytest.raises(ValueError, match=r"--train_file data\.txt: unsupported extension"):
        GlueDataArguments(task_name="rte", train_file="data.txt")


def test_malformed_tsv_rows_are_skipped_and_counted(tmp_path, caplog):
    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.files import read_glue_tsv

    path = tmp_path / "train.tsv"
    write_tsv(
        path,
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        [(1, 1, 2, "a?", "b?", 0), (2, 3, 4, "broken line"), (3, 5, 6, "c?", "d?", 1)],
    )
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        dataset = read_glue_tsv(path, TASKS["qqp"])
    assert dataset["idx"] == [1, 3] and dataset["label"] == ["0", "1"]
    assert "skipped 1 malformed row(s) (expected 6 tab-separated fields), first at line 3" in caplog.text


def test_hub_by_task_name_offline_points_to_local_files(caplog, tmp_path):
    from albert_hf.tasks.glue.data import GlueDataArguments
    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.files import load_raw_splits, prepare_splits

    # No local file: the Hub dataset is asked for, which the offline test environment refuses at once.
    with pytest.raises(InputError, match=r"nyu-mll/glue(.|\n)*Offline\? Pass --data_dir"):
        load_raw_splits(GlueDataArguments(task_name="mrpc"), TASKS["mrpc"], {"train"})
    path = tmp_path / "train.csv"
    path.write_text("question1,question2,label\nWhy?,,0\nHow?,What?,1\n")
    data_args = GlueDataArguments(task_name="qqp", train_file=str(path))
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        splits = prepare_splits(*load_raw_splits(data_args, TASKS["qqp"], {"train"}), TASKS["qqp"])
    assert splits["train"]["label"] == [0, 1]
    assert "1 empty value(s) in column 'question2', read as empty text" in caplog.text


# ------------------------------------------------------------------------------------------------------------
# --paper_hparams and submission files


def parse(argv):
    from albert_hf.tasks.finetuning import parse_arguments
    from albert_hf.tasks.glue.data import GlueDataArguments
    from albert_hf.tasks.paper_hparams import apply_paper_hparams

    model_args, data_args, training_args = parse_arguments(GlueDataArguments, argv)
    return apply_paper_hparams(*data_args.task_data.paper_recipe(), model_args, data_args, training_args, argv)[:3]


def test_paper_hparams_set_spec_values_and_keep_explicit_flags(tmp_path):
    base = ["--model_name_or_path", "m", "--output_dir", str(tmp_path), "--paper_hparams"]
    model_args, data_args, args = parse(base + ["--task_name", "qqp"])
    assert (args.learning_rate, args.per_device_train_batch_size, args.max_steps, args.warmup_steps) == (
        5e-5,
        128,
        14000,
        1000,
    )
    assert (data_args.max_seq_length, model_args.hidden_dropout_prob, model_args.classifier_dropout_prob) == (
        512,
        0.1,
        0.1,
    )
    # the paper's one "ALBERT DR" is the config's hidden and attention dropout both, as in the official code
    assert model_args.attention_probs_dropout_prob == 0.1
    assert (args.adam_epsilon, args.weight_decay, args.max_grad_norm, args.official_optimizer) == (
        1e-6,
        0.01,
        1.0,
        True,
    )
    # Explicit flags win (also spelt with '=' and dashes); the total batch 32 is split over accumulation steps.
    model_args, data_args, args = parse(
        base
        + [
            "--task_name",
            "mrpc",
            "--learning-rate=1e-4",
            "--max_seq_length",
            "64",
            "--gradient_accumulation_steps",
            "4",
        ]
    )
    assert (args.learning_rate, data_args.max_seq_length) == (1e-4, 64)
    assert (args.per_device_train_batch_size, args.max_steps, args.warmup_steps) == (8, 800, 200)
    assert (model_args.hidden_dropout_prob, model_args.attention_probs_dropout_prob) == (0.0, 0.0)
    assert json.loads((tmp_path / "paper_hparams.json").read_text()) == {
        "learning_rate": 1e-4,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 4,
        "max_steps": 800,
        "warmup_steps": 200,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "max_seq_length": 64,
        "classifier_dropout_prob": 0.1,
        "official_optimizer": True,
        "adam_epsilon": 1e-6,
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
    }
    # An explicit epoch count replaces the paper's step count.
    _, _, args = parse(base + ["--task_name", "cola", "--num_train_epochs", "2"])
    assert (args.max_steps, args.learning_rate, args.per_device_train_batch_size) == (-1, 1e-5, 16)
    # A run that trains and evaluates gets the official schedule: a checkpoint scored on dev every 200 steps, the
    # best one (by MCC for CoLA) loaded at the end; paper_hparams.json names it.
    _, _, args = parse(base + ["--task_name", "cola", "--do_train", "--do_eval"])
    assert (
        args.eval_strategy,
        args.eval_steps,
        args.save_strategy,
        args.save_steps,
        args.load_best_model_at_end,
        args.save_total_limit,
    ) == ("steps", 200, "steps", 200, True, 2)
    written = json.loads((tmp_path / "paper_hparams.json").read_text())
    assert (written["eval_steps"], written["load_best_model_at_end"]) == (200, True)
    with pytest.raises(ValueError, match="no recipe for wnli"):
        parse(base + ["--task_name", "wnli"])


def test_write_submission_uses_glue_label_values(tmp_path):
    from albert_hf.tasks.glue.definition import TASKS
    from albert_hf.tasks.glue.files import write_submission

    logits = np.array([[0.1, 0.9, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
    path = write_submission(tmp_path / "MNLI-m.tsv", TASKS["mnli"], [5, 6, 7], logits)
    assert path.read_text() == "index\tprediction\n5\tneutral\n6\tentailment\n7\tcontradiction\n"
    path = write_submission(tmp_path / "CoLA.tsv", TASKS["cola"], [0, 1], np.array([[0.0, 1.0], [1.0, 0.0]]))
    assert path.read_text() == "index\tprediction\n0\t1\n1\t0\n"
    path = write_submission(tmp_path / "STS-B.tsv", TASKS["stsb"], range(2), np.array([[3.14159], [-0.5]]))
    assert path.read_text() == "index\tprediction\n0\t3.142\n1\t-0.500\n"


# ------------------------------------------------------------------------------------------------------------
# End to end (in-process main(argv), tiny model, a few steps)


def submission_rows(path):
    with open(path, encoding="utf-8") as file:
        return list(csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE))


EXPECTED_KEYS = {
    "cola": {"eval_matthews_correlation"},
    "stsb": {"eval_pearson", "eval_spearmanr"},
    "mrpc": {"eval_accuracy", "eval_f1"},
    "qqp": {"eval_accuracy", "eval_f1"},
}


@pytest.mark.parametrize("task_name", ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"])
@pytest.mark.trains
def test_end_to_end_every_task_from_original_tsv_folders(task_name, glue_root, tiny_checkpoint, tmp_path):
    from albert_hf.tasks.glue.definition import TASKS

    task = TASKS[task_name]
    run_glue(
        glue_args(
            tiny_checkpoint,
            tmp_path,
            "--task_name",
            task_name,
            "--data_dir",
            glue_root,
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--max_steps",
            2,
        )
    )
    # Flat, as transformers' run_glue.py writes it; MNLI's mismatched dev set has the keys suffixed "_mm".
    results = json.loads((tmp_path / "eval_results.json").read_text())
    suffixes = ["", "_mm"] if task_name == "mnli" else [""]
    for suffix in suffixes:
        assert results[f"eval_samples{suffix}"] == 8
        assert {key + suffix for key in EXPECTED_KEYS.get(task_name, {"eval_accuracy"})} <= set(results)
    assert all(key.startswith("eval_") or key.startswith("epoch") for key in results)
    assert any(key.endswith("_mm") for key in results) == (task_name == "mnli")
    # The GLUE test files have no labels: no predict metrics; all_results.json merges train and eval.
    assert not (tmp_path / "predict_results.json").exists()
    train_results = json.loads((tmp_path / "train_results.json").read_text())
    assert json.loads((tmp_path / "all_results.json").read_text()) == {**train_results, **results}
    for split, name in task.submission_files.items():
        rows = submission_rows(tmp_path / name)
        assert rows[0] == ["index", "prediction"] and len(rows) == 5
        # Test-file ids are kept (the fixtures number them 10.., MNLI 0..; QQP's come from its id column).
        assert [row[0] for row in rows[1:]] == [str(i) for i in (range(4) if task_name == "mnli" else range(10, 14))]
        for _, prediction in rows[1:]:
            if task.is_regression:
                float(prediction)
            else:
                assert prediction in task.labels
    config = json.loads((tmp_path / "config.json").read_text())
    if task.is_regression:
        assert config["problem_type"] == "regression"
    else:
        assert list(config["id2label"].values()) == list(task.label_names)
    assert (tmp_path / "README.md").read_text().count("nyu-mll/glue") >= 1
    if task_name == "mrpc":
        check_tokenizer_loads_without_prompt(tmp_path)


@pytest.mark.trains
def test_paper_hparams_run_sets_both_dropouts_and_records_the_recipe(glue_root, tiny_checkpoint, tmp_path):
    """RTE's row has ALBERT DR 0.1 (the tiny model's config has 0): the trained model's config has it as hidden
    and attention dropout, and paper_hparams.json and the card hold what the run used."""
    assert json.loads((Path(tiny_checkpoint) / "config.json").read_text())["attention_probs_dropout_prob"] == 0.0
    run_glue(
        glue_args(
            tiny_checkpoint,
            tmp_path,
            "--task_name",
            "rte",
            "--data_dir",
            glue_root,
            "--do_train",
            "--paper_hparams",
            "--max_steps",
            2,
            "--warmup_steps",
            1,
        )
    )
    config = json.loads((tmp_path / "config.json").read_text())
    assert (
        config["hidden_dropout_prob"],
        config["attention_probs_dropout_prob"],
        config["classifier_dropout_prob"],
    ) == (0.1, 0.1, 0.1)
    # RTE: lr 3e-5, batch 32, 800 steps, 200 warm-up; glue_args and the flags above give lr, batch, steps, warm-up
    assert json.loads((tmp_path / "paper_hparams.json").read_text()) == {
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": 2,
        "warmup_steps": 1,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_seq_length": 32,
        "classifier_dropout_prob": 0.1,
        "official_optimizer": True,
        "adam_epsilon": 1e-6,
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
    }
    card = (tmp_path / "README.md").read_text()
    assert "## Recipe" in card and "ALBERT's fine-tuning recipe for rte" in card
    assert "| learning_rate | 0.001 (explicit) |" in card and "| attention_probs_dropout_prob | 0.1 |" in card
    assert "AdamWeightDecay (official" in card


@pytest.mark.trains
def test_end_to_end_csv_and_jsonl_files_then_ax_with_the_mnli_model(tiny_checkpoint, tmp_path):
    rows = [
        {"premise": a, "hypothesis": b, "label": ["entailment", "neutral", "contradiction"][i % 3], "idx": i}
        for i, (a, b) in enumerate(PAIRS * 2)
    ]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in rows))
    dev = tmp_path / "dev.csv"
    with dev.open("w", newline="") as file:
        writer = csv.DictWriter(file, ["premise", "hypothesis", "label"])
        writer.writeheader()
        writer.writerows({k: row[k] for k in ("premise", "hypothesis", "label")} for row in rows)
    test = tmp_path / "test.json"
    test.write_text(json.dumps([{"premise": r["premise"], "hypothesis": r["hypothesis"]} for r in rows[:3]]))
    mnli_dir = tmp_path / "mnli"
    run_glue(
        glue_args(
            tiny_checkpoint,
            mnli_dir,
            "--task_name",
            "mnli",
            "--train_file",
            train,
            "--validation_file",
            dev,
            "--validation_mismatched_file",
            dev,
            "--test_file",
            test,
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--pad_to_max_length",
            "false",
            "--max_steps",
            2,
        )
    )
    results = json.loads((mnli_dir / "eval_results.json").read_text())
    assert results["eval_accuracy"] == results["eval_accuracy_mm"]
    assert [row[0] for row in submission_rows(mnli_dir / "MNLI-m.tsv")[1:]] == ["0", "1", "2"]  # positions

    ax_folder = tmp_path / "glue"
    shutil.copytree(write_glue_folders(tmp_path / "all") / "diagnostic", ax_folder / "diagnostic")
    run_glue(
        [
            "--model_name_or_path",
            mnli_dir,
            "--task_name",
            "ax",
            "--data_dir",
            ax_folder,
            "--do_predict",
            "--output_dir",
            tmp_path / "ax",
            "--max_seq_length",
            32,
            "--report_to",
            "none",
        ]
    )
    ax_rows = submission_rows(tmp_path / "ax" / "AX.tsv")
    assert len(ax_rows) == 5 and {row[1] for row in ax_rows[1:]} <= {"entailment", "neutral", "contradiction"}
    with pytest.raises(InputError, match="ax is the GLUE diagnostic set"):
        run_glue(
            [
                "--model_name_or_path",
                mnli_dir,
                "--task_name",
                "ax",
                "--data_dir",
                ax_folder,
                "--do_eval",
                "--output_dir",
                tmp_path / "ax2",
            ]
        )
    # An MNLI model evaluated on RTE would be silently relabelled: refused.
    rte_dev = tmp_path / "rte.csv"
    rte_dev.write_text("sentence1,sentence2,label\nA cat sat.,A cat sits.,entailment\n")
    with pytest.raises(ValueError, match=r"labels \['entailment', 'neutral', 'contradiction'\] are not those of rte"):
        run_glue(
            [
                "--model_name_or_path",
                mnli_dir,
                "--task_name",
                "rte",
                "--validation_file",
                rte_dev,
                "--do_eval",
                "--output_dir",
                tmp_path / "rte",
            ]
        )


@pytest.mark.trains
def test_labelled_test_files_are_scored_into_predict_results_and_all_results_has_every_result(
    tiny_checkpoint, tmp_path
):
    """Test files WITH labels (GLUE's own have none) are scored as transformers' run_glue.py does: flat
    predict_results.json, MNLI's mismatched set with keys suffixed "_mm"; all_results.json holds train, eval and
    predict. The accuracies are recomputed here from the submission files and the labels."""
    nli = ["entailment", "neutral", "contradiction"]
    rows = [{"premise": a, "hypothesis": b, "label": nli[i % 3]} for i, (a, b) in enumerate(PAIRS * 3)]
    files = {}
    for name, part in (("train", rows), ("dev", rows[:8]), ("test", rows[:7]), ("test_mm", rows[5:])):
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(row) + "\n" for row in part))
    out = tmp_path / "out"
    run_glue(
        glue_args(
            tiny_checkpoint,
            out,
            "--task_name",
            "mnli",
            "--train_file",
            files["train"],
            "--validation_file",
            files["dev"],
            "--validation_mismatched_file",
            files["dev"],
            "--test_file",
            files["test"],
            "--test_mismatched_file",
            files["test_mm"],
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--max_steps",
            3,
        )
    )
    predicted = {name: [row[1] for row in submission_rows(out / name)[1:]] for name in ("MNLI-m.tsv", "MNLI-mm.tsv")}
    expected_accuracy = {
        "": np.mean([p == row["label"] for p, row in zip(predicted["MNLI-m.tsv"], rows[:7])]),
        "_mm": np.mean([p == row["label"] for p, row in zip(predicted["MNLI-mm.tsv"], rows[5:])]),
    }
    results = {kind: json.loads((out / f"{kind}_results.json").read_text()) for kind in ("train", "eval", "predict")}
    for suffix, accuracy in expected_accuracy.items():
        assert results["predict"][f"predict_accuracy{suffix}"] == pytest.approx(accuracy)
        assert f"predict_loss{suffix}" in results["predict"]
    assert (results["predict"]["predict_samples"], results["predict"]["predict_samples_mm"]) == (7, 7)
    assert all(key.startswith("predict_") for key in results["predict"])
    assert results["eval"]["eval_samples"] == results["eval"]["eval_samples_mm"] == 8
    assert results["train"]["train_samples"] == 12
    assert json.loads((out / "all_results.json").read_text()) == {
        **results["train"],
        **results["eval"],
        **results["predict"],
    }


def test_test_set_labels_are_used_only_when_every_row_has_one(tmp_path, caplog):
    from datasets import Dataset

    from albert_hf.tasks.glue import evaluation as script
    from albert_hf.tasks.glue.definition import TASKS

    rte = TASKS["rte"]
    assert script.labels_of_test_set(Dataset.from_dict({"sentence1": ["a", "b"]}), rte, "t.tsv") is None
    assert script.labels_of_test_set(Dataset.from_dict({"label": [-1, -1]}), rte, "hub test") is None  # the Hub's
    assert script.labels_of_test_set(Dataset.from_dict({"label": ["not_entailment", "entailment"]}), rte, "t.csv") == [
        1,
        0,
    ]
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        assert script.labels_of_test_set(Dataset.from_dict({"label": ["entailment", ""]}), rte, "part.csv") is None
    assert "part.csv: 1 of 2 rows have no label" in caplog.text
    with pytest.raises(ValueError, match=r"bad\.csv: row 1: unknown label 'maybe'"):
        script.labels_of_test_set(Dataset.from_dict({"label": ["entailment", "maybe"]}), rte, "bad.csv")


def test_missing_split_and_nothing_to_do_stop_early(tmp_path):
    train = tmp_path / "train.csv"
    train.write_text("sentence,label\ngood,1\nbad,0\n")
    base = ["--model_name_or_path", "unused", "--task_name", "sst2", "--output_dir", tmp_path / "out"]
    with pytest.raises(InputError, match=r"--do_eval needs validation data for sst2.*\['dev\.tsv'\]"):
        run_glue(base + ["--train_file", train, "--do_eval"])
    with pytest.raises(InputError, match="nothing to do"):
        run_glue(base + ["--train_file", train])


def independent_predictions(model_dir, first, second, max_seq_length, batch_size=16):
    """Logits of the saved model on raw sentence pairs, tokenized here, outside the script. The batches have the
    script's shape (padded to max_seq_length, 16 rows): a 4-step model's logits nearly tie, and another shape runs
    other kernels whose rounding could flip an argmax or a rank."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from albert_hf import AlbertHFForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AlbertHFForSequenceClassification.from_pretrained(model_dir).eval()
    batch = tokenizer(
        first,
        second,
        truncation=True,
        max_length=max_seq_length,
        padding="max_length",
        return_token_type_ids=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        return np.concatenate(
            [
                model(**{k: v[i : i + batch_size] for k, v in batch.items()}).logits.numpy()
                for i in range(0, len(first), batch_size)
            ]
        )


@pytest.mark.parametrize("task_name,folder", [("mrpc", "MRPC"), ("stsb", "STS-B"), ("cola", "CoLA")])
@pytest.mark.trains
@pytest.mark.rounding
def test_end_to_end_on_real_glue_files(task_name, folder, tiny_checkpoint, tmp_path, caplog):
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    shared_data("glue", folder)
    caplog.set_level(logging.INFO, logger="albert_hf")  # the glue job and --paper_hparams (recipe.py) log
    # --paper_hparams with the size flags given explicitly: the official optimizer and schedule run, the rest is
    # kept small.
    run_glue(
        glue_args(
            tiny_checkpoint,
            tmp_path,
            "--task_name",
            task_name,
            "--data_dir",
            GLUE_DATA,
            "--do_train",
            "--do_eval",
            "--do_predict",
            "--max_train_samples",
            32,
            "--max_eval_samples",
            64,
            "--max_predict_samples",
            16,
            "--paper_hparams",
            "--max_steps",
            4,
            "--warmup_steps",
            2,
            "--logging_steps",
            1,
        )
    )
    # What it set and what it kept is logged.
    assert f"--paper_hparams ({task_name}) set: " in caplog.text and "classifier_dropout_prob=0.1" in caplog.text
    assert (
        "kept your explicit ['learning_rate', 'max_seq_length', 'max_steps', 'per_device_train_batch_size', "
        "'warmup_steps']" in caplog.text
    )
    # The official schedule (ALBERT_SPEC §5.1) with peak 1e-3, 2 warmup steps, 4 steps, decaying from step 0:
    # the lr used at steps 0..3 (what the Trainer logs) is 1e-3 x (0/2, 1/2, 1 - 2/4, 1 - 3/4); transformers'
    # linear schedule would use 1e-3 x (0, 1/2, 1, 1/2).
    state = json.loads((tmp_path / "trainer_state.json").read_text())
    logged = [entry["learning_rate"] for entry in state["log_history"] if "learning_rate" in entry]
    assert logged == pytest.approx([0.0, 5e-4, 5e-4, 2.5e-4])
    metrics = json.loads((tmp_path / "eval_results.json").read_text())
    # Recompute the dev metric from the saved model with sklearn/scipy on the first 64 real dev rows.
    if task_name == "cola":
        _, labels, _, sentences = read_tsv_columns(GLUE_DATA / folder / "dev.tsv", [0, 1, 2, 3], has_header=False)
        logits = independent_predictions(tmp_path, sentences[:64], None, 32)
        gold = [int(label) for label in labels[:64]]
        assert metrics["eval_matthews_correlation"] == pytest.approx(
            matthews_corrcoef(gold, logits.argmax(-1)), abs=1e-6
        )
    elif task_name == "mrpc":
        labels, first, second = read_tsv_columns(GLUE_DATA / folder / "dev.tsv", ["Quality", "#1 String", "#2 String"])
        predicted = independent_predictions(tmp_path, first[:64], second[:64], 32).argmax(-1)
        gold = [int(label) for label in labels[:64]]
        assert metrics["eval_accuracy"] == pytest.approx(accuracy_score(gold, predicted), abs=1e-6)
        assert metrics["eval_f1"] == pytest.approx(f1_score(gold, predicted, zero_division=0.0), abs=1e-6)
    else:
        scores, first, second = read_tsv_columns(GLUE_DATA / folder / "dev.tsv", ["score", "sentence1", "sentence2"])
        predicted = independent_predictions(tmp_path, first[:64], second[:64], 32)[:, 0]
        gold = [float(score) for score in scores[:64]]
        assert metrics["eval_pearson"] == pytest.approx(pearsonr(predicted, gold)[0], abs=1e-4)
        assert metrics["eval_spearmanr"] == pytest.approx(spearmanr(predicted, gold)[0], abs=1e-4)
    rows = submission_rows(tmp_path / {"mrpc": "MRPC.tsv", "stsb": "STS-B.tsv", "cola": "CoLA.tsv"}[task_name])
    assert rows[0] == ["index", "prediction"] and [row[0] for row in rows[1:]] == [str(i) for i in range(16)]
