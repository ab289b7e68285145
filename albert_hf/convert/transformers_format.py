"""transformers' ALBERT (model_type "albert") <-> albert_hf (model_type "albert_hf"): the weight names are the same,
so a conversion is a config translation plus a re-save (`convert`). To transformers only where its config can say
the same model; tokenizer files are copied along and a model card is written."""

import logging
import shutil
from pathlib import Path

import transformers
from transformers import PreTrainedConfig

from .. import modeling_albert_hf
from ..configuration_albert_hf import AlbertHFConfig
from ..errors import InputError
from .converted_card import write_converted_card

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
        raise InputError(f"{source}: unknown ALBERT architecture {ours!r}; known: {sorted(ARCHITECTURES)}")
    model = getattr(modeling_albert_hf, ours).from_pretrained(source, config=config, **hub_kwargs)
    model.save_pretrained(out_dir)
    return model


def to_transformers(source: str, out_dir: str, **hub_kwargs):
    """Load an albert_hf checkpoint and save it as the equivalent transformers ALBERT class.

    Args:
        source: an albert_hf checkpoint folder or Hub name.
        out_dir: the folder the model is saved in (weights and config only; `convert` adds the tokenizer and card).
        **hub_kwargs: passed to `from_pretrained` (`revision`, `token`, `cache_dir`, ...).

    Returns:
        The transformers model saved, of the `Albert*` class matching the source's head.

    Raises:
        InputError: an architecture transformers' ALBERT cannot express (`AlbertHFConfig.to_albert_config`), or a
            head with no transformers counterpart (e.g. the answerability QA head).
    """
    config = AlbertHFConfig.from_pretrained(source, **hub_kwargs)
    try:
        albert_config = config.to_albert_config()
    except ValueError as error:  # an architecture transformers' ALBERT cannot express
        raise InputError(f"{source}: {error}; it stays an albert_hf checkpoint") from None
    ours = _architecture(config, "AlbertHFForPreTraining")
    theirs = _architecture(albert_config, "AlbertForPreTraining")
    if theirs not in ARCHITECTURES:
        raise InputError(f"{source}: unknown albert_hf architecture {ours!r}; known: {sorted(ARCHITECTURES.values())}")
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


def new_out_dir(out_dir: str) -> None:
    """Refuses a folder that holds anything; the folder itself is made by the first save, after every check, so a
    refused conversion leaves nothing behind."""
    if Path(out_dir).exists() and (not Path(out_dir).is_dir() or any(Path(out_dir).iterdir())):
        raise InputError(f"{out_dir} exists and is not empty; choose a new output directory")


def convert(source: str, out_dir: str, to: str | None = None, license: str | None = None, **hub_kwargs) -> str:
    """Convert `source` to the other format (or to `to`), with a model card (README.md, license `license` or the
    source card's); returns the target format name.

    Args:
        source: a checkpoint folder or Hub name, in transformers' ALBERT format or albert_hf's.
        out_dir: a new or empty folder for the converted checkpoint, its tokenizer files and its card.
        to (`str`, *optional*): `"albert_hf"` or `"transformers"`; None: the format the source is not in.
        license (`str`, *optional*): the card's license, a Hub license id; None: a local source card's, if any.
        **hub_kwargs: passed to `from_pretrained` (`revision`, `token`, `cache_dir`, ...).

    Returns:
        `"albert_hf"` or `"transformers"`, the format written.

    Raises:
        InputError: a source whose model_type is neither `"albert"` nor `"albert_hf"`, another `to`, an `out_dir`
            that is not empty, an unknown architecture, or one transformers' ALBERT cannot express (with
            `to="transformers"`).
    """
    config_dict, _ = PreTrainedConfig.get_config_dict(source, **hub_kwargs)  # raw, before our conversion
    source_type = config_dict.get("model_type")
    if source_type not in ("albert", "albert_hf"):
        raise InputError(f"{source}: config.json has model_type {source_type!r}, expected 'albert' or 'albert_hf'")
    if to is None:
        to = "albert_hf" if source_type == "albert" else "transformers"
    if to not in ("albert_hf", "transformers"):
        raise InputError(f"--to must be 'albert_hf' or 'transformers', got {to!r}")
    new_out_dir(out_dir)
    model = (to_albert_hf if to == "albert_hf" else to_transformers)(source, out_dir, **hub_kwargs)
    copied = copy_tokenizer_files(source, out_dir)
    write_converted_card(out_dir, source=source, target=to, model=model, tokenizer_copied=bool(copied), license=license)
    logger.info("converted %s (%s) -> %s (%s); tokenizer files copied: %s", source, source_type, out_dir, to, copied)
    return to
