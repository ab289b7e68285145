"""Convert checkpoints between transformers' ALBERT (model_type "albert") and albert_hf (model_type "albert_hf").

    python -m albert_hf.convert SRC_DIR_OR_HUB_NAME OUT_DIR [--to albert_hf|transformers] [--license apache-2.0]

The weight names are the same in both formats, so a conversion is a config translation plus a re-save:
- to albert_hf: safetensors, the two remote-code files and a full auto_map, loadable with trust_remote_code.
  (`AlbertHFFor*.from_pretrained` also reads transformers checkpoints directly, without converting first.)
- to transformers: only for configs transformers can express (sharing "all"/"none", the E->H projection present,
  and a layer-group order that transformers' formula reproduces); anything else is refused with the reason.
Tokenizer files found beside the source weights are copied along, and a model card (README.md) is written: the
pipeline tag of the head, the source as base model when it is a Hub name, a local source card's metadata.
"""

import argparse
import json
import logging
import shutil
from pathlib import Path

import transformers
from transformers import PreTrainedConfig

from . import modeling_albert_hf
from .configuration_albert_hf import AlbertHFConfig
from .hub import write_converted_card

logger = logging.getLogger(__name__)

# architecture name in transformers -> ours; the head a checkpoint was saved from decides the class that loads it
ARCHITECTURES = {
    "AlbertModel": "AlbertHFModel",
    "AlbertForPreTraining": "AlbertHFForPreTraining",
    "AlbertForMaskedLM": "AlbertHFForMaskedLM",
    "AlbertForSequenceClassification": "AlbertHFForSequenceClassification",
    "AlbertForMultipleChoice": "AlbertHFForMultipleChoice",
    "AlbertForQuestionAnswering": "AlbertHFForQuestionAnswering",
    "AlbertForTokenClassification": "AlbertHFForTokenClassification",
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model")


def _architecture(config, default: str) -> str:
    return (config.architectures or [default])[0]


def to_albert_hf(source: str, out_dir: str, **hub_kwargs):
    """Load a transformers ALBERT checkpoint into the matching albert_hf class and save it in albert_hf format."""
    config = AlbertHFConfig.from_pretrained(source, **hub_kwargs)
    ours = _architecture(config, "AlbertHFForPreTraining")  # already renamed by AlbertHFConfig.get_config_dict
    if ours not in ARCHITECTURES.values():
        raise ValueError(f"{source}: unknown ALBERT architecture {ours!r}; known: {sorted(ARCHITECTURES)}")
    model = getattr(modeling_albert_hf, ours).from_pretrained(source, config=config, **hub_kwargs)
    model.save_pretrained(out_dir)
    return model


def to_transformers(source: str, out_dir: str, **hub_kwargs):
    """Load an albert_hf checkpoint and save it as the equivalent transformers ALBERT class."""
    config = AlbertHFConfig.from_pretrained(source, **hub_kwargs)
    albert_config = config.to_albert_config()  # raises when transformers cannot express this architecture
    ours = _architecture(config, "AlbertHFForPreTraining")
    theirs = _architecture(albert_config, "AlbertForPreTraining")
    if theirs not in ARCHITECTURES:
        raise ValueError(f"{source}: unknown albert_hf architecture {ours!r}; known: {sorted(ARCHITECTURES.values())}")
    ours_model = getattr(modeling_albert_hf, ours).from_pretrained(source, config=config, **hub_kwargs)
    model = getattr(transformers, theirs)(albert_config)
    model.load_state_dict(ours_model.state_dict(), strict=True)
    model.save_pretrained(out_dir)
    return model


def copy_tokenizer_files(source: str, out_dir: str) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        path = Path(source) / name
        if path.is_file():
            shutil.copy2(path, Path(out_dir) / name)
            copied.append(name)
    return copied


def convert(source: str, out_dir: str, to: str | None = None, license: str | None = None, **hub_kwargs) -> str:
    """Convert `source` to the other format (or to `to`), with a model card (README.md, license `license` or the
    source card's); returns the target format name."""
    config_dict, _ = PreTrainedConfig.get_config_dict(source, **hub_kwargs)  # raw, before our conversion
    source_type = config_dict.get("model_type")
    if source_type not in ("albert", "albert_hf"):
        raise ValueError(f"{source}: config.json has model_type {source_type!r}, expected 'albert' or 'albert_hf'")
    if to is None:
        to = "albert_hf" if source_type == "albert" else "transformers"
    if to not in ("albert_hf", "transformers"):
        raise ValueError(f"--to must be 'albert_hf' or 'transformers', got {to!r}")
    if Path(out_dir).exists() and any(Path(out_dir).iterdir()):
        raise FileExistsError(f"{out_dir} exists and is not empty; choose a new output directory")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    model = (to_albert_hf if to == "albert_hf" else to_transformers)(source, out_dir, **hub_kwargs)
    copied = copy_tokenizer_files(source, out_dir)
    write_converted_card(out_dir, source=source, target=to, model=model, tokenizer_copied=bool(copied),
                         license=license)
    logger.info("converted %s (%s) -> %s (%s); tokenizer files copied: %s", source, source_type, out_dir, to, copied)
    return to


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="checkpoint directory (or Hub name) in either format")
    parser.add_argument("out_dir", help="new, empty output directory")
    parser.add_argument(
        "--to",
        choices=["albert_hf", "transformers"],
        help="target format (default: the other one, read from the source's config.json)",
    )
    parser.add_argument("--license", default=None,
                        help="license for the model card, a Hub license id such as apache-2.0 (default: the one on "
                        "a local source's README.md, if any)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    target = convert(args.source, args.out_dir, args.to, license=args.license)
    print(json.dumps({"source": args.source, "out_dir": args.out_dir, "format": target}))


if __name__ == "__main__":
    main()
