"""The input pipeline alone, at the shapes bench_gpu.py times: does it feed the GPU fast enough?

    python benchmarks/bench_input.py [--train_files books/] [--workers 2] [--gpu_json bench_gpu.json]

For each shape BATCHxSEQ, pairs are built at SEQ as run_pretraining.py builds them, then read through the
DataLoader run_pretraining.py uses on a GPU: DataCollatorForAlbertPretraining with dynamic n-gram masks keyed per
example (`set_epoch`), static shapes and the fixed-size masked positions, `--workers` worker processes (2, the
CUDA default) and pinned memory where CUDA is available. Timed: `--batches` batches after the first one (worker
start-up left out). Tokens/s counts token slots (batch x seq), as a GPU step consumes them. With `--gpu_json`
(bench_gpu.py's output) each shape gets the ratio loader / albert_hf's training step; issue 47's bar is 2.
Writes one JSON file (`--out`) and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader, RandomSampler

from albert_hf import DataCollatorForAlbertPretraining  # noqa: E402
from albert_hf.pretraining.data.embedded_corpus import embedded_corpus  # noqa: E402
from albert_hf.pretraining.data.pairs import create_pretraining_pairs  # noqa: E402
from albert_hf.pretraining.data.sentences import tokenize_documents  # noqa: E402
from albert_hf.tokenization import train_tokenizer  # noqa: E402
from bench_collator import long_documents  # noqa: E402
from bench_gpu import DEFAULT_SHAPES, Shape  # noqa: E402

MAX_PREDICTIONS = 20  # run_pretraining.py's --max_predictions_per_seq default (the official value)


def loader_rate(pairs, tokenizer, batch: int, seq: int, workers: int, batches: int) -> float:
    """Token slots a second that run_pretraining.py's GPU DataLoader delivers, after its first batch."""
    collate = DataCollatorForAlbertPretraining(
        tokenizer=tokenizer,
        seed=0,
        max_predictions_per_seq=MAX_PREDICTIONS,
        masked_positions=True,
        static_shapes=True,
        max_length=seq,
    )
    collate.set_epoch(0)
    # sampled with replacement: a small corpus still fills every batch
    sampler = RandomSampler(pairs, replacement=True, num_samples=batch * (batches + 1))
    loader = DataLoader(
        pairs,
        batch_size=batch,
        sampler=sampler,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        persistent_workers=False,
    )
    batches_seen, start = 0, None
    for made in loader:
        assert made["input_ids"].shape == (batch, seq)
        if start is None:
            start = time.perf_counter()  # after the first batch: worker start-up is not the steady rate
        else:
            batches_seen += 1
    return batches_seen * batch * seq / (time.perf_counter() - start)


def gpu_rates(path: str | None) -> dict[tuple[str, int, int], float]:
    """albert_hf's training tokens/s per (preset, batch, seq) from bench_gpu.py's JSON."""
    if not path:
        return {}
    report = json.loads(Path(path).read_text())
    return {
        (row["preset"], row["batch"], row["seq"]): row["albert_hf"]["tokens_per_s"]
        for row in report["shapes"]
        if "albert_hf" in row and "tokens_per_s" in row["albert_hf"]
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=DEFAULT_SHAPES,
        help="as bench_gpu.py's; PRESET:auto:SEQ takes its batch from --gpu_json (else 64)",
    )
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (run_pretraining's CUDA default)")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--vocab_size", type=int, default=5000)
    parser.add_argument(
        "--train_files", nargs="+", default=None, help="text files or folders of them (default: the embedded corpus)"
    )
    parser.add_argument("--gpu_json", default=None, help="bench_gpu.py's output, for the ratio at each shape")
    parser.add_argument("--out", default="bench_input.json")
    args = parser.parse_args(argv)
    datasets.disable_progress_bars()
    tokenizer = train_tokenizer(embedded_corpus(), vocab_size=args.vocab_size)
    corpus, source = long_documents(args.train_files)
    documents = tokenize_documents(corpus, tokenizer)
    gpu = gpu_rates(args.gpu_json)
    report = {
        "source": source,
        "workers": args.workers,
        "cpu_cores": os.cpu_count(),
        "cuda": torch.cuda.is_available(),
        "shapes": [],
    }
    pairs_by_seq = {}
    for text in args.shapes:
        shape = Shape.parse(text)
        batch = shape.batch or next((b for (p, b, s) in gpu if (p, s) == (shape.preset, shape.seq)), 64)
        if shape.seq not in pairs_by_seq:
            pairs_by_seq[shape.seq] = create_pretraining_pairs(
                documents, tokenizer, max_seq_length=shape.seq, dupe_factor=1
            )
        rate = loader_rate(pairs_by_seq[shape.seq], tokenizer, batch, shape.seq, args.workers, args.batches)
        consumed = gpu.get((shape.preset, batch, shape.seq))
        row = {
            "shape": shape.name(batch),
            "batch": batch,
            "seq": shape.seq,
            "loader_tokens_per_s": rate,
            "gpu_tokens_per_s": consumed,
            "ratio": rate / consumed if consumed else None,
        }
        report["shapes"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\ninput pipeline: {source}; {args.workers} workers on {os.cpu_count()} cores")
    print("| shape | loader tokens/s | albert_hf step tokens/s | loader / step |\n|---|---:|---:|---:|")
    for row in report["shapes"]:
        consumed = f"{row['gpu_tokens_per_s']:,.0f}" if row["gpu_tokens_per_s"] else "-"
        ratio = f"{row['ratio']:.2f}" if row["ratio"] else "-"
        print(f"| {row['shape']} | {row['loader_tokens_per_s']:,.0f} | {consumed} | {ratio} |")


if __name__ == "__main__":
    main()
