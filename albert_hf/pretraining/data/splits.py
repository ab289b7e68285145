"""A pretraining corpus's training and held-out documents in one call (`corpus_splits`), as `datasets` hands over
splits: whole documents held out (never trained on), each process's share of the rest, read or streamed."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from ...errors import InputError
from ...tokenization import split_sentences
from .corpus import (
    files_fingerprint,
    find_text_files,
    first_documents,
    first_few,
    is_plain_text,
    load_corpus,
    text_file_stream,
)

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import datasets


@dataclass
class CorpusSplits:
    """A pretraining corpus's documents (column "text") split as `datasets.load_dataset` hands over splits:
    `corpus_splits`."""

    train: "datasets.Dataset | datasets.IterableDataset"  # this process's; an endless stream when streamed
    held_out: "datasets.Dataset | None"  # whole documents, never trained on
    tokenizer_documents: Iterable[dict]  # every training document, read once: what a tokenizer is trained on
    tokenizer_fingerprint: str | None = None  # the cache key of a tokenizer trained on a text-file stream
    stream_shares: str | None = None  # how the processes share a stream, for the log


def corpus_splits(
    source=None,
    *,
    layout: str = "document_per_file",
    text_column: str = "text",
    config_name: str | None = None,
    streaming: bool = False,
    held_out_percentage: float = 0.0,
    seed: int = 0,
    process_index: int = 0,
    num_processes: int = 1,
    name: str = "the corpus",
    split: str = "train",
    hub_name: bool = False,
) -> CorpusSplits:
    """The training and held-out documents of a corpus, read whole or streamed.

    Args:
        source: text files or folders, json/jsonl/parquet/csv files, a Hub dataset name, or None (the embedded
            corpus, never streamed).
        layout, text_column, config_name, split, hub_name: how to read `source` (`load_corpus`; `hub_name`: a
            dataset's name, such as --dataset_name, even where a folder of that name exists).
        streaming: read as training goes; each process gets its own endless stream of training documents (its own
            files for plain text, its share of the shards otherwise), pass after pass.
        held_out_percentage: the documents held out for evaluation, in percent; a stream has no length, so it holds
            out its first `held_out_percentage * 20` documents instead, and skips them in training.
        seed: the held-out sample's seed, and the file order of each pass over a text-file stream.
        process_index, num_processes: this process among those sharing a stream.
        name: the argument that named the corpus, for error lines.

    Returns:
        A `CorpusSplits`. A corpus too small to hold out from, or a process's stream without a document of two
        sentences, stops with one line (InputError).
    """
    if streaming and source is not None and not hub_name and is_plain_text(source):
        return _text_file_stream_splits(source, layout, held_out_percentage, seed, process_index, num_processes)
    if streaming and source is None:
        logger.warning("--streaming: the embedded corpus is not streamed (it is small)")
    documents = load_corpus(
        source,
        layout=layout,
        text_column=text_column,
        config_name=config_name,
        streaming=streaming,
        split=split,
        hub_name=hub_name,
    )  # None: the embedded corpus
    train, held_out = hold_out_documents(documents, held_out_percentage, seed, name)
    if not streaming or source is None:
        return CorpusSplits(train, held_out, train)
    from datasets.distributed import split_dataset_by_node

    shards = train.n_shards
    own = split_dataset_by_node(train, process_index, num_processes)
    check_two_sentences(own, layout, f"{name}: process {process_index}'s share")
    if num_processes == 1:
        shares = f"{shards} shard(s)"
    elif shards % num_processes == 0:
        shares = f"each of the {num_processes} processes reads its own {shards // num_processes} of {shards} shards"
    else:  # datasets' split_dataset_by_node
        shares = (
            f"each of the {num_processes} processes reads all {shards} shard(s) and keeps every "
            f"{num_processes}th document (a number of shards, i.e. files, divisible by {num_processes} "
            "lets each read its own)"
        )
    return CorpusSplits(own.repeat(None), held_out, train, stream_shares=shares)


def hold_out_documents(documents, percentage: float, seed: int, name: str = "the corpus"):
    """(training documents, held-out documents or None): whole documents held out, so that no evaluation sentence
    was seen in training; a stream (no length) holds out its first `percentage * 20` documents."""
    import datasets

    if percentage == 0:
        return documents, None
    if isinstance(documents, datasets.IterableDataset):
        count = streamed_held_out_count(percentage)
        texts = [row["text"] for row in documents.take(count + 1)]
        if len(texts) <= count:
            raise InputError(too_few_to_hold_out(count, len(texts)))
        held_out = {text_digest(text) for text in texts[:count]}
        # Dropped wherever they come: whichever process's shard holds them (datasets' skip would instead divide the
        # skipped count among the shards, and the others would train on held-out documents).
        train = documents.filter(lambda row: text_digest(row["text"]) not in held_out)
        return train, datasets.Dataset.from_dict({"text": texts[:count]})
    if len(documents) < 2:
        raise InputError(
            f"{name}: {len(documents)} document(s); evaluation needs at least 2 "
            "(or pass --validation_split_percentage 0)"
        )
    split = documents.train_test_split(test_size=percentage / 100, seed=seed)
    return split["train"], split["test"]


def _text_file_stream_splits(
    source, layout: str, held_out_percentage: float, seed: int, process_index: int, num_processes: int
) -> CorpusSplits:
    """Plain-text files streamed: every process streams files of its own (files[process::processes]), endlessly,
    pass after pass in a reshuffled file order. The first documents of the corpus (in file order) are held out, and
    skipped by the training streams."""
    import datasets

    files = find_text_files(source)
    if len(files) < num_processes:
        raise InputError(
            f"--streaming: --train_files has {len(files)} text file(s) for {num_processes} "
            "processes, and each process streams files of its own: split the corpus into at least "
            f"{num_processes} files, or drop --streaming"
        )
    held_out_documents, held_out = None, {}
    if held_out_percentage:
        count = streamed_held_out_count(held_out_percentage)
        texts, held_out, more = first_documents(files, layout, count)
        if not more:
            raise InputError(too_few_to_hold_out(count, len(texts)))
        held_out_documents = datasets.Dataset.from_dict({"text": texts})
    fingerprint = hashlib.sha256(json.dumps([files_fingerprint(files, layout), held_out]).encode()).hexdigest()
    own = files[process_index::num_processes]
    check_two_sentences(
        text_file_stream(own, layout, held_out=held_out, endless=False),
        layout,
        f"--train_files: the files of process {process_index} ({first_few(list(map(str, own)))})",
    )
    shares = (
        f"{len(files)} files"
        if num_processes == 1
        else f"each of the {num_processes} processes reads its own files, this one {len(own)} of {len(files)}"
    )
    return CorpusSplits(
        text_file_stream(own, layout, seed=seed, held_out=held_out),
        held_out_documents,
        text_file_stream(files, layout, held_out=held_out, endless=False),
        fingerprint,
        f"{shares}, each pass in a new file order",
    )


def check_two_sentences(documents, layout: str, where: str) -> None:
    """Stop with one line when a process's stream holds no document of two sentences or more, read once through:
    its endless stream would otherwise read pass after pass and never give a pair, and the run would hang. A normal
    corpus answers at its first documents."""
    for row in documents:
        if len(split_sentences(row["text"] or "", sentence_per_line=layout == "sentence_per_line")) >= 2:
            return
    raise InputError(
        f"{where} holds no document of two sentences or more (the held-out ones left out), so it "
        "gives no sentence pair to train on"
    )


def streamed_held_out_count(percentage: float) -> int:
    """How many documents a stream holds out for evaluation (its first ones): a stream has no length, so
    --validation_split_percentage x 20."""
    return max(1, int(percentage * 20))


def too_few_to_hold_out(count: int, found: int) -> str:
    return (
        f"--streaming holds out the corpus's first {count} documents for evaluation "
        f"(--validation_split_percentage x 20), and the corpus has only {found}: pass a smaller "
        "--validation_split_percentage, or 0"
    )


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
