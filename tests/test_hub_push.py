"""run_pretraining.py --push_to_hub --hub_strategy: what each strategy pushes while the run trains, uploads that
never hold the steps up, a failed upload that costs one line, and a failed final push that exits 1 with the command
that pushes the folder by hand (albert_hf/pretraining/output/hub_push.py, against tests/fake_hub.py)."""

import json
import time

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from albert_hf.runtime.output_lock import LOCK_FILE
from fake_hub import FakeHub
from helpers import reset_accelerate_state

pytestmark = pytest.mark.trains

REPO = "someone/tiny-albert"


def pretrain_pushed(out, hub, *extra, steps=4):
    from albert_hf.pretraining.job import main
    from pretraining_runs import FAST

    with hub.patched():
        return main(
            [
                "--output_dir",
                str(out),
                *FAST,
                "--max_train_steps",
                str(steps),
                "--checkpointing_steps",
                "2",
                "--eval_steps",
                "2",
                "--max_eval_samples",
                "16",
                "--push_to_hub",
                "--hub_model_id",
                REPO,
                *extra,
            ]
        )


def rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def same_weights(pushed, checkpoint):
    """The pushed model folder's weights equal those of the checkpoint (accelerate's model file, which drops the
    tied decoder copy)."""
    got, saved = load_file(pushed / "model.safetensors"), load_file(checkpoint / "model.safetensors")
    assert saved.keys() <= got.keys() and len(saved) > 10
    return all(torch.equal(got[name], saved[name]) for name in saved)


@pytest.mark.parametrize("strategy", ["every_save", "checkpoint", "all_checkpoints"])
def test_each_strategy_pushes_what_it_promises(tmp_path, strategy, fresh_accelerate_state):
    hub, out = FakeHub(tmp_path / "hub"), tmp_path / "run"
    pretrain_pushed(out, hub, "--hub_strategy", strategy)
    progress = [f"Training in progress, step {step}" for step in (2, 4)]
    state = [f"{message}: the training state" for message in progress]
    expected = {
        "every_save": [*progress, "End of training"],
        "all_checkpoints": [*progress, "End of training"],
        "checkpoint": [progress[0], state[0], progress[1], state[1], "End of training"],
    }[strategy]
    assert hub.messages() == expected
    for commit in hub.commits:  # nothing local-only ever goes up: checkpoints' folders, staging, trackers, the lock
        assert not [name for name in commit.files if name.startswith(("step_", ".tmp", "runs/")) or name == LOCK_FILE]
    for step, commit in zip(
        (2, 4),
        [
            c
            for c in hub.commits
            if c.message.startswith("Training in progress, step") and not c.message.endswith("state")
        ],
    ):
        # the model folder of that step: weights, tokenizer, remote code, a card; loadable as a model folder is
        assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "modeling_albert_hf.py"} <= set(
            commit.files
        ), commit.files
        assert same_weights(commit.tree, out / f"step_{step}")
        assert "eval_mlm_loss" in json.loads((commit.tree / "all_results.json").read_text())  # that step's figures
    main = hub.main(REPO)
    assert same_weights(main, out / "step_4") and (main / "fill_mask_examples.json").is_file()  # the final folder
    if strategy == "checkpoint":  # the newest checkpoint's full state, the older one's replaced
        last = main / "last-checkpoint"
        assert sorted(p.name for p in last.iterdir()) == sorted(p.name for p in (out / "step_4").iterdir())
        for path in (out / "step_4").iterdir():
            assert (last / path.name).read_bytes() == path.read_bytes(), path.name
    else:
        assert not (main / "last-checkpoint").exists()
    if strategy == "all_checkpoints":  # each checkpoint's model a branch of its own
        assert sorted(branch for _, branch in hub.branches) == ["step-2", "step-4"]
        for step in (2, 4):
            assert same_weights(hub.branches[(REPO, f"step-{step}")], out / f"step_{step}")
    else:
        assert hub.branches == {}
    uploads = [row for row in rows(out) if "hub_upload" in row]
    assert [row["hub_upload"] for row in uploads] == ["step 2", "step 4"]
    assert all(row["hub_upload_seconds"] >= 0 and "hub_upload_error" not in row for row in uploads)
    assert not (out / ".tmp-hub").exists()  # the staged files are gone once sent


def test_a_slow_hub_does_not_hold_the_steps_up_and_the_newest_checkpoint_wins(
    tmp_path, fresh_accelerate_state, monkeypatch, caplog
):
    """Each upload during training takes 4 s on the fake Hub, the first one until step 8's checkpoint is on disk too.
    Training takes no longer than with an instant Hub: the checkpoints that come while the first upload is in flight
    wait, each replacing the one before it, so that the newest (step 8) goes up next, and the run then waits for it
    before its final folder."""
    from albert_hf.pretraining import job

    fit_seconds, real_fit = [], job.fit

    def timed_fit(*args, **kwargs):
        began = time.perf_counter()
        try:
            return real_fit(*args, **kwargs)
        finally:
            fit_seconds.append(time.perf_counter() - began)

    def slowly(message):
        if not message.startswith("Training in progress"):
            return
        time.sleep(4)
        deadline = time.time() + 120  # an upload that held the loop up would never see it: the test fails
        while message.endswith("step 2") and not (tmp_path / "slow_run" / "step_8").is_dir():
            assert time.time() < deadline, "step 8 was not saved while the first upload ran"
            time.sleep(0.05)

    monkeypatch.setattr(job, "fit", timed_fit)
    instant = FakeHub(tmp_path / "instant")
    slow = FakeHub(tmp_path / "slow", hold=slowly)
    pretrain_pushed(tmp_path / "instant_run", instant, "--hub_strategy", "every_save", steps=8)
    assert instant.messages() == [*(f"Training in progress, step {s}" for s in (2, 4, 6, 8)), "End of training"]
    reset_accelerate_state()
    with caplog.at_level("INFO", logger="albert_hf"):
        pretrain_pushed(tmp_path / "slow_run", slow, "--hub_strategy", "every_save", steps=8)
    # synchronous uploads would have added at least 4 x 4 s (one per checkpoint) to the loop
    assert fit_seconds[1] < fit_seconds[0] + 6.0, fit_seconds
    assert slow.messages() == ["Training in progress, step 2", "Training in progress, step 8", "End of training"]
    assert "Hub: step 4 waits for the upload in flight" in caplog.text
    assert "Hub: step 6 replaces step 4, which was waiting for the upload in flight" in caplog.text
    assert "Hub: step 8 replaces step 6, which was waiting for the upload in flight" in caplog.text


def test_a_failed_upload_is_one_line_and_the_run_finishes_with_its_final_folder(
    tmp_path, fresh_accelerate_state, caplog
):
    hub, out = (
        FakeHub(tmp_path / "hub", fail=lambda message: message.startswith("Training in progress")),
        tmp_path / "run",
    )
    with caplog.at_level("INFO"):
        pretrain_pushed(out, hub, "--hub_strategy", "checkpoint")
    failed = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert failed == [
        f"Hub: the upload of step {step} failed (ConnectionError: the fake Hub refused 'Training in "
        f"progress, step {step}'); the run goes on, and the next save uploads again"
        for step in (2, 4)
    ]
    assert not any(r.exc_info for r in caplog.records)  # no traceback anywhere
    assert hub.messages() == ["End of training"] and (hub.main(REPO) / "model.safetensors").is_file()
    errors = [row["hub_upload_error"] for row in rows(out) if "hub_upload" in row]
    assert errors == [f"ConnectionError: the fake Hub refused 'Training in progress, step {step}'" for step in (2, 4)]


def test_a_failed_final_push_exits_1_with_the_folder_complete_and_the_command_that_pushes_it(
    tmp_path, capsys, fresh_accelerate_state
):
    from albert_hf.runtime.cli import run_entry_point

    hub, out = FakeHub(tmp_path / "hub", fail=lambda message: message == "End of training"), tmp_path / "run"
    with pytest.raises(SystemExit) as exited:
        run_entry_point(lambda: pretrain_pushed(out, hub))
    assert exited.value.code == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        f"error: --push_to_hub: the final folder was not uploaded to {REPO} (ConnectionError: "
        f"the fake Hub refused 'End of training'); it is complete in {out}. Push it with: "
        f"hf upload {REPO} {out} . --exclude 'step_*'"
    ), last
    assert (out / "model.safetensors").is_file() and (out / "README.md").is_file()
    assert hub.commits == []


@pytest.mark.quick
@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--hub_strategy", "every_save", "--checkpointing_steps", "2"],
            "--hub_strategy every_save says what --push_to_hub uploads during the run: pass --push_to_hub too",
        ),
        (
            ["--hub_strategy", "checkpoint", "--push_to_hub"],
            "--hub_strategy checkpoint uploads at each checkpoint, and this run saves none: pass --checkpointing_steps "
            "N",
        ),
    ],
)
def test_a_strategy_that_cannot_push_anything_is_refused_in_one_line(tmp_path, flags, message):
    from albert_hf.pretraining.job import parse_args

    with pytest.raises(InputError, match="^" + message.replace("-", r"\-") + "$"):
        parse_args(["--output_dir", str(tmp_path / "run"), *flags])


# The run in a process of its own, against the fake Hub, sending itself SIGTERM once step 2's checkpoint is saved (a
# scheduler's stop then); each upload takes 2 s.
STOPPED_AFTER_A_CHECKPOINT = """
import os, signal, sys, time
sys.path[:0] = [{repo!r}, {repo!r} + "/tests"]  # this checkout's albert_hf, and the fake Hub
from fake_hub import FakeHub
from albert_hf.pretraining import job
from albert_hf.pretraining.training import loop
from albert_hf.runtime.cli import run_entry_point

real = loop.save_checkpoint  # called by the loop (loop.py), looked up there

def save_checkpoint(run, state):
    path = real(run, state)
    os.kill(os.getpid(), signal.SIGTERM)
    return path

loop.save_checkpoint = save_checkpoint
hub = FakeHub({root!r}, hold=lambda message: time.sleep(2))
sys.argv = ["run_pretraining.py", *{argv!r}]
with hub.patched():
    run_entry_point(job.main, stage="starting")
"""


def test_a_stopped_run_pushes_its_state_and_resumes_from_the_hub_in_an_empty_folder_to_the_same_weights(
    tmp_path, fresh_accelerate_state, caplog
):
    """--hub_strategy checkpoint and a SIGTERM after step 2: the run exits with status 75 once that step's model and
    full training state are on the (fake) Hub, the upload in flight waited for. A run in a new, empty folder with
    --resume_from_checkpoint hub then ends with the weights and curve of the uninterrupted run."""
    import sys

    from albert_hf.pretraining.job import main
    from albert_hf.runtime.preemption import PREEMPTED
    from helpers import REPO as ROOT
    from helpers import run_bounded, subprocess_env
    from pretraining_runs import FAST, check_same_weights_and_curve

    out, root = tmp_path / "stopped", tmp_path / "hub"
    args = [
        *FAST,
        "--max_train_steps",
        "8",
        "--checkpointing_steps",
        "2",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
    ]
    argv = ["--output_dir", str(out), *args, "--push_to_hub", "--hub_model_id", REPO, "--hub_strategy", "checkpoint"]
    code = STOPPED_AFTER_A_CHECKPOINT.format(repo=str(ROOT), root=str(root), argv=argv)
    done = run_bounded([sys.executable, "-c", code], 300, env=subprocess_env(), cwd=tmp_path)
    assert done.returncode == PREEMPTED, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Hub: the upload of" not in done.stderr, done.stderr[-3000:]
    assert (
        f"Hub: waiting for the uploads to {REPO} to finish (SIGTERM received: the checkpoint of step 2 first)"
        in done.stderr
    ), done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("Stopped by SIGTERM after step 2 of 8")
    last = root / REPO / "main" / "last-checkpoint"
    assert sorted(p.name for p in last.iterdir()) == sorted(p.name for p in (out / "step_2").iterdir())
    assert same_weights(root / REPO / "main", out / "step_2")

    main(["--output_dir", str(tmp_path / "uninterrupted"), *args])
    reset_accelerate_state()
    elsewhere = tmp_path / "another_machine"
    with FakeHub(root).patched(), caplog.at_level("INFO", logger="albert_hf"):
        main(["--output_dir", str(elsewhere), *args, "--resume_from_checkpoint", "hub", "--hub_model_id", REPO])
    assert f"Resumed from {elsewhere / 'step_2'}: step 2" in caplog.text  # not a fresh start, which ends alike
    assert [row["step"] for row in rows(elsewhere)] == [4, 6, 8]
    assert (elsewhere / "step_2").is_dir() and not (elsewhere / ".tmp-hub-resume").exists()
    check_same_weights_and_curve(elsewhere, tmp_path / "uninterrupted", after_step=2)


@pytest.mark.quick
@pytest.mark.parametrize(
    "value, message",
    [
        (
            "hub",
            f"--resume_from_checkpoint hub: {REPO} holds no last-checkpoint/ with a training state (what "
            "--hub_strategy checkpoint pushes)",
        ),
        (
            f"hub:{REPO}@step-2",
            f"--resume_from_checkpoint hub:{REPO}@step-2: {REPO}@step-2: FileNotFoundError: the fake "
            f"Hub has no {REPO}@step-2",
        ),
        ("hub:", "--resume_from_checkpoint hub:: name the repo as hub:OWNER/NAME or hub:OWNER/NAME@REVISION"),
    ],
)
def test_a_hub_resume_without_a_state_to_continue_is_refused_in_one_line(
    tmp_path, value, message, fresh_accelerate_state
):
    from albert_hf.pretraining.job import main

    hub = FakeHub(tmp_path / "hub")
    hub.main(REPO).mkdir(parents=True)
    (hub.main(REPO) / "model.safetensors").write_bytes(b"")  # a repo pushed without --hub_strategy checkpoint
    with hub.patched(), pytest.raises(InputError) as refused:
        main(
            [
                "--output_dir",
                str(tmp_path / "run"),
                "--max_train_steps",
                "2",
                "--resume_from_checkpoint",
                value,
                "--hub_model_id",
                REPO,
            ]
        )
    assert str(refused.value) == message


@pytest.mark.launched
@pytest.mark.parametrize("setup", ["DDP", "FSDP2"])
def test_under_two_processes_only_the_first_uploads_and_each_checkpoint_goes_up_once(tmp_path, setup):
    """--hub_strategy checkpoint launched over 2 processes: every commit is the first process's and made once; the
    state in last-checkpoint/ holds both processes' random states; under FSDP2 the weights gathered for step 4's
    push are the final folder's."""
    from helpers import DDP, FSDP
    from pretraining_runs import pretrain_runs

    root, out = tmp_path / "hub", tmp_path / "run"
    args = [
        "--max_train_steps",
        "4",
        "--checkpointing_steps",
        "2",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        "--per_device_train_batch_size",
        "4",
        "--push_to_hub",
        "--hub_model_id",
        REPO,
        "--hub_strategy",
        "checkpoint",
    ]
    results, done = pretrain_runs(
        [(out, args, {}, False, {"fake_hub": str(root)})], launcher={"DDP": DDP, "FSDP2": FSDP}[setup]
    )
    assert results[0]["status"] == 0, (results, done.stderr[-3000:])
    logged = FakeHub(root).logged()
    assert [commit["message"] for commit in logged] == [
        "Training in progress, step 2",
        "Training in progress, step 2: the training state",
        "Training in progress, step 4",
        "Training in progress, step 4: the training state",
        "End of training",
    ]
    assert {commit["rank"] for commit in logged} == {"0"}
    last = root / REPO / "main" / "last-checkpoint"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in last.iterdir()}
    step_4 = load_file(f"{logged[2]['tree']}/model.safetensors")
    final = load_file(out / "model.safetensors")
    assert step_4.keys() == final.keys() and all(torch.equal(step_4[k], final[k]) for k in final)


def test_fine_tuning_with_trainers_hub_strategy_pushes_revisions_that_load(tiny_checkpoint, tmp_path):
    """run_glue.py --push_to_hub --hub_strategy checkpoint (Trainer's): each save pushes the model and
    last-checkpoint/, then the final folder with our card; each pushed revision has the model code its config
    names, so that it loads with trust_remote_code as the final one does."""
    import sys

    from albert_hf.testing.glue_folders import write_glue_folders
    from helpers import glue_args, run_bounded, run_script, subprocess_env

    hub, out = FakeHub(tmp_path / "hub"), tmp_path / "out"
    root = write_glue_folders(tmp_path / "glue")
    with hub.patched():
        run_script(
            "run_glue",
            [
                *glue_args(
                    tiny_checkpoint,
                    out,
                    "--task_name",
                    "rte",
                    "--data_dir",
                    root / "RTE",
                    "--do_train",
                    "--max_steps",
                    2,
                    "--push_to_hub",
                    "--hub_model_id",
                    "someone/albert-rte",
                    "--hub_strategy",
                    "checkpoint",
                ),
                "--save_strategy",
                "steps",
                "--save_steps",
                1,
            ],
        )
    assert hub.messages() == [
        "Training in progress, step 1",
        "Training in progress, step 1, checkpoint",
        "Training in progress, step 2",
        "Training in progress, step 2, checkpoint",
        "End of training",
    ]
    revisions = [hub.commits[0], hub.commits[2], hub.commits[4]]
    for commit in revisions:
        assert {"configuration_albert_hf.py", "modeling_albert_hf.py", "config.json"} <= set(commit.files)
    # each revision as a user loads it: a fresh interpreter without albert_hf, the pushed code
    load = (
        "import sys\nfrom transformers import AutoModelForSequenceClassification as Auto\n"
        "for tree in sys.argv[1:]:\n"
        "    print(type(Auto.from_pretrained(tree, trust_remote_code=True)).__module__.split('.')[0])\n"
        "print('albert_hf' in sys.modules)\n"
    )
    done = run_bounded(
        [sys.executable, "-c", load, *(str(commit.tree) for commit in revisions)],
        300,
        env=subprocess_env(),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["transformers_modules"] * 3 + ["False"], done.stdout
    assert (hub.main("someone/albert-rte") / "last-checkpoint" / "trainer_state.json").is_file()
    assert "README.md" in hub.commits[4].files


def test_a_full_disk_while_staging_an_upload_is_one_line_and_the_run_goes_on(
    tmp_path, fresh_accelerate_state, monkeypatch, caplog
):
    """The model folder staged for a checkpoint's upload cannot be written (no space left): one warning line per
    checkpoint, nothing half-staged left, no upload of it, and the run finishes with its final folder pushed."""
    import errno

    from albert_hf.pretraining import run as run_module

    real = run_module.save_final_model  # a checkpoint's upload is staged through Run.write_model_folder

    def no_space_for_staging(model, tokenizer, output_dir, *args, **kwargs):
        if ".tmp-hub" in str(output_dir):
            (output_dir / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
            (output_dir / "model.safetensors").write_bytes(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(model, tokenizer, output_dir, *args, **kwargs)

    monkeypatch.setattr(run_module, "save_final_model", no_space_for_staging)
    hub, out = FakeHub(tmp_path / "hub"), tmp_path / "run"
    with caplog.at_level("WARNING"):
        pretrain_pushed(out, hub, "--hub_strategy", "every_save")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [
        f"Hub: step {step} was not staged for upload in {out / '.tmp-hub'} (no space left"
        "); the run goes on, and the next save uploads again"
        for step in (2, 4)
    ], warnings
    assert hub.messages() == ["End of training"] and not (out / ".tmp-hub").exists()
