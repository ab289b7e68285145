"""examples/reproduce_downstream.py: its smoke run end to end on tiny GLUE files (every result written, finished runs
reused, changed settings rerun), the learning-rate selection and standard-error arithmetic, and the pretraining
flags it adds to reproduce_sop_vs_nsp.py."""

import argparse
import json
import math
from argparse import Namespace

import pytest

from albert_hf.testing.glue_folders import write_glue_folders
from helpers import REPO

METRICS = {
    "sst2": ("accuracy",),
    "cola": ("matthews_correlation",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "rte": ("accuracy",),
}
MAIN = {task: metrics[0] for task, metrics in METRICS.items()}


@pytest.fixture
def reproduction(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import reproduce_downstream

    return reproduce_downstream


def test_learning_rate_selection_and_standard_errors(reproduction):
    # The best mean over seeds wins, not the best single run; a tie goes to the rate listed first.
    runs = {1e-4: [{"accuracy": 0.7}] * 3, 3e-4: [{"accuracy": 0.9}, {"accuracy": 0.5}, {"accuracy": 0.5}]}
    assert reproduction.select_learning_rate(runs, "accuracy") == 1e-4
    assert reproduction.select_learning_rate({3e-4: [{"accuracy": 0.6}], 1e-4: [{"accuracy": 0.6}]}, "accuracy") == 3e-4

    row = reproduction.summarise(
        [{"accuracy": 0.7, "f1": 0.8}, {"accuracy": 0.8, "f1": 0.8}, {"accuracy": 0.9, "f1": 0.8}],
        ("accuracy", "f1"),
        3e-4,
    )
    assert row == pytest.approx(
        {"accuracy": 0.8, "accuracy_std": 0.1, "f1": 0.8, "f1_std": 0.0, "learning_rate": 3e-4, "seeds": 3}
    )
    assert reproduction.summarise([{"pearson": 0.5}], ("pearson",), 1e-4)["pearson_std"] == 0.0

    # GLUE avg: (80 + 20 + 70 + 50 + 60) / 5 = 56; se = sqrt(3^2/3 + 6^2/3 + 4^2/4) / 5 = sqrt(19) / 5.
    rows = {
        "sst2": {"accuracy": 0.8, "accuracy_std": 0.03, "seeds": 3},
        "cola": {"matthews_correlation": 0.2, "matthews_correlation_std": 0.06, "seeds": 3},
        "mrpc": {"accuracy": 0.7, "accuracy_std": 0.0, "f1": 0.1, "f1_std": 0.5, "seeds": 3},
        "stsb": {"pearson": 0.5, "pearson_std": 0.04, "spearmanr": 0.9, "spearmanr_std": 0.0, "seeds": 4},
        "rte": {"accuracy": 0.6, "accuracy_std": 0.0, "seeds": 3},
    }
    average, se = reproduction.average(rows)
    assert average == pytest.approx(56.0) and se == pytest.approx(math.sqrt(19) / 5)

    results = {"a": {"glue_avg": 60.0, "glue_avg_se": 3.0}, "b": {"glue_avg": 50.0, "glue_avg_se": 4.0}}
    assert reproduction.difference(results, "a", "b") == pytest.approx((10.0, 5.0))
    # A constant STS-B prediction has no Pearson correlation: scored 0, as its MCC would be.
    assert reproduction.read_scores({"eval_pearson": math.nan, "eval_spearmanr": 0.25}, "stsb") == {
        "pearson": 0.0,
        "spearmanr": 0.25,
    }
    assert [reproduction.sst2_label(n) for n in (1000, 5000, 20000, 32)] == [
        "sst2_1k",
        "sst2_5k",
        "sst2_20k",
        "sst2_32",
    ]


def test_glue_dir_is_checked_before_any_training(reproduction, tmp_path):
    with pytest.raises(SystemExit, match="--glue_dir is required"):
        reproduction.glue_folder(Namespace(glue_dir=None, smoke=False, output_dir=str(tmp_path)))
    (tmp_path / "glue" / "SST-2").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no CoLA, MRPC, STS-B, RTE folder"):
        reproduction.glue_folder(Namespace(glue_dir=str(tmp_path / "glue"), smoke=False, output_dir=str(tmp_path)))
    # A smoke run without --glue_dir gets the tests' tiny GLUE folders.
    folder = reproduction.glue_folder(Namespace(glue_dir=None, smoke=True, output_dir=str(tmp_path)))
    assert all((folder / name / "dev.tsv").is_file() for name in ("SST-2", "CoLA", "MRPC", "STS-B", "RTE"))


def test_reproduction_passes_optimizer_and_accumulation_only_when_given(tmp_path, monkeypatch):
    import albert_hf.pretraining.job

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import reproduce_sop_vs_nsp as reproduction

    seen = []
    monkeypatch.setattr(albert_hf.pretraining.job, "main", lambda argv: seen.append(argv))
    for extra in ([], ["--optimizer", "adamw", "--gradient_accumulation_steps", "4"]):
        parser = argparse.ArgumentParser()
        reproduction.common_arguments(parser, steps=700, output_dir=str(tmp_path))
        args = parser.parse_args(extra)
        args.model_fields, args.train_files = dict(reproduction.SMALL_MODEL), None
        run_dir = tmp_path / f"run{len(seen)}"
        run_dir.mkdir()  # the stand-in run_pretraining writes nothing into it
        reproduction.pretrain(args, run_dir, task="sop")
        given = seen[-1]
        for flag, value in zip(["--optimizer", "--gradient_accumulation_steps"], ["adamw", "4"]):
            assert given[given.index(flag) + 1] == value if extra else flag not in given


@pytest.mark.trains
@pytest.mark.rounding
def test_smoke_run_writes_every_result_and_reuses_finished_runs(reproduction, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    argv = ["--smoke", "--glue_dir", str(write_glue_folders(tmp_path / "glue")), "--output_dir", str(out)]
    results = reproduction.main(argv)

    saved = json.loads((out / "downstream_results.json").read_text())
    assert saved == results and list(saved) == ["albert_sop", "no_pretraining"]
    rows = [*METRICS, "sst2_32", "sst2_64"]  # the smoke's --sst2_train_sizes 32 64
    for model, row in saved.items():
        assert list(row) == [*rows, "glue_avg", "glue_avg_se", "pretraining"]
        for name in rows:
            metrics = METRICS[name.split("_")[0]]
            assert set(row[name]) == {*metrics, *(f"{m}_std" for m in metrics), "learning_rate", "seeds"}
            assert all(math.isfinite(row[name][m]) and row[name][f"{m}_std"] >= 0 for m in metrics)
            assert (row[name]["learning_rate"], row[name]["seeds"]) == (1e-3, 1)
        assert row["glue_avg"] == pytest.approx(100 * sum(row[task][MAIN[task]] for task in METRICS) / 5)
        assert row["glue_avg_se"] == 0.0  # one seed
        steps = 20 if model == "albert_sop" else 0
        budget = row["pretraining"]
        assert (budget["steps"], budget["tokens"]) == (steps, steps * 16 * 64) and budget["parameters"] > 0
    assert saved["albert_sop"]["pretraining"]["parameters"] == saved["no_pretraining"]["pretraining"]["parameters"]

    points = json.loads((out / "downstream_curve.json").read_text())
    assert [(p["steps"], p["run"]) for p in points] == [
        (0, "no_pretraining"),
        (10, "albert_sop_steps10"),
        (20, "albert_sop"),
    ]
    assert points[0]["tokens"] < points[1]["tokens"] < points[2]["tokens"]
    assert all(list(p["tasks"]) == ["sst2", "mrpc", "stsb"] and math.isfinite(p["score"]) for p in points)
    assert points[2]["tasks"]["sst2"] == saved["albert_sop"]["sst2"]  # the same runs, reused
    probes = json.loads((out / "fill_mask_probes.json").read_text())
    assert list(probes) == ["no_pretraining", "albert_sop_steps10", "albert_sop"]  # by pretraining budget
    for examples in probes.values():
        assert [e["true_word"] for e in examples] == ["door", "wine", "nation", "sea"]
        assert all(e["masked_sentence"].count("[MASK]") == 1 and len(e["predictions"]) == 5 for e in examples)
    printed = capsys.readouterr().out
    for line in (
        "| albert_sop | ",
        "| no_pretraining | ",
        "Dose-response",
        "| 10 | ",
        "sst2_64 (N=64)",
        "too slow on 2 cores",
        "goal (albert_sop beats no_pretraining",
    ):
        assert line in printed
    assert " MET " in printed.splitlines()[-1] or " not met " in printed.splitlines()[-1]

    # Again: every run is finished, so nothing is pretrained, initialised or fine-tuned.
    import albert_hf.pretraining.job
    import run_glue

    calls = []
    monkeypatch.setattr(albert_hf.pretraining.job, "main", lambda argv: calls.append(argv))
    monkeypatch.setattr(run_glue, "main", lambda argv: calls.append(argv))
    weights = out / "no_pretraining" / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert reproduction.main(argv) == saved
    assert calls == [] and weights.stat().st_mtime_ns == written

    # Changed fine-tuning settings: every fine-tuning run again (once per run folder), no pretraining.
    reproduction.main([*argv, "--num_train_epochs", "2"])
    finetuned = list((out / "finetune").glob("*/*/lr*"))
    assert len(calls) == len({tuple(argv) for argv in calls}) == len(finetuned) == 15
    assert all(argv[argv.index("--num_train_epochs") + 1] == "2" for argv in calls)


@pytest.mark.trains
@pytest.mark.rounding
def test_gpu_mode_at_smoke_size_writes_curve_pairs_gap_and_timings(reproduction, tmp_path, capsys):
    # --gpu's pipeline on the CPU at smoke size (20 steps, one task, one seed): the shape of what it writes and
    # prints, not its numbers.
    out = tmp_path / "out"
    argv = [
        "--gpu",
        "--smoke",
        "--glue_tasks",
        "rte",
        "--glue_dir",
        str(write_glue_folders(tmp_path / "glue")),
        "--output_dir",
        str(out),
    ]
    results = reproduction.main(argv)
    saved = json.loads((out / "gpu_results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert set(saved) == {"settings", "pretraining", "runs", "skipped", "tasks", "average", "timings"}

    pretraining = saved["pretraining"]
    assert (pretraining["steps"], pretraining["tokens"]) == (20, 20 * 16 * 64) and pretraining["parameters"] > 0
    assert pretraining["tokens_per_second"] > 0
    # --eval_points 4 over 20 steps: held-out MLM and SOP every 5 steps, against the tokens seen
    assert [(p["step"], p["tokens"]) for p in pretraining["curve"]] == [(s, s * 16 * 64) for s in (5, 10, 15, 20)]
    assert all(0 <= p["mlm_accuracy"] <= 1 and 0 <= p["sop_accuracy"] <= 1 for p in pretraining["curve"])
    assert saved["settings"]["model"]["hidden_size"] == 64  # --smoke's model; --gpu alone: BERT-medium's 512

    for model in ("albert_sop", "no_pretraining"):
        assert [run["seed"] for run in saved["runs"][model]["rte"]] == [1]
        row = saved["tasks"]["rte"][model]
        assert set(row) == {"accuracy", "accuracy_std", "accuracy_se", "learning_rate", "seeds"}
        assert row["seeds"] == 1 and row["learning_rate"] == 1e-3
        assert set(saved["average"][model]) == {"glue_avg", "glue_avg_se"}
    gap = saved["tasks"]["rte"]["gap"]
    assert gap == pytest.approx(
        100 * (saved["tasks"]["rte"]["albert_sop"]["accuracy"] - saved["tasks"]["rte"]["no_pretraining"]["accuracy"])
    )
    assert saved["average"]["tasks"] == ["rte"] and saved["average"]["gap"] == pytest.approx(gap)
    assert isinstance(saved["average"]["exceeds_2se"], bool) and saved["skipped"] == []
    timings = saved["timings"]
    for phase in (
        "tokenizer_and_pairs_seconds",
        "pretraining_loop_seconds",
        "random_init_seconds",
        "finetuning_seconds",
        "total_seconds",
    ):
        assert timings[phase] >= 0
    assert timings["total_seconds"] >= timings["pretraining_phase_seconds"] + timings["finetuning_seconds"]

    printed = capsys.readouterr().out
    for line in (
        "=== GPU mode",
        "| step | tokens | held-out MLM acc | held-out SOP acc |",
        "| 20 | 20,480 | ",
        "real tokens/s",
        "| RTE acc | ",
        "| GLUE avg (rte) | ",
        "wall times: tokenizer + pairs",
        "skipped runs (deadline 6.5 min): none",
    ):
        assert line in printed
    assert " MET " in printed.splitlines()[-1] or " not met " in printed.splitlines()[-1]

    # Past the deadline: pretraining is reused, every fine-tuning run is skipped and named, the table still comes.
    results = reproduction.main([*argv, "--deadline_minutes", "0"])
    assert results["skipped"] == ["albert_sop rte seed 1", "no_pretraining rte seed 1"]
    assert results["timings"]["pretraining_reused"] and results["average"] == {}
    saved = json.loads((out / "gpu_results.json").read_text())
    assert saved["skipped"] == results["skipped"] and saved["runs"]["albert_sop"]["rte"] == []
    printed = capsys.readouterr().out.splitlines()
    assert "skipped runs (deadline 0 min): albert_sop rte seed 1, no_pretraining rte seed 1" in printed
    assert printed[-1].endswith("not evaluated (no task finished for both models)")


def test_gpu_mode_defaults_and_one_learning_rate(reproduction):
    args = reproduction.parse_arguments(["--gpu"])
    assert (args.max_train_steps, args.batch_size, args.max_seq_length) == (2000, 256, 128)
    assert (args.finetune_learning_rates, args.finetune_seeds, args.deadline_minutes) == ([1e-4], [1, 2, 3], 6.5)
    assert reproduction.parse_arguments(["--gpu", "--max_train_steps", "500"]).max_train_steps == 500
    with pytest.raises(SystemExit, match="one learning rate"):
        reproduction.parse_arguments(["--gpu", "--finetune_learning_rates", "1e-4", "3e-4"])
