"""Shared, cached inputs for the data tests (plain functions, cached per session: pytest fixtures imported
into several modules would be built once per module)."""

from __future__ import annotations

import functools

TEST_VOCAB_SIZE = 1000


@functools.lru_cache(maxsize=None)
def embedded():
    from albert_hf.pretraining.embedded_corpus import embedded_corpus

    return embedded_corpus()


@functools.lru_cache(maxsize=None)
def tokenizer():
    """A 1000-piece ALBERT tokenizer trained on the embedded corpus (cached on disk too)."""
    from albert_hf.tokenization import train_tokenizer

    return train_tokenizer(embedded(), vocab_size=TEST_VOCAB_SIZE)


@functools.lru_cache(maxsize=None)
def tokenized_embedded():
    from albert_hf.pretraining.sentences import tokenize_documents

    return tokenize_documents(embedded(), tokenizer())


@functools.lru_cache(maxsize=None)
def embedded_pairs(max_seq_length: int = 128, dupe_factor: int = 1, task: str = "sop"):
    from albert_hf.pretraining.pairs import create_pretraining_pairs

    return create_pretraining_pairs(
        tokenized_embedded(), tokenizer(), max_seq_length=max_seq_length, dupe_factor=dupe_factor, task=task
    )


@functools.lru_cache(maxsize=None)
def embedded_pair_features(max_seq_length: int = 128, count: int = 4000):
    """`count` real pair features (python lists, as a DataLoader hands them to a collator)."""
    pairs = embedded_pairs(max_seq_length=max_seq_length, dupe_factor=1)
    return tuple(pairs.select(range(min(count, len(pairs)))).to_list())
