"""--hub_token (and any argument whose name says token, key, secret or password) reaches no file a run writes, no
tracker, no Hub commit and no line it prints: planted as `hf_` and random letters, it is searched for everywhere
(albert_hf/runtime/secrets.py)."""

import copy
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from albert_hf.errors import InputError
from albert_hf.runtime import output_lock
from albert_hf.runtime.output_lock import LOCK_FILE
from albert_hf.runtime.secrets import command_line, is_secret, without_secrets
from fake_hub import FakeHub
from helpers import reset_accelerate_state, run_script, subprocess_env


@pytest.fixture
def token():
    return "hf_" + "".join(random.SystemRandom().choices(string.ascii_letters, k=34))


def files_holding(root: Path, secret: str) -> list[str]:
    return [str(path) for path in sorted(root.rglob("*")) if path.is_file() and secret.encode() in path.read_bytes()]


def test_secret_names_and_the_command_line_mask_only_credentials():
    assert [
        name
        for name in (
            "hub_token",
            "--hub-token",
            "api_key",
            "wandb_secret",
            "password",
            "push_to_hub_token",
            "tokenizer_name",
            "max_tokens",
            "keep_linebreaks",
            "hub_model_id",
            "seed",
        )
        if is_secret(name)
    ] == ["hub_token", "--hub-token", "api_key", "wandb_secret", "password", "push_to_hub_token"]
    assert command_line(
        [
            "run.py",
            "--hub_token",
            "hf_a",
            "--hub-token=hf_b",
            "--hub_tok",
            "hf_c",
            "--api_key",
            "k",
            "--tokenizer_name",
            "t",
            "--seed",
            "1",
        ]
    ) == (
        "run.py --hub_token <HUB_TOKEN> --hub-token=<HUB_TOKEN> --hub_tok <HUB_TOK> --api_key <API_KEY> "
        "--tokenizer_name t --seed 1"
    )
    assert without_secrets({"hub_token": "hf_a", "hub_model_id": "me/x", "api_key": None}) == {
        "hub_token": "<HUB_TOKEN>",
        "hub_model_id": "me/x",
        "api_key": None,
    }


def test_pickled_training_arguments_hold_the_mask_while_copies_keep_the_token(tmp_path, token):
    """Trainer writes training_args.bin (torch.save of the arguments) into every checkpoint and output folder, and
    pushes it; transformers masks the token in to_dict() only. Copies in the process still push with the token."""
    from albert_hf.tasks.arguments import AlbertTrainingArguments

    args = AlbertTrainingArguments(output_dir=str(tmp_path / "out"), hub_token=token, report_to="none")
    torch.save(args, tmp_path / "training_args.bin")
    assert token.encode() not in (tmp_path / "training_args.bin").read_bytes()
    loaded = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert type(loaded) is AlbertTrainingArguments and loaded.hub_token == "<HUB_TOKEN>"
    assert loaded.output_dir == args.output_dir and loaded.learning_rate == args.learning_rate
    assert copy.deepcopy(args).hub_token == token and copy.copy(args).hub_token == token and args.hub_token == token


HOLD = (
    "import sys, time\nfrom albert_hf.runtime import output_lock\n"
    "output_lock.acquire(sys.argv[1], '--output_dir')\nprint('held', flush=True)\ntime.sleep(120)\n"
)


def test_the_lock_and_a_second_runs_refusal_show_the_command_with_the_token_masked(tmp_path, token):
    folder = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), "--hub_token", token, "--seed", "3"],
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        lock = (folder / LOCK_FILE).read_text()
        assert token not in lock and "--hub_token <HUB_TOKEN> --seed 3" in lock
        with pytest.raises(InputError) as refused:
            output_lock.acquire(folder, "--output_dir")
        assert token not in str(refused.value) and "--hub_token <HUB_TOKEN> --seed 3" in str(refused.value)
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.trains
def test_a_tracked_pretraining_run_pushed_to_the_hub_and_its_prepared_data_hold_no_token(
    tmp_path, token, capfd, fresh_accelerate_state
):
    """--with_tracking (TensorBoard: hparams and events), a checkpoint, the final folder pushed to a fake Hub, and
    --preprocess_only's manifest: the token is in no file and no printed line."""
    from albert_hf.pretraining.job import main
    from pretraining_runs import FAST

    hub = FakeHub(tmp_path / "hub")
    with hub.patched():
        main(
            [
                "--output_dir",
                str(tmp_path / "run"),
                *FAST,
                "--max_train_steps",
                "4",
                "--checkpointing_steps",
                "2",
                "--eval_steps",
                "0",
                "--with_tracking",
                "--report_to",
                "tensorboard",
                "--push_to_hub",
                "--hub_strategy",
                "checkpoint",
                "--hub_model_id",
                "someone/tiny-albert",
                "--hub_token",
                token,
            ]
        )
    reset_accelerate_state()  # a second in-process run builds its own Accelerator
    main(["--output_dir", str(tmp_path / "prepared"), *FAST, "--preprocess_only", "--hub_token", token])
    assert list((tmp_path / "run" / "runs").rglob("events.out.tfevents.*"))  # the tracker wrote its files
    assert (tmp_path / "run" / "step_2").is_dir() and list((tmp_path / "prepared").iterdir())
    assert hub.messages()[-1] == "End of training" and "last-checkpoint/model.safetensors" in hub.commits[-2].files
    assert hub.commits[-1].lock is not None and token not in hub.commits[-1].lock  # the lock as the run held it
    assert files_holding(tmp_path, token) == []
    out, err = capfd.readouterr()
    assert token not in out + err


@pytest.mark.trains
def test_a_fine_tuning_run_pushed_to_the_hub_holds_no_token_in_its_folders_checkpoints_and_commits(
    tiny_checkpoint, tmp_path, token, capfd
):
    from albert_hf.testing.glue_folders import write_glue_folders
    from helpers import glue_args

    hub = FakeHub(tmp_path / "hub")
    root, out = write_glue_folders(tmp_path / "glue"), tmp_path / "out"
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
                    "--hub_token",
                    token,
                ),
                "--save_strategy",
                "steps",
                "--save_steps",
                1,
                "--report_to",
                "tensorboard",
            ],
        )
    assert (out / "checkpoint-2" / "training_args.bin").is_file() and (out / "training_args.bin").is_file()
    assert list(tmp_path.rglob("events.out.tfevents.*"))  # the tracker wrote its files
    assert hub.commits and "training_args.bin" in hub.commits[-1].files
    assert files_holding(tmp_path, token) == []
    loaded = torch.load(out / "training_args.bin", weights_only=False)
    assert loaded.hub_token == "<HUB_TOKEN>" and loaded.hub_model_id == "someone/albert-rte"
    out_text, err = capfd.readouterr()
    assert token not in out_text + err
