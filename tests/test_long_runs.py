"""Runs that can go on: the WSD schedule against its formula, a run extended from its stable phase against the longer
plan, decay branches (resumed exactly, and equal to a run planned to their length), the refusals, and averaged
checkpoints (the mean element by element, the refusals, a fresh process without albert_hf loading the average).

One module fixture trains the tiny runs, one after the other in one process (`pretrain_runs`):
- long: wsd, 16 steps (warm-up 2, the peak to step 12, decay 4), a checkpoint every 2 steps, --average_last 3;
- short: the same planned for 12 steps (the peak to step 8);
- extended: short's step_8 resumed with --max_train_steps 16: ends as long;
- branch: a decay of 4 steps from long's step_8: ends at step 12 as short;
- branch_resumed: the branch resumed from its own step_10: ends as the branch;
- official: the official schedule, 8 steps, for the refusals;
- in_place: short again, then extended to 16 steps in its own folder;
- and three resumes refused once their checkpoint's files are checked.
"""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file

from helpers import run_python
from pretraining_runs import FAST, check_same_weights_and_curve, metrics, pretrain_runs

WSD = ["--lr_scheduler_type", "wsd", "--num_warmup_steps", "2", "--decay_steps", "4"]
TINY = ["--model_config", "tiny", "--eval_steps", "0", "--validation_split_percentage", "0", "--no_plots"]
EVERY_2 = ["--checkpointing_steps", "2"]
PEAK = 1e-3
REFUSED = ("past_the_decay", "official_longer", "official_as_wsd")


def wsd_factor(step, warmup, decay, total):
    """The WSD multiplier written from its definition: linear warm-up, 1 up to total - decay, then 1 - sqrt of the
    decay's elapsed fraction, 0 from total on."""
    if step < warmup:
        return step / warmup
    start = total - decay
    if step <= start:
        return 1.0
    if step >= total:
        return 0.0
    return 1.0 - math.sqrt((step - start) / decay)


def official_factor(step, warmup, total):
    if step < warmup:
        return step / warmup
    return max(0.0, 1.0 - step / total)


@pytest.fixture(scope="module")
def long_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("long_runs")
    common = [*TINY, *EVERY_2, "--learning_rate", str(PEAK)]
    runs = {
        "long": [*common, *WSD, "--max_train_steps", "16", "--average_last", "3"],
        "short": [*common, *WSD, "--max_train_steps", "12"],
        "extended": [*common, *WSD, "--max_train_steps", "16", "--resume_from_checkpoint", str(root / "short/step_8")],
        "branch": [*common, "--decay_from", str(root / "long/step_8"), "--decay_steps", "4"],
        "branch_resumed": [
            *common,
            "--decay_from",
            str(root / "long/step_8"),
            "--resume_from_checkpoint",
            str(root / "branch/step_10"),
        ],
        "official": [*TINY, "--learning_rate", str(PEAK), "--checkpointing_steps", "4", "--max_train_steps", "8"],
        # refused once the checkpoint's files are checked, before a step
        "past_the_decay": [
            *common,
            *WSD,
            "--max_train_steps",
            "16",
            "--resume_from_checkpoint",
            f"{root}/short/step_10",
        ],
        "official_longer": [*TINY, "--max_train_steps", "12", "--resume_from_checkpoint", f"{root}/official/step_4"],
        "official_as_wsd": [
            *TINY,
            *WSD,
            "--max_train_steps",
            "8",
            "--resume_from_checkpoint",
            f"{root}/official/step_4",
        ],
        # short again, then extended in its own folder, where its step_10 and step_12 are the 12-step plan's
        "in_place": [*common, *WSD, "--max_train_steps", "12"],
    }
    extended_in_place = [
        *common,
        *WSD,
        "--max_train_steps",
        "16",
        "--resume_from_checkpoint",
        f"{root}/in_place/step_8",
    ]
    order = [*runs.items(), ("in_place", extended_in_place)]
    results, done = pretrain_runs([(root / name, argv, {}, False) for name, argv in order], timeout=600)
    lines = {name: result["line"] for (name, _), result in zip(order, results) if result["status"] == 2}
    for (name, _), result in zip(order, results):
        assert result["status"] == (2 if name in REFUSED else 0), (name, result["line"])
    return {"root": root, "stderr": done.stderr, "lines": lines, **{name: root / name for name in runs}}


def parse(*argv):
    from albert_hf.pretraining.resolution import parse_args

    return parse_args([*FAST, *TINY, *argv])


# ----------------------------------------------------------------------------------------------------------------
# The schedule


@pytest.mark.quick
def test_wsd_rates_in_the_warm_up_the_stable_phase_and_the_decay_follow_the_formula():
    from albert_hf.pretraining.schedule import SchedulePlan

    steps = [0, 1, 5, 9, 10, 11, 50, 79, 80, 81, 85, 90, 95, 99, 100, 101, 150]
    got = SchedulePlan("wsd", 10, 100, 20).factors(steps)
    expected = [wsd_factor(step, 10, 20, 100) for step in steps]
    assert got == pytest.approx(expected, abs=1e-12)
    assert got[steps.index(90)] == pytest.approx(1 - math.sqrt(0.5))  # halfway through the decay: 1 - 1/sqrt(2)


@pytest.mark.quick
def test_the_default_schedule_is_the_official_one(tmp_path):
    args = parse("--output_dir", str(tmp_path / "run"), "--max_train_steps", "200")
    assert (args.schedule.kind, args.schedule.num_warmup_steps, args.schedule.decay_steps) == ("official", 5, None)
    steps = [0, 2, 4, 5, 6, 100, 199, 200, 250]
    assert args.schedule.factors(steps) == pytest.approx([official_factor(s, 5, 200) for s in steps], abs=1e-12)


@pytest.mark.quick
def test_the_dry_run_sketch_draws_the_warm_up_the_plateau_and_the_decay():
    from albert_hf.pretraining.schedule import SchedulePlan

    sketch = SchedulePlan("wsd", 10, 100, 20).sketch(width=20)
    assert sketch[0] == "▁" and set(sketch[2:16]) == {"█"} and sketch[-1] in "▁▂▃" and len(sketch) == 20


@pytest.mark.trains
def test_the_logged_learning_rates_are_the_formulas(long_runs):
    for name, (warmup, decay, total) in {"long": (2, 4, 16), "short": (2, 4, 12)}.items():
        rows = [row for row in metrics(long_runs[name]) if "lr" in row]
        assert len(rows) >= 6
        for row in rows:
            assert row["lr"] == pytest.approx(PEAK * wsd_factor(row["step"], warmup, decay, total), abs=1e-12)
    rows = [row for row in metrics(long_runs["official"]) if "lr" in row]
    assert rows and all(row["lr"] == pytest.approx(PEAK * official_factor(row["step"], 0, 8)) for row in rows)


# ----------------------------------------------------------------------------------------------------------------
# Extending and branching


@pytest.mark.trains
def test_a_run_extended_from_its_stable_phase_ends_as_the_longer_plan(long_runs):
    check_same_weights_and_curve(long_runs["extended"], long_runs["long"], after_step=8)
    assert "extended from 12 to 16 steps" in long_runs["stderr"]


@pytest.mark.trains
def test_a_run_extended_in_its_own_folder_sets_aside_the_checkpoints_of_its_earlier_plan(long_runs):
    """Its step_10 and step_12 were the 12-step plan's (decaying): a resume would have taken them as written."""
    folder = long_runs["in_place"]
    check_same_weights_and_curve(folder, long_runs["long"], after_step=8)
    assert "step_10, step_12: written under the run's earlier plan, renamed *.superseded" in long_runs["stderr"]
    for step in (10, 12):
        plan = json.loads((folder / f"step_{step}" / "schedule.json").read_text())["plan"]
        old = json.loads((folder / f"step_{step}.superseded" / "schedule.json").read_text())["plan"]
        assert (plan["max_train_steps"], old["max_train_steps"]) == (16, 12)
    assert not (folder / "step_8.superseded").exists() and (folder / "step_16").is_dir()


@pytest.mark.trains
def test_a_decay_branch_ends_as_the_run_planned_to_its_length_and_resumes_exactly(long_runs):
    check_same_weights_and_curve(long_runs["branch"], long_runs["short"], after_step=8)
    check_same_weights_and_curve(long_runs["branch_resumed"], long_runs["branch"], after_step=10)


@pytest.mark.trains
def test_a_branch_names_its_parent_its_step_and_its_decay(long_runs):
    parent = str(long_runs["long"] / "step_8")
    results = json.loads((long_runs["branch"] / "all_results.json").read_text())
    assert results["decay_branch_parent"] == parent and results["decay_branch_step"] == 8
    assert (results["lr_scheduler_type"], results["decay_steps"], results["decay_shape"]) == ("wsd", 4, "1-sqrt")
    card = (long_runs["branch"] / "README.md").read_text()
    assert f"a decay branch of the run in {long_runs['long']}, from its step 8" in card
    assert f"a decay branch of {parent} (step 8)" in long_runs["stderr"]
    assert "decay_branch_parent" not in json.loads((long_runs["long"] / "all_results.json").read_text())


@pytest.mark.trains
def test_extending_past_the_start_of_the_decay_names_the_last_stable_checkpoint(long_runs):
    short = long_runs["short"]
    assert long_runs["lines"]["past_the_decay"] == (
        f"error: --resume_from_checkpoint {short / 'step_10'}: step 10 is past the start of its decay (step 8), so "
        f"its length and decay stay 12 and 4 steps; extend the run from {short / 'step_8'}, the last checkpoint of "
        "its stable phase"
    )
    assert not (long_runs["past_the_decay"] / "metrics.jsonl").exists()  # refused before a step


@pytest.mark.trains
def test_the_official_schedule_cannot_be_extended_and_says_why(long_runs):
    official = long_runs["official"] / "step_4"
    assert long_runs["lines"]["official_longer"] == (
        f"error: --max_train_steps 12: --resume_from_checkpoint {official} was written under the official schedule, "
        "whose learning rate at every step depends on the run's length (8 steps): resume with --max_train_steps 8; "
        "a run that can be extended trains with --lr_scheduler_type wsd"
    )
    assert long_runs["lines"]["official_as_wsd"] == (
        f"error: --resume_from_checkpoint {official}: written under the official schedule: resume it with that schedule"
    )


@pytest.mark.trains
def test_a_branch_off_the_warm_up_a_decay_or_the_official_schedule_is_refused(long_runs, tmp_path):
    from albert_hf.errors import InputError

    warming = tmp_path / "step_1"
    shutil.copytree(long_runs["long"] / "step_2", warming)
    saved = json.loads((warming / "schedule.json").read_text())
    (warming / "schedule.json").write_text(json.dumps(saved | {"last_epoch": 1}))
    long, out = long_runs["long"], str(tmp_path / "branch")
    cases = {
        str(warming): "step 1 is still in the warm-up (2 steps)",
        str(long / "step_14"): f"step 14 is already decaying (its decay starts after step 12): branch from a "
        f"checkpoint of the stable phase, such as {long / 'step_12'}",
        str(long_runs["official"] / "step_4"): "written under the official schedule, which decays over its whole run",
    }
    for parent, line in cases.items():
        with pytest.raises(InputError) as refused:
            parse("--output_dir", out, "--decay_from", parent)
        assert line in str(refused.value)
    with pytest.raises(InputError, match="a decay branch writes its own --output_dir"):
        parse("--output_dir", str(long), "--decay_from", str(long / "step_8"), "--overwrite_output_dir")


@pytest.mark.quick
@pytest.mark.parametrize(
    "argv, line",
    [
        (["--decay_steps", "5"], "--decay_steps is the decay of --lr_scheduler_type wsd"),
        (["--lr_scheduler_type", "wsd", "--decay_steps", "95", "--num_warmup_steps", "10"], "do not fit in"),
        (["--average_last", "1", "--checkpointing_steps", "10"], "--average_last must be at least 2"),
        (["--average_last", "3"], "pass --checkpointing_steps N"),
        (["--average_last", "3", "--checkpointing_steps", "10", "--checkpoints_total_limit", "2"], "keeps fewer"),
        (["--average_last", "3", "--checkpointing_steps", "50"], "the run writes 2 checkpoints"),
        (["--preprocess_only", "--decay_from", "run/step_50"], "--preprocess_only trains nothing: drop --decay_from"),
        (["--preprocess_only", "--average_last", "2"], "--preprocess_only trains nothing: drop --average_last"),
    ],
)
def test_schedule_and_averaging_flags_that_cannot_be_had_are_refused(tmp_path, argv, line):
    from albert_hf.errors import InputError

    with pytest.raises(InputError) as refused:
        parse("--output_dir", str(tmp_path / "run"), "--max_train_steps", "100", *argv)
    assert line in str(refused.value)


# ----------------------------------------------------------------------------------------------------------------
# Averaging


@pytest.mark.trains
def test_average_last_is_the_element_wise_mean_of_the_last_checkpoints(long_runs):
    folder = long_runs["long"] / "average_last_3"
    sources = [load_file(long_runs["long"] / f"step_{step}" / "model.safetensors") for step in (12, 14, 16)]
    averaged = load_file(folder / "model.safetensors")
    assert averaged.keys() == sources[0].keys()
    for name, tensor in averaged.items():
        expected = sum(source[name].double() for source in sources) / 3
        torch.testing.assert_close(tensor.double(), expected, rtol=0, atol=1e-6, msg=name)
    assert not torch.equal(averaged[name], sources[-1][name])  # an average, not the last checkpoint
    results = json.loads((folder / "all_results.json").read_text())
    assert results["averaged_from"] == [str(long_runs["long"] / f"step_{step}") for step in (12, 14, 16)]
    card = (folder / "README.md").read_text()
    assert all(f"| `{long_runs['long']}/step_{step}` | {step} |" in card for step in (12, 14, 16))


@pytest.mark.trains
def test_the_average_loads_with_automodel_in_a_fresh_process_without_albert_hf(long_runs):
    folder = long_runs["long"] / "average_last_3"
    code = (
        "import torch\nfrom safetensors.torch import load_file\nfrom transformers import AutoModelForMaskedLM\n"
        f"folder = {str(folder)!r}\n"
        "model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True)\n"
        "saved = load_file(folder + '/model.safetensors')\n"
        "state = model.state_dict()\n"
        "same = all(torch.equal(state[name], saved[name]) for name in saved if name in state)\n"
        "print('LOADED', type(model).__name__, same, sum(name in state for name in saved))\n"
    )
    done = run_python(code, cwd=folder.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LOADED AlbertHFForMaskedLM True" in done.stdout
    assert int(done.stdout.split("LOADED AlbertHFForMaskedLM True ")[1].split()[0]) > 10


@pytest.mark.trains
def test_averaging_refuses_another_config_a_missing_tensor_and_an_occupied_folder(long_runs, tmp_path):
    from albert_hf.average import average_checkpoints
    from albert_hf.errors import InputError

    long = long_runs["long"]
    other = tmp_path / "step_99"
    shutil.copytree(long / "step_16", other, ignore=shutil.ignore_patterns("files.json"))
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(config | {"num_hidden_layers": config["num_hidden_layers"] + 1}))
    with pytest.raises(InputError, match=r"config.json: another config than .*step_14's \(num_hidden_layers"):
        average_checkpoints(tmp_path / "out", [long / "step_14", other])
    with pytest.raises(InputError, match="already holds something"):
        average_checkpoints(long, [long / "step_14", long / "step_16"])
    with pytest.raises(InputError, match="at least two"):
        average_checkpoints(tmp_path / "out", [long / "step_14"])
    damaged = tmp_path / "step_98"
    shutil.copytree(long / "step_16", damaged)
    (damaged / "tokenizer.json").write_text("{}")
    with pytest.raises(InputError, match=r"step_98: tokenizer.json"):
        average_checkpoints(tmp_path / "out", [long / "step_14", damaged])
    assert not (tmp_path / "out").exists()


@pytest.mark.trains
def test_the_average_command_writes_a_folder_and_refuses_in_one_line(long_runs, tmp_path):
    import subprocess
    import sys

    from helpers import subprocess_env

    long = long_runs["long"]
    command = [
        sys.executable,
        "-m",
        "albert_hf.average",
        str(tmp_path / "avg"),
        str(long / "step_2"),
        str(long / "step_4"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "avg" / "model.safetensors").is_file() and (tmp_path / "avg" / "tokenizer.json").is_file()
    done = subprocess.run(command, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'avg'}: already holds something; name a new folder for the average"
    ]


@pytest.mark.trains
def test_a_decay_branch_may_take_another_mix_of_sources(tmp_path, tiny_checkpoint):
    """mmBERT's and EuroBERT's anneal: the branch goes on from the checkpoint's position in each source with other
    weights, says the change, and counts its sources under them."""
    from data_fixtures import embedded

    halves = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for i, half in enumerate(halves):
        half.write_text("".join(json.dumps({"text": text}) + "\n" for text in embedded()["text"][i:3000:2]))

    def sources(weight_a):
        return [
            "--sources",
            f"name=a,weight={weight_a},train_files={halves[0]}",
            f"name=b,weight={1 - weight_a:.1f},train_files={halves[1]}",
            "--tokenizer_name",
            str(tiny_checkpoint),
        ]

    common = [*TINY, *EVERY_2, "--learning_rate", str(PEAK)]
    runs = [
        (tmp_path / "mixed", [*common, *WSD, "--max_train_steps", "12", *sources(0.7)]),
        (tmp_path / "annealed", [*common, "--decay_from", str(tmp_path / "mixed/step_6"), *sources(0.2)]),
    ]
    results, done = pretrain_runs([(out, argv, {}, False) for out, argv in runs])
    assert [result["status"] for result in results] == [0, 0], results
    assert "mix changed at step 6" in done.stderr
    annealed = json.loads((tmp_path / "annealed" / "all_results.json").read_text())
    assert (annealed["source_a_weight"], annealed["source_b_weight"]) == (0.2, 0.8)
    assert annealed["decay_branch_step"] == 6 and annealed["decay_steps"] == 4
    rows = [row for row in metrics(tmp_path / "annealed") if "lr" in row]
    assert [row["step"] for row in rows] == [8, 10] and rows[-1]["lr"] == 0.0


@pytest.mark.quick
def test_a_checkpoint_set_aside_twice_keeps_both(tmp_path):
    """A second extension (or a second damaged step_N) sets its checkpoint aside beside the first one's."""
    from albert_hf.pretraining.output.checkpoints import set_aside

    for run in (1, 2):
        (tmp_path / "step_10").mkdir()
        (tmp_path / "step_10" / "run").write_text(str(run))
        set_aside(tmp_path / "step_10", "superseded")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_10.superseded", "step_10.superseded-2"]
    assert (tmp_path / "step_10.superseded-2" / "run").read_text() == "2"
