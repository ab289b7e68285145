"""Uploading an output folder to the Hub: at once (`push_folder`), or in the background while a run trains
(`BackgroundUploads`)."""

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import first_line
from ..runtime.output_lock import LOCK_FILE

logger = logging.getLogger(__name__)

# --hub_strategy, with the names and meanings of transformers' TrainingArguments (pretraining/output/hub_push.py).
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")

# Training state that stays local: step checkpoints and trackers' logs.
UPLOAD_IGNORE = [
    "step_*",
    "step_*/**",
    ".tmp*",
    ".tmp*/**",
    "runs/**",
    "checkpoint-*",
    "checkpoint-*/**",
    LOCK_FILE,
]  # the pushing run still holds its lock


def push_folder(
    output_dir, repo_id: str, token=None, commit_message: str = "Upload model", private=None, ignore=()
) -> str:
    """Create the Hub repo if needed and upload the folder, without step checkpoints nor the `ignore` patterns.
    Returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, exist_ok=True, private=private).repo_id
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=str(output_dir),
        commit_message=commit_message,
        ignore_patterns=[*UPLOAD_IGNORE, *ignore],
    )
    logger.info("Pushed %s to %s", output_dir, repo_id)
    return getattr(commit, "commit_url", str(commit))


@dataclass
class Upload:
    """One upload: `send()` does its Hub calls; `discard()` frees what it would have sent (its staged files), after
    it ran or when a newer upload replaced it."""

    label: str
    send: Callable[[], None]
    discard: Callable[[], None] = lambda: None


@dataclass
class Sent:
    label: str
    seconds: float
    error: str | None = None


class BackgroundUploads:
    """A run's uploads, sent by a thread of their own so that training never waits on the network.

    At most one upload is in flight. One submitted meanwhile waits for it, and a newer one takes the waiting one's
    place (the newest checkpoint wins; a line says so). A failed upload is one warning line: the run goes on, its
    checkpoint on disk is the reference, and the next upload sends the newer state. `wait()` returns when nothing
    is in flight or waiting; `sent()` hands over what finished since the last call (for the metrics log).

    huggingface_hub's `run_as_future` queues every upload in turn; here a waiting upload is replaced instead, so
    that a slow link sends the newest state rather than a backlog.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: Upload | None = None
        self._thread: threading.Thread | None = None
        self._sent: list[Sent] = []

    def submit(self, upload: Upload) -> None:
        with self._lock:
            if self._thread is not None:
                if self._waiting is not None:
                    logger.info(
                        "Hub: %s replaces %s, which was waiting for the upload in flight",
                        upload.label,
                        self._waiting.label,
                    )
                    self._waiting.discard()
                else:
                    logger.info("Hub: %s waits for the upload in flight", upload.label)
                self._waiting = upload
                return
            self._thread = threading.Thread(target=self._send, args=(upload,), name="hub-uploads", daemon=True)
            self._thread.start()

    def _send(self, upload: Upload | None) -> None:
        while upload is not None:
            began, error = time.perf_counter(), None
            try:
                upload.send()
            except Exception as failure:  # noqa: BLE001 - any failure of an upload is reported, and the run goes on
                error = f"{type(failure).__name__}: {first_line(failure)}"
                logger.warning(
                    "Hub: the upload of %s failed (%s); the run goes on, and the next save uploads again",
                    upload.label,
                    error,
                )
            finally:
                upload.discard()
            with self._lock:
                self._sent.append(Sent(upload.label, time.perf_counter() - began, error))
                upload, self._waiting = self._waiting, None
                if upload is None:
                    self._thread = None

    @property
    def busy(self) -> bool:
        with self._lock:
            return self._thread is not None

    def wait(self) -> None:
        while True:
            with self._lock:
                thread = self._thread
            if thread is None:
                return
            thread.join()

    def sent(self) -> list[Sent]:
        with self._lock:
            done, self._sent = self._sent, []
        return done
