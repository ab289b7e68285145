"""Preprocess once, train many times: the official flow (`create_pretraining_data.py`, then `run_pretraining.py`).

    run_pretraining.py --preprocess_only --train_files corpus/ --max_seq_length 512 --output_dir data/albert-512
    accelerate launch run_pretraining.py --prepared_data data/albert-512 --model_config base --output_dir runs/base

`--preprocess_only` writes the tokenizer (at the top of the folder, as a model folder holds it), the training and
held-out pairs as Arrow shards (`pairs/train`, `pairs/validation`), the first held-out documents for the fill-mask
examples (`pairs/eval_documents`) and `prepared_data.json`, the manifest of the arguments that shaped them. A run
with `--prepared_data` memory-maps the shards: no corpus reading, no tokenizing, no pair building, on every process
of every machine. Arguments that shape the pairs take the manifest's values; one given explicitly with another
value stops the run with one line, as do the corpus and tokenizer arguments (the folder has its own).

Everything is written into a temporary folder first and moved into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import datasets
import transformers

from ...errors import InputError
from ...runtime.preemption import deferred
from .pairs import PAIRS_VERSION

MANIFEST = "prepared_data.json"
PAIRS_DIR = "pairs"
FORMAT_VERSION = 1
EVAL_DOCUMENTS_KEPT = 50  # the fill-mask examples read the first 50 held-out documents

# What shaped the pairs: recorded, and taken from the manifest by a run that trains on them.
SHAPING_ARGUMENTS = ("max_seq_length", "short_seq_prob", "dupe_factor", "task", "layout",
                     "validation_split_percentage", "max_eval_samples")
# Where the text and the tokenizer came from: recorded; a training run must not name others.
SOURCE_ARGUMENTS = ("train_files", "dataset_name", "dataset_config_name", "text_column", "tokenizer_name",
                    "vocab_size", "tokenizer_sample_sentences", "streaming")


@dataclass
class PreparedPairs:
    """The tokenizer and the pairs a run trains and evaluates on (built, or read from a prepared folder)."""

    tokenizer: transformers.PreTrainedTokenizerBase
    train_pairs: datasets.Dataset | datasets.IterableDataset
    eval_pairs: datasets.Dataset | datasets.IterableDataset | None
    eval_documents: datasets.Dataset | datasets.IterableDataset | None  # for the fill-mask examples


def save(data: PreparedPairs, folder: Path, arguments: dict) -> dict:
    """Writes `data` and its manifest into `folder` (complete or not at all); returns the manifest. `arguments`:
    the run's arguments by flag name, of which the manifest records those that shaped or sourced the pairs."""
    if not isinstance(data.train_pairs, datasets.Dataset):
        raise InputError("--preprocess_only writes Arrow shards and needs the corpus materialised: drop "
                         "--streaming")
    folder = Path(folder)
    tmp = folder / ".tmp-prepared"
    shutil.rmtree(tmp, ignore_errors=True)
    data.tokenizer.save_pretrained(tmp)
    data.train_pairs.save_to_disk(tmp / PAIRS_DIR / "train")
    counts = {"train_pairs": len(data.train_pairs)}
    if data.eval_pairs is not None:
        data.eval_pairs.save_to_disk(tmp / PAIRS_DIR / "validation")
        documents = data.eval_documents.select(range(min(EVAL_DOCUMENTS_KEPT, len(data.eval_documents))))
        documents.save_to_disk(tmp / PAIRS_DIR / "eval_documents")
        counts["validation_pairs"] = len(data.eval_pairs)
    manifest = {
        "format_version": FORMAT_VERSION, "pairs_version": PAIRS_VERSION,
        "arguments": {name: arguments[name] for name in (*SHAPING_ARGUMENTS, *SOURCE_ARGUMENTS, "seed")},
        "tokenizer_size": len(data.tokenizer), **counts,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    folder.mkdir(parents=True, exist_ok=True)
    with deferred():  # a stop signal waits for the moves: the manifest, last, marks the folder complete
        for path in sorted(tmp.iterdir(), key=lambda path: path.name == MANIFEST):
            os.replace(path, folder / path.name)
        tmp.rmdir()
    return manifest


def read_manifest(folder) -> dict:
    """The manifest of a prepared folder, or InputError naming what is wrong with the folder."""
    path = Path(folder) / MANIFEST
    if not Path(folder).is_dir():
        raise InputError(f"--prepared_data {folder}: no such folder")
    if not path.is_file():
        raise InputError(f"--prepared_data {folder}: no {MANIFEST} (a folder written by run_pretraining.py "
                         "--preprocess_only has one)")
    try:
        manifest = json.loads(path.read_text())
        arguments = manifest["arguments"]
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"--prepared_data {folder}: {MANIFEST} is not readable ({error})")
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("pairs_version") != PAIRS_VERSION:
        raise InputError(f"--prepared_data {folder} was written by another version of albert_hf's pair "
                         "builder; prepare it again with --preprocess_only")
    if not isinstance(arguments, dict):
        raise InputError(f"--prepared_data {folder}: {MANIFEST} has no arguments")
    return manifest


def adopt_manifest(arguments: dict, manifest: dict, explicit: set[str]) -> dict:
    """The shaping arguments' values the manifest recorded, which the run takes instead of its own.

    Args:
        arguments: the parsed arguments by flag name (read only), --prepared_data among them.
        manifest: the prepared folder's manifest (`read_manifest`).
        explicit: the arguments given on the command line or in the arguments file.

    Returns:
        {name: value} for every shaping argument. One given explicitly with another value, or a corpus or
        tokenizer argument given at all, stops with one line (InputError).
    """
    recorded, folder = manifest["arguments"], arguments["prepared_data"]
    for name in SOURCE_ARGUMENTS:
        if name in explicit:
            raise InputError(f"--{name} cannot be combined with --prepared_data {folder}: the "
                             f"pairs and the tokenizer come from that folder (prepared with --{name} "
                             f"{recorded.get(name)})")
    for name in SHAPING_ARGUMENTS:
        value = recorded.get(name)
        if name in explicit and arguments[name] != value:
            raise InputError(f"--{name} {arguments[name]} disagrees with --prepared_data "
                             f"{folder}, which was prepared with --{name} {value}: drop the flag, or "
                             "prepare the data again")
    return {name: recorded.get(name) for name in SHAPING_ARGUMENTS}


def load(folder) -> PreparedPairs:
    """The tokenizer and the memory-mapped pairs of a prepared folder."""
    folder = Path(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    pairs = folder / PAIRS_DIR
    validation = pairs / "validation"
    has_validation = validation.is_dir()
    return PreparedPairs(
        tokenizer=tokenizer,
        train_pairs=datasets.load_from_disk(str(pairs / "train")),
        eval_pairs=datasets.load_from_disk(str(validation)) if has_validation else None,
        eval_documents=datasets.load_from_disk(str(pairs / "eval_documents")) if has_validation else None,
    )
