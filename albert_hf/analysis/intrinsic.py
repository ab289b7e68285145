"""Intrinsic evaluation, the paper's Table 5: MLM, NSP and SOP accuracy of a pretrained model.

Two evaluation sets are built from held-out documents with the pretraining pipeline itself
(`build_pretraining_dataset`, one pass, fixed seed):
  NSP set: B is the true continuation (label 0) or comes from another document (label 1);
  SOP set: A and B in order (label 0) or swapped (label 1).
Both are built with one_chunk="skip": a one-sentence chunk would otherwise always become a random-document
pair labelled 1, which unbalances the NSP set (a constant answer beats 50%) and puts NSP-style pairs into the
SOP set (which a topic-change detector would get right). So each set's labels are a fair coin.
Both are masked statically (the same masks for every model) and run through the model as in pretraining.
  mlm = accuracy of the masked tokens of both sets (token-weighted);
  nsp / sop = accuracy of the model's 2-way head on the pooled output (class 1 = random next / swapped).
A model pretrained without an inter-sentence loss has an untrained head, so its nsp/sop sit near 50%.

    python -m albert_hf.analysis.intrinsic --model DIR --documents FILE_OR_DIR [...] [--max_examples 2000]
        [--per_document]   # also the SOP accuracy on each document alone (`sop_by_document`)
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path

import torch

from ..errors import InputError, first_line
from ..pretraining.data.pairs import NoPairsError, build_pretraining_dataset
from ..runtime.cli import run_entry_point

logger = logging.getLogger(__name__)

SETS = ("nsp", "sop")


def _as_dataset(documents, text_column="text"):
    import datasets

    if isinstance(documents, datasets.Dataset):
        return documents
    documents = [d for d in documents if d and d.strip()]
    if not documents:
        raise NoPairsError("No non-empty document to build the intrinsic evaluation sets from")
    return datasets.Dataset.from_dict({text_column: documents})


def build_intrinsic_sets(
    documents, tokenizer, *, max_seq_length=128, max_examples=2000, seed=12345, layout="document_per_file", tasks=SETS
) -> dict:
    """{"nsp": pairs, "sop": pairs} (or only the `tasks` asked for), each at most `max_examples` pairs (the
    first of the seeded shuffle).

    `documents`: a list of strings (one document each) or a `datasets.Dataset` with a "text" column.
    """
    corpus = _as_dataset(documents)
    sets = {}
    for task in tasks:
        pairs = build_pretraining_dataset(
            corpus,
            tokenizer,
            sentence_per_line=layout == "sentence_per_line",
            max_seq_length=max_seq_length,
            dupe_factor=1,
            task=task,
            seed=seed,
            one_chunk="skip",
        )
        if len(pairs) == 0:
            raise NoPairsError(f"The documents give no {task.upper()} pair (too short?)")
        sets[task] = pairs.select(range(min(max_examples, len(pairs))))
    return sets


@torch.no_grad()
def evaluate_pairs(model, tokenizer, pairs, *, batch_size=32, seed=12345, autocast_dtype=None) -> dict:
    """Counts over one pair set: {"mlm_correct", "mlm_tokens", "pair_correct", "pairs"}."""
    from torch.utils.data import DataLoader

    from ..pretraining.data.collator import DataCollatorForAlbertPretraining

    collate = DataCollatorForAlbertPretraining(tokenizer=tokenizer, seed=seed, static_masking=True)
    loader = DataLoader(pairs, batch_size=batch_size, collate_fn=collate)
    counts = dict(mlm_correct=0, mlm_tokens=0, pair_correct=0, pairs=0)
    model.eval()
    device = next(model.parameters()).device  # the batches follow the model, and so does autocast
    for batch in loader:
        batch = {name: value.to(device) for name, value in batch.items()}
        order = batch.pop("sentence_order_label")
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            # labels make the head run at the masked positions only: (num_masked, vocab) logits
            outputs = model(**batch)
        if getattr(outputs, "sop_logits", None) is None:
            raise ValueError(
                f"{type(model).__name__} has no 2-way sentence head (sop_logits); load the "
                "pretraining model, e.g. AutoModelForPreTraining"
            )
        targets = batch["labels"][batch["labels"] != -100]
        counts["mlm_correct"] += int((outputs.prediction_logits.argmax(-1) == targets).sum())
        counts["mlm_tokens"] += int(targets.numel())
        counts["pair_correct"] += int((outputs.sop_logits.argmax(-1) == order).sum())
        counts["pairs"] += int(order.numel())
    return counts


def evaluate_intrinsic(
    model,
    tokenizer,
    documents,
    *,
    max_seq_length=128,
    max_examples=2000,
    seed=12345,
    batch_size=32,
    autocast_dtype=None,
    sets=None,
) -> dict:
    """Paper Table 5 accuracies on held-out `documents`: {"mlm", "nsp", "sop"} in [0, 1], plus the sizes
    "mlm_tokens", "nsp_examples", "sop_examples". Deterministic for a given seed. Pass `sets` (from
    `build_intrinsic_sets`) to evaluate several models on the same pairs without rebuilding them.

    Args:
        model: a pretraining model with a 2-way sentence head (`sop_logits`), e.g. `AlbertHFForPreTraining`; it is
            put in eval mode, and the batches go to the device of its parameters.
        tokenizer: the model's tokenizer.
        documents: a list of document strings, or a `datasets.Dataset` with a "text" column; unused with `sets`.
        max_seq_length (`int`, defaults to 128): the length of the pairs built.
        max_examples (`int`, defaults to 2000): the most pairs in each set (NSP and SOP).
        seed (`int`, defaults to 12345): seeds the pairs and their static masks.
        batch_size (`int`, defaults to 32): pairs per forward pass.
        autocast_dtype (`torch.dtype`, *optional*): run the model under autocast in this dtype (e.g.
            `torch.bfloat16`); None for no autocast.
        sets (`dict`, *optional*): {"nsp": pairs, "sop": pairs} from `build_intrinsic_sets`.

    Returns:
        {"mlm", "nsp", "sop"}: accuracies (mlm is NaN without a masked token), and "mlm_tokens", "nsp_examples",
        "sop_examples": what each was measured on.

    Raises:
        InputError: `NoPairsError` when the documents give no NSP or SOP pair; a `max_seq_length` above the
            tokenizer's `model_max_length`.
        ValueError: a model without `sop_logits`.
    """
    if sets is None:
        sets = build_intrinsic_sets(
            documents, tokenizer, max_seq_length=max_seq_length, max_examples=max_examples, seed=seed
        )
    result, mlm_correct, mlm_tokens = {}, 0, 0
    for task in SETS:
        counts = evaluate_pairs(
            model, tokenizer, sets[task], batch_size=batch_size, seed=seed, autocast_dtype=autocast_dtype
        )
        result[task] = counts["pair_correct"] / counts["pairs"]
        result[f"{task}_examples"] = counts["pairs"]
        mlm_correct += counts["mlm_correct"]
        mlm_tokens += counts["mlm_tokens"]
    result["mlm"] = mlm_correct / mlm_tokens if mlm_tokens else float("nan")
    result["mlm_tokens"] = mlm_tokens
    return {k: result[k] for k in ("mlm", "nsp", "sop", "mlm_tokens", "nsp_examples", "sop_examples")}


def sop_by_document(
    model,
    tokenizer,
    documents,
    names=None,
    *,
    max_seq_length=128,
    max_examples=600,
    seed=12345,
    batch_size=32,
    autocast_dtype=None,
) -> dict:
    """SOP accuracy on each document alone: {name: {"sop", "sop_examples"}}, names defaulting to "0", "1", ...

    A pooled held-out score is dominated by whichever documents it draws from (books differ by 10 points and
    more at small scale); this shows which. Documents too short to give one SOP pair are left out and logged.

    Args:
        model, tokenizer: as for `evaluate_intrinsic`.
        documents: a sequence of document strings (e.g. a dataset's "text" column).
        names: one name per document (None: their indices as strings).
        max_examples (`int`, defaults to 600): the most SOP pairs of each document.
        max_seq_length, seed, batch_size, autocast_dtype: as for `evaluate_intrinsic`.

    Returns:
        {name: {"sop": accuracy, "sop_examples": pairs}}, in document order, for the documents that give a pair.

    Raises:
        ValueError: a number of `names` other than of `documents`.
    """
    names = [str(i) for i in range(len(documents))] if names is None else list(names)
    if len(names) != len(documents):
        raise ValueError(f"{len(names)} names for {len(documents)} documents")
    result, too_short = {}, []
    for name, text in zip(names, documents):
        try:
            pairs = build_intrinsic_sets(
                [text], tokenizer, max_seq_length=max_seq_length, max_examples=max_examples, seed=seed, tasks=("sop",)
            )["sop"]
        except NoPairsError:  # empty, or too short for a pair; bad arguments still raise
            too_short.append(name)
            continue
        counts = evaluate_pairs(
            model, tokenizer, pairs, batch_size=batch_size, seed=seed, autocast_dtype=autocast_dtype
        )
        result[name] = {"sop": counts["pair_correct"] / counts["pairs"], "sop_examples": counts["pairs"]}
    if too_short:
        logger.warning(
            "SOP by document: skipped %d documents that give no SOP pair: %s", len(too_short), ", ".join(too_short[:10])
        )
    return result


# The paper's Table 5 (ALBERT-base, 125k steps), in percent.
PAPER_TABLE5 = {"none": (54.9, 52.4, 53.3), "nsp": (54.5, 90.5, 52.0), "sop": (54.0, 78.9, 86.5)}


def format_table(rows: dict, paper: dict | None = PAPER_TABLE5) -> str:
    """rows: {objective: evaluate_intrinsic result}. Measured accuracies in percent, the paper's beside them."""
    width = max([10] + [len(str(name)) for name in rows])
    head = f"{'objective':<{width}} {'MLM':>6} {'NSP':>6} {'SOP':>6}"
    lines = [head + ("   | paper: MLM   NSP   SOP" if paper else "")]
    for name, r in rows.items():
        line = f"{name:<{width}} {100 * r['mlm']:>6.1f} {100 * r['nsp']:>6.1f} {100 * r['sop']:>6.1f}"
        if paper and name in paper:
            line += "   |      " + "  ".join(f"{v:4.1f}" for v in paper[name])
        lines.append(line)
    return "\n".join(lines)


def load_pretraining_model(directory):
    from transformers import AutoModelForPreTraining, AutoTokenizer

    import albert_hf  # noqa: F401  (registers the albert_hf model type with the Auto classes)

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"--model: {directory} is not a saved model (no config.json in it)")
    return AutoModelForPreTraining.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


def document_names(documents) -> list[str]:
    """A readable name per document of a `load_corpus` dataset: its file name, plus "#k" when a file holds
    several documents."""
    if "source" not in documents.column_names:
        return [str(i) for i in range(len(documents))]
    sources = documents["source"]
    per_file, seen, names = Counter(sources), Counter(), []
    for source in sources:
        names.append(Path(source).name + (f"#{seen[source]}" if per_file[source] > 1 else ""))
        seen[source] += 1
    return names


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m albert_hf.analysis.intrinsic`."""
    parser = argparse.ArgumentParser(
        description="Paper Table 5: MLM, NSP and SOP accuracy of pretrained models "
        "on pairs built from held-out documents."
    )
    parser.add_argument("--model", action="append", required=True, help="saved model folder (repeat for several)")
    parser.add_argument(
        "--documents", nargs="+", required=True, help="held-out text files or folders (never seen in pretraining)"
    )
    parser.add_argument(
        "--layout",
        default="document_per_file",
        choices=["document_per_file", "blank_line_separated", "sentence_per_line"],
    )
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--max_examples", type=int, default=2000, help="pairs per set (NSP and SOP)")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (fast on CPUs with AMX)")
    parser.add_argument(
        "--per_document",
        action="store_true",
        help="also the SOP accuracy on each document alone (at most --max_examples pairs each)",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    from ..pretraining.data.corpus import load_corpus

    for path in args.documents:
        if not Path(path).exists():
            raise InputError(f"--documents: {path} does not exist")
    documents = load_corpus(args.documents, layout=args.layout)
    if len(documents) == 0:
        raise InputError(f"--documents: no document in {' '.join(args.documents)}")
    rows = {}
    for directory in args.model:
        try:
            model, tokenizer = load_pretraining_model(directory)
            options = dict(
                max_seq_length=args.max_seq_length,
                max_examples=args.max_examples,
                seed=args.seed,
                batch_size=args.batch_size,
                autocast_dtype=torch.bfloat16 if args.bf16 else None,
            )
            rows[directory] = evaluate_intrinsic(model, tokenizer, documents, **options)
            if args.per_document:
                rows[directory]["sop_by_document"] = sop_by_document(
                    model, tokenizer, documents["text"], document_names(documents), **options
                )
        except (FileNotFoundError, ValueError) as error:
            raise InputError(first_line(error)) from None
    print(format_table(rows, paper=None).replace("objective", "model    "))
    if args.per_document:
        print("\nSOP accuracy (%) per document (pairs)")
        for directory, row in rows.items():
            print(
                f"{directory}: "
                + ", ".join(
                    f"{name} {100 * r['sop']:.1f} ({r['sop_examples']})" for name, r in row["sop_by_document"].items()
                )
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    run_entry_point(main)
