"""The official ALBERT input formatting of a RACE question (race_utils.py in google-research/albert): each option
filled into the question, `[CLS] passage [SEP] question+option [SEP]` per option with the question+option part cut
to --max_qa_length, and the collator of the four choices."""

import logging

from datasets import Dataset
from transformers import DataCollatorForMultipleChoice

from ...errors import InputError
from ..inputs import fit_max_seq_length
from .data import ANSWER_LETTERS, RaceDataArguments

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------------------------
# The official input formatting (race_utils.py in google-research/albert)


def fill_option(question: str, option: str) -> str:
    """RaceProcessor.read_examples: a cloze question gets every `_` replaced by the option, else "question option"."""
    return question.replace("_", option) if "_" in question else question + " " + option


def build_choice_input(passage_ids, qa_ids, cls_id: int, sep_id: int, max_seq_length: int, max_qa_length: int):
    """The model input of one option (official `convert_single_example`): `[CLS] passage [SEP] qa [SEP]`, segments 0
    then 1.

    The qa part keeps its LAST `max_qa_length` tokens, at most `max_seq_length - 4` of them so that one passage
    token always fits (the official code keeps the last max_qa_length, leaves no passage for a qa part of
    max_seq_length - 3 tokens and fails its length check on a longer one); the passage is cut from its end to fit
    what is left.

    Args:
        passage_ids (`list[int]`): the passage's token ids, without special tokens.
        qa_ids (`list[int]`): the question+option's token ids (`fill_option`), without special tokens.
        cls_id (`int`): the [CLS] token id.
        sep_id (`int`): the [SEP] token id.
        max_seq_length (`int`): the longest input, at least 5.
        max_qa_length (`int`): the most tokens the qa part keeps, at least 1.

    Returns:
        `tuple(list[int], list[int])`: (input_ids, token_type_ids), of one length, at most `max_seq_length`, unpadded.

    Raises:
        InputError: `max_seq_length` is below 5.
    """
    if max_seq_length < 5:
        raise InputError(f"max_seq_length {max_seq_length}: [CLS] passage [SEP] qa [SEP] needs at least 5 tokens")
    qa_ids = list(qa_ids[-min(max_qa_length, max_seq_length - 4) :])
    passage_ids = list(passage_ids[: max_seq_length - 3 - len(qa_ids)])
    input_ids = [cls_id, *passage_ids, sep_id, *qa_ids, sep_id]
    token_type_ids = [0] * (len(passage_ids) + 2) + [1] * (len(qa_ids) + 1)
    return input_ids, token_type_ids


def fit_lengths(data_args: RaceDataArguments, config) -> RaceDataArguments:
    """The lengths made to compose: --max_seq_length capped at the model's positions
    (`inputs.fit_max_seq_length`); a --max_qa_length that could leave no passage token in the window is
    named once, since `build_choice_input` then keeps the question+option's last max_seq_length - 4 tokens (a
    warning when the length was given, information for the default, which composes quietly).

    Args:
        data_args: the parsed RACE data arguments; left as they are.
        config: the model's config.

    Returns:
        The data arguments the run uses: `data_args` itself when the length fits, else a checked copy.
    """
    data_args = fit_max_seq_length(data_args, config)
    qa_length = min(data_args.max_qa_length, data_args.max_seq_length - 4)  # build_choice_input's cap
    if qa_length < data_args.max_qa_length:
        explicit = data_args.max_qa_length != RaceDataArguments.max_qa_length
        (logger.warning if explicit else logger.info)(
            "--max_qa_length %d could leave no passage token with --max_seq_length %d: the question+option part keeps "
            "its last %d tokens",
            data_args.max_qa_length,
            data_args.max_seq_length,
            qa_length,
        )
    return data_args


def encode_questions(questions: Dataset, tokenizer, data_args: RaceDataArguments, description: str = "RACE") -> Dataset:
    """The questions tokenized: per question, the 4 inputs (passage, question+option) of `build_choice_input`.

    `data_args.max_seq_length` must fit the model (`fit_lengths`).

    Args:
        questions (`datasets.Dataset`): the questions (`load_race_split`).
        tokenizer (`PreTrainedTokenizerBase`): the model's tokenizer, with [CLS] and [SEP] tokens.
        data_args (`RaceDataArguments`): `max_seq_length`, `max_qa_length`, `preprocessing_num_workers` and
            `overwrite_cache`.
        description (`str`, defaults to `"RACE"`): names the set in the progress bar.

    Returns:
        `datasets.Dataset`: `example_id`, `subset` and `label` kept; `input_ids`, `token_type_ids` and `attention_mask`,
        each 4 unpadded lists per question (`data_collator` pads them).

    Raises:
        InputError: the tokenizer has no [CLS] or [SEP] token.
    """
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None:
        raise InputError("The tokenizer has no [CLS]/[SEP] tokens, which RACE's input format needs")

    def encode(batch):
        # Articles repeat across their questions: tokenize each distinct one once per batch.
        distinct_articles = list(dict.fromkeys(batch["article"]))
        article_ids = dict(
            zip(distinct_articles, tokenizer(distinct_articles, add_special_tokens=False, verbose=False)["input_ids"])
        )
        qa_texts = [
            fill_option(question, option)
            for question, options in zip(batch["question"], batch["options"])
            for option in options
        ]
        qa_ids = tokenizer(qa_texts, add_special_tokens=False, verbose=False)["input_ids"]
        features = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        for row, article in enumerate(batch["article"]):
            choices = [
                build_choice_input(
                    article_ids[article],
                    qa_ids[row * 4 + choice],
                    tokenizer.cls_token_id,
                    tokenizer.sep_token_id,
                    data_args.max_seq_length,
                    data_args.max_qa_length,
                )
                for choice in range(len(ANSWER_LETTERS))
            ]
            features["input_ids"].append([ids for ids, _ in choices])
            features["token_type_ids"].append([types for _, types in choices])
            features["attention_mask"].append([[1] * len(ids) for ids, _ in choices])
        return features

    return questions.map(
        encode,
        batched=True,
        remove_columns=["article", "question", "options"],
        num_proc=data_args.preprocessing_num_workers,
        load_from_cache_file=not data_args.overwrite_cache,
        desc=f"Formatting {description} inputs",
    )


def data_collator(tokenizer, data_args: RaceDataArguments, half_precision: bool = False):
    """Pads the 4 inputs of every question in a batch to one length and stacks them to (batch, 4, length)."""
    if data_args.pad_to_max_length:
        return DataCollatorForMultipleChoice(tokenizer, padding="max_length", max_length=data_args.max_seq_length)
    return DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=8 if half_precision else None)
