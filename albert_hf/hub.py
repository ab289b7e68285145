"""Uploading an output folder to the Hub."""

import json
import logging
import os
from pathlib import Path

from .output_lock import LOCK_FILE

logger = logging.getLogger(__name__)

# Training state that stays local: step checkpoints and trackers' logs.
UPLOAD_IGNORE = ["step_*", "step_*/**", ".tmp*", ".tmp*/**", "runs/**", "checkpoint-*", "checkpoint-*/**",
                 LOCK_FILE]  # the pushing run still holds its lock


def push_folder(output_dir, repo_id: str, token=None, commit_message: str = "Upload model", private=None) -> str:
    """Create the Hub repo if needed and upload the folder, without step checkpoints. Returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, exist_ok=True, private=private).repo_id
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=str(output_dir), commit_message=commit_message, ignore_patterns=UPLOAD_IGNORE
    )
    logger.info("Pushed %s to %s", output_dir, repo_id)
    return getattr(commit, "commit_url", str(commit))


def write_json(path, data: dict) -> None:
    """Written whole beside it, then renamed over `path`: a run killed mid-write leaves the previous version."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
