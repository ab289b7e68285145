"""Official TensorFlow ALBERT checkpoints (google-research/albert's releases and fine-tuning runs) into an albert_hf
folder, read without TensorFlow (tf_checkpoint.py): the variable names mapped to albert_hf's, the head chosen from
the variables found, the SentencePiece model's tokenizer beside the weights (`from_tf_checkpoint`)."""

import json
import logging
import re
import shutil
from pathlib import Path

import torch
import transformers

from .. import modeling_albert_hf
from ..configuration_albert_hf import AlbertHFConfig
from ..errors import InputError, first_line
from .converted_card import write_converted_card
from .tf_checkpoint import TFCheckpoint, resolve_prefix
from .transformers_format import new_out_dir

logger = logging.getLogger(__name__)


TF_CONFIG_NAME = "albert_config.json"
SPM_MODEL_NAMES = ("30k-clean.model", "spiece.model")
WORDPIECE_VOCAB = "vocab.txt"  # albert_zh's Chinese releases
TF_SKIPPED_SLOTS = ("adam_m", "adam_v")  # optimizer slots, "<variable>/adam_m": training state, not weights
TF_SKIPPED_NAMES = ("global_step",)
# The official code's activation names -> ours. Its "gelu" is the tanh approximation (transformers' "gelu_new").
TF_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "tanh": "tanh", "linear": "linear"}

# Variables stored as torch wants them: embedding tables, vectors, and the output_weights of the official heads
# ([labels, H], multiplied with transpose_b=True).
TF_WHOLE_NAMES = {
    "bert/embeddings/word_embeddings": "albert.embeddings.word_embeddings.weight",
    "bert/embeddings/position_embeddings": "albert.embeddings.position_embeddings.weight",
    "bert/embeddings/token_type_embeddings": "albert.embeddings.token_type_embeddings.weight",
    "cls/predictions/output_bias": "predictions.bias",
    "cls/seq_relationship/output_weights": "sop_classifier.classifier.weight",
    "cls/seq_relationship/output_bias": "sop_classifier.classifier.bias",
    "output_weights": "classifier.weight",  # run_classifier (GLUE) and run_race
    "output_bias": "classifier.bias",
    "cls/squad/output_weights": "qa_outputs.weight",  # run_squad_v1
    "cls/squad/output_bias": "qa_outputs.bias",
}
# Dense and LayerNorm scopes -> modules. A dense kernel is [in, out] and is transposed for nn.Linear.
TF_SCOPES = {
    "bert/embeddings/LayerNorm": "albert.embeddings.LayerNorm",
    "bert/encoder/embedding_hidden_mapping_in": "albert.encoder.embedding_hidden_mapping_in",
    "bert/pooler/dense": "albert.pooler",
    "cls/predictions/transform/dense": "predictions.dense",
    "cls/predictions/transform/LayerNorm": "predictions.LayerNorm",
    "start_logits/dense": "start_logits",  # run_squad_v2
    "end_logits/dense_0": "end_logits.dense_0",
    "end_logits/LayerNorm": "end_logits.LayerNorm",
    "end_logits/dense_1": "end_logits.dense_1",
    "answer_class/dense_0": "answer_class.dense_0",
    "answer_class/dense_1": "answer_class.dense_1",
}
# Scopes inside bert/encoder/transformer/group_G/inner_group_K -> modules of albert_layer_groups.G.albert_layers.K
TF_BLOCK_SCOPES = {
    "attention_1/self/query": "attention.query",
    "attention_1/self/key": "attention.key",
    "attention_1/self/value": "attention.value",
    "attention_1/output/dense": "attention.dense",
    "LayerNorm": "attention.LayerNorm",
    "ffn_1/intermediate/dense": "ffn",
    "ffn_1/intermediate/output/dense": "ffn_output",
    "LayerNorm_1": "full_layer_layer_norm",
}
TF_LEAVES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias"}
TF_BLOCK = re.compile(r"bert/encoder/transformer/group_(\d+)/inner_group_(\d+)/(.+)")
# Layouts that are not google-research/albert's: brightmart/albert_zh's own modeling.py, and BERT.
TF_FOREIGN = re.compile(r"bert/embeddings/word_embeddings_2$|bert/encoder/layer_shared/|bert/encoder/layer_\d+/")
TF_HEAD_SCOPES = {  # the variables that tell which fine-tuning or pretraining head a checkpoint has
    "mlm": ("cls/predictions/",),
    "sop": ("cls/seq_relationship/",),
    "classifier": ("output_weights", "output_bias"),
    "squad_v1": ("cls/squad/",),
    "squad_v2": ("start_logits/", "end_logits/", "answer_class/"),
}
TF_HEAD_CHOICES = ("multiple_choice", "regression")


def tf_state_dict_key(name: str) -> tuple[str, bool] | None:
    """(albert_hf state-dict key, transpose?) for an official variable name, or None when it has no place."""
    if name in TF_WHOLE_NAMES:
        return TF_WHOLE_NAMES[name], False
    scope, _, leaf = name.rpartition("/")
    if leaf not in TF_LEAVES:
        return None
    block = TF_BLOCK.fullmatch(scope)
    if block:
        module = TF_BLOCK_SCOPES.get(block.group(3))
        if module is None:
            return None
        module = f"albert.encoder.albert_layer_groups.{block.group(1)}.albert_layers.{block.group(2)}.{module}"
    elif scope in TF_SCOPES:
        module = TF_SCOPES[scope]
    else:
        return None
    return f"{module}.{TF_LEAVES[leaf]}", leaf == "kernel"


def tf_variable_names(config: AlbertHFConfig) -> dict[str, str]:
    """albert_hf state-dict key -> official variable name, for every name the mapping knows at this config's size
    (the inverse of `tf_state_dict_key`, to name what a checkpoint lacks in the official terms)."""
    candidates = list(TF_WHOLE_NAMES)
    scopes = list(TF_SCOPES) + [
        f"bert/encoder/transformer/group_{group}/inner_group_{inner}/{scope}"
        for group in range(config.num_hidden_groups)
        for inner in range(config.inner_group_num)
        for scope in TF_BLOCK_SCOPES
    ]
    for scope in scopes:
        leaves = ("gamma", "beta") if scope.rpartition("/")[2].startswith("LayerNorm") else ("kernel", "bias")
        candidates += [f"{scope}/{leaf}" for leaf in leaves]
    names = {}
    for name in candidates:
        key = tf_state_dict_key(name)[0]
        names[key] = names[key.removeprefix("albert.")] = name
    return names


def _tf_head(checkpoint: TFCheckpoint, names: list[str], tf_head: str | None) -> tuple[str, dict]:
    """The albert_hf class for the head variables found, and the config fields it needs."""
    found = {
        head
        for head, scopes in TF_HEAD_SCOPES.items()
        if any(name == scope or name.startswith(scope) for name in names for scope in scopes)
    }
    if tf_head and found != {"classifier"}:
        raise InputError(
            f"--tf_head {tf_head}: only for a checkpoint with the one-row output_weights of run_race "
            f"or a regression task; this one has {', '.join(sorted(found)) or 'no head'}"
        )
    if found == {"classifier"}:
        if "output_weights" not in names:
            raise InputError("the checkpoint has output_bias without output_weights")
        labels = checkpoint.entry("output_weights").shape[0]
        if labels > 1:
            return "AlbertHFForSequenceClassification", {"num_labels": labels}
        if tf_head == "multiple_choice":
            return "AlbertHFForMultipleChoice", {}
        if tf_head == "regression":
            return "AlbertHFForSequenceClassification", {"num_labels": 1, "problem_type": "regression"}
        raise InputError(
            "output_weights has one row: a RACE (multiple-choice) head or a one-label regression "
            "classifier (STS-B), which the names do not tell apart; pass --tf_head multiple_choice or "
            "--tf_head regression"
        )
    heads = {
        frozenset(): ("AlbertHFModel", {}),
        frozenset({"mlm", "sop"}): ("AlbertHFForPreTraining", {}),
        frozenset({"mlm"}): ("AlbertHFForMaskedLM", {}),
        frozenset({"squad_v1"}): ("AlbertHFForQuestionAnswering", {}),
        frozenset({"squad_v2"}): ("AlbertHFForQuestionAnsweringWithAnswerability", {}),
    }
    if frozenset(found) not in heads:
        scopes = sorted(
            {
                scope
                for head in found
                for scope in TF_HEAD_SCOPES[head]
                if any(name == scope or name.startswith(scope) for name in names)
            }
        )
        raise InputError(f"no albert_hf head holds this mix of head variables: {', '.join(scopes)}")
    return heads[frozenset(found)]


def _read_tf_config(path: Path) -> dict:
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"--config {path}: cannot read it as JSON: {first_line(error)}") from None
    if not isinstance(values, dict):
        raise InputError(f"--config {path}: not a JSON object")
    activation = values.get("hidden_act", "gelu")
    if activation not in TF_ACTIVATIONS:
        raise InputError(
            f"--config {path}: hidden_act {activation!r} is none of the official code's {sorted(TF_ACTIVATIONS)}"
        )
    values["hidden_act"] = TF_ACTIVATIONS[activation]
    return values


def _find_spm_model(folder: Path) -> Path | None:
    for name in SPM_MODEL_NAMES:
        if (folder / name).is_file():
            return folder / name
    models = sorted(folder.glob("*.model"))
    return models[0] if len(models) == 1 else None


def _tf_sources(checkpoint, out_dir: str, config: str | None, spm_model: str | None) -> tuple:
    """(checkpoint prefix, config file, SentencePiece model or None, WordPiece vocabulary or None) for
    `from_tf_checkpoint`, each checked; an output folder that is not new and empty stops it too."""
    try:
        prefix = resolve_prefix(checkpoint)
    except FileNotFoundError as error:
        raise InputError(f"--from_tf {checkpoint}: {error}") from None
    folder = prefix.parent
    if config is None:
        config_path = folder / TF_CONFIG_NAME
        if not config_path.is_file():
            raise InputError(f"--config: no {TF_CONFIG_NAME} beside the checkpoint in {folder}; pass --config")
    else:
        config_path = Path(config)
        if not config_path.is_file():
            raise InputError(f"--config {config}: no such file")
    if spm_model is not None and not Path(spm_model).is_file():
        raise InputError(f"--spm_model {spm_model}: no such file")
    spm_path = Path(spm_model) if spm_model else _find_spm_model(folder)
    # albert_zh's *_google_zh releases carry BERT's WordPiece vocabulary instead of a SentencePiece model
    vocab_path = folder / WORDPIECE_VOCAB if spm_path is None and (folder / WORDPIECE_VOCAB).is_file() else None
    if Path(out_dir).exists() and any(Path(out_dir).iterdir()):
        raise InputError(f"{out_dir} exists and is not empty; choose a new output directory")
    return prefix, config_path, spm_path, vocab_path


def _checked_names(reader: TFCheckpoint, prefix) -> tuple[list[str], set[str]]:
    """(the checkpoint's variables to convert, those skipped: optimizer slots, global_step); a checkpoint in
    albert_zh's original or BERT's layout stops the conversion."""
    names = reader.names()
    foreign = sorted({match.group(0) for name in names for match in [TF_FOREIGN.search(name)] if match})
    if foreign:
        raise InputError(
            f"{prefix}: not google-research/albert's layout but brightmart/albert_zh's original (or BERT's): "
            f"{', '.join(foreign)} means BERT-named layers and a bias-free E->H projection of the word embedding "
            "alone, before H-wide position/token-type embeddings; ALBERT adds E-wide embeddings, then projects with a "
            "bias, so these weights cannot be loaded into it (albert_zh's *_google_zh releases convert)"
        )
    skipped = {name for name in names if name in TF_SKIPPED_NAMES or name.rpartition("/")[2] in TF_SKIPPED_SLOTS}
    return [name for name in names if name not in skipped], skipped


def _place_variables(
    reader: TFCheckpoint, names: list[str], model, class_name: str, config_path: Path, prefix
) -> tuple[dict, list[str]]:
    """({state-dict key: (TF variable, transposed)}, variables the model does not use) for `model`; any variable
    without a place, missing or of the wrong shape stops the conversion, all named in one line."""
    expected = model.state_dict()
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    has_pooler = any(key.startswith(("pooler.", "albert.pooler.")) for key in expected)
    unknown, unused, state, shapes = [], [], {}, []
    for name in names:
        key, transpose = tf_state_dict_key(name) or (None, False)
        if key is not None and class_name == "AlbertHFModel":
            key = key.removeprefix("albert.")  # the bare model's keys have no "albert." prefix
        if key not in expected:
            if key is not None and key.startswith(("pooler.", "albert.pooler.")) and not has_pooler:
                unused.append(name)  # the official SQuAD and MLM graphs build the pooler without using it
            else:
                unknown.append(name)
            continue
        entry = reader.entry(name)
        wanted = tuple(reversed(expected[key].shape)) if transpose else tuple(expected[key].shape)  # TF's order
        if entry.shape != wanted:
            shapes.append(f"{name} {list(entry.shape)} (expected {list(wanted)})")
            continue
        state[key] = name, transpose
    official = tf_variable_names(model.config)
    missing = [official.get(key, key) for key in expected if key not in state and key not in tied]
    problems = []
    if unknown:
        problems.append(f"variables with no place in {class_name}: {', '.join(unknown)}")
    if missing:
        problems.append(f"missing variables that {class_name} needs: {', '.join(missing)}")
    if shapes:
        problems.append(f"shapes that do not fit {config_path.name}: {', '.join(shapes)}")
    if problems:
        raise InputError(f"{prefix}: " + "; ".join(problems))
    return state, unused


def _tf_tokenizer(spm_path: Path | None, vocab_path: Path | None, vocab_size: int):
    """The checkpoint's tokenizer (None without one), checked against the config's vocab_size before anything is
    written."""
    if spm_path is not None:
        from ..tokenization import tokenizer_from_spm_proto

        tokenizer, where = (
            tokenizer_from_spm_proto(spm_path.read_bytes(), source=str(spm_path)),
            f"--spm_model {spm_path}",
        )
    elif vocab_path is not None:
        # What albert_zh tells its users to load it with: BERT's tokenizer, lower-cased, one piece per CJK character.
        pieces = vocab_path.read_text(encoding="utf-8").splitlines()
        tokenizer = transformers.BertTokenizer(vocab={piece: i for i, piece in enumerate(pieces)}, do_lower_case=True)
        where = str(vocab_path)
    else:
        return None
    if len(tokenizer) != vocab_size:
        raise InputError(f"{where}: {len(tokenizer)} pieces, but the config's vocab_size is {vocab_size}")
    return tokenizer


def from_tf_checkpoint(
    checkpoint,
    out_dir: str,
    config: str | None = None,
    spm_model: str | None = None,
    tf_head: str | None = None,
    license: str | None = None,
):
    """Convert an official TensorFlow ALBERT checkpoint (a prefix, one of its files, or its folder) into an albert_hf
    folder; returns the model. Raises InputError with one line saying what is wrong, before anything is written.

    Args:
        checkpoint: the checkpoint's prefix (e.g. `model.ckpt-best`), one of its files, or its folder.
        out_dir: a new or empty folder for the model, its tokenizer and its card.
        config (`str`, *optional*): the official config file; None: albert_config.json beside the checkpoint.
        spm_model (`str`, *optional*): the SentencePiece model; None: 30k-clean.model or spiece.model beside the
            checkpoint, or the one *.model there (a vocab.txt of albert_zh's releases serves when there is none).
        tf_head (`str`, *optional*): for a one-row output_weights head, `"multiple_choice"` (RACE) or
            `"regression"`.
        license (`str`, *optional*): the card's license, a Hub license id.

    Returns:
        The albert_hf model written, in eval mode, of the class the checkpoint's head variables call for
        (`AlbertHFModel` without a head).

    Raises:
        InputError: a missing or damaged checkpoint, config or tokenizer, a non-empty `out_dir`, a layout other
            than google-research/albert's, variables that are missing, do not fit the config or have no place in
            the model, or head variables no albert_hf class holds (or a one-row head without `tf_head`).
    """
    prefix, config_path, spm_path, vocab_path = _tf_sources(checkpoint, out_dir, config, spm_model)
    reader = TFCheckpoint(prefix)
    names, skipped = _checked_names(reader, prefix)
    class_name, head_fields = _tf_head(reader, names, tf_head)
    values = _read_tf_config(config_path)
    # The official code builds the E->H mapping only when E != H; keep what the checkpoint has.
    values["project_when_equal"] = "bert/encoder/embedding_hidden_mapping_in/kernel" in names
    try:
        albert_config = AlbertHFConfig(**{**values, **head_fields, "architectures": [class_name]})
    except (TypeError, ValueError) as error:
        raise InputError(f"--config {config_path}: {first_line(error)}") from None
    model = getattr(modeling_albert_hf, class_name)(albert_config)
    state, unused = _place_variables(reader, names, model, class_name, config_path, prefix)
    tokenizer = _tf_tokenizer(spm_path, vocab_path, albert_config.vocab_size)
    expected = model.state_dict()
    with torch.no_grad():  # every read is checked (size, checksum) before the output folder is made
        for key, (name, transpose) in state.items():
            array = torch.from_numpy(reader.read(name))
            expected[key].copy_(array.T if transpose else array)
    model.eval()
    new_out_dir(out_dir)
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    if spm_path is not None:
        shutil.copyfile(spm_path, Path(out_dir) / "spiece.model")
    if tokenizer is None:
        logger.warning(
            "no SentencePiece model (%s) or %s beside %s and no --spm_model: the folder has no tokenizer",
            ", ".join(SPM_MODEL_NAMES),
            WORDPIECE_VOCAB,
            prefix,
        )
    write_converted_card(
        out_dir,
        source=str(prefix.parent),
        target="albert_hf",
        model=model,
        tokenizer_copied=tokenizer is not None,
        license=license,
    )
    logger.info(
        "converted %s (%d variables; skipped %d optimizer slots and global_step entries%s) -> %s (%s)",
        prefix,
        len(state),
        len(skipped),
        f"; unused: {', '.join(unused)}" if unused else "",
        out_dir,
        class_name,
    )
    return model
