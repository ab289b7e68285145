"""recipes/*.yaml: each one read by run_pretraining.py's own argument parser (nothing trained), the paper's recipes
with the paper's values, and the demo recipe the arguments of the demo's flags (`DEMO_FLAGS`)."""

import re

import pytest

from albert_hf.pretraining.job import parse_args
from helpers import REPO

RECIPES = REPO / "recipes"
PAPER = ("base", "large", "xlarge", "xxlarge")
DEMO_FLAGS = [
    "--overwrite_output_dir",
    "--model_config",
    "small",
    "--max_seq_length",
    "64",
    "--learning_rate",
    "5e-3",
    "--adam_beta2",
    "0.98",
    "--max_train_steps",
    "700",
    "--eval_steps",
    "175",
]


def test_every_recipe_is_read_by_the_argument_parser(tmp_path, monkeypatch, tiny_checkpoint):
    monkeypatch.chdir(tmp_path)  # their output_dir is relative: a fresh folder, no earlier run
    recipes = sorted(RECIPES.glob("*.yaml"))
    assert {path.stem for path in recipes} == {"demo", "continue", *PAPER}
    for path in recipes:
        # the continued recipe's model is on the Hub: a local folder of 128 positions stands in (flags after a file win)
        stand_in = ["--model_name_or_path", str(tiny_checkpoint), "--max_seq_length", "128"]
        parse_args([str(path), *(stand_in if path.stem == "continue" else [])])


def test_the_continued_recipe_replays_general_text_beside_the_domain(tmp_path, monkeypatch, tiny_checkpoint):
    monkeypatch.chdir(tmp_path)
    path = RECIPES / "continue.yaml"
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert "model_name_or_path: albert/albert-base-v2" in path.read_text()
    args = parse_args([str(path), "--model_name_or_path", str(tiny_checkpoint), "--max_seq_length", "128"])
    assert [(s.name, s.weight) for s in args.sources.sources] == [("domain", 0.9), ("general", 0.1)]
    assert args.sources.sources[1].dataset_name == "wikimedia/wikipedia"
    flat = args.flat()
    assert (flat["global_batch_size"], flat["max_train_steps"], flat["num_warmup_steps"], flat["optimizer"]) == (
        2048,
        12_500,
        750,
        "lamb",
    )
    assert flat["learning_rate"] == pytest.approx(0.00176 * (2048 / 4096) ** 0.5, rel=0.01)


@pytest.mark.parametrize("name", PAPER)
def test_the_paper_recipes_have_the_paper_values(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    path = RECIPES / f"{name}.yaml"
    processes = int(re.search(r"--num_processes (\d+)", path.read_text()).group(1))  # how its header launches it
    monkeypatch.setenv("WORLD_SIZE", str(processes))  # as that launch sets it: the accumulation follows
    resolved = parse_args([str(path)])
    args = resolved.flat()
    # the paper's two corpora, Wikipedia and books, mixed by size as the paper concatenated them
    assert resolved.sources.names == ("wikipedia", "books") and resolved.sources.alpha == 1.0
    assert resolved.sources.sources[0].dataset_name == "wikimedia/wikipedia" and args["streaming"]
    assert args["global_batch_size"] == 4096
    assert args["per_device_train_batch_size"] * processes * args["gradient_accumulation_steps"] == 4096
    assert tuple(
        args[name]
        for name in (
            "model_config",
            "max_seq_length",
            "optimizer",
            "learning_rate",
            "max_train_steps",
            "num_warmup_steps",
            "max_ngram",
            "max_predictions_per_seq",
        )
    ) == (name, 512, "lamb", 0.00176, 125_000, 3125, 3, 20)


def test_the_demo_recipe_is_what_make_pretrain_passed_as_flags(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_args([str(RECIPES / "demo.yaml")]) == parse_args(DEMO_FLAGS)
    assert "run_pretraining.py recipes/demo.yaml" in (REPO / "Makefile").read_text()
