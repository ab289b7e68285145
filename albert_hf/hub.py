"""Model cards, uploads and loading errors shared by the run_*.py scripts."""

import json
import logging
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger(__name__)

# Training state that stays local: step checkpoints and trackers' logs.
UPLOAD_IGNORE = ["step_*", "step_*/**", ".tmp*", ".tmp*/**", "runs/**", "checkpoint-*", "checkpoint-*/**"]


def _table(rows: dict) -> str:
    lines = ["| | |", "|---|---|"]
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        lines.append(f"| {key} | {value} |")
    return "\n".join(lines)


def write_model_card(
    output_dir,
    *,
    title: str,
    summary: str,
    model,
    data: str,
    training: dict,
    metrics: dict,
    tags=(),
    usage_class: str = "AutoModel",
) -> Path:
    """Write README.md (the Hub model card): what the model is, its config and size, data, training and metrics."""
    config = model.config
    num_parameters = sum(p.numel() for p in model.parameters())
    arch = {
        "architecture": (config.architectures or [type(model).__name__])[0],
        "parameters": f"{num_parameters:,}",
        "vocab_size (V)": config.vocab_size,
        "embedding_size (E)": config.embedding_size,
        "hidden_size (H)": config.hidden_size,
        "num_hidden_layers (L)": config.num_hidden_layers,
        "num_hidden_groups (G)": config.num_hidden_groups,
        "inner_group_num (K)": config.inner_group_num,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "sharing": config.sharing,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
    }
    front_matter = ["---", "library_name: transformers", "tags:"]
    front_matter += [f"- {tag}" for tag in ("albert", "albert_hf", *tags)]
    front_matter += ["---"]
    text = "\n".join(
        front_matter
        + [
            f"# {title}",
            "",
            summary,
            "",
            "## Usage",
            "",
            "```python",
            f"from transformers import {usage_class}",
            f'model = {usage_class}.from_pretrained("<this repo or folder>", trust_remote_code=True)',
            "```",
            "",
            "The model code ships with the checkpoint (`modeling_albert_hf.py`), so `albert_hf` need not be installed.",
            "",
            "## Configuration",
            "",
            _table(arch),
            "",
            "## Data",
            "",
            data,
            "",
            "## Training",
            "",
            _table(training),
            "",
            "## Results",
            "",
            _table(metrics) if metrics else "No evaluation was run.",
            "",
        ]
    )
    path = Path(output_dir) / "README.md"
    path.write_text(text, encoding="utf-8")
    return path


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
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextmanager
def loading(flag: str, name):
    """Stop with one line naming the argument when `from_pretrained(name)` cannot find it.

    transformers raises OSError for a folder that does not exist or lacks the files, an unknown Hub repo, and a
    Hub that cannot be reached (offline, or HF_HUB_OFFLINE=1); its traceback buries which argument was wrong.
    """
    try:
        yield
    except OSError as error:
        if Path(str(name)).exists():
            where = "a local folder, but it does not hold what is needed"
        else:
            where = "no local folder by that name, so it was looked up on the Hub"
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        from huggingface_hub import constants

        hint = "; the Hub is switched off (HF_HUB_OFFLINE), so pass a local folder" if constants.HF_HUB_OFFLINE else ""
        raise SystemExit(f"error: {flag} {name}: cannot load it ({where}): {reason}{hint}") from None
