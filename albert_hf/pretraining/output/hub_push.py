"""--push_to_hub while a run trains: what --hub_strategy sends at each checkpoint, and the final folder at the end.

- `end`: the final folder only, at the end, as the commit "End of training".
- `every_save`: at each checkpoint, also the model folder as of that step (weights, tokenizer, remote code, a card
  with that step's latest held-out figures), as the commit "Training in progress, step N".
- `checkpoint`: the same, then the checkpoint's full training state into `last-checkpoint/`, which replaces the
  previous one.
- `all_checkpoints`: as `every_save`, and a branch `step-N` at that commit, so that each checkpoint's model stays a
  revision of its own (`from_pretrained(repo, revision="step-N")`, as Pythia publishes its checkpoints).

The uploads during training run in the background (`hub.upload.BackgroundUploads`): at most one in flight, the
newest checkpoint replacing one that waits, a failure one warning line. Only the main process uploads; under FSDP
every process takes part in gathering the weights. What a checkpoint sends is staged in OUTPUT_DIR/.tmp-hub (never
uploaded as such; removed once sent): the model folder written there, the checkpoint's files hard-linked, so that
a checkpoint rotated away by --checkpoints_total_limit meanwhile stays readable. At the end, and when a stop signal
ends the run, the run waits for the uploads in flight.

`--resume_from_checkpoint hub` (the repo --push_to_hub pushes to) or `hub:REPO[@REVISION]` continues from the
training state in the repo's `last-checkpoint/`: downloaded into OUTPUT_DIR/step_N, then resumed as a local
checkpoint is, so that a preempted run goes on on another machine with an empty output folder.
"""

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from accelerate.utils import broadcast_object_list

from ...errors import InputError, NothingProduced, first_line
from ...hub.upload import UPLOAD_IGNORE, BackgroundUploads, Upload, push_folder
from ...runtime.storage import shared_fault, write_fault
from ..arguments import OutputArgs
from .checkpoints import STATE_FILE
from .folder import from_hub

logger = logging.getLogger(__name__)

STAGING = ".tmp-hub"
LAST_CHECKPOINT = "last-checkpoint"


def branch(step: int) -> str:
    return f"step-{step}"


def hand_push_command(repo_id: str, output_dir: Path) -> str:
    """The command that uploads the final folder as the run would have (huggingface_hub's CLI)."""
    excluded = " ".join(f"--exclude '{pattern}'" for pattern in UPLOAD_IGNORE)
    return f"hf upload {repo_id} {output_dir} . {excluded}"


def link_tree(source: Path, target: Path) -> None:
    """`source`'s files hard-linked into `target` (copied where the file system cannot link)."""
    for path in source.rglob("*"):
        if path.is_file():
            (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target / path.relative_to(source))
            except OSError:
                shutil.copy2(path, target / path.relative_to(source))


class HubPush:
    """A run's pushes to the Hub repo --hub_model_id (default: the output folder's name)."""

    def __init__(self, output: OutputArgs, output_dir: Path, main_process: bool):
        self.strategy, self.token, self.output_dir = output.hub_strategy, output.hub_token, output_dir
        self.repo_id = output.hub_model_id or output_dir.name
        self.staging = output_dir / STAGING
        self.latest_eval: dict = {}  # the held-out figures the next step's card shows
        self.uploads = BackgroundUploads() if main_process else None
        self._repo_created, self._last_step = False, None
        if main_process:
            shutil.rmtree(self.staging, ignore_errors=True)  # what a killed run left staged

    def pushes(self, step: int) -> bool:
        """Whether the checkpoint of `step` goes up (every process asks: the weights are gathered under FSDP). A
        stop signal's save of a step just saved is not pushed twice."""
        if self.strategy == "end" or step == self._last_step:
            return False
        self._last_step = step
        return True

    def _api(self):
        from huggingface_hub import HfApi

        api = HfApi(token=self.token)
        if not self._repo_created:
            self.repo_id = api.create_repo(self.repo_id, exist_ok=True).repo_id
            self._repo_created = True
        return api

    def push_checkpoint(self, step: int, checkpoint: Path, write_model: Callable[[Path], None]) -> None:
        """On the main process: stage the model folder of `step` (`write_model(folder)`) and, with `checkpoint`,
        the training state, then hand them to the background uploads."""
        folder, state = self.staging / f"step_{step}", self.staging / f"step_{step}-state"

        def discard():
            for path in (folder, state):
                shutil.rmtree(path, ignore_errors=True)

        discard()

        def stage():
            write_model(folder)
            if self.strategy == "checkpoint":
                link_tree(checkpoint, state)

        fault = write_fault(stage)
        if fault is not None:  # a full disk: the checkpoint itself is written, and the next one tries again
            discard()
            logger.warning(
                "Hub: step %d was not staged for upload in %s (%s); the run goes on, and the next save uploads again",
                step,
                self.staging,
                fault,
            )
            return

        def send():
            api = self._api()
            commit = api.upload_folder(
                repo_id=self.repo_id,
                folder_path=str(folder),
                commit_message=f"Training in progress, step {step}",
                ignore_patterns=UPLOAD_IGNORE,
            )
            if self.strategy == "checkpoint":
                api.upload_folder(
                    repo_id=self.repo_id,
                    folder_path=str(state),
                    path_in_repo=LAST_CHECKPOINT,
                    commit_message=f"Training in progress, step {step}: the training state",
                    delete_patterns="*",
                )
            if self.strategy == "all_checkpoints":
                api.create_branch(self.repo_id, branch=branch(step), revision=commit.oid, exist_ok=True)

        self.uploads.submit(Upload(f"step {step}", send, discard))

    def sent_rows(self) -> list[dict]:
        """The uploads finished since the last call, as metrics rows (main process)."""
        if self.uploads is None:
            return []
        return [
            {
                "hub_upload": sent.label,
                "hub_upload_seconds": round(sent.seconds, 3),
                **({"hub_upload_error": sent.error} if sent.error else {}),
            }
            for sent in self.uploads.sent()
        ]

    def wait(self, why: str) -> None:
        """Waits for the uploads in flight or waiting (main process), with a line when there are any."""
        if self.uploads is not None and self.uploads.busy:
            logger.info("Hub: waiting for the uploads to %s to finish (%s)", self.repo_id, why)
            self.uploads.wait()

    def push_final(self, commit_message: str = "End of training") -> tuple[str, float]:
        """The final folder, after `wait` (main process): (commit URL, seconds). A failure stops the run with exit
        status 1 and one line: the folder is complete, and the line says how to push it by hand."""
        shutil.rmtree(self.staging, ignore_errors=True)
        began = time.perf_counter()
        try:
            url = push_folder(self.output_dir, self.repo_id, token=self.token, commit_message=commit_message)
        except Exception as failure:  # noqa: BLE001 - the network, the Hub, the token: all end the same way
            raise NothingProduced(
                f"--push_to_hub: the final folder was not uploaded to {self.repo_id} ({type(failure).__name__}: "
                f"{first_line(failure)}); it is complete in {self.output_dir}. Push it with: "
                f"{hand_push_command(self.repo_id, self.output_dir)}"
            ) from None
        return url, time.perf_counter() - began


def hub_source(value: str | None, output: OutputArgs) -> tuple[str, str | None] | None:
    """(repo, revision or None) of --resume_from_checkpoint `hub` or `hub:REPO[@REVISION]`; None for a local one."""
    if not from_hub(value):
        return None
    if value == "hub":
        return output.hub_model_id or Path(output.output_dir).name, None
    repo, at, revision = value[len("hub:") :].partition("@")
    if not repo or (at and not revision):
        raise InputError(
            f"--resume_from_checkpoint {value}: name the repo as hub:OWNER/NAME or hub:OWNER/NAME@REVISION"
        )
    return repo, revision or None


def download_last_checkpoint(value: str, output: OutputArgs, accelerator) -> Path:
    """A collective: the main process downloads the repo's last-checkpoint/ into OUTPUT_DIR/step_N (N from its
    training state), unless a complete step_N is there already; every process gets its path, or the one line of
    what went wrong (a missing repo, revision or state, the network)."""
    from huggingface_hub import HfApi

    repo_id, revision = hub_source(value, output)
    output_dir, found, fault = Path(output.output_dir), None, None
    if accelerator.is_main_process:
        where = f"{repo_id}@{revision}" if revision else repo_id
        staging = output_dir / f"{STAGING}-resume"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            HfApi(token=output.hub_token).snapshot_download(
                repo_id, revision=revision, local_dir=staging, allow_patterns=[f"{LAST_CHECKPOINT}/*"]
            )
            source = staging / LAST_CHECKPOINT
            if not (source / STATE_FILE).is_file():
                raise InputError(
                    f"{where} holds no {LAST_CHECKPOINT}/ with a training state (what --hub_strategy checkpoint pushes)"
                )
            step = json.loads((source / STATE_FILE).read_text()).get("step")
            if type(step) is not int or step < 0:  # it names the folder the state goes into
                raise InputError(f"{where}: {LAST_CHECKPOINT}/{STATE_FILE} holds no step (an integer >= 0)")
            found = output_dir / f"step_{step}"
            if not (found / STATE_FILE).is_file():
                shutil.rmtree(found, ignore_errors=True)
                os.replace(source, found)
            logger.info(
                "--resume_from_checkpoint %s: the training state of %s/%s is in %s",
                value,
                where,
                LAST_CHECKPOINT,
                found,
            )
        except Exception as failure:  # noqa: BLE001 - the Hub's errors, the network, a state we cannot read
            reason = (
                first_line(failure)
                if isinstance(failure, InputError)
                else (f"{where}: {type(failure).__name__}: {first_line(failure)}")
            )
            fault = f"--resume_from_checkpoint {value}: {reason}"
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    fault = shared_fault(accelerator, fault, main_only=True)
    if fault is not None:
        raise InputError(fault)
    if accelerator.num_processes > 1:  # the main process downloaded it: every process resumes from its folder
        found = broadcast_object_list([str(found) if found else None])[0]
    return Path(found)
