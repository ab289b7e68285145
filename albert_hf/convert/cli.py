"""Convert checkpoints between transformers' ALBERT (model_type "albert") and albert_hf (model_type "albert_hf").

    python -m albert_hf.convert SRC_DIR_OR_HUB_NAME OUT_DIR [--to albert_hf|transformers] [--license apache-2.0]

The weight names are the same in both formats, so a conversion is a config translation plus a re-save:
- to albert_hf: safetensors, the two remote-code files and a full auto_map, loadable with trust_remote_code.
  (`AlbertHFFor*.from_pretrained` also reads transformers checkpoints directly, without converting first.)
- to transformers: only for configs transformers can express (sharing "all"/"none", the E->H projection present,
  and a layer-group order that transformers' formula reproduces); anything else is refused with the reason.
Tokenizer files found beside the source weights are copied along, and a model card (README.md) is written: the
pipeline tag of the head, the source as base model when it is a Hub name, a local source card's metadata.

    python -m albert_hf.convert --from_tf PREFIX_OR_DIR OUT_DIR [--config albert_config.json] [--spm_model M]

reads an official TensorFlow ALBERT checkpoint (google-research/albert's releases and fine-tuning runs) without
TensorFlow (albert_hf.convert.tf_checkpoint), maps its variable names to albert_hf's, and writes an albert_hf folder
with the tokenizer of the SentencePiece model beside it (30k-clean.model). The head follows the variables found:
pretraining (cls/predictions + cls/seq_relationship), classifier (output_weights), SQuAD v1.1 (cls/squad), SQuAD
v2.0 (start_logits, end_logits, answer_class), RACE (output_weights with one row, with --tf_head multiple_choice),
none (AlbertHFModel). Optimizer slots and global_step are skipped; any other variable that does not fit, or one
that is missing, stops the conversion with its name.
"""

import argparse
import json
import logging

from ..errors import InputError, first_line
from .tf_import import SPM_MODEL_NAMES, TF_CONFIG_NAME, TF_HEAD_CHOICES, from_tf_checkpoint
from .transformers_format import convert


def build_parser() -> argparse.ArgumentParser:
    """The command line of `python -m albert_hf.convert`."""
    parser = argparse.ArgumentParser(
        prog="python -m albert_hf.convert", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", nargs="?", help="checkpoint directory (or Hub name) in either format")
    parser.add_argument("out_dir", nargs="?", help="new, empty output directory")
    parser.add_argument(
        "--to",
        choices=["albert_hf", "transformers"],
        help="target format (default: the other one, read from the source's config.json)",
    )
    parser.add_argument(
        "--license",
        default=None,
        help="license for the model card, a Hub license id such as apache-2.0 (default: the one on "
        "a local source's README.md, if any)",
    )
    parser.add_argument(
        "--from_tf",
        metavar="PREFIX_OR_DIR",
        help="convert an official TensorFlow ALBERT checkpoint instead: its prefix (model.ckpt-best), "
        "one of its files, or its folder; then give only OUT_DIR",
    )
    parser.add_argument(
        "--config", help=f"with --from_tf: the official config (default: {TF_CONFIG_NAME} beside the checkpoint)"
    )
    parser.add_argument(
        "--spm_model",
        help=f"with --from_tf: the SentencePiece model (default: {' or '.join(SPM_MODEL_NAMES)} beside the checkpoint)",
    )
    parser.add_argument(
        "--tf_head",
        choices=TF_HEAD_CHOICES,
        help="with --from_tf, for a one-row output_weights head: RACE (multiple_choice) or a "
        "one-label regression classifier",
    )
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.from_tf is not None:
        if args.out_dir is not None or args.source is None:
            parser.error("with --from_tf give one positional argument, OUT_DIR")
        if args.to not in (None, "albert_hf"):
            parser.error("--from_tf writes albert_hf; convert its output with --to transformers afterwards")
        try:
            from_tf_checkpoint(
                args.from_tf,
                args.source,
                config=args.config,
                spm_model=args.spm_model,
                tf_head=args.tf_head,
                license=args.license,
            )
        except (ValueError, OSError) as error:  # ValueError: a config the model's own checks refuse
            raise InputError(first_line(error)) from None
        print(json.dumps({"source": args.from_tf, "out_dir": args.source, "format": "albert_hf"}))
        return
    if args.source is None or args.out_dir is None:
        parser.error("the following arguments are required: source, out_dir (or --from_tf PREFIX_OR_DIR OUT_DIR)")
    for flag in ("config", "spm_model", "tf_head"):
        if getattr(args, flag) is not None:
            parser.error(f"--{flag} goes with --from_tf")
    target = convert(args.source, args.out_dir, args.to, license=args.license)
    print(json.dumps({"source": args.source, "out_dir": args.out_dir, "format": target}))
