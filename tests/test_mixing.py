"""Pretraining on a mix of sources (--sources): the schedule's shares, a source repeated and its epochs counted, the
per-source rows, held-out metrics, results and card, exact resume (1 process, and 2 -> 1 processes at the same global
batch), weights changed, sources added or dropped at resume without a pair repeated, streaming and prepared data
alike, the plan of --dry_run, and each bad input's one line."""

import json
import re

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from albert_hf.pretraining.data.mixed_pairs import MixedPairs
from albert_hf.pretraining.data.mixture import MixPlan, drawn_counts, tokenizer_sample
from albert_hf.pretraining.data.sources import parse_sources
from albert_hf.pretraining.resolution import parse_args
from data_fixtures import embedded
from helpers import DDP
from pretraining_runs import metrics, pretrain_runs, untimed

TINY_DOCUMENTS = [  # four documents: one held out, three to train on (a few pairs: repeated at weight 0.5)
    " ".join(
        f"The {word} of the harbour was counted at dawn number {i}. Each {word} was a sentence of its own."
        for i in range(3)
    )
    for word in ("lantern", "anchor", "sailor", "gull")
]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """A large source (a jsonl file of the embedded corpus's documents) and a tiny one (a folder of 4 text files)."""
    root = tmp_path_factory.mktemp("corpora")
    with open(root / "big.jsonl", "w") as f:
        for row in embedded().select(range(400)):
            f.write(json.dumps({"body": row["text"]}) + "\n")
    (root / "tiny").mkdir()
    for i, text in enumerate(TINY_DOCUMENTS):
        (root / "tiny" / f"doc{i}.txt").write_text(text + "\n")
    (root / "empty").mkdir()
    (root / "empty" / "nothing.txt").write_text("\n\n")
    (root / "no_rows.jsonl").write_text("")
    return root


def sources(corpora, big=0.5, tiny=0.5, with_tiny=True):
    words = [f"name=big,weight={big},train_files={corpora / 'big.jsonl'},text_column=body"]
    if with_tiny:
        words.append(f"name=tiny,weight={tiny},train_files={corpora / 'tiny'}")
    return ["--sources", *words]


def mix_args(corpora, tokenizer, *extra, **weights):
    return [
        *sources(corpora, **weights),
        "--tokenizer_name",
        str(tokenizer),
        "--max_train_steps",
        "8",
        "--checkpointing_steps",
        "4",
        "--eval_steps",
        "4",
        *extra,
    ]


@pytest.fixture(scope="module")
def mixed_runs(tmp_path_factory, corpora, tiny_checkpoint):
    """Every run the end-to-end tests read, in two launches: two processes (4 pairs each, global batch 8), then
    one process (8 pairs): the reference, its resumes (as it was, with other weights, without a source, from the
    two-process run's checkpoint), streamed and resumed, prepared and trained on."""
    root = tmp_path_factory.mktemp("mixed")
    args = mix_args(corpora, tiny_checkpoint)
    ddp_results, _ = pretrain_runs(
        [(root / "ddp", [*args, "--per_device_train_batch_size", "4"], {}, False)], launcher=DDP
    )
    stream = mix_args(corpora, tiny_checkpoint, "--streaming", "--validation_split_percentage", "0.05")
    ref = root / "ref"
    runs = {
        "ref": (ref, args),
        "resumed": (root / "resumed", [*args, "--resume_from_checkpoint", str(ref / "step_4")]),
        "changed": (
            root / "changed",
            [*mix_args(corpora, tiny_checkpoint, big=0.8, tiny=0.2), "--resume_from_checkpoint", str(ref / "step_4")],
        ),
        "missing": (
            root / "missing",
            [*mix_args(corpora, tiny_checkpoint, with_tiny=False), "--resume_from_checkpoint", str(ref / "step_4")],
        ),
        "dropped": (
            root / "dropped",
            [
                *mix_args(corpora, tiny_checkpoint, with_tiny=False),
                "--drop_sources",
                "tiny",
                "--resume_from_checkpoint",
                str(ref / "step_4"),
            ],
        ),
        "from_ddp": (root / "from_ddp", [*args, "--resume_from_checkpoint", str(root / "ddp" / "step_4")]),
        "stream": (root / "stream", stream),
        "stream_resumed": (
            root / "stream_resumed",
            [*stream, "--resume_from_checkpoint", str(root / "stream" / "step_4")],
        ),
        "prepare": (
            root / "prepared",
            [*sources(corpora), "--tokenizer_name", str(tiny_checkpoint), "--preprocess_only"],
        ),
        "on_prepared": (
            root / "on_prepared",
            [
                "--prepared_data",
                str(root / "prepared"),
                "--max_train_steps",
                "8",
                "--checkpointing_steps",
                "4",
                "--eval_steps",
                "4",
            ],
        ),
        "other_mix": (
            root / "other_mix",
            [
                "--prepared_data",
                str(root / "prepared"),
                *sources(corpora)[:2],
                f"name=web,weight=0.5,train_files={corpora / 'tiny'}",
            ],
        ),
        "plain_from_mix": (
            root / "plain_from_mix",
            ["--tokenizer_name", str(tiny_checkpoint), "--resume_from_checkpoint", str(ref / "step_4")],
        ),
        "empty": (
            root / "empty",
            [*sources(corpora), f"name=empty,weight=1,train_files={corpora / 'empty'}", *args[3:]],
        ),
        "no_rows": (
            root / "no_rows",
            [*sources(corpora), f"name=none,weight=1,train_files={corpora / 'no_rows.jsonl'}", *args[3:]],
        ),
    }
    results, done = pretrain_runs(
        [(out, argv, {}, False, {}, name not in ("on_prepared", "other_mix")) for name, (out, argv) in runs.items()]
    )
    by_name = dict(zip(runs, results))
    return {
        "root": root,
        "corpora": corpora,
        "results": by_name | {"ddp": ddp_results[0]},
        "stderr": done.stderr,
        "stdout": done.stdout,
        **{name: out for name, (out, _) in runs.items()},
        "ddp": root / "ddp",
    }


def check_same_run(run, reference, after_step, atol=1e-6):
    """`run` ended with `reference`'s weights and logged its rows after `after_step`: the same losses, accuracies and
    per-source counts (the times and rates aside)."""
    expected, got = load_file(reference / "model.safetensors"), load_file(run / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=atol, msg=name)
    rows, reference_rows = (
        [row for row in untimed(metrics(folder)) if row["step"] > after_step] for folder in (run, reference)
    )
    assert [row["step"] for row in rows] == [row["step"] for row in reference_rows] and rows
    for row, expected_row in zip(rows, reference_rows):
        assert row.keys() == expected_row.keys()
        for key, value in expected_row.items():
            assert row[key] == pytest.approx(value, rel=1e-5, abs=1e-6), (row["step"], key)


def status(mixed_runs, name):
    return mixed_runs["results"][name]["status"], mixed_runs["results"][name]["line"]


def source_rows(folder):
    """The logged training rows' per-source counts (integers: the data's position, exact)."""
    return [
        {key: row[key] for key in row if key.startswith(("run_pairs_", "pairs_"))}
        for row in metrics(folder)
        if "train_mlm_loss" in row
    ]


# ----------------------------------------------------------------------------------------------------------------
# The schedule


@pytest.mark.quick
@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.9, 0.1), (0.5, 0.3, 0.15, 0.05)])
def test_every_100_steps_each_share_is_within_half_a_point_of_its_weight(weights):
    names = [f"s{i}" for i in range(len(weights))]
    batch = 32
    plan = MixPlan.start(names, dict.fromkeys(names, 10_000), dict(zip(names, weights)), batch)
    per_step = np.array([np.bincount(plan.batch(k * batch, seed=3)[0], minlength=len(names)) for k in range(600)])
    assert (per_step.sum(1) == batch).all()
    for start in range(0, 500):  # every window of 100 consecutive optimizer steps
        share = per_step[start : start + 100].sum(0) / (100 * batch)
        assert np.abs(share - np.array(weights)).max() < 0.005, (start, share)
    orders = [plan.batch(k * batch, seed=3)[0] for k in range(20)]  # the order within a batch is random
    assert sum(bool((np.diff(order) >= 0).all()) for order in orders) < 3


@pytest.mark.quick
def test_the_counts_never_go_back_and_stay_within_one_pair_of_the_weights():
    weights = np.array([0.001, 0.6, 0.399])
    before = np.zeros(3, np.int64)
    for draws in range(5000):
        counts = drawn_counts(weights, draws)
        assert counts.sum() == draws and (counts >= before).all() and (np.abs(counts - weights * draws) <= 1).all()
        before = counts


def pairs_of(count, tag):
    return datasets.Dataset.from_dict({"input_ids": [[tag, i] for i in range(count)]})


def drawn_ids(dataset, start, stop):
    """(source, pair id, epoch) of items start..stop of a MixedPairs."""
    rows = dataset.__getitems__(list(range(start, stop)))
    return [(row["source"], row["input_ids"][1], row["mask_epoch"]) for row in rows]


@pytest.mark.quick
def test_with_weights_changed_and_a_source_added_at_resume_no_pair_repeats_within_its_epoch():
    """Each source's pairs, drawn over two segments (0.5/0.5, then 0.9/0.1 with a third source added), hashed: every
    epoch of a source is each of its pairs exactly once, and its pairs carry that epoch for their masks."""
    sizes = {"a": 37, "b": 11}
    batch = 8
    data = [pairs_of(sizes["a"], 0), pairs_of(sizes["b"], 1)]
    plan = MixPlan.start(["a", "b"], sizes, {"a": 0.5, "b": 0.5}, batch)
    first = MixedPairs(data, plan, seed=5, total_pairs=10**6)
    seen = drawn_ids(first, 0, 24 * batch)
    resumed, line = plan.resumed(
        24 * batch, 24, ["a", "b", "c"], {**sizes, "c": 5}, {"a": 0.9, "b": 0.05, "c": 0.05}, batch
    )
    assert line == "mix changed at step 24: a 0.5 → 0.9, b 0.5 → 0.05, c added at 0.05"
    second = MixedPairs([*data, pairs_of(5, 2)], resumed, seed=5, total_pairs=10**6)
    second.first = 24 * batch
    seen += drawn_ids(second, 0, 40 * batch)
    for index, size in enumerate([sizes["a"], sizes["b"], 5]):
        ids = [(pair, epoch) for source, pair, epoch in seen if source == index]
        full = len(ids) // size
        assert full >= 2, (index, len(ids))
        epochs = [sorted(pair for pair, e in ids if e == epoch) for epoch in range(full + 1)]
        for epoch in range(full):
            assert epochs[epoch] == list(range(size)), (index, epoch)
        assert len(set(epochs[full])) == len(epochs[full]) == len(ids) - full * size  # the open epoch too
        # epoch by epoch: a pair of epoch e + 1 comes only once the batch holding epoch e's last pair has begun
        order = [e for _, e in ids]
        assert all(later >= earlier - 1 for earlier, later in zip(order, order[1:]))
    # b dropped at step 64, given again at step 70: it goes on from its position, in its epoch
    third, _ = resumed.resumed(
        64 * batch, 64, ["a", "c"], {"a": sizes["a"], "c": 5}, {"a": 0.5, "c": 0.5}, batch, dropped=("b",)
    )
    fourth, line = third.resumed(
        70 * batch, 70, ["a", "b", "c"], {**sizes, "c": 5}, {"a": 0.4, "b": 0.3, "c": 0.3}, batch
    )
    assert line == "mix changed at step 70: a 0.5 → 0.4, c 0.5 → 0.3, b added at 0.3"
    assert fourth.segments[-1].offsets["b"] == resumed.drawn(64 * batch)["b"] > 0
    # 64 steps of 8: b gave 12 x 4 + 40 x ~0.4 pairs, a 12 x 4 + 40 x 7.2
    counts = np.bincount([source for source, _, _ in seen], minlength=3)
    assert abs(counts[0] - (96 + 0.9 * 320)) <= 1 and abs(counts[2] - 16) <= 1


@pytest.mark.quick
def test_the_tokenizer_sample_follows_the_weights():
    documents = {
        name: [{"text": f"{name} sentence number {i} is here. And {name} again {i} there."} for i in range(400)]
        for name in ("small", "large")
    }
    layouts = dict.fromkeys(documents, "document_per_file")
    sample, given = tokenizer_sample(documents, {"small": 0.05, "large": 0.95}, layouts, 600, seed=1)
    assert len(sample) == 600 and given == {"small": 30, "large": 570}
    assert sum("small" in s for s in sample) == 30
    assert len(set(sample)) == 600  # a uniform sample, no sentence twice while a source has enough
    _, by_size = tokenizer_sample(
        {"small": documents["small"][:100], "large": documents["large"]}, None, layouts, 10_000, seed=1, alpha=1.0
    )
    assert by_size == {"small": 200, "large": 800}  # 200 and 800 sentences, in proportion: the whole of each


# ----------------------------------------------------------------------------------------------------------------
# Bad input


BAD = [
    (["name=a,weight=0,train_files=X"], "--sources: every source has weight 0 (held out only, never trained on)"),
    (
        ["name=a,weight=-1,train_files=X"],
        "--sources: source 'a': weight -1 must be a finite number >= 0 (0: held out only",
    ),
    (["name=a,weight=heavy,train_files=X"], "--sources: source 'a': weight 'heavy' is not a number, size or size^A"),
    (["name=a,weight=nan,train_files=X"], "--sources: source 'a': weight nan must be a finite number >= 0"),
    (["name=a,weight=1,train_files=X", "name=a,weight=1,train_files=Y"], "--sources: two sources are named a"),
    (
        ["name=a,weight=size^1.5,train_files=X"],
        "--sources: source 'a': weight size^1.5: the temperature's exponent must be a number in [0, 1]",
    ),
    (
        ["name=a,weight=size,train_files=X", "name=b,weight=1,train_files=Y"],
        "--sources: the weights mix a number and size",
    ),
    (["name=a,weight=1,files=X"], "--sources: source 'a': unknown key(s) files"),
    (["name=a,weight=1"], "--sources: source 'a': give one of train_files, dataset_name or prepared_data"),
    (
        ["name=a,weight=1,train_files=X,dataset_name=Y"],
        "give one of train_files, dataset_name or prepared_data, not train_files and dataset_name",
    ),
    (["name=a b,weight=1,train_files=X"], "--sources: source 'a b': needs a name of letters"),
    (["weight=1,train_files=X"], "--sources: source 1: needs a name"),
]


@pytest.mark.quick
@pytest.mark.parametrize("words, line", BAD)
def test_a_bad_source_stops_with_one_line_naming_it(words, line):
    with pytest.raises(InputError) as error:
        parse_sources(words)
    assert line in str(error.value) and "\n" not in str(error.value)


@pytest.mark.quick
@pytest.mark.parametrize(
    "extra, line",
    [
        (
            ["--validation_split_percentage", "0"],
            "source b has weight 0 (held out only): with "
            "--validation_split_percentage 0 nothing of it would be evaluated",
        ),
        (
            ["--preprocess_only"],
            "source b has weight 0 (held out only): --preprocess_only prepares every source's "
            "training pairs; give it its weight when training on the folder",
        ),
    ],
)
def test_a_source_held_out_only_needs_held_out_pairs_and_a_training_run(extra, line, tmp_path):
    sources = ["--sources", "name=a,weight=1,train_files=X", "name=b,weight=0,train_files=X"]
    with pytest.raises(InputError) as error:
        parse_args(["--output_dir", str(tmp_path / "out"), *sources, *extra])
    assert str(error.value) == line


def test_a_recipe_names_its_sources_as_mappings_and_bad_combinations_are_refused(tmp_path, corpora):
    recipe = tmp_path / "mix.yaml"
    recipe.write_text(
        f"sources:\n  - name: books\n    weight: size\n    train_files: [{corpora / 'tiny'}]\n"
        f"  - name: web\n    weight: size\n    train_files: {corpora / 'big.jsonl'}\n"
        f"    text_column: body\noutput_dir: {tmp_path / 'out'}\n"
    )
    args = parse_args([str(recipe)])
    assert args.sources.names == ("books", "web") and args.sources.alpha == 1.0
    assert args.sources.sources[1].text_column == "body" and args.sources.sources[0].train_files == (
        str(corpora / "tiny"),
    )
    out = ["--output_dir", str(tmp_path / "o")]
    for extra, line in [
        (["--train_files", str(corpora / "tiny")], "--train_files names one corpus and --sources several"),
        (["--drop_sources", "web"], "--drop_sources says which sources of a checkpoint a resumed run goes on without"),
    ]:
        with pytest.raises(InputError, match=re.escape(line)):
            parse_args([*out, *sources(corpora), *extra])


# ----------------------------------------------------------------------------------------------------------------
# End to end


@pytest.mark.trains
@pytest.mark.launched
def test_every_run_of_the_mix_ends_as_expected(mixed_runs):
    expected = {name: (0, "") for name in mixed_runs["results"]}
    expected["missing"] = (
        2,
        f"error: source tiny is in --resume_from_checkpoint {mixed_runs['ref'] / 'step_4'} but "
        "not in --sources: give it again, or pass --drop_sources tiny to go on without it",
    )
    root, corpora = mixed_runs["root"], mixed_runs["corpora"]
    expected["other_mix"] = (
        2,
        f"error: --prepared_data {root / 'prepared'} was written for the sources big, tiny "
        f"(train_files {corpora / 'big.jsonl'}; train_files "
        f"{corpora / 'tiny'}), and --sources names another mix: name the same "
        "sources (their weights may change), or prepare the folder again",
    )
    expected["empty"] = (
        2,
        f"error: source empty (train_files {corpora / 'empty'}): No text in 1 "
        f"file(s) under ['{corpora / 'empty'}']: all are empty or binary",
    )
    expected["plain_from_mix"] = (
        2,
        f"error: --resume_from_checkpoint {mixed_runs['ref'] / 'step_4'}: it was "
        "written by a run mixing --sources big, tiny: resume it with its --sources",
    )
    got = {name: status(mixed_runs, name) for name in expected}
    no_rows = got.pop("no_rows")
    assert no_rows[0] == 2 and no_rows[1].startswith(f"error: source none (train_files {corpora}"), no_rows
    expected.pop("no_rows")
    assert got == expected


@pytest.mark.trains
@pytest.mark.launched
def test_a_tiny_source_at_half_the_weight_is_repeated_and_its_epochs_are_counted(mixed_runs):
    ref = mixed_runs["ref"]
    said = re.search(r"tiny: weight 0\.5, (\d+) pairs, 32 pairs drawn, ×([\d.]+) epochs", mixed_runs["stderr"])
    assert said, mixed_runs["stderr"][-3000:]
    size = int(said.group(1))
    assert 3 <= size <= 16  # a handful of pairs: drawn 32 times over the run
    last = [row for row in metrics(ref) if "train_mlm_loss" in row][-1]
    assert last["run_pairs_tiny"] == 32 and last["run_pairs_big"] == 32
    assert last["epochs_tiny"] == pytest.approx(32 / size) and last["epochs_tiny"] > 1.5
    results = json.loads((ref / "all_results.json").read_text())
    assert results["source_tiny_epochs"] == pytest.approx(32 / size) and results["source_tiny_pairs"] == 32
    assert results["source_tiny_share"] == 0.5 and results["source_tiny_weight"] == 0.5


@pytest.mark.trains
@pytest.mark.launched
def test_each_row_carries_each_sources_tokens_and_the_evaluation_each_sources_metrics(mixed_runs):
    ref = mixed_runs["ref"]
    rows = metrics(ref)
    train = [row for row in rows if "train_mlm_loss" in row]
    assert [row["step"] for row in train] == [2, 4, 6, 8]
    for row in train:  # 2 steps of 8 pairs a window: 8 of each source; tokens of real pairs (<= 64 each)
        assert row["pairs_big"] == row["pairs_tiny"] == 8
        assert 8 * 10 < row["tokens_big"] <= 8 * 64 and 8 * 10 < row["tokens_tiny"] <= 8 * 64
    assert sum(row["tokens_big"] for row in train) == train[-1]["run_tokens_big"]
    results = json.loads((ref / "all_results.json").read_text())
    assert results["source_big_tokens"] + results["source_tiny_tokens"] == results["total_tokens"]
    evaluated = [row for row in rows if "eval_mlm_loss" in row]
    assert [row["step"] for row in evaluated] == [4, 8]
    for row in evaluated:
        for name in ("big", "tiny"):
            for metric in ("mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"):
                assert 0 <= row[f"eval_{name}_{metric}"] < 10
        for metric in ("mlm_loss", "mlm_accuracy", "sop_accuracy"):  # the mix's weights: 0.5 and 0.5
            mean = 0.5 * row[f"eval_big_{metric}"] + 0.5 * row[f"eval_tiny_{metric}"]
            assert row[f"eval_{metric}"] == pytest.approx(mean, rel=1e-12)
    assert results["eval_tiny_mlm_accuracy"] == evaluated[-1]["eval_tiny_mlm_accuracy"]
    card = (ref / "README.md").read_text()
    assert re.search(
        r"source tiny \| weight 0\.5, share 0\.5 of the pairs; 32 pairs, [\d,]+ tokens, ×[\d.]+ epochs", card
    ), card
    assert "eval_big_mlm_accuracy" in card and "2 sources mixed" in card
    assert (ref / "training_curves.png").stat().st_size > 10_000


@pytest.mark.trains
@pytest.mark.launched
def test_resumed_two_source_runs_end_with_the_uninterrupted_weights_on_one_process_and_from_two(mixed_runs):
    check_same_run(mixed_runs["resumed"], mixed_runs["ref"], after_step=4)
    assert source_rows(mixed_runs["resumed"]) == source_rows(mixed_runs["ref"])[2:]
    # 2 processes x 4 pairs and 1 x 8: the same global batches, so the same draws
    assert source_rows(mixed_runs["ddp"]) == source_rows(mixed_runs["ref"])
    expected, got = (
        load_file(mixed_runs["ddp"] / "model.safetensors"),
        load_file(mixed_runs["from_ddp"] / "model.safetensors"),
    )
    for name in expected:  # fp32; DDP's reduction order differs from one process's by an ulp or two
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-5, msg=name)
    assert source_rows(mixed_runs["from_ddp"]) == source_rows(mixed_runs["ddp"])[2:]


@pytest.mark.trains
@pytest.mark.launched
def test_weights_changed_or_a_source_dropped_at_resume_are_said_and_followed(mixed_runs):
    stderr = mixed_runs["stderr"]
    assert "mix changed at step 4: big 0.5 → 0.8, tiny 0.5 → 0.2" in stderr
    assert "mix changed at step 4: big 0.5 → 1, tiny dropped (was 0.5)" in stderr
    for row in [row for row in metrics(mixed_runs["changed"]) if "train_mlm_loss" in row]:
        assert row["step"] > 4 and abs(row["pairs_big"] / 16 - 0.8) <= 1 / 16  # 2 steps of 8: 13 or 12 of 16
    state = json.loads((mixed_runs["changed"] / "step_8" / "training_state.json").read_text())
    segments = state["mix"]["segments"]
    assert [s["start"] for s in segments] == [0, 32] and segments[1]["offsets"] == {"big": 16, "tiny": 16}
    assert state["mix"]["drawn"]["big"] == 16 + round(0.8 * 32)
    dropped = [row for row in metrics(mixed_runs["dropped"]) if "train_mlm_loss" in row]
    assert all(row["pairs_big"] == 16 and row.get("pairs_tiny", 0) == 0 for row in dropped)


@pytest.mark.trains
@pytest.mark.launched
def test_a_streamed_mix_resumes_exactly_and_prepared_pairs_train_as_the_built_ones(mixed_runs):
    check_same_run(mixed_runs["stream_resumed"], mixed_runs["stream"], after_step=4)
    assert source_rows(mixed_runs["stream"])[-1]["run_pairs_tiny"] == 32
    manifest = json.loads((mixed_runs["prepare"] / "prepared_data.json").read_text())
    assert [(s["name"], s["weight"]) for s in manifest["sources"]] == [("big", 0.5), ("tiny", 0.5)]
    for entry in manifest["sources"]:
        assert entry["train_pairs"] > 0 and entry["train_tokens"] > 10 * entry["train_pairs"]
        assert entry["validation_pairs"] > 0
    # the pairs the folder holds are the ones the reference built: the same run, to the bit
    expected, got = (
        load_file(mixed_runs["ref"] / "model.safetensors"),
        load_file(mixed_runs["on_prepared"] / "model.safetensors"),
    )
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    assert source_rows(mixed_runs["on_prepared"]) == source_rows(mixed_runs["ref"])


@pytest.mark.trains
def test_dry_run_prints_the_plan_of_each_source(tmp_path, corpora, tiny_checkpoint, capsys):
    from albert_hf.pretraining.job import main

    main(
        [
            "--output_dir",
            str(tmp_path / "out"),
            *mix_args(corpora, tiny_checkpoint),
            "--max_seq_length",
            "64",
            "--dupe_factor",
            "1",
            "--per_device_train_batch_size",
            "8",
            "--max_train_steps",
            "100",
            "--dry_run",
        ]
    )
    printed = capsys.readouterr().out
    assert "sources (2, weights as given; over 100 steps of 8 pairs):" in printed
    big = re.search(r"big: weight 0\.5, ([\d,]+) pairs, 400 pairs drawn, ×([\d.]+) epochs", printed)
    tiny = re.search(r"tiny: weight 0\.5, ([\d,]+) pairs, 400 pairs drawn, ×([\d.]+) epochs", printed)
    assert big and tiny, printed
    assert float(tiny.group(2)) == pytest.approx(400 / int(tiny.group(1)), rel=1e-2)
    assert not (tmp_path / "out").exists()
