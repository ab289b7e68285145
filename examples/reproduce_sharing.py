"""Paper Table 4 (sharing strategy) and Figure 1 at small scale: all-shared vs not-shared vs attention-shared
vs FFN-shared models, same corpus, architecture, steps and seed; only `--sharing` differs.

    python examples/reproduce_sharing.py --torch_compile   # the real run: 4 models, about 5 minutes each on 2 cores
    python examples/reproduce_sharing.py --smoke           # end to end in about a minute (numbers meaningless)

Prints, per strategy, the parameter count and the intrinsic MLM / SOP accuracy on held-out documents, and writes
the Figure 1 plot (L2 distance and angle between each layer's input and output embedding) for all-shared vs
not-shared into OUTPUT_DIR/figure1.png (+ .csv).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reproduce_sop_vs_nsp import common_arguments, held_out_documents, intrinsic, prepare, pretrain, wall_time

STRATEGIES = ("all", "none", "attention", "ffn")
# The paper's E=128 sharing ablation (ALBERT-base dims): parameters and its average downstream score.
PAPER = {"all": "12M, avg 80.1", "none": "89M, avg 81.6", "attention": "64M, avg 81.7", "ffn": "38M, avg 80.2"}


def figure_texts(held_out, count: int = 300, min_chars: int = 200) -> list[str]:
    """Paragraphs of the held-out documents, long enough to fill most of a sequence."""
    from albert_hf.pretraining.data.corpus import paragraphs

    texts = []
    for document in held_out["text"]:
        texts += [" ".join(p.split()) for p in paragraphs(document) if len(p) >= min_chars]
        if len(texts) >= count:
            break
    return texts[:count]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_arguments(parser, steps=600, output_dir="outputs/sharing")
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    parser.add_argument("--figure_texts", type=int, default=300, help="held-out paragraphs for Figure 1")
    args = parser.parse_args(argv)
    prepare(args)
    if not args.smoke and not args.model_json:
        args.model_fields["num_hidden_layers"] = 6  # sharing needs depth to matter
    out = Path(args.output_dir)

    for sharing in args.strategies:
        print(f"\n=== pretraining, sharing = {sharing} ===")
        pretrain(args, out / sharing, task="sop", sharing=sharing)

    from albert_hf.analysis.transitions import load_model_and_tokenizer, model_transitions, plot, write_csv

    held_out = held_out_documents(args)
    rows = {}
    for sharing in args.strategies:
        r = intrinsic(args, out / sharing, held_out)
        model, _ = load_model_and_tokenizer(out / sharing)
        r["parameters"] = sum(p.numel() for p in model.parameters())  # encoder + embeddings, no heads
        rows[sharing] = r
    (out / "sharing.json").write_text(json.dumps(rows, indent=2))

    m = args.model_fields
    print(
        f"\nSharing ablation: {args.max_train_steps} steps x {args.batch_size} x {args.max_seq_length} tokens per "
        f"model, L={m['num_hidden_layers']} H={m['hidden_size']} E={m['embedding_size']}, {args.mixed_precision}, "
        f"SOP; accuracies (%) on {len(held_out)} held-out documents"
    )
    print(f"{'sharing':<10} {'params':>11} {'MLM':>6} {'SOP':>6} {'time':>9}   paper (E=128, base)")
    for sharing, r in rows.items():
        print(
            f"{sharing:<10} {r['parameters']:>11,} {100 * r['mlm']:>6.1f} {100 * r['sop']:>6.1f} "
            f"{wall_time(out / sharing):>9}   {PAPER[sharing]}"
        )

    pair = [s for s in ("all", "none") if s in args.strategies]
    if pair:
        texts = figure_texts(held_out, args.figure_texts)
        if not texts:
            raise SystemExit("error: the held-out documents have no paragraph long enough for Figure 1")
        results = {}
        for sharing in pair:
            model, tokenizer = load_model_and_tokenizer(out / sharing)
            name = {"all": "all-shared", "none": "not-shared"}[sharing]
            results[name] = model_transitions(model, tokenizer, texts, args.max_seq_length)
        write_csv(results, out / "figure1.csv")
        plot(results, out / "figure1.png", title=f"Layer transitions over {len(texts)} held-out paragraphs")
        print(f"\nFigure 1 (mean over {results[next(iter(results))]['tokens']:,} tokens): {out / 'figure1.png'}")
        for name, r in results.items():
            print(f"  {name:<12} L2:    " + " ".join(f"{v:6.2f}" for v in r["l2"]))
            print(f"  {name:<12} angle: " + " ".join(f"{v:6.1f}" for v in r["angle_degrees"]))
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
