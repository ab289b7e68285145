"""Pretraining text: plain-text files and any `datasets` dataset with a text column (the embedded default corpus:
embedded_corpus.py; the held-out split: splits.py).

Every source ends up as rows of one document each, in a column "text". Sentence splitting happens later, per
document, inside the tokenizing `datasets.map` (see `split_sentences` and `sentences.tokenize_documents`).

Plain-text layouts (`layout=`):
- "document_per_file":    each file is one document (a book, an article); blank lines separate paragraphs.
- "blank_line_separated": blank lines separate documents; each document is split into sentences.
- "sentence_per_line":    the official `create_pretraining_data.py` format: one sentence per line, blank lines
                          between documents. Pass `sentence_per_line=True` when tokenizing such a corpus.

Sentences are split by `sentencex` (Wikimedia): maintained, rule-based like pysbd (abbreviations, initials,
quotes), but compiled, so it runs at ~100 MB/s where pysbd runs at ~0.3 MB/s on the same books.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Iterator

from ...errors import InputError, datasets_read_errors, input_errors
from ...runtime.input_files import check_json_start
from ...tokenization import paragraphs
from .embedded_corpus import embedded_corpus

logger = logging.getLogger(__name__)

LAYOUTS = ("document_per_file", "blank_line_separated", "sentence_per_line")
TEXT_FILE_SUFFIXES = (".txt", ".text", ".raw")
DATASET_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".tsv": "csv"}


def decode_text(data: bytes) -> tuple[str, int]:
    """Decode UTF-8, replacing undecodable bytes by U+FFFD (real Gutenberg files are partly cp1252).

    Returns (text, number of replacements made). Never raises on bad bytes; the caller logs the count.
    """
    text = data.decode("utf-8", errors="replace")
    # U+FFFD that were already in the file (as the bytes EF BF BD) are text, not replacements.
    n_replaced = text.count("\ufffd") - data.count("\ufffd".encode())
    text = text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not text
    return text.replace("\r\n", "\n").replace("\r", "\n"), n_replaced


# ----------------------------------------------------------------------------------------------------------------
# Plain-text files


def find_text_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files and directories (recursively, *.txt-like files, sorted) into a list of files.

    Args:
        paths: a file or directory, or an iterable of them. A directory gives its .txt, .text and .raw files, at any
            depth, sorted; a file is taken as it is, whatever its suffix.

    Returns:
        The files, as `Path`s, in the order of `paths`.

    Raises:
        InputError: a path that does not exist, or a directory without a text file.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_FILE_SUFFIXES)
            if not found:
                raise InputError(f"No text files ({', '.join(TEXT_FILE_SUFFIXES)}) under directory {path}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"Corpus file or directory not found: {path}")
    return files


def documents_from_text(text: str, layout: str) -> list[str]:
    """Cut the decoded text of one file into documents according to `layout`."""
    if layout == "document_per_file":
        return [text.strip()] if text.strip() else []
    if layout in ("blank_line_separated", "sentence_per_line"):
        return paragraphs(text)
    raise InputError(f"Unknown layout {layout!r}; choose one of {LAYOUTS}")


def first_few(names: list[str], shown: int = 3) -> str:
    """'a, b, c and 141 more': a problem that repeats per file is reported once, with a count and a few names."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def read_text_documents(
    files, layout: str = "document_per_file", held_out: dict | None = None, report: bool = True
) -> Iterator[dict]:
    """Yield {"text", "source"} per document. Files skipped or repaired are summarised at the end (a count and the
    first few names; every file at debug level), so a corpus of 100k files does not print 100k warnings.

    `held_out` maps a file name to how many of its first documents are not yielded (`first_documents` chose
    them for evaluation). `report=False` logs the summary at debug level only (a stream's later passes)."""
    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {layout!r}; choose one of {LAYOUTS}")
    empty_files, binary_files, documents = [], [], 0
    replaced = {}
    held_out = held_out or {}
    for file in files:
        data = Path(file).read_bytes()
        if b"\x00" in data:
            # NUL bytes never occur in text; a decoded binary file would only add noise.
            binary_files.append(str(file))
            logger.debug("Skipping %s: it contains NUL bytes, so it is not a text file", file)
            continue
        text, n_bad = decode_text(data)
        if n_bad:
            replaced[str(file)] = n_bad
            logger.debug("%s: %d byte sequences are not valid UTF-8 (cp1252?); replaced by U+FFFD", file, n_bad)
        docs = documents_from_text(text, layout)
        if not docs:
            empty_files.append(str(file))
            continue
        for doc in docs[held_out.get(str(file), 0) :]:
            documents += 1
            yield {"text": doc, "source": str(file)}
    logger.log(
        logging.INFO if report else logging.DEBUG,
        "Read %d documents from %d files; skipped %d empty and %d binary files; "
        "%d files had %d undecodable byte sequences",
        documents,
        len(files),
        len(empty_files),
        len(binary_files),
        len(replaced),
        sum(replaced.values()),
    )
    if not report:
        return
    if binary_files:
        logger.warning("Skipped %d file(s) with NUL bytes (not text): %s", len(binary_files), first_few(binary_files))
    if replaced:
        logger.warning(
            "%d file(s) hold byte sequences that are not valid UTF-8 (cp1252?), %d in all, replaced by U+FFFD: %s",
            len(replaced),
            sum(replaced.values()),
            first_few([f"{name} ({count})" for name, count in replaced.items()]),
        )
    if empty_files:
        logger.warning("Skipped %d empty file(s): %s", len(empty_files), first_few(empty_files))


def files_fingerprint(files, layout: str) -> str:
    """A key for what `files` hold: their names, sizes and modification times, and the layout."""
    stats = [(str(f), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    return hashlib.sha256(json.dumps([layout, stats]).encode()).hexdigest()[:32]


def load_text_files(paths, layout: str = "document_per_file", cache_dir: str | None = None):
    """A `datasets.Dataset` with columns "text" (one document per row) and "source" (the file).

    The Arrow table is written once and cached; the cache key includes each file's size and mtime, so editing
    a file rebuilds it.

    Args:
        paths: text files or directories, as `find_text_files` takes them.
        layout (`str`, defaults to `"document_per_file"`): how a file is cut into documents, one of `LAYOUTS`.
        cache_dir (`str`, *optional*): where `datasets` caches the table (None: its default cache).

    Returns:
        The `datasets.Dataset` of the documents, in file order; empty and binary files give none.

    Raises:
        InputError: an unknown `layout`, a path `find_text_files` refuses, or no text in any of the files.
    """
    import datasets

    if layout not in LAYOUTS:
        raise InputError(f"Unknown layout {layout!r}; choose one of {LAYOUTS}")
    files = [str(f) for f in find_text_files(paths)]
    fingerprint = files_fingerprint(files, layout)
    features = datasets.Features({"text": datasets.Value("string"), "source": datasets.Value("string")})
    try:
        return datasets.Dataset.from_generator(
            read_text_documents,
            # A tuple, not a list: datasets would shard a list into one generator per file, and one log each.
            gen_kwargs={"files": tuple(files), "layout": layout},
            features=features,
            fingerprint=fingerprint,
            cache_dir=cache_dir,
            # documents may be whole books: written 32 at a time, not held by the thousand
            writer_batch_size=32,
        )
    except ValueError as error:
        if "corresponds to no data" not in str(error):
            raise
        raise InputError(f"No text in {len(files)} file(s) under {paths}: all are empty or binary") from error


def first_documents(files, layout: str, count: int) -> tuple[list[str], dict, bool]:
    """The first `count` documents of `files` (in their order), {file: how many of its first documents they are}
    (the `held_out` of `read_text_documents` and `text_file_stream`), and whether more documents follow: a
    stream's evaluation documents, found without reading the rest of the corpus."""
    texts, held_out = [], {}
    for row in read_text_documents(files, layout, report=False):
        if len(texts) == count:
            return texts, held_out, True
        texts.append(row["text"])
        held_out[row["source"]] = held_out.get(row["source"], 0) + 1
    return texts, held_out, False


def _text_file_passes(files, layout, seed, held_out, passes):
    """read_text_documents over `files`, pass after pass (`passes` None: forever), each pass in a file order
    shuffled by (seed, pass); the per-file summary is logged after the first pass only."""
    import random

    for number in itertools.count() if passes is None else range(passes):
        order = list(files)
        if passes is None:
            random.Random(f"albert_hf-files:{seed}:{number}").shuffle(order)
        read = 0
        for row in read_text_documents(order, layout, held_out, report=number == 0):
            read += 1
            yield {"text": row["text"]}
        if not read:
            raise InputError(
                f"No text to stream in {len(files)} file(s) ({first_few([str(f) for f in files])}): "
                "all are empty, binary or held out for evaluation"
            )


def text_file_stream(
    files, layout: str = "document_per_file", *, seed: int = 0, held_out: dict | None = None, endless: bool = True
):
    """Plain-text files as a `datasets.IterableDataset` of {"text"} documents, read file by file as iterated:
    the plain-text side of --streaming. Nothing is read before the first document is asked for.

    `endless`: pass after pass over `files`, each pass in another order (seeded), so a training stream never
    ends (each process of a run streams its own files, and their passes differ in length); otherwise one pass in
    the given order. `held_out`: see `read_text_documents`.

    The position resumes exactly with the dataset's `state_dict()` / `load_state_dict()`, which count documents:
    resuming re-reads (without tokenizing) the documents before the position.
    """
    import datasets

    features = datasets.Features({"text": datasets.Value("string")})
    return datasets.IterableDataset.from_generator(
        _text_file_passes,
        features=features,
        # a tuple, so that datasets keeps one generator over all the files (a list would be split into shards)
        gen_kwargs={
            "files": tuple(str(f) for f in files),
            "layout": layout,
            "seed": seed,
            "held_out": dict(held_out or {}),
            "passes": None if endless else 1,
        },
    )


# ----------------------------------------------------------------------------------------------------------------
# `datasets` sources (local json/jsonl/parquet/csv files or Hub names); the first three checks and readers also
# read through `runtime.input_files`, the checks the fine-tuning scripts' data files get too


def load_text_dataset(
    name_or_files,
    text_column: str = "text",
    config_name: str | None = None,
    split: str = "train",
    streaming: bool = False,
    hub_name: bool = False,
    **load_kwargs,
):
    """Load a dataset with a text column and return it with that column named "text".

    Args:
        name_or_files: a Hub dataset name (online only), or a local .json/.jsonl/.parquet/.csv/.tsv file or a list of
            them, all of one format.
        text_column (`str`, defaults to `"text"`): the column holding the documents.
        config_name (`str`, *optional*): the Hub dataset's configuration.
        split (`str`, defaults to `"train"`): the split to load.
        streaming (`bool`, defaults to `False`): stream the rows (for corpora larger than the disk cache).
        hub_name (`bool`, defaults to `False`): `name_or_files` is a dataset's name for `datasets.load_dataset` (a Hub
            name, or a local folder laid out as a Hub dataset repository), not files.
        **load_kwargs: passed to `datasets.load_dataset` (.tsv files are read with a tab delimiter unless
            `delimiter` is given).

    Returns:
        A `datasets.Dataset`, or an `IterableDataset` with `streaming=True`, its text column renamed "text" (a
        "text" column it already had is dropped) and its other columns kept.

    Raises:
        InputError: a missing or unreadable file, mixed formats, no `text_column` or one that does not hold text
            (or, read whole, is not valid UTF-8), or a source that is neither such files nor a Hub name.
    """
    import datasets

    files = [name_or_files] if isinstance(name_or_files, (str, os.PathLike)) else list(name_or_files)
    suffixes = {Path(f).suffix.lower() for f in files}
    missing = [str(f) for f in files if Path(f).suffix.lower() in DATASET_FILE_BUILDERS and not Path(f).exists()]
    if missing:
        raise InputError(f"Corpus file(s) not found: {', '.join(missing)}")
    if hub_name:
        where = str(name_or_files)
        with input_errors(f"Dataset {where}", *datasets_read_errors()):
            dataset = datasets.load_dataset(where, config_name, split=split, streaming=streaming, **load_kwargs)
    elif all(Path(f).exists() for f in files) and suffixes <= set(DATASET_FILE_BUILDERS):
        builders = {DATASET_FILE_BUILDERS[s] for s in suffixes}
        if len(builders) > 1:
            raise InputError(f"Mixed file types {sorted(suffixes)}; load one format at a time")
        if ".tsv" in suffixes:
            load_kwargs.setdefault("delimiter", "\t")
        where = ", ".join(map(str, files))
        for file in files:
            if DATASET_FILE_BUILDERS[Path(file).suffix.lower()] == "json":
                check_json_start(file)
        with input_errors(f"Could not read {where}", *datasets_read_errors()):
            dataset = datasets.load_dataset(
                builders.pop(), data_files=[str(f) for f in files], split=split, streaming=streaming, **load_kwargs
            )
    elif len(files) == 1 and not Path(files[0]).exists():
        dataset = datasets.load_dataset(str(files[0]), config_name, split=split, streaming=streaming, **load_kwargs)
        where = str(files[0])
    else:
        raise InputError(
            f"Cannot load {files}: expected existing {sorted(DATASET_FILE_BUILDERS)} files or a Hub dataset name "
            "(plain .txt files go through load_text_files)"
        )
    columns = dataset.column_names
    if columns is not None and text_column not in columns:
        raise InputError(f"Dataset {where} has no text column {text_column!r}; its columns are {columns}")
    feature = (dataset.features or {}).get(text_column)
    if feature is not None and getattr(feature, "dtype", None) not in ("string", "large_string", "null"):
        raise InputError(f"Dataset {where}: its text column {text_column!r} holds {feature}, not text")
    if isinstance(dataset, datasets.Dataset):
        # Arrow keeps the bytes of a parquet string as they are; invalid UTF-8 would fail later, in tokenizing
        import pyarrow

        with input_errors(f"Dataset {where}: its text column {text_column!r} is not valid UTF-8", pyarrow.ArrowInvalid):
            dataset.data.table.column(text_column).validate(full=True)
    if columns is not None and text_column != "text":
        if "text" in columns:
            dataset = dataset.remove_columns("text")
        dataset = dataset.rename_column(text_column, "text")
    return dataset


# ----------------------------------------------------------------------------------------------------------------


def is_plain_text(source) -> bool:
    """Whether `source` (a path or a list of them) is plain-text files and folders, rather than a `datasets`
    source (json/jsonl/parquet/csv files, a Hub name)."""
    sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    return all(Path(s).is_dir() or Path(s).suffix.lower() in TEXT_FILE_SUFFIXES for s in sources)


def load_corpus(source=None, layout: str = "document_per_file", text_column: str = "text", **kwargs):
    """One entry point for scripts: None -> embedded corpus; .txt files or directories -> `load_text_files`;
    json/jsonl/parquet/csv files or a Hub name -> `load_text_dataset`.

    Args:
        source: None, plain-text files or directories (.txt, .text, .raw), or a `datasets` source: json/jsonl/
            parquet/csv/tsv files or a Hub dataset name.
        layout (`str`, defaults to `"document_per_file"`): how plain-text files are cut into documents (`LAYOUTS`).
        text_column (`str`, defaults to `"text"`): the text column of a `datasets` source.
        **kwargs: for a `datasets` source only, passed to `load_text_dataset` (`config_name`, `split`,
            `streaming`, `hub_name`: a name for `datasets.load_dataset`, even of a local folder); ignored for plain
            text and the embedded corpus.

    Returns:
        The documents in a column "text": a `datasets.Dataset` (with a "source" column for plain text and the
        embedded corpus), or an `IterableDataset` for a `datasets` source read with `streaming=True`.
    """
    if source is None:
        return embedded_corpus()
    if kwargs.get("hub_name"):
        return load_text_dataset(source, text_column=text_column, **kwargs)
    kwargs.pop("hub_name", None)
    if is_plain_text(source):
        return load_text_files(source, layout=layout)
    return load_text_dataset(source, text_column=text_column, **kwargs)


__all__ = [
    "LAYOUTS",
    "decode_text",
    "find_text_files",
    "read_text_documents",
    "load_text_files",
    "first_documents",
    "text_file_stream",
    "load_text_dataset",
    "is_plain_text",
    "load_corpus",
]
