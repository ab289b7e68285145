"""Uploading an output folder to the Hub."""

import logging

from ..runtime.output_lock import LOCK_FILE

logger = logging.getLogger(__name__)

# Training state that stays local: step checkpoints and trackers' logs.
UPLOAD_IGNORE = ["step_*", "step_*/**", ".tmp*", ".tmp*/**", "runs/**", "checkpoint-*", "checkpoint-*/**",
                 LOCK_FILE]  # the pushing run still holds its lock


def push_folder(output_dir, repo_id: str, token=None, commit_message: str = "Upload model", private=None,
                ignore=()) -> str:
    """Create the Hub repo if needed and upload the folder, without step checkpoints nor the `ignore` patterns.
    Returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, exist_ok=True, private=private).repo_id
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=str(output_dir), commit_message=commit_message,
        ignore_patterns=[*UPLOAD_IGNORE, *ignore],
    )
    logger.info("Pushed %s to %s", output_dir, repo_id)
    return getattr(commit, "commit_url", str(commit))
