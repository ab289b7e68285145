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
"""

import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import NothingProduced, first_line
from ..hub.upload import UPLOAD_IGNORE, BackgroundUploads, Upload, push_folder
from .arguments import OutputArgs

logger = logging.getLogger("albert_hf.pretraining.job")

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
        for path in (folder, state):
            shutil.rmtree(path, ignore_errors=True)
        write_model(folder)
        if self.strategy == "checkpoint":
            link_tree(checkpoint, state)

        def send():
            api = self._api()
            commit = api.upload_folder(repo_id=self.repo_id, folder_path=str(folder),
                                       commit_message=f"Training in progress, step {step}",
                                       ignore_patterns=UPLOAD_IGNORE)
            if self.strategy == "checkpoint":
                api.upload_folder(repo_id=self.repo_id, folder_path=str(state), path_in_repo=LAST_CHECKPOINT,
                                  commit_message=f"Training in progress, step {step}: the training state",
                                  delete_patterns="*")
            if self.strategy == "all_checkpoints":
                api.create_branch(self.repo_id, branch=branch(step), revision=commit.oid, exist_ok=True)

        def discard():
            for path in (folder, state):
                shutil.rmtree(path, ignore_errors=True)

        self.uploads.submit(Upload(f"step {step}", send, discard))

    def sent_rows(self) -> list[dict]:
        """The uploads finished since the last call, as metrics rows (main process)."""
        if self.uploads is None:
            return []
        return [{"hub_upload": sent.label, "hub_upload_seconds": round(sent.seconds, 3),
                 **({"hub_upload_error": sent.error} if sent.error else {})} for sent in self.uploads.sent()]

    def wait(self, why: str) -> None:
        """Waits for the uploads in flight or waiting (main process), with a line when there are any."""
        if self.uploads is not None and self.uploads.busy:
            logger.info("Hub: waiting for the uploads to %s to finish (%s)", self.repo_id, why)
            self.uploads.wait()

    def push_final(self, commit_message: str = "End of training") -> tuple[str, float]:
        """The final folder, once the uploads during training are done (main process): (commit URL, seconds). A
        failure stops the run with exit status 1 and one line: the folder is complete, and the line says how to push
        it by hand."""
        self.wait("before the final folder")
        shutil.rmtree(self.staging, ignore_errors=True)
        began = time.perf_counter()
        try:
            url = push_folder(self.output_dir, self.repo_id, token=self.token, commit_message=commit_message)
        except Exception as failure:  # noqa: BLE001 - the network, the Hub, the token: all end the same way
            raise NothingProduced(
                f"--push_to_hub: the final folder was not uploaded to {self.repo_id} ({type(failure).__name__}: "
                f"{first_line(failure)}); it is complete in {self.output_dir}. Push it with: "
                f"{hand_push_command(self.repo_id, self.output_dir)}") from None
        return url, time.perf_counter() - began
