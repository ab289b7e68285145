"""Bad input reaches the user as one `error:` line and exit status 2, from every entry point; defaults compose.

The input kinds are fuzzed in test_fuzz_inputs.py; here each entry point is run as a user runs it, on inputs
whose checks sit deep in a run (a damaged data file, defaults that meet a small model, a launched run)."""

import json
import logging
import shutil
import signal
import sys

import pytest

from albert_hf.errors import InputError
from albert_hf.runtime.cli import run_entry_point
from albert_hf.runtime.preemption import STOP_SIGNALS
from albert_hf.tasks.finetuning import run_script
from albert_hf.testing.glue_folders import write_glue_folders, write_tsv
from data_fixtures import SQUAD_V1, write_json, write_official_layout
from helpers import ANY_PORT, REPO, reset_accelerate_state, run_bounded, run_glue, run_squad, squad_args, subprocess_env

MRPC_HEADER = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
MRPC_ROWS = [(i % 2, 100 + i, 200 + i, f"The cat sat on mat {i}.", f"A cat was on mat {i}.") for i in range(8)]


def error_line(capsys, main) -> str:
    """The entry point's stderr for `main()`: checked to end in exit status 2 and one `error:` line, no traceback.
    The entry point leaves the stop signals ignored for the process's exit; this process goes on, so they are put
    back."""
    capsys.readouterr()
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    try:
        with pytest.raises(SystemExit) as stop:
            run_script(main)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and err.count("error: ") == 1, err[-2000:]
    return last


def test_run_entry_point_prints_input_errors_only_and_keeps_other_tracebacks(capsys, monkeypatch):
    def refuse():
        raise InputError("data.tsv: row 3: unknown label '7'\nsecond line")

    with pytest.raises(SystemExit) as stop:
        run_entry_point(refuse)
    assert stop.value.code == 2 and capsys.readouterr().err == "error: data.tsv: row 3: unknown label '7'\n"
    monkeypatch.setenv("RANK", "1")  # another process of a launched run: the same status, silently
    with pytest.raises(SystemExit) as stop:
        run_entry_point(refuse)
    assert stop.value.code == 2 and capsys.readouterr().err == ""

    def bug():
        raise KeyError("a bug")

    finished = []
    with pytest.raises(KeyError):  # not caught: a bug keeps its traceback
        run_entry_point(bug, finish=lambda: finished.append(True))
    assert finished == [True]


@pytest.mark.parametrize(
    "damage, message",
    [
        ("drop_column", r"train\.tsv \(train\): missing column\(s\) \['sentence2'\]"),
        ("label_7", r"train\.tsv \(train\): row 3: unknown label '7' in column 'label' for mrpc"),
        ("empty", r"train\.tsv: the file is empty"),
        ("header_only", r"train\.tsv: no data rows after the header"),
        ("binary", r"train\.tsv: not UTF-8 text"),
        (
            "comma_separated",
            r"train\.tsv: its header .* names none of mrpc.s columns .*: a comma-separated file needs the \.csv "
            r"extension",
        ),
    ],
)
def test_run_glue_refuses_a_damaged_file_with_one_line(tmp_path, tiny_checkpoint, capsys, damage, message):
    import re

    rows = [list(row) for row in MRPC_ROWS]
    header = list(MRPC_HEADER)
    if damage == "drop_column":
        header, rows = header[:-1], [row[:-1] for row in rows]
    if damage == "label_7":
        rows[3][0] = 7
    path = tmp_path / "train.tsv"
    write_tsv(path, header, rows)
    if damage == "empty":
        path.write_text("")
    elif damage == "header_only":
        path.write_text("\t".join(header) + "\n")
    elif damage == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif damage == "comma_separated":
        path.write_text(path.read_text().replace("\t", ","))
    out = tmp_path / "out"
    argv = [
        "--model_name_or_path",
        tiny_checkpoint,
        "--task_name",
        "mrpc",
        "--train_file",
        path,
        "--do_train",
        "--max_steps",
        2,
        "--output_dir",
        out,
        "--report_to",
        "none",
        "--max_seq_length",
        32,
    ]
    line = error_line(capsys, lambda: run_glue(argv))
    assert re.search(message, line), line
    assert not (out / "model.safetensors").exists()


def test_run_glue_skips_a_truncated_last_line_and_counts_it(tmp_path, tiny_checkpoint, caplog):
    path = tmp_path / "train.tsv"
    write_tsv(path, MRPC_HEADER, MRPC_ROWS)
    path.write_text(path.read_text().rstrip("\n").rsplit("\t", 2)[0] + "\n")  # the last row loses two fields
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        run_glue(
            [
                "--model_name_or_path",
                tiny_checkpoint,
                "--task_name",
                "mrpc",
                "--train_file",
                path,
                "--do_train",
                "--max_steps",
                1,
                "--output_dir",
                out,
                "--report_to",
                "none",
                "--max_seq_length",
                32,
            ]
        )
    assert "skipped 1 malformed row(s) (expected 5 tab-separated fields), first at line 9" in caplog.text
    assert (out / "model.safetensors").exists()


def test_run_squad_short_windows_compose_with_the_default_question_length(tmp_path, tiny_checkpoint, caplog):
    path = write_json(tmp_path / "train-v1.1.json", SQUAD_V1)
    out = tmp_path / "out"
    argv = squad_args(tiny_checkpoint, out, steps=1, seq=48)
    at = argv.index("--max_query_length")
    del argv[at : at + 2]  # the default, 64, longer than the 48-piece window
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        run_squad(["--train_file", path, "--validation_file", path, "--do_train", "--do_eval", *argv])
    capped = [r.getMessage() for r in caplog.records if "--max_query_length" in r.getMessage()]
    assert capped == [
        "--max_query_length 64 would leave no context in a --max_seq_length 48 window: questions keep "
        "their first 22 pieces"
    ]
    assert json.loads((out / "eval_results.json").read_text())["eval_samples"] == 3


def test_the_default_max_seq_length_is_capped_at_a_small_models_positions(tmp_path, tiny_checkpoint, caplog):
    # RACE's default is 512; the tiny model has 128 positions
    root = write_official_layout(tmp_path / "RACE")
    out = tmp_path / "out"
    import run_race

    reset_accelerate_state()
    with caplog.at_level(logging.WARNING, logger="albert_hf"):
        run_race.main(
            [
                str(a)
                for a in [
                    "--model_name_or_path",
                    tiny_checkpoint,
                    "--data_dir",
                    root,
                    "--do_eval",
                    "--output_dir",
                    out,
                    "--report_to",
                    "none",
                    "--max_eval_samples",
                    2,
                ]
            ]
        )
    assert "--max_seq_length 512 is longer than the model's 128 positions; using 128" in caplog.text
    assert (out / "eval_results.json").exists()


# ----------------------------------------------------------------------------------------------------------------
# As a user runs them: python script.py ..., and under accelerate launch


def run_script_file(script, *argv, cwd, launcher=None):
    command = (launcher or [sys.executable]) + [str(REPO / script), *map(str, argv)]
    env = subprocess_env()
    return run_bounded(command, 240, env=env, cwd=cwd)


def check_one_error_line(done, *expected):
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and all(part in last for part in expected), last


def test_each_script_prints_one_line_and_exits_2(tmp_path, tiny_checkpoint):
    glue = write_glue_folders(tmp_path / "glue") / "MRPC"
    (glue / "train.tsv").write_text((glue / "train.tsv").read_text().replace("#2 String", "#2 Str"))
    done = run_script_file(
        "run_glue.py",
        "--model_name_or_path",
        tiny_checkpoint,
        "--task_name",
        "mrpc",
        "--data_dir",
        glue,
        "--do_train",
        "--output_dir",
        tmp_path / "glue_out",
        cwd=tmp_path,
    )
    check_one_error_line(done, "train.tsv (train): missing column(s) ['sentence2']")
    assert not (tmp_path / "glue_out" / "model.safetensors").exists()

    race_root = write_official_layout(tmp_path / "race")
    shutil.rmtree(race_root / "dev" / "middle")
    done = run_script_file(
        "run_race.py",
        "--model_name_or_path",
        tiny_checkpoint,
        "--data_dir",
        race_root,
        "--do_eval",
        "--output_dir",
        tmp_path / "race_out",
        cwd=tmp_path,
    )
    check_one_error_line(done, "dev/middle: missing", "use --subset for one level")

    (tmp_path / "no_text").mkdir()
    (tmp_path / "no_text" / "data.bin").write_bytes(b"\x00\x01")
    done = run_script_file(
        "run_pretraining.py", "--train_files", tmp_path / "no_text", "--output_dir", tmp_path / "pre_out", cwd=tmp_path
    )
    check_one_error_line(done, "--train_files: No text files", "no_text")
    assert not (tmp_path / "pre_out").exists()

    done = run_bounded(
        [sys.executable, "-m", "albert_hf.convert", "--from_tf", tmp_path / "nowhere", tmp_path / "converted"],
        240,
        cwd=REPO,
    )
    check_one_error_line(done, "--from_tf", "nowhere")


@pytest.mark.parametrize("which", ["every process", "the second process only"])
@pytest.mark.launched
def test_under_accelerate_launch_the_line_is_printed_once(tmp_path, tiny_checkpoint, which):
    """Every process checks the same flags, and the first prints the line. A problem that only one process meets
    (its own share of a streamed corpus) stops every process at once, and the first prints that process's line."""
    from accelerate_configs import write_config

    config = tmp_path / "ddp.yaml"
    write_config(
        config,
        {
            "type of machine": "multi-GPU",
            "How many different machines": "1",
            "How many GPU(s)": "2",
            "FullyShardedDataParallel": "no",
            "mixed precision": "no",
        },
    )
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), *ANY_PORT]
    if which == "every process":
        argv, expected = ["--train_files", tmp_path / "nowhere.txt"], "nowhere.txt"
    else:
        (tmp_path / "text").mkdir()
        (tmp_path / "text" / "a.txt").write_text("A first sentence. A second one follows it. " * 20)
        (tmp_path / "text" / "b.txt").write_text("Only one sentence here")
        argv = [
            "--train_files",
            tmp_path / "text",
            "--streaming",
            "--tokenizer_name",
            tiny_checkpoint,
            "--validation_split_percentage",
            "0",
            "--max_train_steps",
            "2",
        ]
        expected = "the files of process 1"
    done = run_script_file(
        "run_pretraining.py", *argv, "--output_dir", tmp_path / "out", cwd=tmp_path, launcher=launcher
    )
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and expected in ours[0], done.stderr[-3000:]
    assert "[rank" not in done.stderr, done.stderr[-3000:]  # no worker traceback, only the launcher's report
