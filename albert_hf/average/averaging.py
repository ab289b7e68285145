"""The averaging job: the sources checked (one config, one tokenizer, the same tensors), the weights' mean streamed
one tensor at a time, the folder written whole with its card. See `albert_hf.average`."""

import argparse
import json
import logging
import math
import re
import shutil
import struct
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .. import modeling_albert_hf
from ..configuration_albert_hf import AlbertHFConfig
from ..errors import InputError, first_line
from ..hub.model_card import CardContent, write_model_card
from ..modeling_albert_hf import AlbertHFModel
from ..pretraining.output.loadable import FSDP_SHARDS, WEIGHTS
from ..runtime import checkpoint_files
from ..runtime.storage import check_writable

logger = logging.getLogger(__name__)

# What a model folder needs beside its weights, and the tokenizer's files where it has them: copied from the first
# source; the tokenizer's must be the same bytes in every source.
MODEL_FILES = ("config.json", "configuration_albert_hf.py", "modeling_albert_hf.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "spiece.model", "special_tokens_map.json")
RESULTS_FILE = "all_results.json"
STEP = re.compile(r"step_(\d+)$")
# config.json keys that name where and with what a folder was written, not the model
UNCOMPARED = ("_name_or_path", "transformers_version")
# safetensors' dtype names -> bytes an element
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def check_source(path: Path) -> None:
    """A source is a model folder with its weights in one safetensors file, intact where it records its files."""
    if not path.is_dir():
        raise InputError(f"{path}: not a folder")
    if not (path / WEIGHTS).is_file():
        if (path / FSDP_SHARDS).is_dir():
            raise InputError(
                f"{path}: an FSDP checkpoint without its gathered weights; write them with "
                f"`python -m albert_hf.pretraining.output.loadable {path}`, then average it"
            )
        raise InputError(f"{path}: no {WEIGHTS} (a model folder or a step_N checkpoint)")
    missing = [name for name in MODEL_FILES if not (path / name).is_file()]
    if missing:
        raise InputError(f"{path}: no {missing[0]} (a model folder or a step_N checkpoint)")
    if checkpoint_files.record_name(path) is not None:
        damage = checkpoint_files.recorded_damage(path)
        if damage:
            raise InputError(f"{path}: {damage}")


def read_config(path: Path) -> dict:
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        raise InputError(f"{path / 'config.json'}: {first_line(error)}") from None
    if not isinstance(config, dict):
        raise InputError(f"{path / 'config.json'}: not a config")
    return {key: value for key, value in config.items() if key not in UNCOMPARED}


def check_alike(sources: list[Path]) -> None:
    """One config and one tokenizer: the first key or file that differs is named."""
    first = read_config(sources[0])
    for path in sources[1:]:
        other = read_config(path)
        differ = sorted(key for key in first.keys() | other.keys() if first.get(key) != other.get(key))
        if differ:
            key = differ[0]
            raise InputError(
                f"{path / 'config.json'}: another config than {sources[0]}'s ({key}: {other.get(key)!r} against "
                f"{first.get(key)!r}): average checkpoints of one model"
            )
    for name in TOKENIZER_FILES:
        present = [path for path in sources if (path / name).is_file()]
        if present and len(present) != len(sources):
            lacking = next(path for path in sources if path not in present)
            raise InputError(f"{lacking}: no {name}, which {present[0]} has: average checkpoints of one tokenizer")
        sums = {checkpoint_files.sha256(path / name) for path in present}
        if len(sums) > 1:
            raise InputError(f"{name}: not the same in {', '.join(map(str, sources))}: average one tokenizer's")


def open_weights(sources: list[Path]) -> list:
    """Each source's weights, memory-mapped, with the same tensors of the same shapes and dtypes."""
    files = []
    for path in sources:
        try:
            files.append(safe_open(path / WEIGHTS, framework="pt"))
        except (OSError, SafetensorError) as error:
            raise InputError(f"{path / WEIGHTS}: {first_line(error)}") from None
    names = sorted(files[0].keys())
    unknown = [name for name in names if files[0].get_slice(name).get_dtype() not in DTYPE_BYTES]
    if unknown:
        raise InputError(f"{sources[0] / WEIGHTS}: tensor {unknown[0]} has a dtype this average does not take")
    for path, weights in zip(sources[1:], files[1:]):
        if sorted(weights.keys()) != names:
            extra = sorted(set(weights.keys()) ^ set(names))[0]
            raise InputError(f"{path / WEIGHTS}: tensor {extra} is in one source only: average one model's")
        for name in names:
            ours, theirs = weights.get_slice(name), files[0].get_slice(name)
            if (ours.get_shape(), ours.get_dtype()) != (theirs.get_shape(), theirs.get_dtype()):
                raise InputError(
                    f"{path / WEIGHTS}: tensor {name} is {ours.get_dtype()} {ours.get_shape()}, "
                    f"{theirs.get_dtype()} {theirs.get_shape()} in {sources[0]}"
                )
    return files


def mean_tensors(sources: list[Path], files: list):
    """(name, the element-wise mean of the sources' tensor), one tensor at a time: summed in float32 one source's
    tensor at a time, returned in the sources' dtype; a tensor that is not floating point (a buffer of indices) must
    be the same in all."""
    for name in sorted(files[0].keys()):
        first = files[0].get_tensor(name)
        if not first.is_floating_point():
            for path, weights in zip(sources[1:], files[1:]):
                if not torch.equal(weights.get_tensor(name), first):
                    raise InputError(f"{path / WEIGHTS}: {name} (not weights) differs from {sources[0]}'s")
            yield name, first
            continue
        total = first.to(torch.float32)
        for weights in files[1:]:
            total += weights.get_tensor(name).to(torch.float32)
        yield name, (total / len(sources)).to(first.dtype)


def write_mean(sources: list[Path], path: Path) -> None:
    """The mean of the sources' weights written to `path` as safetensors, each tensor as soon as it is computed: the
    header first (the names, dtypes and shapes are the sources', so every offset is known before any data), then
    each tensor's bytes. safetensors' own `save_file` takes the whole state dict and copies it into bytes."""
    files = open_weights(sources)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(files[0].keys()):
        tensor = files[0].get_slice(name)
        size = math.prod(tensor.get_shape()) * DTYPE_BYTES[tensor.get_dtype()]
        header[name] = {
            "dtype": tensor.get_dtype(),
            "shape": tensor.get_shape(),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded)
        for name, tensor in mean_tensors(sources, files):
            file.write(tensor.contiguous().reshape(-1).view(torch.uint8).numpy().data)


def source_step(path: Path) -> int | None:
    match = STEP.search(path.name)
    return int(match[1]) if match else None


def average_checkpoints(output_dir, sources) -> Path:
    """Write the mean of `sources`' weights, with their config, tokenizer and code, into `output_dir`.

    Args:
        output_dir: the folder to write; it must not exist, or be empty.
        sources: two or more model folders of one model (one config, one tokenizer).

    Returns:
        The folder written.

    Raises:
        InputError: fewer than two sources, one named twice, a source that is not an intact model folder, sources of
            different configs, tokenizers or tensors, or an output folder that holds something.
    """
    output_dir, sources = Path(output_dir), [Path(source) for source in sources]
    if len(sources) < 2:
        raise InputError("average at least two checkpoints")
    if len({path.resolve() for path in sources}) != len(sources):
        raise InputError("a checkpoint is named twice: each source counts once in the mean")
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise InputError(f"{output_dir}: already holds something; name a new folder for the average")
    check_writable(output_dir, "the output folder")
    for path in sources:
        check_source(path)
    check_alike(sources)
    tmp = output_dir.with_name(f".tmp-{output_dir.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_mean(sources, tmp / WEIGHTS)
        for name in (*MODEL_FILES, *TOKENIZER_FILES):
            if (sources[0] / name).is_file():
                shutil.copyfile(sources[0] / name, tmp / name)
        results = {"averaged_checkpoints": len(sources), "averaged_from": [str(path) for path in sources]}
        (tmp / RESULTS_FILE).write_text(json.dumps(results, indent=2) + "\n")
        write_averaged_card(tmp, sources)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if output_dir.is_dir():
        output_dir.rmdir()  # empty (checked above)
    tmp.rename(output_dir)
    return output_dir


def write_averaged_card(folder: Path, sources: list[Path]) -> Path:
    """The card: what was averaged, the sources by name and step, how to load it."""
    config = AlbertHFConfig.from_pretrained(folder)
    with torch.device("meta"):  # the card's parameter count, without a second copy of the weights
        model = getattr(modeling_albert_hf, (config.architectures or ["AlbertHFModel"])[0], AlbertHFModel)(config)
    rows = "\n".join(f"| `{path}` | {source_step(path) if source_step(path) is not None else ''} |" for path in sources)
    card = CardContent(
        title=f"{folder.name.removeprefix('.tmp-')}: the average of {len(sources)} ALBERT checkpoints",
        summary=(
            f"The element-wise mean of the weights of {len(sources)} checkpoints of one run (LAWA: Kaddour 2022; "
            "Sanyal et al. 2023), written by `python -m albert_hf.average`. Its sources:\n\n"
            f"| source | step |\n|---|---|\n{rows}"
        ),
        pipeline_tag="fill-mask",
        usage_class="AutoModel",
        training={"averaged": f"mean of {len(sources)} checkpoints", "sources": ", ".join(map(str, sources))},
    )
    return write_model_card(folder, model, card)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m albert_hf.average",
        description="Average the weights of checkpoints of one model into a new model folder.",
    )
    parser.add_argument("output_dir", help="the folder to write (new, or empty)")
    parser.add_argument("checkpoints", nargs="+", help="two or more step_N checkpoints or model folders of one run")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    written = average_checkpoints(args.output_dir, args.checkpoints)
    print(f"{written}: the average of {len(args.checkpoints)} checkpoints ({', '.join(args.checkpoints)})")
