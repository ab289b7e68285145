"""Stage 1 of the pairs (pairs.py): documents -> sentences -> token ids, as a cached `datasets.map` whose rows hold a
document's sentences as lists of ids (`tokenize_documents`). Sentences are encoded by the tokenizer's SentencePiece
model where it gives the same ids, else by its fast backend (`sentence_encoder`)."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ...tokenization import split_sentences
from .spm_encoder import SentencePieceEncoder

logger = logging.getLogger(__name__)


def list_column(arrays: list[np.ndarray], dtype) -> pa.ListArray:
    """An Arrow list column from numpy arrays, one row each.

    The maps below return Arrow tables, which `datasets` writes as they come: as Python lists of ints (about 36
    bytes a token, and held until 1000 rows are written) a batch of books took gigabytes.
    """
    offsets = np.zeros(len(arrays) + 1, np.int32)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def as_output(table: pa.Table, arrow: bool):
    # A streaming map (IterableDataset) takes dicts of lists only; its batches live one at a time anyway.
    return table if arrow else table.to_pydict()


def _tokenize_batch(batch, encoder, text_column, sentence_per_line, arrow=True):
    input_ids, offsets = [], []
    for text in batch[text_column]:
        # One document at a time: a book's Encoding objects (ids, token strings, offsets) take about 100 bytes a
        # token until they are turned into ids.
        sentences = split_sentences(text or "", sentence_per_line=sentence_per_line)
        ids = [np.asarray(sentence, np.int32) for sentence in encoder.encode(sentences)]
        ids = [sentence for sentence in ids if len(sentence)]  # the official reader drops lines tokenizing to nothing
        input_ids.append(np.concatenate(ids) if ids else np.zeros(0, np.int32))
        offsets.append(np.concatenate([[0], np.cumsum([len(sentence) for sentence in ids])]))
    return as_output(
        pa.table({"input_ids": list_column(input_ids, np.int32), "sentence_offsets": list_column(offsets, np.int32)}),
        arrow,
    )


class BackendEncoder:
    """Sentences -> token ids with the tokenizer's Rust backend directly: no per-call special tokens, no "longer
    than model_max_length" warnings."""

    def __init__(self, backend):
        self.backend = backend

    def encode(self, sentences: list[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.backend.encode_batch_fast(sentences, add_special_tokens=False)]


def sentence_encoder(tokenizer):
    """SentencePiece's own encoder when it gives the tokenizer's ids (`spm_encoder.SentencePieceEncoder`, about 4
    times faster), else the tokenizer's backend."""
    backend = plain_backend(tokenizer)
    fast = SentencePieceEncoder.for_tokenizer(tokenizer, backend)
    logger.info(
        "Tokenizing with %s",
        "SentencePiece's encoder (the tokenizer's ids, faster)"
        if fast
        else "the tokenizer's backend (no spiece.model matching it for the faster SentencePiece encoder)",
    )
    return fast or BackendEncoder(backend)


def plain_backend(tokenizer):
    """A copy of the tokenizer's Rust backend with padding and truncation off: a fast tokenizer keeps whatever an
    earlier `tokenizer(..., padding=True, truncation=True)` call switched on, which would pad every sentence."""
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    return backend


def tokenize_documents(
    corpus,
    tokenizer,
    *,
    text_column: str = "text",
    sentence_per_line: bool = False,
    num_proc: int | None = None,
    batch_size: int = 32,
):
    """Split every document into sentences and tokenize them (a batched, cached `datasets.map`).

    Returns one row per input document: "input_ids" (all its tokens, int32) and "sentence_offsets" (n + 1
    cumulative sentence ends starting at 0, so sentence k is input_ids[offsets[k]:offsets[k + 1]]).
    Empty documents are kept as rows with no sentences, so that they can be counted, then skipped, later.
    """
    import datasets

    if corpus.column_names is None and hasattr(corpus, "_resolve_features"):
        corpus = corpus._resolve_features()  # a streaming dataset of unknown columns: peek at its first row
    columns = corpus.column_names
    if columns is not None and text_column not in columns:
        raise InputError(f"The corpus has no text column {text_column!r}; its columns are {columns}")
    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int32")),
            "sentence_offsets": datasets.List(datasets.Value("int32")),
        }
    )
    kwargs = dict(
        batched=True,
        batch_size=batch_size,
        remove_columns=columns,
        features=features,
        fn_kwargs=dict(
            encoder=sentence_encoder(tokenizer),
            text_column=text_column,
            sentence_per_line=sentence_per_line,
            arrow=isinstance(corpus, datasets.Dataset),
        ),
    )
    if isinstance(corpus, datasets.Dataset):
        kwargs.update(num_proc=num_proc, desc="Splitting and tokenizing documents")
    return corpus.map(_tokenize_batch, **kwargs)
