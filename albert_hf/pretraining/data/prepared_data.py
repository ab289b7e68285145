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

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import transformers

from ...errors import InputError
from ...runtime.preemption import deferred
from .mixture import Mix, resolve_weights
from .pairs import PAIRS_VERSION
from .sources import KEYS, Sources, parse_sources

if TYPE_CHECKING:
    from .vocabulary import VocabularyExtension

MANIFEST = "prepared_data.json"
PAIRS_DIR = "pairs"
FORMAT_VERSION = 1
EVAL_DOCUMENTS_KEPT = 50  # the fill-mask examples read the first 50 held-out documents

# What shaped the pairs: recorded, and taken from the manifest by a run that trains on them.
SHAPING_ARGUMENTS = (
    "max_seq_length",
    "short_seq_prob",
    "dupe_factor",
    "task",
    "layout",
    "validation_split_percentage",
    "max_eval_samples",
)
# Where the text and the tokenizer came from: recorded; a training run must not name others.
SOURCE_ARGUMENTS = (
    "train_files",
    "dataset_name",
    "dataset_config_name",
    "text_column",
    "tokenizer_name",
    "vocab_size",
    "tokenizer_sample_sentences",
    "streaming",
)


@dataclass
class PreparedPairs:
    """The tokenizer and the pairs a run trains and evaluates on (built, or read from a prepared folder). A mixed
    run's (`mix`) training pairs are a dict by source name, its held-out pairs carry their source's index
    ("source")."""

    tokenizer: transformers.PreTrainedTokenizerBase
    train_pairs: datasets.Dataset | datasets.IterableDataset | dict
    eval_pairs: datasets.Dataset | datasets.IterableDataset | None
    eval_documents: datasets.Dataset | datasets.IterableDataset | None  # for the fill-mask examples
    mix: Mix | None = None
    vocabulary: VocabularyExtension | None = None  # --extend_vocabulary's new pieces (data/vocabulary.py)


def save(data: PreparedPairs, folder: Path, arguments: dict, sources: Sources | None = None) -> dict:
    """Writes `data` and its manifest into `folder` (complete or not at all); returns the manifest. `arguments`:
    the run's arguments by flag name, of which the manifest records those that shaped or sourced the pairs. A mixed
    run's pairs are kept per source (`pairs/<name>/train`), the manifest listing each source with its weight and its
    size in pairs and tokens; the held-out pairs of all sources are one set, each pair with its source's index."""
    trains = data.train_pairs if isinstance(data.train_pairs, dict) else {None: data.train_pairs}
    if not all(isinstance(pairs, datasets.Dataset) for pairs in trains.values()):
        raise InputError("--preprocess_only writes Arrow shards and needs the corpus materialised: drop --streaming")
    folder = Path(folder)
    tmp = folder / ".tmp-prepared"
    shutil.rmtree(tmp, ignore_errors=True)
    data.tokenizer.save_pretrained(tmp)
    listed = []
    mappings = {entry["name"]: entry for entry in sources.mappings()} if sources is not None else {}
    for name, pairs in trains.items():
        pairs.save_to_disk(tmp / PAIRS_DIR / (name or "") / "train")
        if name is not None:
            listed.append({**mappings[name], "train_pairs": len(pairs), "train_tokens": pair_tokens(pairs)})
    counts = {"train_pairs": sum(len(pairs) for pairs in trains.values())}
    if data.eval_pairs is not None:
        data.eval_pairs.save_to_disk(tmp / PAIRS_DIR / "validation")
        documents = data.eval_documents.select(range(min(EVAL_DOCUMENTS_KEPT, len(data.eval_documents))))
        documents.save_to_disk(tmp / PAIRS_DIR / "eval_documents")
        counts["validation_pairs"] = len(data.eval_pairs)
        if listed:
            held_out = np.bincount(np.asarray(data.eval_pairs["source"]), minlength=len(listed))
            for entry, count in zip(listed, held_out.tolist()):
                entry["validation_pairs"] = count
    manifest = {
        "format_version": FORMAT_VERSION,
        "pairs_version": PAIRS_VERSION,
        "arguments": {name: arguments[name] for name in (*SHAPING_ARGUMENTS, *SOURCE_ARGUMENTS, "seed")},
        "tokenizer_size": len(data.tokenizer),
        "tokenizer_sha256": file_sha256(tmp / "tokenizer.json"),
        **counts,
        **({"sources": listed} if listed else {}),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    folder.mkdir(parents=True, exist_ok=True)
    with deferred():  # a stop signal waits for the moves: the manifest, last, marks the folder complete
        for path in sorted(tmp.iterdir(), key=lambda path: path.name == MANIFEST):
            os.replace(path, folder / path.name)
        tmp.rmdir()
    return manifest


def pair_tokens(pairs: datasets.Dataset) -> int:
    """The tokens of `pairs` (their input_ids' lengths), read from the Arrow column's offsets."""
    import pyarrow.compute

    return int(pyarrow.compute.sum(pyarrow.compute.list_value_length(pairs.data.column("input_ids"))).as_py() or 0)


def file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def read_manifest(folder, label: str = "--prepared_data") -> dict:
    """The manifest of a prepared folder, or InputError naming what is wrong with the folder (`label`: the
    argument or source that named it)."""
    path = Path(folder) / MANIFEST
    if not Path(folder).is_dir():
        raise InputError(f"{label} {folder}: no such folder")
    if not path.is_file():
        raise InputError(
            f"{label} {folder}: no {MANIFEST} (a folder written by run_pretraining.py --preprocess_only has one)"
        )
    try:
        manifest = json.loads(path.read_text())
        arguments = manifest["arguments"]
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{label} {folder}: {MANIFEST} is not readable ({error})")
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("pairs_version") != PAIRS_VERSION:
        raise InputError(
            f"{label} {folder} was written by another version of albert_hf's pair "
            "builder; prepare it again with --preprocess_only"
        )
    if not isinstance(arguments, dict):
        raise InputError(f"{label} {folder}: {MANIFEST} has no arguments")
    missing = [name for name in SHAPING_ARGUMENTS if name not in arguments]
    if missing:
        raise InputError(
            f"{label} {folder}: {MANIFEST} does not record {', '.join(missing)}; prepare it again with "
            "--preprocess_only"
        )
    if label != "--prepared_data" and "sources" in manifest:
        raise InputError(
            f"{label} {folder} holds a mix of sources itself ({len(manifest['sources'])}): train on it "
            "with --prepared_data, or name its sources' own folders"
        )
    return manifest


def manifest_sources(folder) -> Sources | None:
    """The sources a --prepared_data folder of several holds (its manifest's), or None for a folder of one."""
    manifest = read_manifest(folder)
    if "sources" not in manifest:
        return None
    listed = manifest["sources"]
    try:
        sources = parse_sources([{key: value for key, value in entry.items() if key in KEYS} for entry in listed])
    except (InputError, AttributeError, TypeError) as error:
        raise InputError(f"--prepared_data {folder}: {MANIFEST}'s sources are not readable ({error})") from None
    return sources


def difference(first: dict, first_folder, other: dict, other_folder) -> str | None:
    """What two prepared folders' manifests differ in (the tokenizer, or a shaping argument), or None."""
    tokenizers = [
        manifest.get("tokenizer_sha256") or file_sha256(Path(folder) / "tokenizer.json")
        for manifest, folder in ((first, first_folder), (other, other_folder))
    ]
    if tokenizers[0] != tokenizers[1] or first.get("tokenizer_size") != other.get("tokenizer_size"):
        return "different tokenizers"
    for name in SHAPING_ARGUMENTS:
        if first["arguments"].get(name) != other["arguments"].get(name):
            return f"--{name} {first['arguments'].get(name)} and {other['arguments'].get(name)}"
    return None


def adopt_manifest(arguments: dict, manifest: dict, explicit: set[str], sources_only: bool = False) -> dict:
    """The shaping arguments' values the manifest recorded, which the run takes instead of its own.

    Args:
        arguments: the parsed arguments by flag name (read only), --prepared_data among them.
        manifest: the prepared folder's manifest (`read_manifest`).
        explicit: the arguments given on the command line or in the arguments file.

    Returns:
        {name: value} for every shaping argument. One given explicitly with another value, or a corpus or
        tokenizer argument given at all, stops with one line (InputError). `sources_only`: the folder is a source
        of --sources, whose other sources may read a corpus (the tokenizer argument is checked by the caller).
    """
    recorded, folder = manifest["arguments"], arguments["prepared_data"]
    for name in () if sources_only else SOURCE_ARGUMENTS:
        if name in explicit:
            raise InputError(
                f"--{name} cannot be combined with --prepared_data {folder}: the "
                f"pairs and the tokenizer come from that folder (prepared with --{name} "
                f"{recorded.get(name)})"
            )
    for name in SHAPING_ARGUMENTS:
        value = recorded.get(name)
        if name in explicit and arguments[name] != value:
            raise InputError(
                f"--{name} {arguments[name]} disagrees with --prepared_data "
                f"{folder}, which was prepared with --{name} {value}: drop the flag, or "
                "prepare the data again"
            )
    return {name: recorded.get(name) for name in SHAPING_ARGUMENTS}


def load(folder, sources: Sources | None = None) -> PreparedPairs:
    """The tokenizer and the memory-mapped pairs of a prepared folder; a folder of several sources with their mix
    (`sources`: the run's, whose weights replace the folder's)."""
    folder = Path(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    pairs = folder / PAIRS_DIR
    validation = pairs / "validation"
    has_validation = validation.is_dir()
    manifest = json.loads((folder / MANIFEST).read_text())
    mix, train = None, None
    if "sources" in manifest:
        sources = sources or manifest_sources(folder)
        train = {name: datasets.load_from_disk(str(pairs / name / "train")) for name in sources.trained}
        sizes = {name: len(pairs) for name, pairs in train.items()}
        mix = Mix(sources.trained, resolve_weights(sources, sizes), sizes, sources.weighting(), sources.names)
    return PreparedPairs(
        tokenizer=tokenizer,
        train_pairs=train if mix is not None else datasets.load_from_disk(str(pairs / "train")),
        eval_pairs=datasets.load_from_disk(str(validation)) if has_validation else None,
        eval_documents=datasets.load_from_disk(str(pairs / "eval_documents")) if has_validation else None,
        mix=mix,
    )
