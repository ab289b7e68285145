"""run_pretraining.py's arguments: help, files, the global batch's split, the plan of a dry run, the micro-batch
found, and a mistake stopped in one line naming it before any work."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from albert_hf.pretraining.arguments import build_parser
from albert_hf.pretraining.resolution import parse_args
from albert_hf.pretraining.training.model import make_optimizer
from helpers import REPO, tiny_config
from pretraining_runs import FAST, metrics, pretrain_runs, untimed

# Flags docs/pretraining.md names that are not run_pretraining.py's fields: accelerate launch's, the fine-tuning
# scripts', python -m albert_hf.pretraining.output.loadable's and argparse's own --help.
OTHER_TOOLS_FLAGS = {
    "--config_file",
    "--use_cpu",
    "--bf16",
    "--fp16",
    "--help",
    "--model_files",
    "--from_tf",  # accelerate's, and python -m albert_hf.convert's
    "--source_model",
    "--tasks",
    "--data_dir",  # run_checkpoint_evals.py's
    "--save_total_limit",
}  # the fine-tuning scripts' (Trainer's)


def test_help_prints_each_options_own_text_and_every_flag_the_docs_name_exists():
    """--help shows what each option's field says (not only its name), and a flag renamed or removed while
    docs/pretraining.md still names it fails here."""
    parser = build_parser()
    options = [action for action in parser._actions if action.option_strings and action.dest != "help"]
    # compared without whitespace: argparse re-wraps the text, breaking lines at hyphens too
    shown = "".join(parser.format_help().split())
    assert [action.dest for action in options if "".join(action.help.replace("%%", "%").split()) not in shown] == []
    flags = {flag for action in options for flag in action.option_strings}
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_]+)", (REPO / "docs" / "pretraining.md").read_text()))
    assert len(named) > 30  # the pattern reads the page's flags
    assert sorted(named - flags - OTHER_TOOLS_FLAGS) == []


def test_the_arguments_are_resolved_once_and_read_only_after(tmp_path):
    import dataclasses

    args = parse_args(
        [
            "--output_dir",
            str(tmp_path / "run"),
            "--max_train_steps",
            "200",
            "--torch_compile_mode",
            "default",
            "--model_config",
            "base",
            "--sharing",
            "ffn",
        ]
    )
    # 2.5% of the steps; a mode asks for compiling; the config from the preset and --sharing
    assert args.optimization.num_warmup_steps == 5 and args.model.torch_compile
    assert (args.config.hidden_size, args.config.sharing) == (768, "ffn")
    warmup = parse_args(["--output_dir", str(tmp_path / "run"), "--num_warmup_steps", "0"]).optimization
    assert warmup.num_warmup_steps == 0
    for frozen in (args, args.optimization):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.num_warmup_steps = 0


@pytest.mark.parametrize("processes, accumulation", [(1, 8), (2, 4), (4, 2)])
def test_a_global_batch_is_split_into_the_accumulation_the_processes_need(
    tmp_path, monkeypatch, processes, accumulation
):
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    out = ["--output_dir", str(tmp_path / "run")]
    split = parse_args([*out, "--global_batch_size", "64", "--per_device_train_batch_size", "8"]).optimization
    assert (split.global_batch_size, split.per_device_train_batch_size) == (64, 8)
    assert split.gradient_accumulation_steps == accumulation  # 64 = processes x 8 x accumulation
    agreeing = parse_args(
        [
            *out,
            "--global_batch_size",
            "64",
            "--per_device_train_batch_size",
            "8",
            "--gradient_accumulation_steps",
            str(accumulation),
        ]
    ).optimization
    assert agreeing == split


@pytest.mark.parametrize(
    "processes, flags, message",
    [
        (
            3,
            ["--per_device_train_batch_size", "8"],
            "--global_batch_size 64 is not a multiple of 3 processes x "
            "--per_device_train_batch_size 8 = 24; 64 is not a multiple of the 3 processes",
        ),
        (
            1,
            ["--per_device_train_batch_size", "12"],
            "--global_batch_size 64 is not a multiple of 1 process x "
            "--per_device_train_batch_size 12 = 12; --per_device_train_batch_size 8 or 4 or 2 would",
        ),
        (
            2,
            ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"],
            "--global_batch_size 64 "
            "disagrees with 2 processes x --per_device_train_batch_size 8 x --gradient_accumulation_steps 2 = 32: give "
            "one "
            "of the two",
        ),
    ],
)
def test_a_global_batch_that_cannot_be_split_is_refused_in_one_line(tmp_path, monkeypatch, processes, flags, message):
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    with pytest.raises(InputError) as refused:
        parse_args(["--output_dir", str(tmp_path / "run"), "--global_batch_size", "64", *flags])
    assert str(refused.value) == message


def test_the_start_line_says_how_the_global_batch_is_split():
    from albert_hf.pretraining.plan import batch_split

    assert batch_split(4096, 16, 32, 8) == "global batch 4096 = 16 processes x 32 x 8 accumulation"
    assert batch_split(64, 1, 8, 8) == "global batch 64 = 1 process x 8 x 8 accumulation"
    assert batch_split(32, 1, 32, 1) == "global batch 32"


def test_a_dry_run_prints_the_plan_from_real_steps_and_writes_nothing(tmp_path, capsys):
    """--dry_run on the tiny model in fp32: the weights, their gradients and LAMB's two moments are 16 bytes a
    parameter; the step's peak holds more; the projected time is the steps' micro-batches at the measured rate."""
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.pretraining.job import main

    out = tmp_path / "run"
    plan = main(
        ["--output_dir", str(out), *FAST, "--max_train_steps", "100", "--gradient_accumulation_steps", "2", "--dry_run"]
    )
    assert not out.exists()
    parameters = sum(p.numel() for p in AlbertHFForPreTraining(tiny_config(vocab_size=500)).parameters())
    assert plan["parameters"] == parameters and plan["static_bytes"] == 16 * parameters
    assert plan["static_bytes"] < plan["peak_bytes"] < plan["available_bytes"] and plan["fits"]
    assert plan["projected_seconds"] == pytest.approx(100 * 2 * 8 * 64 / plan["tokens_per_second"])
    printed = capsys.readouterr().out
    assert f"model: {parameters:,} parameters, vocabulary 500" in printed
    assert "global batch 16 = 1 process x 8 x 2 accumulation, 64 tokens each" in printed
    assert "fits: yes" in printed and "time to --max_train_steps 100: " in printed


@pytest.mark.trains
def test_auto_find_batch_size_settles_below_an_out_of_memory_limit_and_trains_as_the_explicit_split(
    tmp_path, monkeypatch, fresh_accelerate_state, caplog
):
    """Out of memory above micro-batch 4 (the device's error, from a stand-in of the trial steps): with
    --global_batch_size 16 and at most 16 a micro-batch, the run tries 16 and 8, settles on 4 with 4 accumulation
    steps, and trains as --per_device_train_batch_size 4 --gradient_accumulation_steps 4 does."""

    from albert_hf.pretraining import job, plan

    real, tried = plan.measure_steps, []

    def limited(config, micro_batch, *args, **kwargs):
        tried.append(micro_batch)
        if micro_batch > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(config, micro_batch, *args, **kwargs)

    monkeypatch.setattr(plan, "measure_steps", limited)
    common = [*FAST, "--max_train_steps", "6", "--eval_steps", "0", "--validation_split_percentage", "0", "--no_plots"]
    found, explicit = tmp_path / "found", tmp_path / "explicit"
    with caplog.at_level("INFO", logger="albert_hf"):
        job.main(
            [
                "--output_dir",
                str(found),
                *common,
                "--global_batch_size",
                "16",
                "--per_device_train_batch_size",
                "16",
                "--auto_find_batch_size",
            ]
        )
    start = next(r.getMessage() for r in caplog.records if "parameters; global batch" in r.getMessage())
    assert "global batch 16 = 1 process x 4 x 4 accumulation" in start
    assert (
        "--auto_find_batch_size: micro-batch 4 x 4 accumulation (16 (out of memory), 8 (out of memory) did not "
        "fit)" in start
    )
    assert tried[1:] == [16, 8, 4]  # after the smallest candidate's measured step, on a CPU
    job.main(
        [
            "--output_dir",
            str(explicit),
            *common,
            "--per_device_train_batch_size",
            "4",
            "--gradient_accumulation_steps",
            "4",
        ]
    )
    assert untimed(metrics(found)) == untimed(metrics(explicit))
    ours, theirs = load_file(found / "model.safetensors"), load_file(explicit / "model.safetensors")
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_flags_after_an_arguments_file_override_its_values_and_count_as_given(tmp_path):
    from albert_hf.pretraining.arguments import ARGUMENT_GROUPS
    from albert_hf.runtime.cli import explicit_arguments

    path = tmp_path / "recipe.yaml"
    path.write_text(f"output_dir: {tmp_path / 'run'}\nmax_train_steps: 40\nlearning_rate: 0.003\n")
    args = parse_args([str(path), "--max_train_steps", "5", "--dry_run"])
    assert (args.optimization.max_train_steps, args.optimization.learning_rate, args.output.dry_run) == (5, 0.003, True)
    assert args.output.output_dir == str(tmp_path / "run")
    assert explicit_arguments([str(path), "--dry_run"], ARGUMENT_GROUPS) == {
        "output_dir",
        "max_train_steps",
        "learning_rate",
        "dry_run",
    }


def test_every_option_shows_its_help_and_default_and_takes_its_choices_from_where_they_are_defined():
    from albert_hf.configuration_albert_hf import PRESETS, SHARING_MODES
    from albert_hf.pretraining.data.corpus import LAYOUTS

    options = {action.dest: action for action in build_parser()._actions if action.dest != "help"}
    assert len(options) >= 50
    for name, action in options.items():
        assert action.help and len(action.help) > 10, name
    text = build_parser().format_help()
    blocks = re.split(r"\n(?=  --)", text.split("\nmodel:\n", 1)[1])  # one block per option, from its flag on
    assert len(blocks) == len(options)
    for block in blocks:
        assert "(default:" in " ".join(block.split()), block
    assert options["sharing"].choices == list(SHARING_MODES)
    assert options["model_config"].choices == sorted(PRESETS)
    assert options["layout"].choices == list(LAYOUTS)
    assert options["task"].choices == ["sop", "nsp", "none"]
    for heading in (
        "model:",
        "data and tokenizer:",
        "objective:",
        "optimization:",
        "evaluation, checkpoints and output:",
    ):
        assert f"\n{heading}\n" in text


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_arguments_from_a_json_or_yaml_file_equal_the_same_flags(tmp_path, suffix):
    flags = [
        "--output_dir",
        str(tmp_path / "run"),
        "--max_train_steps",
        "40",
        "--learning_rate",
        "0.003",
        "--torch_compile",
        "--train_files",
        str(tmp_path),
        "--task",
        "nsp",
    ]
    values = {
        "output_dir": str(tmp_path / "run"),
        "max_train_steps": 40,
        "learning_rate": 0.003,
        "torch_compile": True,
        "train_files": [str(tmp_path)],
        "task": "nsp",
    }
    path = tmp_path / f"args{suffix}"
    (tmp_path / "corpus.txt").write_text("One sentence. Another one.")
    if suffix == ".json":
        path.write_text(json.dumps(values))
    else:
        import yaml

        path.write_text(yaml.safe_dump(values))
    from_file, from_flags = parse_args([str(path)]), parse_args(flags)
    assert from_file.flat() == from_flags.flat()
    assert from_file.optimization.num_warmup_steps == 1 and from_file.objective.max_ngram == 3  # 2.5% of 40; a default


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bogus", "1"], "error: unrecognized arguments: --bogus 1"),
        (["{file}"], "error: {file}: unknown argument(s) ['learning_rat']"),
        (["{missing}"], "error: {missing}: no such arguments file"),
    ],
)
def test_a_mistake_in_the_arguments_is_one_line_naming_it(tmp_path, capsys, argv, message):
    from albert_hf.tasks.finetuning import parse_arguments
    from albert_hf.tasks.glue.data import GlueDataArguments

    file, missing = tmp_path / "args.yaml", tmp_path / "missing.json"
    file.write_text("learning_rat: 0.1\n")
    argv = [arg.format(file=file, missing=missing) for arg in argv]
    message = message.format(file=file, missing=missing)
    with pytest.raises(SystemExit) as stop:
        parse_args(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)
    # the fine-tuning scripts parse the same way
    required = ["--model_name_or_path", "m", "--task_name", "mrpc", "--output_dir", str(tmp_path / "out")]
    file.write_text(json.dumps({**dict(zip(required[::2], required[1::2])), "learning_rat": 0.1}).replace('"--', '"'))
    with pytest.raises(SystemExit):
        parse_arguments(GlueDataArguments, required + argv if argv[0].startswith("--") else argv)
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_bad_arguments_stop_with_a_clear_message(tmp_path):
    # one process for the three (the command line's own exit with status 2 and one line: test_bad_input.py)
    results, done = pretrain_runs(
        [
            (tmp_path / "a", ["--model_config", "huge", "--max_train_steps", "2"]),
            (tmp_path / "b", ["--max_train_steps", "5", "--num_warmup_steps", "9"]),
            (tmp_path / "c", ["--train_files", str(tmp_path / "nothing_here.txt"), "--max_train_steps", "2"]),
        ]
    )
    assert [result["status"] for result in results] == [2, 2, 2] and "Traceback" not in done.stderr, results
    usage = [line for line in done.stderr.splitlines() if "invalid choice: 'huge'" in line]
    assert len(usage) == 1 and "--model_config" in usage[0] and "xxlarge" in usage[0]  # argparse's own line
    assert results[1]["line"] == "error: --num_warmup_steps exceeds --max_train_steps"
    assert "nothing_here.txt" in results[2]["line"]


def test_a_sequence_longer_than_the_models_positions_stops_at_the_entry_before_any_data(tmp_path, tiny_checkpoint):
    """Checked once, in parse_args, for a preset, a --config_name and a loaded --model_name_or_path alike, before
    the corpus is read (the model itself would fail only at its first batch)."""
    from albert_hf.pretraining.resolution import parse_args

    base = ["--output_dir", str(tmp_path / "out")]
    for extra in (
        ["--model_config", "tiny"],
        ["--config_name", str(tiny_checkpoint)],
        ["--model_name_or_path", str(tiny_checkpoint)],
    ):  # the tiny preset and checkpoint: 128 positions
        with pytest.raises(
            InputError,
            match=r"^--max_seq_length 129 exceeds the model's "
            r"max_position_embeddings=128$",
        ):
            parse_args([*base, *extra, "--max_seq_length", "129"])
    assert parse_args([*base, "--model_config", "tiny", "--max_seq_length", "128"]).data.max_seq_length == 128


def test_optimizer_takes_the_moment_decays_and_epsilon_from_the_command_line(tmp_path):
    # its own --output_dir: the default, outputs/albert-pretraining, holds `make pretrain`'s run after the README's
    # first command, and is refused as an earlier run
    out = ["--output_dir", str(tmp_path / "run")]
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.optimization import AdamWeightDecay, Lamb
    from helpers import tiny_config

    model = AlbertHFForPreTraining(tiny_config())
    official = make_optimizer(model, parse_args(out).optimization)
    assert isinstance(official, Lamb)
    assert {(g["betas"], g["eps"]) for g in official.param_groups} == {((0.9, 0.999), 1e-6)}
    custom = make_optimizer(
        model,
        parse_args(
            [*out, "--optimizer", "adamw", "--adam_beta1", "0.8", "--adam_beta2", "0.98", "--adam_epsilon", "1e-8"]
        ).optimization,
    )
    assert isinstance(custom, AdamWeightDecay)
    assert {(g["betas"], g["eps"]) for g in custom.param_groups} == {((0.8, 0.98), 1e-8)}
    with pytest.raises(InputError, match="--adam_beta2 must be in"):
        parse_args([*out, "--adam_beta2", "1.0"])
