"""Token classification features: words split into pieces, each word's tag on its first piece (or on every piece with
--label_all_tokens), the rest ignored by the loss."""

from __future__ import annotations

from .data import IGNORED, NerDataArguments


def continuation_ids(names: tuple[str, ...]) -> list[int]:
    """For --label_all_tokens: the id a word's later pieces get, `I-X` for `B-X` when there is one."""
    ids = {name: i for i, name in enumerate(names)}
    return [ids.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(names)]


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")


def tokenize_splits(
    splits: dict, tokenizer, data_args: NerDataArguments, names: tuple[str, ...], main_process_first
) -> tuple[dict, dict]:
    """(features, inputs) per split: the tokenized sentences with their `first_pieces` (for the metrics and the
    predictions file), and the model's columns only (for Trainer).

    Args:
        splits (`dict`): split -> dataset with `tokens` and, when tagged, `ner_tags` as ids (`encoded_splits`).
        tokenizer (`PreTrainedTokenizerFast`): the model's tokenizer; a fast one, for the word ids.
        data_args (`NerDataArguments`): `max_seq_length`, `pad_to_max_length`, `label_all_tokens`,
            `preprocessing_num_workers` and `overwrite_cache`.
        names (`tuple[str, ...]`): the tags in id order.
        main_process_first (`Callable`): `TrainingArguments.main_process_first`: the main process tokenizes first, the
            others then read its cache.

    Returns:
        `tuple(dict, dict)`: split -> features (the split's columns plus those of `tokenize_function`), and split ->
        inputs (`input_ids`, `attention_mask`, `token_type_ids` and, when tagged, `labels`).
    """
    tokenize = tokenize_function(
        tokenizer, data_args.max_seq_length, data_args.pad_to_max_length, data_args.label_all_tokens, names
    )
    with main_process_first(desc="tokenizing"):
        features = {
            split: dataset.map(
                tokenize,
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Tokenizing {split}",
            )
            for split, dataset in splits.items()
        }
    inputs = {
        split: dataset.remove_columns([c for c in dataset.column_names if c not in MODEL_INPUTS])
        for split, dataset in features.items()
    }
    return features, inputs


def tokenize_function(
    tokenizer, max_seq_length: int, pad_to_max_length: bool, label_all_tokens: bool, names: tuple[str, ...]
):
    """Batched map function: pieces of the pre-split words, `labels` aligned to them (see the module's docstring) when
    the rows have tags, and `first_pieces`, each word's first piece position (-1: not kept).

    Args:
        tokenizer (`PreTrainedTokenizerFast`): the model's tokenizer; a fast one, for the word ids.
        max_seq_length (`int`): the most pieces per sentence, specials included; longer sentences are truncated.
        pad_to_max_length (`bool`): pad every sentence to `max_seq_length`.
        label_all_tokens (`bool`): label a word's later pieces too, a `B-X` tag as `I-X` when that is among `names`.
        names (`tuple[str, ...]`): the tags in id order.

    Returns:
        `Callable`: batch (`tokens` and optional `ner_tags` as ids) -> `input_ids`, `token_type_ids`, `attention_mask`,
        `labels` (tagged rows: the word's tag id on its first piece, -100 on special tokens, padding and, without
        `label_all_tokens`, later pieces) and `first_pieces`.
    """
    continuation = continuation_ids(names)

    def tokenize(batch):
        encoded = tokenizer(
            batch["tokens"],
            is_split_into_words=True,
            truncation=True,
            max_length=max_seq_length,
            padding="max_length" if pad_to_max_length else False,
            return_token_type_ids=True,
        )
        labels, first_pieces = [], []
        for row, tokens in enumerate(batch["tokens"]):
            word_ids = encoded.word_ids(row)
            firsts = [-1] * len(tokens)
            row_labels = []
            previous = None
            for position, word in enumerate(word_ids):
                if word is None:
                    row_labels.append(IGNORED)
                elif word != previous:
                    firsts[word] = position
                    row_labels.append(batch["ner_tags"][row][word] if "ner_tags" in batch else IGNORED)
                else:
                    tag = batch["ner_tags"][row][word] if "ner_tags" in batch else None
                    row_labels.append(continuation[tag] if label_all_tokens and tag is not None else IGNORED)
                previous = word
            labels.append(row_labels)
            first_pieces.append(firsts)
        if "ner_tags" in batch:
            encoded["labels"] = labels
        encoded["first_pieces"] = first_pieces
        return encoded

    return tokenize
