"""What `run_checkpoint_evals.py` evaluates: the model folders of a pretraining run, each with the step and the
tokens it had seen (`Source`). Locally, every complete `step_N` (pretraining/output/loadable.py: each is a model folder)
and the run's final folder; on the Hub, the `step-N` branches that `--hub_strategy all_checkpoints` pushes; and, with
`--baseline random_init`, step 0: the run's config with random weights."""

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..pretraining.output.checkpoints import MODEL_FILES_DIR, STATE_FILE, STEP_DIR, StepCheckpoints
from ..pretraining.output.loadable import missing

logger = logging.getLogger(__name__)

HUB_BRANCH = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Source:
    step: int
    tokens: float | None  # the real tokens trained on up to `step` (None where the folder does not say)
    path: Path | str  # a local model folder, or (hub) the repo id
    revision: str | None = None  # the Hub branch

    @property
    def name(self) -> str:
        return f"step_{self.step}"


def step_tokens(checkpoint: Path) -> float | None:
    """A checkpoint's tokens so far: its closed windows' and its open window's (training_state.json)."""
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
        return float(state["run_tokens"]) + float(state.get("window_tokens", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def steps_and_tokens(folder: Path) -> tuple[int | None, float | None]:
    """What a model folder's all_results.json says of its training: the steps and the tokens seen (None each where
    it does not say)."""
    try:
        results = json.loads((folder / "all_results.json").read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(results, dict):
        return None, None
    steps, tokens = results.get("train_steps"), results.get("total_tokens")
    return (
        steps if type(steps) is int else None,
        float(tokens) if isinstance(tokens, (int, float)) and not isinstance(tokens, bool) else None,
    )


def final_source(run_dir: Path) -> Source | None:
    """The run's final folder, once the run has written it (its all_results.json names the steps and tokens)."""
    steps, tokens = steps_and_tokens(run_dir)
    if steps is None or missing(run_dir):
        return None
    return Source(steps, tokens, run_dir)


def local_sources(run_dir: Path) -> list[Source]:
    """The run's complete checkpoints and its final folder (when written), by step; the final folder stands in for
    a checkpoint of the same step."""
    found = {}
    for path in run_dir.glob("step_*") if run_dir.is_dir() else ():
        match = STEP_DIR.match(path.name)
        if match and StepCheckpoints.problem(path) is None:
            found[int(match.group(1))] = Source(int(match.group(1)), step_tokens(path), path)
    final = final_source(run_dir)
    if final is not None:
        found[final.step] = final
    return [found[step] for step in sorted(found)]


def hub_sources(repo: str, into: Path, token: str | None = None) -> list[Source]:
    """The `step-N` branches of a Hub model repo (what --hub_strategy all_checkpoints pushes), by step, with the
    tokens their all_results.json names (downloaded alone into `into`/step_N; `download` fetches the rest)."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    steps = sorted(
        int(match.group(1)) for branch in api.list_repo_refs(repo).branches if (match := HUB_BRANCH.match(branch.name))
    )
    found = []
    for step in steps:
        folder = into / f"step_{step}"
        if not (folder / "all_results.json").is_file():
            api.snapshot_download(
                repo, revision=f"step-{step}", local_dir=str(folder), allow_patterns=["all_results.json"]
            )
        found.append(Source(step, steps_and_tokens(folder)[1], repo, f"step-{step}"))
    return found


def download(source: Source, into: Path, token: str | None = None) -> Path:
    """A Hub source's folder, downloaded into `into`/step_N (once); a local source as it is."""
    if source.revision is None:
        return Path(source.path)
    from huggingface_hub import HfApi

    folder = into / source.name
    if not (folder / "config.json").is_file():
        HfApi(token=token).snapshot_download(str(source.path), revision=source.revision, local_dir=str(folder))
    return folder


def random_init(run_dir: Path, folder: Path, seed: int = 0) -> Source:
    """--baseline random_init: the run's config with random weights (as pretraining starts), in `folder`, step 0."""
    from transformers import AutoTokenizer

    from .. import AlbertHFConfig, AlbertHFForPreTraining

    files = run_dir / MODEL_FILES_DIR if (run_dir / MODEL_FILES_DIR).is_dir() else run_dir
    if not (folder / "model.safetensors").is_file():
        config = AlbertHFConfig.from_pretrained(files)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AlbertHFForPreTraining(config)
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(files).save_pretrained(folder)
    return Source(0, 0.0, folder)
