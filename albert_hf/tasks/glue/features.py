"""run_glue.py's features: one text or a pair of texts tokenized into the model's inputs, for a GLUE task or the user's
own data."""

from __future__ import annotations

from .data import GlueDataArguments
from .definition import GlueTask


def tokenize_function(tokenizer, task: GlueTask, max_seq_length: int, pad_to_max_length: bool):
    """Batched map function: `[CLS] a [SEP] (b [SEP])` with segment ids 0/1, truncating the longer side first
    (the official `_truncate_seq_pair`, which pops from the end of whichever side is longer)."""

    def tokenize(batch):
        texts = [["" if text is None else text for text in batch[column]] for column in task.text_columns]
        return tokenizer(
            *texts,
            truncation="longest_first",
            max_length=max_seq_length,
            padding="max_length" if pad_to_max_length else False,
            return_token_type_ids=True,
        )

    return tokenize


def tokenize_splits(splits: dict, tokenizer, task: GlueTask, data_args: GlueDataArguments, main_process_first) -> dict:
    """Each split tokenized (`tokenize_function`), with its `label` column only besides the model's inputs.

    Args:
        splits (`dict`): split -> prepared dataset (`task_and_splits`).
        tokenizer (`PreTrainedTokenizerBase`): the model's tokenizer.
        task (`GlueTask` or `own_data.definition.OwnTask`): the text columns.
        data_args (`GlueDataArguments`): `max_seq_length`, `pad_to_max_length`, `preprocessing_num_workers` and
            `overwrite_cache`.
        main_process_first (`Callable`): `TrainingArguments.main_process_first`: the main process tokenizes first, the
            others then read its cache.

    Returns:
        `dict`: split -> `datasets.Dataset` with `input_ids`, `token_type_ids`, `attention_mask` and, when the split
        has one, `label`.
    """
    tokenize = tokenize_function(tokenizer, task, data_args.max_seq_length, data_args.pad_to_max_length)
    with main_process_first(desc="tokenizing"):
        return {
            split: dataset.map(
                tokenize,
                batched=True,
                num_proc=data_args.preprocessing_num_workers,
                remove_columns=[c for c in dataset.column_names if c != "label"],
                load_from_cache_file=not data_args.overwrite_cache,
                desc=f"Tokenizing {split}",
            )
            for split, dataset in splits.items()
        }
