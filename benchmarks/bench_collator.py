"""Collator throughput at sequence length 512: DataCollatorForAlbertPretraining against transformers'
DataCollatorForLanguageModeling (plain 15% token masking) on the very same batches.

    python benchmarks/bench_collator.py [--batch_size 32] [--num_batches 64] [--repeats 3] [--train_files books/]

Pairs come from `--train_files` (text files or folders of them, one document per file, e.g. Project Gutenberg
plain-text books), else from the embedded stdlib-docstring corpus with each module's docstrings joined into one
long document (so that pairs reach 512 tokens). Timing is the best of `--repeats` passes over the same list of
python-list features, which is what a DataLoader hands a collator.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import datasets
from transformers import DataCollatorForLanguageModeling

from albert_hf import DataCollatorForAlbertPretraining
from albert_hf.pretraining.data.corpus import load_text_files
from albert_hf.pretraining.data.embedded_corpus import embedded_corpus
from albert_hf.pretraining.data.pairs import create_pretraining_pairs
from albert_hf.pretraining.data.sentences import tokenize_documents
from albert_hf.tokenization import train_tokenizer


def long_documents(train_files=None):
    if train_files:
        for path in train_files:
            if not Path(path).exists():
                raise SystemExit(f"error: --train_files: {path} does not exist")
        return load_text_files(train_files), f"documents in {', '.join(train_files)}"
    modules = {}
    for row in embedded_corpus():
        modules.setdefault(row["source"].split(":")[0], []).append(row["text"])
    texts = ["\n\n".join(docs) for docs in modules.values()]
    return datasets.Dataset.from_dict({"text": texts}), "embedded corpus, one document per stdlib module"


def throughput(collator, batches, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            collator(batch)
        best = min(best, time.perf_counter() - start)
    return sum(len(b) for b in batches) / best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_batches", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab_size", type=int, default=5000)
    parser.add_argument(
        "--train_files",
        nargs="+",
        default=None,
        help="text files or folders of them, one long document per file, e.g. books (default: the embedded corpus)",
    )
    args = parser.parse_args()
    datasets.disable_progress_bars()

    tokenizer = train_tokenizer(embedded_corpus(), vocab_size=args.vocab_size)
    corpus, source = long_documents(args.train_files)
    pairs = create_pretraining_pairs(
        tokenize_documents(corpus, tokenizer), tokenizer, max_seq_length=512, short_seq_prob=0.0, dupe_factor=4
    )
    full = pairs.filter(lambda ids: len(ids) == 512, input_columns="input_ids")
    needed = args.batch_size * min(args.num_batches, len(full) // args.batch_size)
    if needed == 0:
        raise SystemExit(f"Only {len(full)} pairs of length 512 from {source}; lower --batch_size")
    features = full.select(range(needed)).to_list()
    batches = [features[i : i + args.batch_size] for i in range(0, needed, args.batch_size)]

    ours = DataCollatorForAlbertPretraining(tokenizer=tokenizer, seed=0)
    ours_epoch = DataCollatorForAlbertPretraining(tokenizer=tokenizer, seed=0)
    ours_epoch.set_epoch(0)
    ours_static = DataCollatorForAlbertPretraining(tokenizer=tokenizer, seed=0, static_masking=True)
    theirs = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.15, pad_to_multiple_of=8, seed=0)
    for collator in (ours, ours_epoch, ours_static, theirs):  # warm-up: lazy generators, first-call imports
        collator(batches[0])

    ours_rate = throughput(ours, batches, args.repeats)
    theirs_rate = throughput(theirs, batches, args.repeats)
    epoch_rate = throughput(ours_epoch, batches, args.repeats)
    static_rate = throughput(ours_static, batches[: max(1, len(batches) // 8)], 1)
    print(f"data: {len(features)} pairs of 512 tokens from {source}, batch size {args.batch_size}")
    print(f"DataCollatorForLanguageModeling (token masking):       {theirs_rate:9.0f} sequences/s")
    print(f"DataCollatorForAlbertPretraining (n-gram + SOP):        {ours_rate:9.0f} sequences/s")
    print(f"  same, masks keyed per example after set_epoch():      {epoch_rate:9.0f} sequences/s")
    print(f"  static_masking=True (the official per-example loop):  {static_rate:9.0f} sequences/s")
    print(
        f"ratio (ours / DataCollatorForLanguageModeling): {ours_rate / theirs_rate:.2f}x "
        f"(per-example keyed: {epoch_rate / theirs_rate:.2f}x)"
    )


if __name__ == "__main__":
    main()
