"""Every complete `step_N` is also a model folder: `AutoModel.from_pretrained(step_N, trust_remote_code=True)`, a
pipeline and `run_glue.py --model_name_or_path step_N` load it, as they load Trainer's `checkpoint-N`.

Beside accelerate's training state (whose `model.safetensors` holds the weights of one process or DDP) a checkpoint
holds the model's files: config.json, the tokenizer and the remote code (`REQUIRED` names what loading needs). They
are the same for every checkpoint of a run, so the run writes them once, at its first checkpoint, into
OUTPUT_DIR/.model_files (`ModelFiles`), and each checkpoint gets hard links to them (a copy where the file system
has none): a few directory entries a checkpoint. Under FSDP the weights are
sharded (`pytorch_model_fsdp_0/`), so the gathered full weights are written too, as the final folder's are.

A checkpoint that holds accelerate's training state alone is made loadable by

    python -m albert_hf.pretraining.output.loadable OUTPUT_DIR/step_N [--model_files FOLDER]

which checks it against its record, adds the files (from FOLDER, default the run's final folder or its
.model_files), for an FSDP checkpoint the full weights read from its shards (as data: `gathered_weights`), and
records them.
"""

import argparse
import copy
import os
import pickle
import shutil
import sys
import warnings
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException

from ...errors import InputError, first_line
from ...runtime import checkpoint_files
from ...runtime.cli import run_entry_point
from .checkpoints import MODEL_FILES_DIR, RECORD_FILE, StepCheckpoints

AUTO_MAP_MODULE = "albert_hf.modeling_albert_hf"
WEIGHTS = "model.safetensors"
FSDP_SHARDS = "pytorch_model_fsdp_0"  # accelerate's folder of an FSDP checkpoint's model shards
# what from_pretrained needs beside the weights (the tokenizer's files are what its save_pretrained wrote)
REQUIRED = ("config.json", "configuration_albert_hf.py", "modeling_albert_hf.py", "tokenizer_config.json")


def write_model_files(output_dir: Path, model, tokenizer) -> Path:
    """The run's one copy of the files a checkpoint needs to load as a model (main process, once a run): the
    config (with its auto_map), the remote code and the tokenizer."""
    from ...modeling_albert_hf import AUTO_MAP

    folder = Path(output_dir) / MODEL_FILES_DIR
    tmp = Path(output_dir) / ".tmp-model_files"
    shutil.rmtree(tmp, ignore_errors=True)
    config = copy.deepcopy(model.config)
    # as the model's save_pretrained writes them: every head's Auto class, and the class trained (not FSDP's)
    config.auto_map = dict(AUTO_MAP)
    config.architectures = [next(c.__name__ for c in type(model).__mro__ if c.__module__ == AUTO_MAP_MODULE)]
    config.save_pretrained(tmp)
    for name in ("configuration_albert_hf.py", "modeling_albert_hf.py"):  # as save_pretrained copies them
        shutil.copyfile(Path(__file__).parents[2] / name, tmp / name)  # albert_hf/
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


class ModelFiles:
    """The run's model files, written when its first checkpoint links them (a run stopped before any checkpoint
    leaves nothing behind: its folder is as empty as before)."""

    def __init__(self, output_dir: Path, model, tokenizer):
        self.output_dir, self.model, self.tokenizer, self.written = Path(output_dir), model, tokenizer, None

    def folder(self) -> Path:
        if self.written is None:
            self.written = write_model_files(self.output_dir, self.model, self.tokenizer)
        return self.written


def missing(folder: Path, weights: bool = True) -> list[str]:
    """What keeps a checkpoint folder from loading as a model: the model files it lacks (the weights among them
    with `weights`)."""
    return [name for name in (*REQUIRED, *(WEIGHTS,) * weights) if not (folder / name).is_file()]


def model_files_for(checkpoint: Path, given: Path | None) -> Path:
    """Where the model files of a checkpoint without them come from: --model_files, else the run's .model_files,
    else the run's final folder (the checkpoint's parent, once the run has ended)."""
    candidates = [given] if given is not None else [checkpoint.parent / MODEL_FILES_DIR, checkpoint.parent]
    for folder in candidates:
        if folder.is_dir() and not missing(folder, weights=False):
            return folder
    where = (
        f"--model_files {given}"
        if given is not None
        else (f"{checkpoint.parent / MODEL_FILES_DIR} nor {checkpoint.parent} (the run's final folder)")
    )
    raise InputError(
        f"{checkpoint}: neither {where} holds the model's files ({', '.join(REQUIRED)}); pass "
        "--model_files with the run's final folder, or a model folder of the same config"
    )


def make_loadable(checkpoint: Path, given: Path | None = None) -> list[str]:
    """Adds the model files to a checkpoint written without them, after checking it against its record, and
    records them; returns the names added ([] when it was loadable already)."""
    problem = StepCheckpoints.problem(checkpoint) or StepCheckpoints.damage(checkpoint)
    if problem:
        raise InputError(f"{checkpoint}: {problem}")
    if not missing(checkpoint):
        return []
    if not (checkpoint / WEIGHTS).is_file() and not (checkpoint / FSDP_SHARDS).is_dir():
        raise InputError(f"{checkpoint}: neither {WEIGHTS} nor {FSDP_SHARDS}/: not a checkpoint of run_pretraining.py")
    source = model_files_for(checkpoint, given)
    taken = allowed(source)
    added = [
        path.name
        for path in sorted(source.iterdir())
        if path.is_file() and path.name in taken and not (checkpoint / path.name).exists()
    ]
    for name in added:
        shutil.copyfile(source / name, checkpoint / name)
    if not (checkpoint / WEIGHTS).is_file():  # FSDP: the shards only
        gathered_weights(checkpoint, source)
        added.append(WEIGHTS)
    if (checkpoint / RECORD_FILE).is_file():  # the files as they are now, the added ones among them
        checkpoint_files.write_record(checkpoint, RECORD_FILE)
    return added


def gathered_weights(checkpoint: Path, files: Path) -> None:
    """An FSDP checkpoint's model shards (FSDP_SHARDS, torch.distributed.checkpoint's format), read in one process
    as data (`checkpoint_files.weights_only_loads`) into the model of `files`' config, written as its WEIGHTS."""
    import torch.distributed.checkpoint as dcp

    from ... import modeling_albert_hf
    from ...configuration_albert_hf import AlbertHFConfig

    config = AlbertHFConfig.from_pretrained(files)
    model = getattr(modeling_albert_hf, (config.architectures or ["AlbertHFForPreTraining"])[0])(config)
    weights = model.state_dict()
    shards = dcp.FileSystemReader(str(checkpoint / FSDP_SHARDS))
    try:
        with checkpoint_files.weights_only_loads():
            saved = {name.removeprefix("model.") for name in shards.read_metadata().state_dict_metadata}
            if saved == set(weights):
                with warnings.catch_warnings():  # that it loads in one process is the point here
                    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                    dcp.load({"model": weights}, storage_reader=shards, no_dist=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError, CheckpointException) as error:
        raise InputError(f"{checkpoint / FSDP_SHARDS}: cannot be read ({first_line(error)})") from None
    if saved != set(weights):
        raise InputError(
            f"{checkpoint / FSDP_SHARDS}: its tensors ({len(saved)}) are not those of the model of "
            f"{files / 'config.json'} ({len(weights)}), e.g. {sorted(saved ^ set(weights))[0]}"
        )
    tmp = checkpoint / ".tmp-weights"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    os.replace(tmp / WEIGHTS, checkpoint / WEIGHTS)
    shutil.rmtree(tmp)


def allowed(source: Path) -> set[str]:
    """The files of a model folder a checkpoint takes: config, code and tokenizer, not weights, cards or results."""
    return {
        path.name
        for path in source.iterdir()
        if path.suffix in (".json", ".py", ".model", ".txt")
        and path.name
        not in (
            "all_results.json",
            "fill_mask_examples.json",
            "metrics.jsonl",
            "prepared_data.json",
            "model.safetensors.index.json",
        )
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m albert_hf.pretraining.output.loadable",
        description=(
            "Make a run_pretraining.py checkpoint (step_N) written without its model files loadable with "
            "AutoModel.from_pretrained and run_glue.py --model_name_or_path."
        ),
    )
    parser.add_argument("checkpoint", type=Path, help="the step_N folder")
    parser.add_argument(
        "--model_files",
        type=Path,
        default=None,
        help=(
            "a folder with the run's config.json, tokenizer and remote code (default: the run's .model_files, or its "
            "final folder)"
        ),
    )
    args = parser.parse_args(argv)
    added = make_loadable(args.checkpoint, args.model_files)
    print(f"{args.checkpoint}: loadable ({'added ' + ', '.join(added) if added else 'nothing to add'})")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main, stage="starting"))
