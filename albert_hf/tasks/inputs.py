"""What the fine-tuning scripts load and feed the Trainer: the splits the --do_* flags ask for and how many of each
(`wanted_splits`, `wanted_samples`), the tokenizer and the model (`load_tokenizer_and_model`), lengths fitted to the
model (`fit_max_seq_length`), the collator, and the best checkpoint chosen by the task's metric."""

import logging
from dataclasses import replace

from transformers import AutoConfig, AutoTokenizer, default_data_collator

from .. import AlbertHFConfig
from ..errors import InputError
from ..hub.loading import check_tokenizer, loading
from .arguments import ModelArguments

logger = logging.getLogger(__name__)


# The split each of TrainingArguments' --do_* flags asks for.
SPLIT_FLAGS = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}


def best_by_task_metric(training_args, metric: str):
    """--load_best_model_at_end without --metric_for_best_model keeps the checkpoint best on the task's main metric
    (`metric`, e.g. "accuracy"; higher is better), as the official code does, where Trainer would take the loss.

    Returns:
        `training_args` itself, or a copy checked again with the metric set.
    """
    if not training_args.load_best_model_at_end or training_args.metric_for_best_model_given:
        return training_args
    logger.info(
        "--load_best_model_at_end keeps the checkpoint with the best dev %s (the task's main metric; "
        "--metric_for_best_model chooses another)",
        metric,
    )
    return replace(
        training_args,
        metric_for_best_model=metric,
        greater_is_better=True if not training_args.greater_is_better_given else training_args.greater_is_better,
    )


def wanted_splits(training_args) -> list[str]:
    """The splits the run's --do_train / --do_eval / --do_predict ask for, in that order."""
    return [split for split, flag in SPLIT_FLAGS.items() if getattr(training_args, flag[2:])]


def wanted_samples(training_args, data_args) -> dict[str, int | None]:
    """The splits the run asks for and how many rows of each it reads: the one place the scripts learn it.

    Args:
        training_args: --do_train, --do_eval, --do_predict.
        data_args: the script's data arguments, with --max_train_samples, --max_eval_samples, --max_predict_samples.

    Returns:
        {split: max_samples (None: every row)} for "train", "validation", "test" as asked for, in that order. None
        asked for stops the run with one line (InputError).
    """
    caps = {
        "train": data_args.max_train_samples,
        "validation": data_args.max_eval_samples,
        "test": data_args.max_predict_samples,
    }
    wanted = {split: caps[split] for split in wanted_splits(training_args)}
    if not wanted:
        raise InputError("nothing to do; pass --do_train, --do_eval and/or --do_predict")
    return wanted


def load_checkpoint_config(model_args: ModelArguments):
    """The checkpoint's own config as saved (AutoConfig: its labels, problem type), before anything overrides it:
    what the scripts compare the data's labels with."""
    flag, config_name = model_args.source("config")
    with loading(flag, config_name):
        return AutoConfig.from_pretrained(
            config_name,
            trust_remote_code=model_args.trust_remote_code,
            cache_dir=model_args.cache_dir,
            revision=model_args.model_revision,
            token=model_args.token,
        )


def load_tokenizer_and_model(model_args: ModelArguments, model_class, **config_overrides):
    """The tokenizer and the model a fine-tuning run starts from.

    Args:
        model_args: the checkpoint (--model_name_or_path, or --config_name / --tokenizer_name), its Hub revision,
            token and cache folder, and the dropout overrides.
        model_class: the head to load, an AlbertHFFor* class; a transformers ALBERT checkpoint is converted on load.
        **config_overrides: config fields set on load (the labels: num_labels, id2label, label2id, ...).

    Returns:
        (tokenizer, model); the tokenizer always returns token_type_ids. A checkpoint that cannot be read, or a
        tokenizer larger than the model's vocabulary, stops with one line naming the argument (InputError).
    """
    hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token)
    flag, tokenizer_name = model_args.source("tokenizer")
    with loading(flag, tokenizer_name):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=model_args.trust_remote_code, **hub)
    check_tokenizer(tokenizer, flag, tokenizer_name)
    if "token_type_ids" not in tokenizer.model_input_names:
        # transformers' AlbertTokenizer leaves them out by default; ALBERT's segment embeddings need them.
        tokenizer.model_input_names = [*tokenizer.model_input_names, "token_type_ids"]
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob"):
        if getattr(model_args, name) is not None:
            config_overrides[name] = getattr(model_args, name)
    flag, config_name = model_args.source("config")
    with loading(flag, config_name):
        config = AlbertHFConfig.from_pretrained(config_name, **config_overrides, **hub)
    with loading("--model_name_or_path", model_args.model_name_or_path):
        model = model_class.from_pretrained(
            model_args.model_name_or_path,
            config=config,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
            **hub,
        )
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
            f"{model.config.vocab_size}: they do not belong together"
        )
    return tokenizer, model


def check_columns(dataset, required, where: str, expected: str = "") -> None:
    """Stop with the file/split and the missing column named, before any preprocessing runs; `expected` says
    what the rows should look like (e.g. " for mrpc (expected [...])")."""
    missing = [name for name in required if name not in dataset.column_names]
    if missing:
        raise InputError(f"{where}: missing column(s) {missing}{expected}; found {dataset.column_names}")


def fit_max_seq_length(data_args, config):
    """The data arguments with `max_seq_length` capped at the model's positions, with a warning, as transformers'
    examples do: a script's default (GLUE 128, SQuAD 384, RACE 512) then works with a model that has fewer.

    Args:
        data_args: a script's data arguments (a dataclass with `max_seq_length`); left as they are.
        config: the model's config.

    Returns:
        `data_args` itself when the length fits, else a copy with the capped length, checked again by its
        `__post_init__`.
    """
    if data_args.max_seq_length <= config.max_position_embeddings:
        return data_args
    logger.warning(
        "--max_seq_length %d is longer than the model's %d positions; using %d",
        data_args.max_seq_length,
        config.max_position_embeddings,
        config.max_position_embeddings,
    )
    return replace(data_args, max_seq_length=config.max_position_embeddings)


def padding_collator(collator_class, tokenizer, pad_to_max_length: bool, half_precision: bool):
    """`default_data_collator` when --pad_to_max_length padded the inputs already, else `collator_class` padding each
    batch to its longest row (to a multiple of 8 in fp16/bf16)."""
    if pad_to_max_length:
        return default_data_collator
    return collator_class(tokenizer, pad_to_multiple_of=8 if half_precision else None)


def limit(dataset, max_samples: int | None):
    return dataset if max_samples is None else dataset.select(range(min(max_samples, len(dataset))))
