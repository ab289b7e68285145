"""A checkpoint is input: resuming one runs no code from it, its files are checked against the record written with
it, and a state it cannot restore stops the run with one line naming the file. Pretraining's step_N (local, `latest`,
and from a stand-in Hub) and fine-tuning's checkpoint-N; checkpoints written before the record still resume. The
tests that resume the checkpoints of a trained fixture are marked `trains` (make test runs them, not test-fast)."""

import json
import os
import pickle
import re
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.pretraining.output.checkpoints import (
    LEGACY_SCHEDULE_FILE,
    RECORD,
    RECORD_FILE,
    SCHEDULE_FILE,
    STATE_FILE,
)
from helpers import REPO, run_bounded, start_process, subprocess_env
from pretraining_runs import check_same_weights_and_curve, pretrain, pretrain_runs

STEPS = [
    "--max_train_steps",
    "4",
    "--checkpointing_steps",
    "2",
    "--eval_steps",
    "0",
    "--validation_split_percentage",
    "0",
]


class RunsCode:
    """Unpickled with code, it creates the file `marker`: what a planted pickle can do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def plant(path, marker):
    path.write_bytes(pickle.dumps({"state": RunsCode(marker)}))


def flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def as_written_before_the_record(checkpoint):
    """The checkpoint as versions before the record wrote it: no record, the schedule in accelerate's pickle of its
    state_dict (custom_checkpoint_0.pkl, torch.save), no schedule.json."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    del state[RECORD]
    (checkpoint / STATE_FILE).write_text(json.dumps(state))
    (checkpoint / RECORD_FILE).unlink()
    torch.save(json.loads((checkpoint / SCHEDULE_FILE).read_text()), checkpoint / LEGACY_SCHEDULE_FILE)
    (checkpoint / SCHEDULE_FILE).unlink()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """An uninterrupted 4-step run with step_2 and step_4: the checkpoints the tests copy, and the weights a resumed
    run ends with."""
    out = tmp_path_factory.mktemp("pretrained") / "run"
    pretrain(out, *STEPS)
    return out


def copy_of(pretrained, folder, steps=("step_2",), written_before_the_record=False):
    folder.mkdir(parents=True)
    for step in steps:
        shutil.copytree(pretrained / step, folder / step)
        if written_before_the_record:
            as_written_before_the_record(folder / step)
    return folder


def test_the_record_holds_each_files_size_and_sha256_and_finds_what_changed(tmp_path):
    """Against sha256sum and the sizes on disk; each damage named, the first file in order."""
    import subprocess

    from albert_hf.runtime.checkpoint_files import damage, record

    (tmp_path / "sub").mkdir()
    for name, size in (("a.bin", 3), ("sub/b.json", 20_000_000), ("empty", 0)):
        (tmp_path / name).write_bytes(os.urandom(size))
    written = record(tmp_path)
    assert sorted(written) == ["a.bin", "empty", "sub/b.json"]
    for name, entry in written.items():
        digest = subprocess.run(["sha256sum", str(tmp_path / name)], capture_output=True, text=True, check=True)
        assert entry == {"bytes": (tmp_path / name).stat().st_size, "sha256": digest.stdout.split()[0]}, name
    assert damage(tmp_path, written) is None
    flip_a_byte(tmp_path / "sub" / "b.json")
    assert damage(tmp_path, written) == "sub/b.json: changed since it was written (its sha256 differs from the record)"
    (tmp_path / "empty").write_bytes(b"x")
    assert damage(tmp_path, written) == "empty: 1 bytes where 0 were written (larger than written)"
    (tmp_path / "extra.pkl").write_bytes(b"")
    assert damage(tmp_path, written) == "extra.pkl: not written by the run (it is not in the checkpoint's record)"


def test_a_sharded_checkpoints_metadata_is_read_as_data_and_a_planted_one_runs_nothing(tmp_path):
    """torch.distributed.checkpoint reads `.metadata` with a plain pickle.load; within weights_only_loads (every
    resume) it is data only."""
    import torch.distributed.checkpoint as dcp

    from albert_hf.runtime import checkpoint_files

    weights = {"model": {"linear.weight": torch.arange(6.0).view(2, 3), "linear.bias": torch.ones(2)}}
    dcp.save(weights, checkpoint_id=tmp_path / "shards", no_dist=True)
    loaded = {"model": {name: torch.zeros_like(value) for name, value in weights["model"].items()}}
    with checkpoint_files.weights_only_loads():
        dcp.load(loaded, checkpoint_id=tmp_path / "shards", no_dist=True)
    for name, value in weights["model"].items():
        assert torch.equal(loaded["model"][name], value)
    assert checkpoint_files.unreadable(tmp_path / "shards") is None
    marker = tmp_path / "code-ran"
    plant(tmp_path / "shards" / ".metadata", marker)
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException, match="posix.system: not data of a sharded checkpoint's metadata"):
        with checkpoint_files.weights_only_loads():
            dcp.load(loaded, checkpoint_id=tmp_path / "shards", no_dist=True)
    assert not marker.exists(), "a planted pickle ran"
    assert checkpoint_files.unreadable(tmp_path / "shards").startswith(".metadata: posix.system: not data")
    import torch.distributed.checkpoint.filesystem as filesystem

    assert filesystem.pickle is pickle  # outside the loads, torch's reader is as it was


@pytest.mark.trains
@pytest.mark.parametrize("written_before_the_record", [False, True], ids=["recorded", "before-the-record"])
def test_a_planted_pickle_in_a_step_checkpoint_runs_nothing_and_ends_in_one_line_naming_the_file(
    tmp_path, pretrained, written_before_the_record
):
    marker = tmp_path / "code-ran"
    names = ["model.safetensors", "optimizer.bin", "random_states_0.pkl", LEGACY_SCHEDULE_FILE, STATE_FILE]
    if not written_before_the_record:
        names += [SCHEDULE_FILE, RECORD_FILE]
    runs = []
    for name in names:
        out = copy_of(pretrained, tmp_path / name, written_before_the_record=written_before_the_record)
        plant(out / "step_2" / name, marker)
        runs.append((out, [*STEPS, "--resume_from_checkpoint", str(out / "step_2")]))
    results, done = pretrain_runs(runs)
    assert not marker.exists(), "a planted pickle ran"
    for name, (out, _), result in zip(names, runs, results):
        assert result["status"] == 2, (name, result, done.stderr[-3000:])
        prefix = re.escape(f"error: --resume_from_checkpoint {out / 'step_2'}: ")
        assert re.match(f"{prefix}(cannot load )?{re.escape(name)}: ", result["line"]), (name, result["line"])
        assert not (out / "model.safetensors").exists() and not (out / "step_4").exists(), name


@pytest.mark.trains
def test_a_checkpoint_records_its_files_last_and_one_whose_record_was_never_written_resumes_with_a_line(
    tmp_path, pretrained
):
    """The record names every file of the checkpoint, training_state.json included, and is written after them (in
    the background, while training goes on); a run killed before it was written leaves a checkpoint that resumes
    unchecked, saying so."""
    for step in ("step_2", "step_4"):
        checkpoint = pretrained / step
        files = json.loads((checkpoint / RECORD_FILE).read_text())["files"]
        assert json.loads((checkpoint / STATE_FILE).read_text())[RECORD] == RECORD_FILE
        assert sorted(files) == sorted(p.name for p in checkpoint.iterdir() if p.name != RECORD_FILE)
        assert all(files[name]["bytes"] == (checkpoint / name).stat().st_size for name in files)
        assert (checkpoint / RECORD_FILE).stat().st_mtime_ns >= max((checkpoint / n).stat().st_mtime_ns for n in files)
    out = copy_of(pretrained, tmp_path / "killed-while-hashing")
    (out / "step_2" / RECORD_FILE).unlink()
    results, done = pretrain_runs([(out, [*STEPS, "--resume_from_checkpoint", str(out / "step_2")])])
    assert results[0]["status"] == 0, (results, done.stderr[-3000:])
    assert (
        f"{out / 'step_2'}: its record ({RECORD_FILE}) was never written (the run ended while hashing the files): "
        "its files are not checked"
    ) in done.stderr


@pytest.mark.trains
def test_a_changed_or_cut_short_file_is_refused_naming_it_and_the_intact_checkpoint_beside_it(tmp_path, pretrained):
    damages = {
        "flipped": ("model.safetensors", flip_a_byte, "changed since it was written"),
        "truncated": ("optimizer.bin", lambda path: path.write_bytes(path.read_bytes()[:1000]), "cut short"),
        "larger": (
            "random_states_0.pkl",
            lambda path: path.write_bytes(path.read_bytes() + b"\0"),
            "larger than written",
        ),
        "missing": ("optimizer.bin", lambda path: path.unlink(), "missing"),
    }
    runs = []
    for kind, (name, damage, _) in damages.items():
        out = copy_of(pretrained, tmp_path / kind, steps=("step_2", "step_4"))
        damage(out / "step_4" / name)
        runs.append((out, [*STEPS, "--max_train_steps", "6", "--resume_from_checkpoint", str(out / "step_4")]))
    results, done = pretrain_runs(runs)
    for (kind, (name, _, what)), (out, _), result in zip(damages.items(), runs, results):
        assert result["status"] == 2, (kind, result, done.stderr[-3000:])
        assert result["line"].startswith(f"error: --resume_from_checkpoint {out / 'step_4'}: {name}: "), result
        assert what in result["line"], result
        assert result["line"].endswith(
            f"the newest earlier intact checkpoint is {out / 'step_2'}: --resume_from_checkpoint {out / 'step_2'}"
        ), result


@pytest.mark.trains
def test_latest_passes_over_a_damaged_checkpoint_and_both_formats_resume_to_the_uninterrupted_weights(
    tmp_path, pretrained
):
    """`latest` with a changed step_4 resumes from step_2 (step_4 renamed aside, so the run writes its own); a
    checkpoint written before the record resumes, unchecked, with a line; each ends with the uninterrupted run's
    weights and curve (exact resume: the schedule and the random states restored from data)."""
    damaged = copy_of(pretrained, tmp_path / "damaged", steps=("step_2", "step_4"))
    flip_a_byte(damaged / "step_4" / "optimizer.bin")
    before = copy_of(pretrained, tmp_path / "before", written_before_the_record=True)
    recorded = copy_of(pretrained, tmp_path / "recorded")
    runs = [
        (damaged, [*STEPS, "--resume_from_checkpoint", "latest"]),
        (before, [*STEPS, "--resume_from_checkpoint", str(before / "step_2")]),
        (recorded, [*STEPS, "--resume_from_checkpoint", str(recorded / "step_2")]),
    ]
    results, done = pretrain_runs(runs, steps_only=False)
    assert [result["status"] for result in results] == [0, 0, 0], (results, done.stderr[-3000:])
    assert (
        "--resume_from_checkpoint latest: passed over step_4 (optimizer.bin: changed since it was written "
        "(its sha256 differs from the record)), renamed step_4.damaged"
    ) in done.stderr
    assert (damaged / "step_4.damaged").is_dir() and (damaged / "step_4" / RECORD_FILE).is_file()
    assert (
        f"{before / 'step_2'} was written before checkpoints recorded their files' sizes and sha256: its files "
        "are not checked"
    ) in done.stderr
    assert done.stderr.count("was written before checkpoints recorded") == 1
    # `latest` checks the checkpoint it picks once: load does not hash it again (nor say it twice)
    only_before = copy_of(pretrained, tmp_path / "latest-before", written_before_the_record=True)
    results, done = pretrain_runs([(only_before, [*STEPS, "--resume_from_checkpoint", "latest"])])
    assert results[0]["status"] == 0, (results, done.stderr[-3000:])
    assert done.stderr.count("was written before checkpoints recorded") == 1, done.stderr[-3000:]
    for out, _ in runs:
        check_same_weights_and_curve(out, pretrained, after_step=2)
    # what the resumed runs wrote is data: the schedule as JSON, no pickle of it
    assert (before / "step_4" / SCHEDULE_FILE).is_file() and not (before / "step_4" / LEGACY_SCHEDULE_FILE).exists()


@pytest.mark.trains
def test_a_random_state_or_schedule_that_cannot_be_restored_stops_the_run(tmp_path, pretrained):
    """accelerate skips random states it cannot read with a debug line: the run would go on, no longer exact."""
    cases = {
        "random-states-not-a-dict": (
            "random_states_0.pkl",
            lambda path: torch.save([1, 2], path),
            "random_states_0.pkl: not the random states accelerate writes",
        ),
        "random-states-gone": ("random_states_0.pkl", lambda path: path.unlink(), "random_states_0.pkl: missing"),
        "schedule-text": (
            SCHEDULE_FILE,
            lambda path: path.write_text('{"last_epoch": "two"}'),
            f"{SCHEDULE_FILE}: not the state of this run's learning-rate schedule",
        ),
    }
    runs = []
    for kind, (name, damage, _) in cases.items():
        out = copy_of(pretrained, tmp_path / kind, written_before_the_record=False)
        state = json.loads((out / "step_2" / STATE_FILE).read_text())
        del state[RECORD]  # damaged past the record: what is read must still be checked
        (out / "step_2" / STATE_FILE).write_text(json.dumps(state))
        damage(out / "step_2" / name)
        runs.append((out, [*STEPS, "--resume_from_checkpoint", str(out / "step_2")]))
    results, done = pretrain_runs(runs)
    for (kind, (_, _, what)), (out, _), result in zip(cases.items(), runs, results):
        assert result["status"] == 2, (kind, result, done.stderr[-3000:])
        assert result["line"].startswith(f"error: --resume_from_checkpoint {out / 'step_2'}: {what}"), result


def test_a_stream_position_that_cannot_be_read_stops_in_one_line(tmp_path):
    from unittest import mock

    from albert_hf.errors import InputError
    from albert_hf.pretraining.output.checkpoints import STREAM_STATE_FILE, StepCheckpoints

    checkpoints = StepCheckpoints(tmp_path, mock.MagicMock(process_index=0))
    for content, what in ((b"\x80\x04not json", "stream_state_0.json: "), (b"[1, 2]", "not a stream position")):
        (tmp_path / STREAM_STATE_FILE.format(0)).write_bytes(content)
        with pytest.raises(InputError, match=f"^--resume_from_checkpoint {tmp_path}: .*{what}"):
            checkpoints.stream_state(tmp_path)


@pytest.mark.trains
def test_a_planted_pickle_from_the_hub_runs_nothing(tmp_path, pretrained):
    """--resume_from_checkpoint hub:OWNER/NAME with someone's last-checkpoint/ holding a planted pickle, through a
    stand-in for the Hub's download: nothing runs, one line; an intact one resumes."""
    marker = tmp_path / "code-ran"
    runs = []
    for name in ("optimizer.bin", LEGACY_SCHEDULE_FILE, None):
        hub = tmp_path / f"hub-{name}"
        last = hub / "someone" / "albert" / "main" / "last-checkpoint"
        shutil.copytree(pretrained / "step_2", last)
        if name == LEGACY_SCHEDULE_FILE:
            as_written_before_the_record(last)
        if name is not None:
            plant(last / name, marker)
        out = tmp_path / f"out-{name}"
        runs.append((out, [*STEPS, "--resume_from_checkpoint", "hub:someone/albert"], {}, True, {"fake_hub": str(hub)}))
    results, done = pretrain_runs(runs)
    assert not marker.exists(), "a planted pickle ran"
    for (out, *_), result, name in zip(runs, results, ("optimizer.bin", LEGACY_SCHEDULE_FILE, None)):
        if name is None:
            assert result["status"] == 0, (result, done.stderr[-3000:])
            continue
        assert result["status"] == 2, (name, result, done.stderr[-3000:])
        assert re.match(
            re.escape(f"error: --resume_from_checkpoint {out / 'step_2'}: ") + f"(cannot load )?{name}: ",
            result["line"],
        ), result


@pytest.mark.trains
def test_a_hub_state_whose_step_is_not_a_number_is_refused(tmp_path, pretrained):
    """The step names the folder the download goes into: '../..' must not take it outside --output_dir."""
    hub = tmp_path / "hub"
    last = hub / "someone" / "albert" / "main" / "last-checkpoint"
    shutil.copytree(pretrained / "step_2", last)
    state = json.loads((last / STATE_FILE).read_text())
    (last / STATE_FILE).write_text(json.dumps({**state, "step": "2/../../../elsewhere"}))
    out = tmp_path / "out"
    results, done = pretrain_runs(
        [(out, [*STEPS, "--resume_from_checkpoint", "hub:someone/albert"], {}, True, {"fake_hub": str(hub)})]
    )
    assert results[0] == {
        "status": 2,
        "line": "error: --resume_from_checkpoint hub:someone/albert: someone/albert: "
        f"last-checkpoint/{STATE_FILE} holds no step (an integer >= 0)",
    }, results
    assert not (tmp_path / "elsewhere").exists()


# ----------------------------------------------------------------------------------------------------------------
# Fine-tuning: Trainer's checkpoint-N, checked before Trainer loads it


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, tiny_checkpoint):
    """run_glue.py's 4 steps on RTE with checkpoint-2 and checkpoint-4."""
    from albert_hf.testing.glue_folders import write_glue_folders

    folder = tmp_path_factory.mktemp("finetuned")
    rte = write_glue_folders(folder / "glue") / "RTE"
    command = glue_command(tiny_checkpoint, rte, folder / "run", "--max_steps", "4", "--save_steps", "2")
    done = run_bounded(command, 300, env=subprocess_env(), cwd=folder)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder / "run", rte


def glue_command(checkpoint, data_dir, output_dir, *extra):
    return [
        sys.executable,
        str(REPO / "run_glue.py"),
        "--model_name_or_path",
        str(checkpoint),
        "--task_name",
        "rte",
        "--data_dir",
        str(data_dir),
        "--do_train",
        "--max_seq_length",
        "32",
        "--per_device_train_batch_size",
        "4",
        "--learning_rate",
        "1e-3",
        "--report_to",
        "none",
        "--save_strategy",
        "steps",
        "--seed",
        "0",
        "--dataloader_pin_memory",
        "false",
        "--disable_tqdm",
        "true",
        "--output_dir",
        str(output_dir),
        *extra,
    ]


@pytest.mark.trains
def test_a_fine_tuning_checkpoint_records_its_files_written_last(finetuned):
    from albert_hf.runtime.checkpoint_files import RECORD_FILE

    run, _ = finetuned
    for step in (2, 4):
        checkpoint = run / f"checkpoint-{step}"
        files = json.loads((checkpoint / RECORD_FILE).read_text())["files"]
        assert sorted(files) == sorted(p.name for p in checkpoint.iterdir() if p.name != RECORD_FILE)
        wanted = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "model.safetensors", "trainer_state.json"}
        assert wanted <= set(files), files
        assert all(files[name]["bytes"] == (checkpoint / name).stat().st_size for name in files)
        newest = max((checkpoint / name).stat().st_mtime_ns for name in files)
        assert (checkpoint / RECORD_FILE).stat().st_mtime_ns >= newest


@pytest.mark.trains
@pytest.mark.parametrize("written_before_the_record", [False, True], ids=["recorded", "before-the-record"])
def test_a_planted_or_damaged_file_in_a_fine_tuning_checkpoint_ends_in_one_line_naming_it(
    tmp_path, tiny_checkpoint, finetuned, written_before_the_record
):
    """Trainer loads with weights_only=True, so nothing would run, but its refusal is a traceback (status 1): the
    run checks the checkpoint first and stops with one line naming the file."""
    from albert_hf.runtime.checkpoint_files import RECORD_FILE

    run, rte = finetuned
    marker = tmp_path / "code-ran"
    cases = {
        name: lambda path: plant(path, marker)
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")
    }
    if not written_before_the_record:  # one changed byte there is found by the record only
        cases["model.safetensors"] = flip_a_byte
    processes = {}
    for name, damage in cases.items():
        out = tmp_path / name
        for step in (2, 4):
            shutil.copytree(run / f"checkpoint-{step}", out / f"checkpoint-{step}")
            if written_before_the_record:
                (out / f"checkpoint-{step}" / RECORD_FILE).unlink()
        damage(out / "checkpoint-4" / name)
        command = glue_command(
            tiny_checkpoint,
            rte,
            out,
            "--max_steps",
            "6",
            "--save_steps",
            "2",
            "--resume_from_checkpoint",
            str(out / "checkpoint-4"),
        )
        processes[name] = (
            out,
            start_process(
                command, env=subprocess_env(), cwd=tmp_path, stdout=out / "stdout.txt", stderr=out / "stderr.txt"
            ),
        )
    for name, (out, process) in processes.items():
        assert process.wait(timeout=300) == 2, (name, (out / "stderr.txt").read_text()[-3000:])
        stderr = (out / "stderr.txt").read_text()
        assert "Traceback" not in stderr, stderr[-3000:]
        line = stderr.strip().splitlines()[-1]
        assert line.startswith(f"error: --resume_from_checkpoint {out / 'checkpoint-4'}: {name}: "), line
        assert line.endswith(
            f"; the newest earlier intact checkpoint is {out / 'checkpoint-2'}: "
            f"--resume_from_checkpoint {out / 'checkpoint-2'}"
        ), line
        assert not (out / "model.safetensors").exists()
    assert not marker.exists(), "a planted pickle ran"


@pytest.mark.trains
def test_a_fine_tuning_checkpoint_resumes_in_both_formats(tmp_path, tiny_checkpoint, finetuned):
    """Recorded (under the record's name now, or fine-tuning's earlier checkpoint_files.json), or written before
    checkpoints held a record."""
    from albert_hf.runtime.checkpoint_files import RECORD_FILE

    run, rte = finetuned
    for form in ("recorded", "earlier-name", "before-the-record"):
        out = tmp_path / form
        shutil.copytree(run / "checkpoint-2", out / "checkpoint-2")
        if form == "before-the-record":
            (out / "checkpoint-2" / RECORD_FILE).unlink()
        if form == "earlier-name":
            (out / "checkpoint-2" / RECORD_FILE).rename(out / "checkpoint-2" / "checkpoint_files.json")
        done = run_bounded(
            glue_command(
                tiny_checkpoint,
                rte,
                out,
                "--max_steps",
                "4",
                "--save_steps",
                "2",
                "--resume_from_checkpoint",
                str(out / "checkpoint-2"),
            ),
            300,
            env=subprocess_env(),
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        said = (
            f"{out / 'checkpoint-2'} was written before checkpoints recorded their files' sizes and sha256"
            in done.stderr
        )
        assert said == (form == "before-the-record"), done.stderr[-3000:]
        expected, got = load_file(run / "model.safetensors"), load_file(out / "model.safetensors")
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


# A run killed while it writes a checkpoint's record: the part file cut short, then SIGKILL, at the `at`-th record
KILLED_WHILE_RECORDING = """
import os, runpy, signal, sys
from pathlib import Path
from albert_hf.runtime import checkpoint_files

real, calls = checkpoint_files.write_record, []

def dying(folder, name=checkpoint_files.RECORD_FILE):
    calls.append(folder)
    if len(calls) == {at}:
        (Path(folder) / checkpoint_files.record_part(name)).write_text('{{"files": {{"model.safet')
        os.kill(os.getpid(), signal.SIGKILL)
    return real(folder, name)

checkpoint_files.write_record = dying
sys.argv = {argv!r}
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def killed_while_recording(argv, at: int, cwd):
    """`argv` (a script and its flags) run until the `at`-th record is being written, then killed (SIGKILL)."""
    done = run_bounded(
        [sys.executable, "-c", KILLED_WHILE_RECORDING.format(at=at, argv=[str(a) for a in argv])],
        300,
        env=subprocess_env(),
        cwd=cwd,
    )
    assert done.returncode == -9, done.stderr[-3000:]


@pytest.mark.trains
def test_a_fine_tuning_run_killed_while_recording_keeps_a_checkpoint_to_resume_from(
    tmp_path, tiny_checkpoint, finetuned
):
    """With --save_total_limit 1, checkpoint-2 stays until checkpoint-4's record is in place (Trainer's own rotation
    would remove it before), and checkpoint-4, complete but unrecorded, resumes (read as data, with a line) to the
    uninterrupted run's weights."""
    from albert_hf.runtime.checkpoint_files import RECORD_FILE, record_part

    run, rte = finetuned
    out = tmp_path / "run"
    command = glue_command(
        tiny_checkpoint, rte, out, "--max_steps", "4", "--save_steps", "2", "--save_total_limit", "1"
    )
    killed_while_recording(command[1:], at=2, cwd=tmp_path)
    assert (out / "checkpoint-2" / RECORD_FILE).is_file()  # not rotated away: checkpoint-4 had no record yet
    assert not (out / "checkpoint-4" / RECORD_FILE).exists() and (out / "checkpoint-4" / record_part()).is_file()
    done = run_bounded(
        [*command, "--resume_from_checkpoint", str(out / "checkpoint-4")], 300, env=subprocess_env(), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        f"{out / 'checkpoint-4'}: its record ({RECORD_FILE}) was never completed (the run stopped while writing "
        "it): its files are not checked, only read as data"
    ) in done.stderr
    expected, got = load_file(run / "model.safetensors"), load_file(out / "model.safetensors")
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)


@pytest.mark.trains
def test_a_pretraining_run_killed_while_recording_keeps_a_checkpoint_to_resume_from(tmp_path, reference_run):
    """With --checkpoints_total_limit 1, step_3 stays until step_6's record is written (not only until step_6 is
    renamed into place), and step_6 resumes to the reference's end."""
    from albert_hf.runtime.checkpoint_files import RECORD_FILE, record_part
    from pretraining_runs import FAST, RESUME_ARGS, SCRIPT

    out = tmp_path / "run"
    argv = [SCRIPT, "--output_dir", out, *FAST, *RESUME_ARGS, "--checkpoints_total_limit", "1"]
    killed_while_recording(argv, at=2, cwd=tmp_path)
    assert (out / "step_3" / RECORD_FILE).is_file()
    assert not (out / "step_6" / RECORD_FILE).exists() and (out / "step_6" / record_part()).is_file()
    done = pretrain(out, *RESUME_ARGS, "--checkpoints_total_limit", "1", "--resume_from_checkpoint", "latest")
    assert (
        f"{out / 'step_6'}: its record ({RECORD_FILE}) was never written (the run ended while hashing the "
        "files): its files are not checked"
    ) in done.stderr
    check_same_weights_and_curve(out, reference_run, after_step=6)
    assert sorted(path.name for path in out.glob("step_*")) == ["step_12"]
