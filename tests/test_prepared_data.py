"""Preprocess once, train many times: run_pretraining.py --preprocess_only writes the tokenizer and the pairs, and
--prepared_data trains on them with no tokenizing, to the same weights as a run that builds them itself."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from albert_hf.pretraining.job import parse_args
from helpers import run_bounded, subprocess_env
from pretraining_runs import SCRIPT, metrics, untimed

DATA = ["--vocab_size", "500", "--max_seq_length", "64", "--dupe_factor", "1", "--max_eval_samples", "64"]
# --seed seeds the pairs (recorded in the manifest) and, separately, each training run's weights and masks
TRAINING = [
    "--per_device_train_batch_size",
    "8",
    "--logging_steps",
    "2",
    "--max_train_steps",
    "6",
    "--eval_steps",
    "3",
    "--mixed_precision",
    "no",
    "--seed",
    "7",
]


def run(*arguments):
    env = subprocess_env()
    done = run_bounded([sys.executable, SCRIPT, *map(str, arguments)], 300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("prepared") / "data"
    done = run("--preprocess_only", "--output_dir", folder, *DATA, "--seed", "7")
    assert f"in {folder}. Train on them with: run_pretraining.py --prepared_data {folder}" in done.stdout
    return folder


def test_the_prepared_folder_holds_the_tokenizer_the_pairs_and_what_shaped_them(prepared):
    manifest = json.loads((prepared / "prepared_data.json").read_text())
    assert manifest["arguments"]["max_seq_length"] == 64 and manifest["arguments"]["dupe_factor"] == 1
    assert manifest["arguments"]["vocab_size"] == 500 and manifest["arguments"]["task"] == "sop"
    assert manifest["tokenizer_size"] == 500 and manifest["train_pairs"] > 1000
    assert manifest["validation_pairs"] == 64
    assert {"tokenizer.json", "tokenizer_config.json", "pairs"} <= {path.name for path in prepared.iterdir()}
    assert not list(prepared.glob(".tmp-*"))  # moved into place complete
    assert not (prepared / "model.safetensors").exists()  # nothing trained


@pytest.mark.trains
def test_training_on_the_prepared_folder_tokenizes_nothing_and_equals_building_the_pairs(tmp_path, prepared):
    built = tmp_path / "built"
    run("--output_dir", built, *DATA, *TRAINING)
    from_folder = tmp_path / "from_folder"
    done = run("--output_dir", from_folder, "--prepared_data", prepared, *TRAINING)
    assert (
        f"Training on the pairs prepared in {prepared} (no tokenizing); from its manifest: --max_seq_length 64, "
        "--dupe_factor 1, --max_eval_samples 64"
    ) in done.stderr
    for building in ("albert_hf.tokenization", "albert_hf.pretraining.data.pairs", "Splitting and tokenizing"):
        assert building not in done.stderr
    expected, got = load_file(built / "model.safetensors"), load_file(from_folder / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)

    def curve(folder):  # every logged loss and accuracy, training and held-out (the speed aside)
        return untimed(metrics(folder))

    assert curve(from_folder) == curve(built) and len(curve(built)) == 5
    assert (from_folder / "fill_mask_examples.json").is_file()  # the held-out documents came along


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--max_seq_length", "128"],
            "--max_seq_length 128 disagrees with --prepared_data {p}, which was "
            "prepared with --max_seq_length 64: drop the flag, or prepare the data again",
        ),
        (["--task", "nsp"], "--task nsp disagrees with --prepared_data {p}, which was prepared with --task sop"),
        (
            ["--train_files", "corpus/"],
            "--train_files cannot be combined with --prepared_data {p}: the pairs and "
            "the tokenizer come from that folder",
        ),
        (["--vocab_size", "500"], "--vocab_size cannot be combined with --prepared_data {p}"),
        (
            ["--preprocess_only"],
            "pass --preprocess_only (to prepare a folder) or --prepared_data (to train on one), not both",
        ),
    ],
)
def test_arguments_that_disagree_with_the_prepared_folder_stop_with_one_line(tmp_path, prepared, flags, message):
    with pytest.raises(InputError) as stop:
        parse_args(["--output_dir", str(tmp_path / "run"), "--prepared_data", str(prepared), *flags])
    assert str(stop.value).startswith(message.format(p=prepared))


def test_a_folder_that_was_not_prepared_stops_with_one_line(tmp_path):
    with pytest.raises(InputError, match="no prepared_data.json"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--prepared_data", str(tmp_path)])
    with pytest.raises(InputError, match="no such folder"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--prepared_data", str(tmp_path / "missing")])


def test_an_explicit_value_equal_to_the_manifest_is_accepted(tmp_path, prepared):
    args = parse_args(
        ["--output_dir", str(tmp_path / "run"), "--prepared_data", str(prepared), "--max_seq_length", "64"]
    )
    assert args.data.max_seq_length == 64 and args.data.dupe_factor == 1 and "--max_seq_length 64" not in args.adopted


def test_a_stop_signal_while_the_folder_is_moved_into_place_waits_for_the_folder_to_be_complete(
    tmp_path, prepared, monkeypatch
):
    """SIGTERM (the run still has nothing to save) at the first of the moves that put the prepared folder in
    place: the moves finish, the manifest last, and only then does the run stop."""
    import os
    import signal

    from albert_hf.pretraining.data import prepared_data
    from albert_hf.runtime.preemption import StopOnSignal, Stopped

    data = prepared_data.load(prepared)
    arguments = prepared_data.read_manifest(prepared)["arguments"]
    moved, real_replace = [], os.replace

    def replace(source, target):
        if not moved:
            signal.raise_signal(signal.SIGTERM)  # handled here, in the main thread, as a scheduler's would be
        moved.append(os.path.basename(target))
        real_replace(source, target)

    monkeypatch.setattr(prepared_data.os, "replace", replace)
    folder = tmp_path / "again"
    with pytest.raises(Stopped, match="SIGTERM while writing the prepared pairs"):
        with StopOnSignal("writing the prepared pairs"):
            prepared_data.save(data, folder, arguments)
    assert moved[-1] == prepared_data.MANIFEST and len(moved) > 3
    assert sorted(path.name for path in folder.iterdir()) == sorted(path.name for path in prepared.iterdir())
    assert len(prepared_data.load(folder).train_pairs) == len(data.train_pairs)
