"""The held-out baselines beside a run's numbers, and training_curves.png (pretraining and fine-tuning)."""

import json

import numpy as np
import pytest
import torch

from albert_hf.reports.baselines import heldout_baselines, with_baselines
from albert_hf.reports.curves import pretraining_curves, trainer_curves
from pretraining_runs import pretrain_runs


def stacked(features):
    return {key: torch.tensor([f[key] for f in features]) for key in features[0]}


def test_baselines_are_the_majority_label_the_most_frequent_piece_and_the_unigram_cross_entropy():
    # a vocabulary of 6; 0 is padding and 5 the mask, both special
    pairs = [
        {
            "input_ids": [2, 2, 5, 3, 0],
            "labels": [-100, -100, 3, -100, -100],
            "attention_mask": [1, 1, 1, 1, 0],
            "sentence_order_label": 1,
        },
        {
            "input_ids": [2, 5, 2, 4, 3],
            "labels": [-100, 2, -100, -100, -100],
            "attention_mask": [1, 1, 1, 1, 1],
            "sentence_order_label": 0,
        },
        {
            "input_ids": [2, 2, 0, 0, 0],
            "labels": [-100, -100, -100, -100, -100],
            "attention_mask": [1, 1, 0, 0, 0],
            "sentence_order_label": 0,
        },
    ]
    # a masked position holds the mask id 5 in input_ids; its piece comes from the labels
    got = heldout_baselines(pairs, stacked, vocab_size=6, special_ids=[0, 5], pair_task="sop")
    # the text's pieces: row 1: 2 2 3 3; row 2: 2 2 2 4 3 (the 5 masks a 2); row 3: 2 2 (padding not counted)
    counts = {2: 2 + 3 + 2, 3: 3, 4: 1}
    total = sum(counts.values())
    assert got["eval_mlm_accuracy_baseline"] == pytest.approx(1 / 2)  # targets 3 and 2; the guess is 2
    expected_loss = -np.mean([np.log((counts[3] + 1) / (total + 6)), np.log((counts[2] + 1) / (total + 6))])
    assert got["eval_mlm_loss_baseline"] == pytest.approx(expected_loss)
    assert got["eval_sop_accuracy_baseline"] == pytest.approx(2 / 3)
    assert "eval_sop_accuracy_baseline" not in heldout_baselines(pairs, stacked, 6, [0, 5], pair_task=None)


def test_the_summary_puts_each_baseline_beside_its_number():
    rows = dict(
        with_baselines(
            {
                "eval_mlm_accuracy": 0.25,
                "eval_mlm_accuracy_baseline": 0.0625,
                "eval_sop_loss": 0.5,
                "eval_sop_accuracy": 0.75,
                "eval_sop_accuracy_baseline": 0.5,
            }
        )
    )
    assert rows == {
        "eval_mlm_accuracy": "0.2500 (always the most frequent piece: 0.0625)",
        "eval_sop_loss": "0.5000",
        "eval_sop_accuracy": "0.7500 (majority label: 0.5000)",
    }


def check_png(path, width, height):
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (height, width)
    assert image[..., :3].std() > 0.05  # lines and text, not a blank canvas
    assert (image[..., :3] < 0.5).mean() > 0.005


def test_curves_are_drawn_from_the_logs(tmp_path):
    rows = [
        {
            "step": s,
            "train_mlm_loss": 8 - s / 10,
            "train_mlm_accuracy": s / 100,
            "train_sop_accuracy": 0.5,
            "lr": 1e-3 * (1 - s / 40),
        }
        for s in range(2, 41, 2)
    ]
    rows += [
        {"step": s, "eval_mlm_loss": 7 - s / 20, "eval_mlm_accuracy": s / 80, "eval_sop_accuracy": 0.6}
        for s in (20, 40)
    ]
    path = pretraining_curves(rows, {"eval_mlm_accuracy_baseline": 0.05}, tmp_path / "p.png", "sop")
    check_png(path, 1680, 340)  # four panels of 4.2 x 3.4 inches at 100 dpi
    assert pretraining_curves([{"step": 1, "lr": 0.1}], {}, tmp_path / "none.png", "sop") is None
    history = [{"step": s, "loss": 1 / s, "learning_rate": 1e-5, "epoch": s / 10} for s in range(1, 20)]
    history += [{"step": 10, "eval_accuracy": 0.6, "eval_runtime": 1.0}, {"step": 19, "eval_accuracy": 0.7}]
    check_png(trainer_curves(history, tmp_path / "t.png"), 3 * 420, 340)  # loss, eval_accuracy, learning rate


@pytest.mark.trains
def test_a_run_ends_with_baselines_in_its_summary_results_and_card_and_draws_its_curves(tmp_path):
    out, quiet = tmp_path / "run", tmp_path / "quiet"
    results, done = pretrain_runs(
        [
            (out, ["--max_train_steps", "4", "--eval_steps", "2"]),
            (quiet, ["--max_train_steps", "2", "--eval_steps", "2", "--no_plots"]),
        ],
        steps_only=False,
    )  # one process: its start-up costs more than these runs
    assert [result["status"] for result in results] == [0, 0], results
    assert "(always the most frequent piece: " in done.stdout and "(majority label: " in done.stdout
    assert "(unigram cross-entropy: " in done.stdout
    results = json.loads((out / "all_results.json").read_text())
    assert {"eval_mlm_accuracy_baseline", "eval_mlm_loss_baseline", "eval_sop_accuracy_baseline"} <= set(results)
    assert 0 < results["eval_mlm_accuracy_baseline"] < 1 and results["eval_mlm_loss_baseline"] > 0
    card = (out / "README.md").read_text()
    assert "| eval_mlm_accuracy_baseline |" in card and "![Training curves](training_curves.png)" in card
    model_index = card.split("---")[1]
    assert "baseline" not in model_index  # the model-index holds the model's own results only
    check_png(out / "training_curves.png", 1680, 340)

    assert not (quiet / "training_curves.png").exists()
    assert "Training curves" not in (quiet / "README.md").read_text()


@pytest.mark.trains
def test_fine_tuning_draws_its_curves_and_the_card_shows_them(tmp_path, tiny_checkpoint):
    from albert_hf.testing.glue_folders import write_glue_folders
    from helpers import glue_args, run_glue

    folder = write_glue_folders(tmp_path / "glue") / "RTE"
    out = tmp_path / "out"
    run_glue(
        glue_args(
            tiny_checkpoint,
            out,
            "--task_name",
            "rte",
            "--data_dir",
            folder,
            "--do_train",
            "--do_eval",
            "--max_steps",
            6,
            "--logging_steps",
            1,
            "--eval_strategy",
            "steps",
            "--eval_steps",
            3,
        )
    )
    check_png(out / "training_curves.png", 4 * 420, 340)  # training loss, eval accuracy and loss, learning rate
    assert "![Training curves](training_curves.png)" in (out / "README.md").read_text()

    quiet = tmp_path / "quiet"
    run_glue(
        glue_args(
            tiny_checkpoint,
            quiet,
            "--task_name",
            "rte",
            "--data_dir",
            folder,
            "--do_train",
            "--max_steps",
            2,
            "--logging_steps",
            1,
            "--no_plots",
        )
    )
    assert not (quiet / "training_curves.png").exists()
