"""Sentence-pair instances for ALBERT pretraining (SOP, or NSP for the ablation) as cached `datasets.map`s, from the
documents' token ids (stage 1: sentences.py).

A port of `create_instances_from_document` in the official `create_pretraining_data.py` (google-research/albert).
Per document and per pass (`dupe_factor` passes):
  1. target length = max_seq_length - 3, or with probability `short_seq_prob` a uniform randint(2, that);
  2. sentences are gathered into a chunk until the target is reached or the document ends;
  3. A = the first randint(1, len(chunk) - 1) sentences of the chunk, B = the rest;
     SOP: swap A and B with probability 0.5 (label 1 = swapped);
     NSP (`task="nsp"`): with probability 0.5, B comes from a random other document instead (label 1), and the
     chunk's unused sentences are "put back" for the next chunk;
  4. the pair is cut to max_seq_length - 3 by removing one token at a time from the longer side (B on a tie),
     from its front or back with probability 0.5 each;
  5. [CLS] A [SEP] B [SEP], token types 0 up to the first [SEP] included, 1 after.

The one-chunk quirk: a chunk of a single sentence cannot be split, and the official code then takes B from a
random other document and labels the pair 1 *in SOP mode too*, so SOP data holds a few NSP-style negatives.
`one_chunk="random_next"` (default) keeps that; `one_chunk="skip"` drops such chunks for a pure SOP signal.

Deviations, each on purpose:
- Documents with fewer than `min_sentences` (default 2) sentences are skipped and counted: a one-sentence
  document can only make a random-next pair, never an order pair. `min_sentences=1` is the official corpus.
- Randomness is seeded per document (`random.Random` keyed by seed and row index) instead of one stream over
  the corpus, so the output does not depend on `num_proc`, batch size or the order workers finish.
- Masking is not done here: `DataCollatorForAlbertPretraining` masks per batch (or statically, per example).
- The official code shuffles documents first and instances last; here the final `Dataset.shuffle(seed)` does
  both jobs (the random document is drawn uniformly, so document order does not change the distribution). A
  stream mixes the pairs of each map batch of documents instead (64 by default), seeded, so that a resumed
  stream continues exactly.
- Random documents (NSP and one-chunk B) are drawn from the whole corpus for a map-style `Dataset` (read
  zero-copy from its Arrow table), and from the documents of the same map batch for a streaming
  `IterableDataset`, which has no random access.
"""

from __future__ import annotations

import bisect
import logging
import random

import numpy as np
import pyarrow as pa

from ...errors import InputError
from .sentences import as_output, list_column, tokenize_documents

logger = logging.getLogger(__name__)

OFFICIAL_DUPE_FACTOR = 40
TASKS = ("sop", "nsp")


class NoPairsError(InputError):
    """The documents are empty or too short to give a single sentence pair (as opposed to bad arguments)."""


ONE_CHUNK_POLICIES = ("random_next", "skip")
STREAM_BATCH = 64  # documents per pair-building batch of a stream: its random-document pool and mixing window
PAIRS_VERSION = 1  # bump when the output of the pair builder changes, to invalidate cached maps


# ----------------------------------------------------------------------------------------------------------------
# Where "a random other document" comes from


class ArrowDocuments:
    """Random access to the tokenized documents of a map-style dataset, zero-copy from its Arrow table.

    Only the documents with at least `min_sentences` sentences take part (`rows` are their row indices).
    """

    def __init__(self, table, rows: np.ndarray):
        self.table = table  # a datasets Table: memory-mapped tables pickle as a file path, cheap for num_proc
        self.rows = rows
        self._chunks = None

    def __len__(self) -> int:
        return len(self.rows)

    def __getstate__(self):
        return {"table": self.table, "rows": self.rows, "_chunks": None}

    def _locate(self, row: int):
        if self._chunks is None:
            ids, offsets = self.table.column("input_ids"), self.table.column("sentence_offsets")
            starts = np.cumsum([0] + [len(c) for c in ids.chunks])
            self._chunks = (ids.chunks, offsets.chunks, starts)
        ids, offsets, starts = self._chunks
        c = bisect.bisect_right(starts, row) - 1
        return ids[c], offsets[c], row - starts[c]

    def row(self, k: int) -> int:
        return int(self.rows[k])

    def document(self, k: int):
        """(token ids, sentence offsets) of the k-th participating document, as numpy views."""
        ids, offsets, i = self._locate(int(self.rows[k]))
        return ids[i].values.to_numpy(), offsets[i].values.to_numpy()


class BatchDocuments:
    """The documents of one map batch: the random-document source for streaming datasets."""

    def __init__(self, documents: list, rows: list):
        self.documents, self.rows = documents, rows

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, k: int) -> int:
        return self.rows[k]

    def document(self, k: int):
        return self.documents[k]


# ----------------------------------------------------------------------------------------------------------------
# Stage 2: the official per-document algorithm


def truncate_pair(a: list, b: list, max_num_tokens: int, rng: random.Random) -> None:
    """Official truncate_seq_pair on [array, start, end] spans: drop one token at a time from the longer side
    (B on a tie), from the front or the back with probability 0.5 each."""
    while (a[2] - a[1]) + (b[2] - b[1]) > max_num_tokens:
        side = a if a[2] - a[1] > b[2] - b[1] else b
        if rng.random() < 0.5:
            side[1] += 1
        else:
            side[2] -= 1


def instances_from_document(
    row: int,
    tokens: np.ndarray,
    offsets: np.ndarray,
    documents,
    rng: random.Random,
    *,
    max_seq_length: int = 512,
    short_seq_prob: float = 0.1,
    random_next_sentence: bool = False,
    one_chunk: str = "random_next",
):
    """One pass of the official `create_instances_from_document` over one document, kept line for line beside it.

    Yields (a, b, is_random_next) with a and b as [token array, start, end] spans after truncation. `documents`
    (ArrowDocuments or BatchDocuments) is the pool that random B segments come from; `row` is this document's
    row in it, so it is never its own random document (unless 10 draws in a row hit it, as officially).
    """
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    num_sentences = len(offsets) - 1
    chunk_start, current_length, i = 0, 0, 0
    while i < num_sentences:
        current_length += int(offsets[i + 1] - offsets[i])
        if i == num_sentences - 1 or current_length >= target_seq_length:
            chunk_len = i + 1 - chunk_start
            if chunk_len == 1 and one_chunk == "skip":
                chunk_start, current_length, i = i + 1, 0, i + 1
                continue
            a_end = rng.randint(1, chunk_len - 1) if chunk_len >= 2 else 1
            a = [tokens, int(offsets[chunk_start]), int(offsets[chunk_start + a_end])]
            b = [tokens, int(offsets[chunk_start + a_end]), int(offsets[i + 1])]
            if chunk_len == 1 or (random_next_sentence and rng.random() < 0.5):
                is_random_next = True
                target_b_length = target_seq_length - (a[2] - a[1])
                for _ in range(10):
                    k = rng.randint(0, len(documents) - 1)
                    if documents.row(k) != row:
                        break
                other_tokens, other_offsets = documents.document(k)
                start = rng.randint(0, len(other_offsets) - 2)
                end = start
                while end < len(other_offsets) - 1:
                    end += 1
                    if other_offsets[end] - other_offsets[start] >= target_b_length:
                        break
                b = [other_tokens, int(other_offsets[start]), int(other_offsets[end])]
                # The chunk's sentences after A were not used: put them back for the next chunk.
                i -= chunk_len - a_end
            elif not random_next_sentence and rng.random() < 0.5:
                is_random_next = True  # SOP: "random next" means swapped
                a, b = b, a
            else:
                is_random_next = False
            truncate_pair(a, b, max_num_tokens, rng)
            yield a, b, is_random_next
            chunk_start, current_length = i + 1, 0
        i += 1


def _pairs_batch(
    batch, indices, documents, cls_id, sep_id, seed, dupe_factor, min_sentences, options, arrow=True, mix=False
):
    input_ids, token_type_ids, labels = [], [], []
    cls, sep = np.array([cls_id], np.int32), np.array([sep_id], np.int32)
    streaming = documents is None
    if streaming:  # random documents come from this batch
        docs = [
            (np.asarray(t, np.int32), np.asarray(o, np.int32))
            for t, o in zip(batch["input_ids"], batch["sentence_offsets"])
        ]
        keep = [k for k, (_, o) in enumerate(docs) if len(o) - 1 >= min_sentences]
        documents = BatchDocuments([docs[k] for k in keep], [indices[k] for k in keep])
    for k, row in enumerate(indices):
        if streaming:
            tokens, offsets = docs[k]
        else:
            tokens, offsets = np.asarray(batch["input_ids"][k], np.int32), np.asarray(batch["sentence_offsets"][k])
        if len(offsets) - 1 < min_sentences or len(documents) == 0:
            continue
        rng = random.Random(f"albert_hf-pairs:{seed}:{row}")
        for _ in range(dupe_factor):
            for a, b, is_random_next in instances_from_document(row, tokens, offsets, documents, rng, **options):
                seq_a, seq_b = a[0][a[1] : a[2]], b[0][b[1] : b[2]]
                input_ids.append(np.concatenate([cls, seq_a, sep, seq_b, sep]))
                segments = np.zeros(len(seq_a) + len(seq_b) + 3, np.int8)
                segments[len(seq_a) + 2 :] = 1
                token_type_ids.append(segments)
                labels.append(int(is_random_next))
    if mix:
        # A stream has no global shuffle: the pairs of the batch's documents are mixed here, in an order seeded by
        # the batch's first row, so a resumed stream yields the same order (a shuffle buffer would be lost).
        order = np.random.default_rng([seed, indices[0] if indices else 0]).permutation(len(labels))
        input_ids, token_type_ids = [input_ids[i] for i in order], [token_type_ids[i] for i in order]
        labels = [labels[i] for i in order]
    return as_output(
        pa.table(
            {
                "input_ids": list_column(input_ids, np.int32),
                "token_type_ids": list_column(token_type_ids, np.int8),
                "sentence_order_label": pa.array(labels, pa.int8()),
            }
        ),
        arrow,
    )


def _check_pair_options(
    tokenized, tokenizer, max_seq_length: int, dupe_factor: int, min_sentences: int, task: str, one_chunk: str
) -> None:
    """`create_pretraining_pairs`' arguments: what the user set stops with one line, a caller's mistake with
    ValueError."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if one_chunk not in ONE_CHUNK_POLICIES:
        raise ValueError(f"one_chunk must be one of {ONE_CHUNK_POLICIES}, got {one_chunk!r}")
    limit = getattr(tokenizer, "model_max_length", None)
    if limit is not None and limit < 10**9 and max_seq_length > limit:
        raise InputError(
            f"max_seq_length={max_seq_length} exceeds the tokenizer's model_max_length={limit} "
            "(ALBERT has 512 position embeddings)"
        )
    if max_seq_length < 5:
        raise InputError(f"max_seq_length={max_seq_length} leaves no room for [CLS] A [SEP] B [SEP]")
    if dupe_factor < 1 or min_sentences < 1:
        raise InputError("dupe_factor and min_sentences must be at least 1")
    missing = {"input_ids", "sentence_offsets"} - set(tokenized.column_names or ())
    if missing:
        raise ValueError(f"Expected the output of tokenize_documents; missing columns {sorted(missing)}")


def _usable_documents(tokenized, min_sentences: int, draws_random_next: bool) -> np.ndarray:
    """The rows of the documents with at least `min_sentences` sentences, counted from the offsets' list lengths
    alone (no token is read), and the skipped ones logged; none stops the run."""
    chunks = tokenized.data.column("sentence_offsets").chunks
    num_sentences = np.concatenate([c.value_lengths().to_numpy(zero_copy_only=False) for c in chunks] or [[]]) - 1
    rows = np.flatnonzero(num_sentences >= min_sentences)
    logger.info(
        "Pair building: %d documents, %d used; skipped %d empty and %d with fewer than %d sentences "
        "(too short to make a pair)",
        len(num_sentences),
        len(rows),
        int((num_sentences <= 0).sum()),
        int(((num_sentences > 0) & (num_sentences < min_sentences)).sum()),
        min_sentences,
    )
    if len(rows) == 0:
        raise NoPairsError(f"No document has {min_sentences} or more sentences; cannot build sentence pairs")
    if len(rows) == 1 and draws_random_next:  # otherwise no random B is ever drawn
        logger.warning("Only one usable document: random-next segments will come from the same document")
    return rows


def _dataset_pairs(
    tokenized,
    fn_kwargs: dict,
    features,
    task: str,
    one_chunk: str,
    batch_size: int | None,
    num_proc: int | None,
    shuffle: bool,
):
    """`create_pretraining_pairs` for a `datasets.Dataset`: the usable documents' pairs by a cached, batched map
    (any `num_proc`), then shuffled."""
    from datasets.fingerprint import Hasher

    if tokenized._indices is not None:
        tokenized = tokenized.flatten_indices()  # row numbers must be Arrow rows for random access
    rows = _usable_documents(
        tokenized, fn_kwargs["min_sentences"], draws_random_next=task == "nsp" or one_chunk == "random_next"
    )

    fingerprint = Hasher.hash([tokenized._fingerprint, PAIRS_VERSION, fn_kwargs, fn_kwargs["cls_id"]])
    pairs = tokenized.map(
        _pairs_batch,
        with_indices=True,
        batched=True,
        batch_size=batch_size or 16,
        remove_columns=tokenized.column_names,
        features=features,
        fn_kwargs={**fn_kwargs, "documents": ArrowDocuments(tokenized.data, rows)},
        num_proc=num_proc,
        new_fingerprint=fingerprint,
        desc=f"Building {task.upper()} pairs",
    )
    labels = np.asarray(pairs.data.column("sentence_order_label").combine_chunks())
    logger.info(
        "Built %d %s pairs (dupe_factor=%d), %.1f%% with label 1",
        len(pairs),
        task.upper(),
        fn_kwargs["dupe_factor"],
        100 * labels.mean() if len(labels) else 0.0,
    )
    return pairs.shuffle(seed=fn_kwargs["seed"]) if shuffle else pairs


def create_pretraining_pairs(
    tokenized,
    tokenizer,
    *,
    max_seq_length: int = 512,
    short_seq_prob: float = 0.1,
    dupe_factor: int = OFFICIAL_DUPE_FACTOR,
    task: str = "sop",
    one_chunk: str = "random_next",
    min_sentences: int = 2,
    seed: int = 12345,
    num_proc: int | None = None,
    batch_size: int | None = None,
    shuffle: bool = True,
):
    """Build [CLS] A [SEP] B [SEP] instances from `tokenize_documents` output (a batched, cached `datasets.map`).

    Deterministic for a given seed: a `Dataset`'s pairs whatever `num_proc` and `batch_size`; a stream's for a
    given `batch_size` too, since its random other documents and its mixing come from each batch.

    `batch_size` (documents per map batch) defaults to 16 for a `Dataset`: a batch of books gives hundreds of
    thousands of pairs. A stream draws its random other documents from its batch and mixes its pairs, so its
    default is 64: larger would mix more, but a stream's first pairs wait for a whole batch to be tokenized (64
    books are about 20 MB of text).

    Args:
        tokenized: the output of `tokenize_documents`, a `datasets.Dataset` or a streamed `IterableDataset`.
        tokenizer: gives the [CLS] and [SEP] ids, and `model_max_length`, the cap on `max_seq_length`.
        max_seq_length (`int`, defaults to 512): a pair's length with [CLS] and both [SEP], at least 5.
        short_seq_prob (`float`, defaults to 0.1): the probability of a shorter target length,
            randint(2, max_seq_length - 3).
        dupe_factor (`int`, defaults to 40, the official value): passes over each document, each drawing anew.
        task (`str`, defaults to `"sop"`): `"sop"` (B after A or swapped) or `"nsp"` (B next or from another
            document).
        one_chunk (`str`, defaults to `"random_next"`): a one-sentence chunk becomes a random-document pair labelled
            1, as officially (`"random_next"`), or is dropped (`"skip"`).
        min_sentences (`int`, defaults to 2): documents with fewer sentences are skipped.
        seed (`int`, defaults to 12345): seeds every document's draws and the shuffle.
        num_proc (`int`, *optional*): processes of the map, for a `Dataset`.
        batch_size (`int`, *optional*): documents per map batch (see above); None: 16, or 64 for a stream.
        shuffle (`bool`, defaults to `True`): shuffle a `Dataset`'s pairs with `seed`, or mix a stream's pairs
            within each batch of documents.

    Returns:
        A `Dataset` (an `IterableDataset` for a stream) with "input_ids" (int32), "token_type_ids" (int8) and
        "sentence_order_label" (int8: 0 = in order; 1 = swapped for SOP, random B for NSP and one-chunk pairs).

    Raises:
        InputError: `max_seq_length` above the tokenizer's `model_max_length` or below 5, `dupe_factor` or
            `min_sentences` below 1; `NoPairsError` when no document of a `Dataset` has `min_sentences` sentences.
        ValueError: an unknown `task` or `one_chunk`, or `tokenized` without "input_ids" and "sentence_offsets".
    """
    import datasets

    _check_pair_options(tokenized, tokenizer, max_seq_length, dupe_factor, min_sentences, task, one_chunk)

    options = dict(
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        random_next_sentence=task == "nsp",
        one_chunk=one_chunk,
    )
    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int32")),
            "token_type_ids": datasets.List(datasets.Value("int8")),
            "sentence_order_label": datasets.Value("int8"),
        }
    )
    fn_kwargs = dict(
        cls_id=tokenizer.cls_token_id,
        sep_id=tokenizer.sep_token_id,
        seed=seed,
        dupe_factor=dupe_factor,
        min_sentences=min_sentences,
        options=options,
    )

    if not isinstance(tokenized, datasets.Dataset):  # streaming: no random access, no counts, no cache
        # Each batch's pairs come out mixed (see _pairs_batch), and nothing else is shuffled: what the stream
        # yields then depends on its position only, which `state_dict()` restores exactly.
        return tokenized.map(
            _pairs_batch,
            with_indices=True,
            batched=True,
            batch_size=batch_size or STREAM_BATCH,
            remove_columns=tokenized.column_names,
            features=features,
            fn_kwargs={**fn_kwargs, "documents": None, "arrow": False, "mix": shuffle},
        )

    return _dataset_pairs(tokenized, fn_kwargs, features, task, one_chunk, batch_size, num_proc, shuffle)


def build_pretraining_dataset(
    corpus, tokenizer, *, text_column="text", sentence_per_line=False, num_proc=None, **pair_kwargs
):
    """Corpus -> tokenized documents -> shuffled sentence pairs, both steps cached `datasets.map`s."""
    tokenized = tokenize_documents(
        corpus, tokenizer, text_column=text_column, sentence_per_line=sentence_per_line, num_proc=num_proc
    )
    return create_pretraining_pairs(tokenized, tokenizer, num_proc=num_proc, **pair_kwargs)


__all__ = [
    "OFFICIAL_DUPE_FACTOR",
    "tokenize_documents",
    "instances_from_document",
    "truncate_pair",
    "create_pretraining_pairs",
    "build_pretraining_dataset",
    "ArrowDocuments",
    "BatchDocuments",
]
