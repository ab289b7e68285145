"""run_pretraining.py end to end on the embedded corpus, with tiny models: outputs, exact resume after SIGKILL,
two processes against one, fp16 loss scaling, Hub push."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from albert_hf.pretraining.checkpoints import STATE_FILE, StepCheckpoints
from albert_hf.pretraining.job import build_parser, parse_args
from albert_hf.pretraining.model import make_optimizer
from helpers import (
    REPO,
    check_tokenizer_loads_without_prompt,
    run_bounded,
    run_python,
    start_process,
    subprocess_env,
    tiny_config,
)

SCRIPT = str(REPO / "run_pretraining.py")
# Tiny and fast: the embedded corpus, a 500-piece tokenizer (trained once, cached in the test HF_HOME).
FAST = ["--vocab_size", "500", "--max_seq_length", "64", "--per_device_train_batch_size", "8", "--dupe_factor", "1",
        "--max_eval_samples", "64", "--logging_steps", "2", "--seed", "7",
        "--mixed_precision", "no"]  # fp32 whatever the CPU: the precision choice has its own tests (test_hardware)


def pretrain(out, *extra, launcher=None, check=True, timeout=300, started: Path | None = None, env=None,
             new_session=False):
    """The script run to its end (the finished process), or with `started` (a folder for its stdout.txt and
    stderr.txt) only started (the running process; with `new_session`, as a scheduler's job: `signal_job`)."""
    command = (launcher or [sys.executable]) + [SCRIPT, "--output_dir", str(out), *FAST, *extra]
    env = subprocess_env(**(env or {}))
    if started:
        return start_process(command, env=env, cwd=out.parent, stdout=started / "stdout.txt",
                             stderr=started / "stderr.txt", new_session=new_session)
    done = run_bounded(command, timeout, env=env, cwd=out.parent)
    if check:
        assert done.returncode == 0, done.stderr[-4000:]
    return done


def pretrain_runs(runs, launcher=None, timeout=300, steps_only=False,
                  process_env=None) -> tuple[list[dict], subprocess.CompletedProcess]:
    """Several `pretrain` runs, each (output folder, extra arguments[, environment[, steps_only[, hooks]]]), one after
    the other in one process or one launch (tests/launched_runs.py: a launch costs more than a tiny run). Per run:
    "status" (0, 2 or "traceback") and "line" (its error line), and the finished process. With `steps_only` (the
    default for runs that do not say), prepare and fit only (no final save). `process_env`: set for the whole
    process, before torch is imported (a run's own environment is set after)."""
    spec = [{"argv": ["--output_dir", str(out), *FAST, *extra], "env": rest[0] if rest else {},
             "steps_only": rest[1] if len(rest) > 1 else steps_only, "hooks": rest[2] if len(rest) > 2 else {}}
            for out, extra, *rest in runs]
    folder = Path(runs[0][0]).parent
    path = folder / f"runs-{Path(runs[0][0]).name}.json"
    path.write_text(json.dumps(spec))
    command = (launcher or [sys.executable]) + [str(REPO / "tests" / "launched_runs.py"), str(path)]
    env = subprocess_env(**(process_env or {}))
    done = run_bounded(command, timeout, env=env, cwd=folder)
    results = Path(f"{path}.results")
    assert done.returncode == 0 and results.is_file(), done.stderr[-4000:]
    return json.loads(results.read_text()), done


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# Flags docs/pretraining.md names that are not run_pretraining.py's fields: accelerate launch's, the fine-tuning
# scripts', and argparse's own --help.
OTHER_TOOLS_FLAGS = {"--config_file", "--use_cpu", "--bf16", "--fp16", "--help"}


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

    args = parse_args(["--output_dir", str(tmp_path / "run"), "--max_train_steps", "200",
                       "--torch_compile_mode", "default", "--model_config", "base", "--sharing", "ffn"])
    # 2.5% of the steps; a mode asks for compiling; the config from the preset and --sharing
    assert args.optimization.num_warmup_steps == 5 and args.model.torch_compile
    assert (args.config.hidden_size, args.config.sharing) == (768, "ffn")
    warmup = parse_args(["--output_dir", str(tmp_path / "run"), "--num_warmup_steps", "0"]).optimization
    assert warmup.num_warmup_steps == 0
    for frozen in (args, args.optimization):
        with pytest.raises(dataclasses.FrozenInstanceError):
            frozen.num_warmup_steps = 0


@pytest.mark.parametrize("processes, accumulation", [(1, 8), (2, 4), (4, 2)])
def test_a_global_batch_is_split_into_the_accumulation_the_processes_need(tmp_path, monkeypatch, processes,
                                                                          accumulation):
    monkeypatch.setenv("WORLD_SIZE", str(processes))
    out = ["--output_dir", str(tmp_path / "run")]
    split = parse_args([*out, "--global_batch_size", "64", "--per_device_train_batch_size", "8"]).optimization
    assert (split.global_batch_size, split.per_device_train_batch_size) == (64, 8)
    assert split.gradient_accumulation_steps == accumulation  # 64 = processes x 8 x accumulation
    agreeing = parse_args([*out, "--global_batch_size", "64", "--per_device_train_batch_size", "8",
                           "--gradient_accumulation_steps", str(accumulation)]).optimization
    assert agreeing == split


@pytest.mark.parametrize("processes, flags, message", [
    (3, ["--per_device_train_batch_size", "8"], "--global_batch_size 64 is not a multiple of 3 processes x "
     "--per_device_train_batch_size 8 = 24; 64 is not a multiple of the 3 processes"),
    (1, ["--per_device_train_batch_size", "12"], "--global_batch_size 64 is not a multiple of 1 process x "
     "--per_device_train_batch_size 12 = 12; --per_device_train_batch_size 8 or 4 or 2 would"),
    (2, ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2"], "--global_batch_size 64 "
     "disagrees with 2 processes x --per_device_train_batch_size 8 x --gradient_accumulation_steps 2 = 32: give one "
     "of the two"),
])
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
    plan = main(["--output_dir", str(out), *FAST, "--max_train_steps", "100", "--gradient_accumulation_steps", "2",
                 "--dry_run"])
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
        tmp_path, monkeypatch, fresh_accelerate_state, caplog):
    """Out of memory above micro-batch 4 (the device's error, from a stand-in of the trial steps): with
    --global_batch_size 16 and at most 16 a micro-batch, the run tries 16 and 8, settles on 4 with 4 accumulation
    steps, and trains as --per_device_train_batch_size 4 --gradient_accumulation_steps 4 does."""
    import torch

    from albert_hf.pretraining import job, plan

    real, tried = plan.measure_steps, []

    def limited(config, micro_batch, *args, **kwargs):
        tried.append(micro_batch)
        if micro_batch > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(config, micro_batch, *args, **kwargs)

    monkeypatch.setattr(plan, "measure_steps", limited)
    common = [*FAST, "--max_train_steps", "6", "--eval_steps", "0", "--validation_split_percentage", "0",
              "--no_plots"]
    found, explicit = tmp_path / "found", tmp_path / "explicit"
    with caplog.at_level("INFO", logger="albert_hf.pretraining.job"):
        job.main(["--output_dir", str(found), *common, "--global_batch_size", "16", "--per_device_train_batch_size",
                  "16", "--auto_find_batch_size"])
    start = next(r.getMessage() for r in caplog.records if "parameters; global batch" in r.getMessage())
    assert "global batch 16 = 1 process x 4 x 4 accumulation" in start
    assert "--auto_find_batch_size: micro-batch 4 x 4 accumulation (16 (out of memory), 8 (out of memory) did not " \
           "fit)" in start
    assert tried[1:] == [16, 8, 4]  # after the smallest candidate's measured step, on a CPU
    job.main(["--output_dir", str(explicit), *common, "--per_device_train_batch_size", "4",
              "--gradient_accumulation_steps", "4"])
    strip = lambda rows: [{k: v for k, v in row.items() if k != "tokens_per_second"} for row in rows]  # noqa: E731
    assert strip(metrics(found)) == strip(metrics(explicit))
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
    assert explicit_arguments([str(path), "--dry_run"], ARGUMENT_GROUPS) == {"output_dir", "max_train_steps",
                                                                         "learning_rate", "dry_run"}


def test_every_option_shows_its_help_and_default_and_takes_its_choices_from_where_they_are_defined():
    from albert_hf.configuration_albert_hf import PRESETS, SHARING_MODES
    from albert_hf.pretraining.corpus import LAYOUTS

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
    for heading in ("model:", "data and tokenizer:", "objective:", "optimization:",
                    "evaluation, checkpoints and output:"):
        assert f"\n{heading}\n" in text


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_arguments_from_a_json_or_yaml_file_equal_the_same_flags(tmp_path, suffix):
    flags = ["--output_dir", str(tmp_path / "run"), "--max_train_steps", "40", "--learning_rate", "0.003",
             "--torch_compile", "--train_files", str(tmp_path), "--task", "nsp"]
    values = {"output_dir": str(tmp_path / "run"), "max_train_steps": 40, "learning_rate": 0.003,
              "torch_compile": True, "train_files": [str(tmp_path)], "task": "nsp"}
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


@pytest.mark.parametrize("argv, message", [
    (["--bogus", "1"], "error: unrecognized arguments: --bogus 1"),
    (["{file}"], "error: {file}: unknown argument(s) ['learning_rat']"),
    (["{missing}"], "error: {missing}: no such arguments file"),
])
def test_a_mistake_in_the_arguments_is_one_line_naming_it(tmp_path, capsys, argv, message):
    from albert_hf.tasks.finetuning import parse_arguments
    from albert_hf.tasks.glue.job import GlueDataArguments

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


@pytest.mark.trains
def test_end_to_end_run_saves_a_model_that_loads_without_albert_hf(tmp_path):
    out = tmp_path / "run"
    done = pretrain(out, "--max_train_steps", "6", "--eval_steps", "3", "--with_tracking")
    assert "Pretraining done." in done.stdout and "AutoModel -> AlbertHFModel" in done.stdout
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "all_results.json",
            "modeling_albert_hf.py", "configuration_albert_hf.py", "metrics.jsonl", "fill_mask_examples.json"} <= files
    check_fill_mask_examples(out, done.stdout, held_out_texts(tmp_path))
    assert not any(name.startswith(".tmp") for name in files)
    rows = metrics(out)
    evals = [row for row in rows if "eval_mlm_accuracy" in row]
    assert [row["step"] for row in evals] == [3, 6]
    assert all(0 <= row["eval_sop_accuracy"] <= 1 and row["eval_mlm_loss"] > 0 for row in evals)
    assert any("train_mlm_loss" in row and "tokens_per_second" in row for row in rows)
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_mlm_accuracy"] == evals[-1]["eval_mlm_accuracy"]
    card = (out / "README.md").read_text()
    n_params = sum(t.numel() for t in load_file(out / "model.safetensors").values())
    assert "## Results" in card and "eval_mlm_accuracy" in card and "MLM" in card and "SOP" in card
    assert f"{n_params:,}" in card  # the tied decoder is stored once, so the file holds every parameter
    assert list((out / "runs").rglob("events.out.tfevents*")), "TensorBoard logs missing"
    loaded = run_python(
        "import transformers, sys\n"
        f"m = transformers.AutoModelForPreTraining.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        f"t = transformers.AutoTokenizer.from_pretrained({str(out)!r})\n"
        "enc = t('first part.', 'second part.', return_tensors='pt')\n"
        "print('TYPES', enc['token_type_ids'].tolist(), type(m).__name__, m(**enc).sop_logits.shape)\n",
        cwd=tmp_path,
    )
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "AlbertHFForPreTraining torch.Size([1, 2])" in loaded.stdout and "1, 1" in loaded.stdout
    check_tokenizer_loads_without_prompt(out, fill_mask=True)


def held_out_texts(tmp_path):
    """The documents `pretrain` holds out of the embedded corpus (FAST's seed, the default 5%), single-spaced."""
    from albert_hf.pretraining.corpus import hold_out_documents
    from data_fixtures import embedded

    args = parse_args(["--output_dir", str(tmp_path / "unused"), *FAST])
    _, held_out = hold_out_documents(embedded(), args.data.validation_split_percentage, args.optimization.seed)
    return [" ".join(text.split()) for text in held_out["text"]]


def check_fill_mask_examples(out, stdout, held_out):
    """The summary's fill-mask block and fill_mask_examples.json agree, and show held-out sentences, one masked
    content word each, with the model's top 5."""
    examples = json.loads((out / "fill_mask_examples.json").read_text())
    assert 3 <= len(examples) <= 5
    block = stdout.split("  fill-mask (held-out sentences; true word, then the model's top 5):\n")[1].splitlines()
    for example, line in zip(examples, block):
        assert set(example) == {"masked_sentence", "true_word", "predictions", "probabilities"}
        sentence, word = example["masked_sentence"], example["true_word"]
        assert sentence.split().count("[MASK]") == 1 and word.isalpha() and len(word) >= 4
        assert 8 <= len(sentence.split()) <= 30
        assert any(sentence.replace("[MASK]", word) in text for text in held_out), sentence  # never trained on
        assert len(example["predictions"]) == 5 and all(example["predictions"])
        assert example["probabilities"] == sorted(example["probabilities"], reverse=True)
        assert 0 < example["probabilities"][-1] and sum(example["probabilities"]) <= 1 + 1e-3
        assert line == f'    "{sentence}" — true: {word}; predicted: {" | ".join(example["predictions"])}'


RESUME_ARGS = ["--max_train_steps", "12", "--checkpointing_steps", "3", "--eval_steps", "0",
               "--validation_split_percentage", "0"]  # checkpoints at 3, 6, 9, 12; logging every 2 steps (FAST)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """One uninterrupted 12-step run with a checkpoint every 3 steps, the curve resumed runs must follow."""
    reference = tmp_path_factory.mktemp("reference") / "run"
    pretrain(reference, *RESUME_ARGS)
    return reference


def check_same_weights_and_curve(run, reference, after_step):
    expected, got = load_file(reference / "model.safetensors"), load_file(run / "model.safetensors")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    # the resumed run continues the same curve: it logs the same steps, with the same losses, after the resume point
    reference_rows = [row for row in metrics(reference) if row["step"] > after_step]
    rows = [row for row in metrics(run) if row["step"] > after_step]
    assert [row["step"] for row in rows] == [row["step"] for row in reference_rows] and rows
    for row, expected_row in zip(rows, reference_rows):
        for key in ("train_mlm_loss", "train_mlm_accuracy", "train_sop_loss", "train_sop_accuracy"):
            assert row[key] == pytest.approx(expected_row[key], abs=1e-7), (row["step"], key)


@pytest.mark.parametrize("step", [3, 9])
@pytest.mark.trains
def test_resume_from_a_checkpoint_inside_a_logging_window_logs_the_uninterrupted_curve(tmp_path, reference_run,
                                                                                      step):
    """Checkpoints at odd steps fall inside a 2-step logging window: the window's sums travel with the checkpoint,
    so the first row logged after the resume covers the same steps as the uninterrupted run's."""
    resumed = tmp_path / "resumed"
    done = pretrain(resumed, *RESUME_ARGS, "--resume_from_checkpoint", str(reference_run / f"step_{step}"))
    assert f"Resumed from {reference_run / f'step_{step}'}: step {step}" in done.stderr
    check_same_weights_and_curve(resumed, reference_run, after_step=step)


@pytest.mark.trains
def test_dataloader_workers_change_nothing_but_the_speed(tmp_path, reference_run):
    """Two DataLoader workers mask and batch the pairs: the uninterrupted run's weights and curve, and again
    when resumed from one of its checkpoints (masks are keyed on seed, epoch and example, not on a worker)."""
    workers = [*RESUME_ARGS, "--dataloader_num_workers", "2"]
    resumed = [*workers, "--resume_from_checkpoint", str(reference_run / "step_6")]
    results, done = pretrain_runs([(tmp_path / "workers", workers), (tmp_path / "resumed", resumed)],
                                  steps_only=False)
    assert [result["status"] for result in results] == [0, 0], results
    assert done.stderr.count("; 2 DataLoader workers") == 2  # in each start line
    check_same_weights_and_curve(tmp_path / "workers", reference_run, after_step=0)
    check_same_weights_and_curve(tmp_path / "resumed", reference_run, after_step=6)


@pytest.mark.trains
def test_sigkill_mid_run_then_resume_ends_with_the_same_weights(tmp_path, reference_run):
    interrupted = tmp_path / "interrupted"
    process = pretrain(interrupted, *RESUME_ARGS, started=tmp_path)
    deadline = time.time() + 300
    while not (interrupted / "step_6" / STATE_FILE).exists():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (interrupted / "model.safetensors").exists()  # it really died before the end
    resumed_from = max(int(path.name[5:]) for path in interrupted.glob("step_*") if (path / STATE_FILE).exists())
    done = pretrain(interrupted, *RESUME_ARGS, "--resume_from_checkpoint", "latest")
    assert f"Resumed from {interrupted / f'step_{resumed_from}'}" in done.stderr
    # wherever the kill landed, the log holds one series: rows logged after the checkpoint were dropped on resume
    steps = [row["step"] for row in metrics(interrupted)]
    assert steps == sorted(steps) and len(steps) == len(set(steps)) == 6
    check_same_weights_and_curve(interrupted, reference_run, after_step=0)


def test_partial_checkpoints_are_never_resumed_from(tmp_path):
    accelerator = mock.MagicMock(is_main_process=True)
    for name in ("step_3", "step_6", "step_9", ".tmp-step_12"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_3" / STATE_FILE).write_text("{}")
    (tmp_path / "step_6" / STATE_FILE).write_text("{}")
    # step_9 has no state file: a save killed before it was renamed into place would never be called step_9,
    # but a folder copied by hand might; .tmp-step_12 is what a killed save leaves
    checkpoints = StepCheckpoints(tmp_path, accelerator)
    assert checkpoints.resolve("latest") == tmp_path / "step_6"
    with pytest.raises(InputError, match="not a complete checkpoint"):
        checkpoints.resolve(str(tmp_path / "step_9"))
    checkpoints.remove_partial()
    assert not (tmp_path / ".tmp-step_12").exists() and (tmp_path / "step_6").exists()
    assert StepCheckpoints(tmp_path / "missing", accelerator).resolve("latest") is None


def test_a_training_state_is_checked_once_on_load_position_and_window_alike(tmp_path):
    from albert_hf.pretraining.step import COUNTS

    checkpoints = StepCheckpoints(tmp_path, mock.MagicMock(is_main_process=True))  # load_state: a mock
    position = {"step": 4, "epoch": 0, "batches_in_epoch": 4}
    window = {"window": [1.0] * COUNTS, "window_tokens": 512, "window_seconds": 0.5}
    for name, state, problem in (
            ("good", {**position, **window}, None), ("no_window", position, None),
            ("short", {**position, **window, "window": [1.0] * (COUNTS - 1)}, "the logging window"),
            ("text", {**position, **window, "window_tokens": "512"}, "the logging window"),
            ("negative", {**position, "step": -1}, "does not hold the loop's position")):
        (tmp_path / name).mkdir()
        (tmp_path / name / STATE_FILE).write_text(json.dumps(state))
        if problem is None:
            assert checkpoints.load(tmp_path / name, COUNTS) == state
        else:
            with pytest.raises(InputError, match=f"^--resume_from_checkpoint {tmp_path / name}: .*{problem}"):
                checkpoints.load(tmp_path / name, COUNTS)


@pytest.mark.trains
@pytest.mark.launched
@pytest.mark.rounding
def test_two_processes_and_accumulation_follow_the_same_loss_curve_as_one(tmp_path):
    args = ["--max_train_steps", "8", "--eval_steps", "0", "--validation_split_percentage", "0"]
    single, accumulated = tmp_path / "single", tmp_path / "accumulated"
    # same global batch: 2 processes x 4 = 1 process x 8 = 1 process x 4 x 2 accumulation steps (one process
    # for the two one-process runs; the curve is all they are compared by)
    results, _ = pretrain_runs([(single, args), (accumulated, [*args, "--per_device_train_batch_size", "4",
                                                               "--gradient_accumulation_steps", "2"])])
    assert [result["status"] for result in results] == [0, 0], results
    double = tmp_path / "double"
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    done = pretrain(double, *args, "--per_device_train_batch_size", "4", launcher=launcher)
    assert "2 processes" in done.stderr
    one = metrics(single)
    for other in (metrics(double), metrics(accumulated)):
        check_same_curve(one, other)


def check_same_curve(one, two):
    assert [row["step"] for row in one] == [row["step"] for row in two] == [2, 4, 6, 8]
    for a, b in zip(one, two):
        # identical examples and masks; only DDP's mean of per-process MLM means differs from one global mean,
        # so the curves agree to ~1e-4 and an argmax near a tie may flip for a token or two
        assert b["train_mlm_loss"] == pytest.approx(a["train_mlm_loss"], rel=1e-3)
        assert b["train_sop_loss"] == pytest.approx(a["train_sop_loss"], rel=1e-3)
        assert b["train_mlm_accuracy"] == pytest.approx(a["train_mlm_accuracy"], abs=0.02)


@pytest.mark.trains
def test_streaming_jsonl_corpus(tmp_path, tiny_checkpoint):
    """--streaming reads the corpus lazily (an IterableDataset end to end) and still trains and evaluates."""
    from data_fixtures import embedded

    corpus = tmp_path / "corpus.jsonl"
    with open(corpus, "w") as f:
        for row in embedded().select(range(1500)):
            f.write(json.dumps({"body": row["text"]}) + "\n")
    out = tmp_path / "run"
    done = pretrain(out, "--train_files", str(corpus), "--text_column", "body", "--streaming",
                    "--tokenizer_name", str(tiny_checkpoint), "--max_train_steps", "4", "--eval_steps", "4")
    assert "Pretraining done." in done.stdout
    rows = metrics(out)
    assert rows[-1]["step"] == 4 and "eval_mlm_accuracy" in rows[-1] and "eval_sop_accuracy" in rows[-1]
    # a stream holds out its first 100 documents (5% x 20): the fill-mask sentences come from those
    check_fill_mask_examples(out, done.stdout, [" ".join(row["text"].split()) for row in embedded().select(range(100))])


@pytest.mark.trains
def test_nsp_run_names_its_metrics_nsp(tmp_path, tiny_checkpoint):
    """With --task nsp the 2-way head's loss and accuracy are logged as nsp_*, never as sop_*."""
    out = tmp_path / "run"
    pretrain(out, "--task", "nsp", "--tokenizer_name", str(tiny_checkpoint), "--max_train_steps", "2",
             "--logging_steps", "1", "--eval_steps", "2")
    rows = metrics(out)
    train, evals = [r for r in rows if "train_mlm_loss" in r], [r for r in rows if "eval_mlm_loss" in r]
    assert train and evals
    assert all("train_nsp_accuracy" in r and "train_nsp_loss" in r for r in train)
    assert all(0 <= r["eval_nsp_accuracy"] <= 1 for r in evals)
    assert not any(key.startswith(("train_sop", "eval_sop")) for r in rows for key in r)
    assert "eval_nsp_accuracy" in json.loads((out / "all_results.json").read_text())


def test_bad_arguments_stop_with_a_clear_message(tmp_path):
    # one process for the three (the command line's own exit with status 2 and one line: test_bad_input.py)
    results, done = pretrain_runs([(tmp_path / "a", ["--model_config", "huge", "--max_train_steps", "2"]),
                                   (tmp_path / "b", ["--max_train_steps", "5", "--num_warmup_steps", "9"]),
                                   (tmp_path / "c", ["--train_files", str(tmp_path / "nothing_here.txt"),
                                                     "--max_train_steps", "2"])])
    assert [result["status"] for result in results] == [2, 2, 2] and "Traceback" not in done.stderr, results
    usage = [line for line in done.stderr.splitlines() if "invalid choice: 'huge'" in line]
    assert len(usage) == 1 and "--model_config" in usage[0] and "xxlarge" in usage[0]  # argparse's own line
    assert results[1]["line"] == "error: --num_warmup_steps exceeds --max_train_steps"
    assert "nothing_here.txt" in results[2]["line"]


def test_a_sequence_longer_than_the_models_positions_stops_at_the_entry_before_any_data(tmp_path, tiny_checkpoint):
    """Checked once, in parse_args, for a preset, a --config_name and a loaded --model_name_or_path alike (the last
    one used to fail inside the model, after the corpus was read)."""
    from albert_hf.pretraining.job import parse_args

    base = ["--output_dir", str(tmp_path / "out")]
    for extra in (["--model_config", "tiny"], ["--config_name", str(tiny_checkpoint)],
                  ["--model_name_or_path", str(tiny_checkpoint)]):  # the tiny preset and checkpoint: 128 positions
        with pytest.raises(InputError, match=r"^--max_seq_length 129 exceeds the model's "
                                             r"max_position_embeddings=128$"):
            parse_args([*base, *extra, "--max_seq_length", "129"])
    assert parse_args([*base, "--model_config", "tiny", "--max_seq_length", "128"]).data.max_seq_length == 128


@pytest.mark.trains
def test_fp16_overflow_skips_the_update_and_the_schedule_without_touching_weights(fresh_accelerate_state):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from albert_hf import AlbertHFForPreTraining
    from albert_hf.optimization import Lamb, get_official_schedule, parameter_groups
    from albert_hf.pretraining.step import training_step
    from albert_hf.runtime.hardware import enable_cpu_fp16
    from helpers import tiny_config

    def setup(init_scale):
        accelerator = Accelerator(cpu=True, mixed_precision="fp16")
        enable_cpu_fp16(accelerator)
        accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        torch.manual_seed(0)
        model = AlbertHFForPreTraining(tiny_config())
        optimizer = Lamb(parameter_groups(model), lr=1e-3)
        scheduler = get_official_schedule(optimizer, 0, 10)
        model, optimizer = accelerator.prepare(model, optimizer)
        return accelerator, model, optimizer, scheduler

    ids = torch.randint(5, 1000, (4, 16))
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    batch = dict(input_ids=ids, labels=labels, sentence_order_label=torch.tensor([0, 1, 0, 1]))

    accelerator, model, optimizer, scheduler = setup(init_scale=2.0**100)  # every fp16 gradient overflows
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dtypes = []
    model.predictions.decoder.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    training_step(model, [batch], optimizer, scheduler, accelerator, max_grad_norm=1.0)
    assert dtypes == [torch.float16]  # fp16 autocast really ran
    assert accelerator.optimizer_step_was_skipped
    assert scheduler.last_epoch == 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert accelerator.scaler.get_scale() < 2.0**100  # the scale backed off

    AcceleratorState._reset_state(True)
    accelerator, model, optimizer, scheduler = setup(init_scale=2.0**8)
    training_step(model, [batch], optimizer, scheduler, accelerator, max_grad_norm=1.0)
    assert not accelerator.optimizer_step_was_skipped and scheduler.last_epoch == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_push_to_hub_uploads_the_final_folder_without_step_checkpoints(tmp_path, fresh_accelerate_state):
    from huggingface_hub import HfApi, RepoUrl

    from albert_hf.pretraining.job import main

    uploads = []

    def create_repo(self, repo_id, **kwargs):
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, repo_id, folder_path, commit_message=None, ignore_patterns=None, **kwargs):
        uploads.append(dict(repo_id=repo_id, files=sorted(p.name for p in Path(folder_path).iterdir()),
                            message=commit_message, ignore=ignore_patterns))
        return mock.MagicMock(commit_url="https://huggingface.co/fake/commit")

    out = tmp_path / "run"
    with mock.patch.object(HfApi, "create_repo", create_repo), mock.patch.object(HfApi, "upload_folder", upload_folder):
        main(["--output_dir", str(out), *FAST, "--max_train_steps", "4", "--checkpointing_steps", "2",
              "--eval_steps", "0", "--push_to_hub", "--hub_model_id", "someone/tiny-albert", "--hub_token", "x"])
    assert len(uploads) == 1 and uploads[0]["repo_id"] == "someone/tiny-albert"
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "modeling_albert_hf.py"} <= set(
        uploads[0]["files"])
    assert "step_*" in uploads[0]["ignore"] and (out / "step_2").is_dir()  # present locally, not uploaded


def test_running_metric_counts_hold_no_autograd_graph():
    """The training loop adds every step's counts into one window; a graph attached to them kept each step's
    logits alive (the process grew ~30 MB a step until the machine ran out of memory)."""
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.pretraining.step import example_counts, step_counts
    from helpers import tiny_config

    model = AlbertHFForPreTraining(tiny_config()).train()
    input_ids = torch.randint(5, 1000, (4, 16))
    labels = torch.full_like(input_ids, -100)
    labels[:, 3::4] = input_ids[:, 3::4]
    batch = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels,
                 sentence_order_label=torch.tensor([0, 1, 0, 1]))
    outputs = model(**batch)
    outputs.loss.backward()
    for counts in (example_counts(outputs, batch).sum(0), step_counts(outputs, batch)):
        window = torch.zeros(6, dtype=torch.float64)
        window += counts
        assert not window.requires_grad and window.grad_fn is None
        assert window[2] == 16 and window[5] == 4  # 4 masked tokens and one SOP label per example


def test_training_counts_from_the_model_losses_equal_the_per_token_recount():
    """Training sums the model's own mean losses times their counts; evaluation recounts per token: the same."""
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.pretraining.step import example_counts, step_counts
    from helpers import tiny_config

    model = AlbertHFForPreTraining(tiny_config()).eval()
    input_ids = torch.randint(5, 1000, (6, 24))
    labels = torch.full_like(input_ids, -100)
    labels[:, 2::5] = input_ids[:, 2::5]
    labels[0, :] = -100  # an example without masked tokens
    batch = dict(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels,
                 sentence_order_label=torch.tensor([0, 1, 1, 0, 1, 0]))
    with torch.no_grad():
        outputs = model(**batch)
    recount, counts = example_counts(outputs, batch).sum(0), step_counts(outputs, batch)
    assert counts[2] == 25 and counts[5] == 6
    torch.testing.assert_close(counts, recount, rtol=1e-6, atol=1e-6)
    assert counts[0] > 25 * 4  # a near-random model over 1000 pieces: several nats per token, not a mean


# One maskable word: "value" (one piece, 5 letters); "which" and "then" are function words, "xylophonequartz" is
# many pieces, "got." has punctuation, the rest are short.
FILL_MASK_SENTENCE = "So we set x to the value of an xylophonequartz which we then got."


def test_fill_mask_picks_a_one_piece_content_word_of_a_mid_length_sentence():
    from albert_hf.analysis.fill_mask import maskable, pick_fill_mask_sentences
    from data_fixtures import tokenizer

    tok = tokenizer()
    assert tok.tokenize("value") == ["▁value"] and len(tok.tokenize("xylophonequartz")) > 1
    assert [word for word in FILL_MASK_SENTENCE.split() if maskable(word, tok)] == ["value"]
    document = "\n\n".join(["Return the value.",  # too short
                             " ".join(["value"] * 31) + ".",  # too long
                             FILL_MASK_SENTENCE])
    assert pick_fill_mask_sentences([document], tok, seed=3) == [(FILL_MASK_SENTENCE, 6)]
    assert pick_fill_mask_sentences([document], tok, max_length=10) == []  # longer than the model reads
    many = [FILL_MASK_SENTENCE.replace("value", word) for word in ("file", "object", "module", "string", "number")]
    picked = pick_fill_mask_sentences(many, tok, count=3, seed=3)
    assert [sentence.split()[6] for sentence, _ in picked] == ["file", "object", "module"]  # one per document
    assert pick_fill_mask_sentences(many, tok, count=3, seed=3) == picked


def test_fill_mask_examples_report_the_top_predictions_at_the_masked_word():
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.analysis.fill_mask import fill_mask_examples
    from data_fixtures import tokenizer
    from helpers import tiny_config

    tok = tokenizer()
    model = AlbertHFForPreTraining(tiny_config(vocab_size=len(tok))).train()
    with torch.no_grad():  # a huge output bias for "▁file": the model's first guess everywhere
        model.get_output_embeddings().bias[tok.convert_tokens_to_ids("▁file")] = 100.0
    examples = fill_mask_examples(model, tok, [(FILL_MASK_SENTENCE, 6), ("Return the module object.", 1)], top_k=3)
    assert model.training  # left as it was found
    first = examples[0]
    assert first["masked_sentence"] == "So we set x to the [MASK] of an xylophonequartz which we then got."
    assert first["true_word"] == "value" and examples[1]["true_word"] == "the"
    assert first["predictions"][0] == "file" and first["probabilities"][0] > 0.99
    assert len(first["predictions"]) == len(first["probabilities"]) == 3


def test_fill_mask_examples_read_each_sentence_at_its_own_mask_in_a_padded_batch():
    """A stand-in model that predicts the previous token: each sentence's first guess is the word before its
    [MASK], which only holds if every row is read at its own masked position (at different places, the shorter
    row padded)."""
    from types import SimpleNamespace

    from albert_hf.analysis.fill_mask import fill_mask_examples
    from data_fixtures import tokenizer

    tok = tokenizer()

    class PreviousToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device

        def forward(self, input_ids, **kwargs):
            previous = torch.roll(input_ids, 1, dims=1)
            return SimpleNamespace(prediction_logits=10.0 * torch.nn.functional.one_hot(previous, len(tok)).float())

    sentences = [("the file value is read here", 2), ("when the work is done we return the object to the caller", 7)]
    examples = fill_mask_examples(PreviousToken(), tok, sentences)
    assert [e["predictions"][0] for e in examples] == ["file", "return"]
    assert [e["true_word"] for e in examples] == ["value", "the"]


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
    custom = make_optimizer(model, parse_args([*out, "--optimizer", "adamw", "--adam_beta1", "0.8",
                                               "--adam_beta2", "0.98", "--adam_epsilon", "1e-8"]).optimization)
    assert isinstance(custom, AdamWeightDecay)
    assert {(g["betas"], g["eps"]) for g in custom.param_groups} == {((0.8, 0.98), 1e-8)}
    with pytest.raises(InputError, match="--adam_beta2 must be in"):
        parse_args([*out, "--adam_beta2", "1.0"])


def test_an_earlier_run_in_output_dir_is_refused_then_cleared_with_overwrite_output_dir(tmp_path, tiny_checkpoint):
    out = tmp_path / "run"
    common = ["--tokenizer_name", str(tiny_checkpoint), "--eval_steps", "0"]
    first = pretrain(out, *common, "--max_train_steps", "4", "--checkpointing_steps", "2")  # 5% held out
    assert "fill-mask (held-out sentences" in first.stdout and (out / "fill_mask_examples.json").is_file()
    (out / "my_notes.txt").write_text("not ours")
    weights, log = (out / "model.safetensors").read_bytes(), (out / "metrics.jsonl").read_text()

    common += ["--validation_split_percentage", "0"]
    again = pretrain(out, *common, "--max_train_steps", "2", check=False)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    message = again.stderr.strip().splitlines()[-1]
    assert str(out) in message and "--overwrite_output_dir" in message and "--resume_from_checkpoint latest" in message
    assert (out / "model.safetensors").read_bytes() == weights and (out / "metrics.jsonl").read_text() == log  # kept

    done = pretrain(out, *common, "--max_train_steps", "2", "--overwrite_output_dir")
    assert not list(out.glob("step_*"))  # the old run's checkpoints would otherwise be resumed by `latest`
    assert [row["step"] for row in metrics(out)] == [2]  # one series, the new run's
    assert (out / "model.safetensors").read_bytes() != weights
    # nothing held out: no examples, and the earlier run's would mislead
    assert "fill-mask" not in done.stdout
    assert not (out / "fill_mask_examples.json").exists()
    assert (out / "my_notes.txt").read_text() == "not ours"  # only what a run writes is cleared


def test_output_dir_checks_before_any_work(tmp_path):
    out = tmp_path / "run"
    assert parse_args(["--output_dir", str(out)]).output.output_dir == str(out)  # a new folder
    out.mkdir()
    (out / "notes.txt").write_text("a user's file")
    parse_args(["--output_dir", str(out)])  # unrelated files are no earlier run
    (out / "metrics.jsonl").write_text('{"step": 2}\n')
    with pytest.raises(InputError, match="holds an earlier run .*no complete step_N checkpoint for "
                                         "--resume_from_checkpoint latest; pass --overwrite_output_dir"):
        parse_args(["--output_dir", str(out)])
    # `latest` with nothing to continue from would silently start over on top of the earlier run
    with pytest.raises(InputError, match="no complete step_N checkpoint"):
        parse_args(["--output_dir", str(out), "--resume_from_checkpoint", "latest"])
    (out / "step_2").mkdir()
    (out / "step_2" / STATE_FILE).write_text("{}")
    with pytest.raises(InputError, match="pass --resume_from_checkpoint latest to continue it; pass "
                                         "--overwrite_output_dir to start over"):
        parse_args(["--output_dir", str(out)])
    assert parse_args(["--output_dir", str(out), "--resume_from_checkpoint", "latest"]).output.resume_from_checkpoint
    with pytest.raises(InputError, match="not both"):
        parse_args(["--output_dir", str(out), "--resume_from_checkpoint", "latest", "--overwrite_output_dir"])


def test_a_checkpoint_that_cannot_be_resumed_stops_with_one_line_naming_the_flag(tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(InputError, match=f"--resume_from_checkpoint {missing}: no such folder"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(missing)])
    incomplete = tmp_path / "step_5"
    incomplete.mkdir()
    with pytest.raises(InputError, match=f"--resume_from_checkpoint {incomplete}: not a complete checkpoint"):
        parse_args(["--output_dir", str(tmp_path / "run"), "--resume_from_checkpoint", str(incomplete)])

    # a folder that looks complete but lacks the saved state: found out when loading, still one line
    (incomplete / STATE_FILE).write_text(json.dumps({"step": 5, "epoch": 0, "batches_in_epoch": 5}))
    done = pretrain(tmp_path / "run", "--max_train_steps", "6", "--eval_steps", "0", "--validation_split_percentage",
                    "0", "--resume_from_checkpoint", str(incomplete), check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith(f"error: --resume_from_checkpoint {incomplete}: cannot load")
    assert not (tmp_path / "run" / "model.safetensors").exists()


DELAYED_SAVE = """
import sys, time
import torch
from accelerate import Accelerator
from albert_hf.pretraining.checkpoints import StepCheckpoints
from albert_hf.runtime.distributed import end_distributed

accelerator = Accelerator(cpu=True)
model = accelerator.prepare(torch.nn.Linear(2, 2))
checkpoints = StepCheckpoints(sys.argv[1], accelerator)
for step in (1, 1, 2):  # step 1 twice: the second save finds the checkpoint already there
    if accelerator.process_index == 1:
        time.sleep(2)  # the slow process looks only after the main process has renamed step_N into place
    checkpoints.save(step, {"step": step})
    total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), "sum")  # the next collective call
    with open(f"{sys.argv[2]}/rank_{accelerator.process_index}.txt", "a") as log:  # one file each: no interleaving
        log.write(f"rank {accelerator.process_index} step {step} total {total.item()}\\n")
del model  # then the process group is freed before the exit, as in run_pretraining (no abort in teardown)
assert end_distributed(accelerator) == 0
"""


@pytest.mark.launched
def test_checkpoint_save_takes_the_same_collective_path_on_every_process(tmp_path):
    """A slower process must not decide alone that a checkpoint exists and skip the collective calls the others
    make: it would leave them waiting forever (seen: a 2-process run hung at its first checkpoint)."""
    script = tmp_path / "delayed_save.py"
    script.write_text(DELAYED_SAVE)
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    env = subprocess_env()
    done = run_bounded(launcher + [str(script), str(tmp_path / "out"), str(tmp_path)], timeout=120, env=env,
                       cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = sorted(line for rank in (0, 1) for line in (tmp_path / f"rank_{rank}.txt").read_text().splitlines())
    assert lines == [f"rank {rank} step {step} total 3.0" for rank in (0, 1) for step in (1, 1, 2)]
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["step_1", "step_2"]
    for step in ("step_1", "step_2"):  # each process's own random states made it into the renamed folder
        assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in (tmp_path / "out" / step).iterdir()}
