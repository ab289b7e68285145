"""A pretraining run's output folder before it starts: an earlier run recognised by the names it writes, refused
unless the arguments continue it (--resume_from_checkpoint) or clear it (--overwrite_output_dir)."""

import logging
import shutil
from pathlib import Path

from ...errors import InputError
from ...runtime.output_lock import in_use
from .checkpoints import FILL_MASK_FILE, MODEL_FILES_DIR, StepCheckpoints

logger = logging.getLogger(__name__)


AVERAGE_PREFIX = "average_last_"  # --average_last K's folder: OUTPUT_DIR/average_last_K

# What a run writes into --output_dir: an earlier run is recognised (and, with --overwrite_output_dir, cleared)
# by these names only, so unrelated files a user keeps there are neither a reason to refuse nor deleted.
RUN_OUTPUTS = (
    "step_*",
    ".tmp-*",
    MODEL_FILES_DIR,
    "runs",
    "metrics.jsonl",
    "all_results.json",
    "README.md",
    "config.json",
    "model.safetensors",
    "model-*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "spiece.model",
    "configuration_albert_hf.py",
    "modeling_albert_hf.py",
    FILL_MASK_FILE,
    "pairs",
    "prepared_data.json",
    "training_curves.png",
    f"{AVERAGE_PREFIX}*",
)


def previous_run_files(output_dir) -> list[str]:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted({path.name for pattern in RUN_OUTPUTS for path in output_dir.glob(pattern)})


def from_hub(resume_from_checkpoint: str | None) -> bool:
    """Whether --resume_from_checkpoint names a Hub repo's pushed state (`hub`, `hub:REPO[@REVISION]`:
    pretraining/output/hub_push.py) rather than a local checkpoint."""
    return resume_from_checkpoint == "hub" or (resume_from_checkpoint or "").startswith("hub:")


def check_output_dir(output_dir, resume_from_checkpoint: str | None, overwrite_output_dir: bool) -> None:
    """Stops with one line, before any work, on a --resume_from_checkpoint folder that cannot be resumed, or on an
    --output_dir holding an earlier run that the arguments neither continue nor overwrite."""
    busy = in_use(output_dir, "--output_dir")  # a live run's folder: named as such, whatever else it holds
    if busy:
        raise InputError(busy)
    if resume_from_checkpoint not in (None, "latest") and not from_hub(resume_from_checkpoint):
        problem = StepCheckpoints.problem(Path(resume_from_checkpoint))
        if problem:
            raise InputError(f"--resume_from_checkpoint {resume_from_checkpoint}: {problem}")
    earlier = previous_run_files(output_dir)
    if earlier and not overwrite_output_dir:
        has_checkpoint = bool(StepCheckpoints.complete_in(output_dir))
        if resume_from_checkpoint is None:
            resumable = (
                "pass --resume_from_checkpoint latest to continue it"
                if has_checkpoint
                else "it left no complete step_N checkpoint for --resume_from_checkpoint latest"
            )
            raise InputError(
                f"--output_dir {output_dir} holds an earlier run ({', '.join(earlier[:4])}"
                f"{', ...' if len(earlier) > 4 else ''}): {resumable}; pass --overwrite_output_dir to "
                "start over, or another --output_dir"
            )
        if resume_from_checkpoint == "latest" and not has_checkpoint:
            raise InputError(
                f"--resume_from_checkpoint latest: --output_dir {output_dir} holds an "
                "earlier run but no complete step_N checkpoint to continue from; pass "
                "--overwrite_output_dir to start over, or another --output_dir"
            )


def clear_earlier_run(output_dir) -> list[str]:
    """--overwrite_output_dir: what an earlier run wrote into output_dir is deleted, and logged; returns the names."""
    names = previous_run_files(output_dir)
    for name in names:
        path = Path(output_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    if names:
        logger.info("--overwrite_output_dir: deleted the earlier run's %s", ", ".join(names))
    return names
