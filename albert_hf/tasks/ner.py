"""Token classification (named entities, part-of-speech tags) for run_ner.py: reading, word-to-piece label
alignment, entity metrics and the predictions file.

- Data: CoNLL files (`.conll`, `.txt`, `.iob`, `.bio`: a token and its tag per line, the tag in the last column, a blank
  line between sentences, `-DOCSTART-` lines skipped), `.json`/`.jsonl` rows with a list of tokens and a list of
  tags, or --dataset_name (a Hub dataset, a folder of data files, or a `save_to_disk` folder).
- Tags: a ClassLabel keeps its names and order; otherwise the training tags, `O` first, then sorted.
- Alignment: each word's tag goes to its first SentencePiece piece, the others are ignored (-100), or with
  --label_all_tokens tagged too (a `B-X` continues as `I-X`). Metrics and predictions are per word, from the first
  piece, whichever is used.
- Metrics: seqeval's entity precision, recall and F1 in its default mode, which counts entities as the CoNLL
  evaluation script (conlleval) does and is what transformers' run_ner.py reports: an entity is a maximal span of
  one type, opened by `B-`/`S-`, or by `I-`/`E-` after another type or `O` (IOB1); plus the word accuracy. A tag
  without a prefix (`PER`, or a part-of-speech tag) is scored as the inside of its own type.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Sequence

from ..errors import InputError
from ..hub.model_card import CardDataset, limits, user_data
from ..metrics.ner import entity_scores
from ..runtime.input_files import check_not_empty, read_with_datasets
from .finetuning import SPLIT_FLAGS, limit, save_results
from .seeds import Baseline
from .text_classification import labels_without_training, load_hub_or_folder, reconcile_labels

MAIN_METRIC = "f1"  # over entities (seqeval)
# A model that learned nothing tags every word O (or entities at random): no entity found right.
BASELINE = Baseline(MAIN_METRIC, 0.0, "no entity found")

logger = logging.getLogger(__name__)

CONLL_SUFFIXES = (".conll", ".txt", ".iob", ".bio")
JSON_SUFFIXES = (".json", ".jsonl")
PREDICTIONS_FILE = "predictions.txt"  # transformers' run_ner.py: one sentence per line, its tags space-separated
SPLITS = ("train", "validation", "test")
IGNORED = -100


@dataclass
class NerDataArguments:
    """Data arguments, named as in transformers' run_ner.py."""

    train_file: str | None = field(default=None, metadata={
        "help": "a CoNLL file (.conll/.txt/.iob/.bio) or .json/.jsonl"})
    validation_file: str | None = field(default=None, metadata={"help": "dev data, as --train_file"})
    test_file: str | None = field(default=None, metadata={"help": "test data (its tags, when present, are scored)"})
    dataset_name: str | None = field(default=None, metadata={
        "help": "used when no file is given: a Hub dataset (e.g. conll2003), a folder of data files or a "
        "save_to_disk folder"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "the Hub dataset's config"})
    text_column_name: str = field(default="tokens", metadata={"help": "json/Hub: the column of token lists"})
    label_column_name: str = field(default="ner_tags", metadata={"help": "json/Hub: the column of tag lists"})
    max_seq_length: int = field(default=128, metadata={"help": "pieces per sentence; longer ones are truncated"})
    pad_to_max_length: bool = field(default=False, metadata={"help": "pad every sentence to max_seq_length"})
    label_all_tokens: bool = field(default=False, metadata={
        "help": "train on every piece of a word (B-X continues as I-X), not only on its first piece"})
    return_entity_level_metrics: bool = field(default=False, metadata={
        "help": "also precision/recall/F1 per entity type (e.g. eval_PER_f1)"})
    overwrite_cache: bool = field(default=False, metadata={"help": "recompute the tokenized datasets"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    max_train_samples: int | None = field(default=None, metadata={"help": "keep only the first N train sentences"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "keep only the first N dev sentences"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "keep only the first N test sentences"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "token-classification", "AutoModelForTokenClassification", "run_ner.py"

    def card_tags(self) -> list[str]:
        return []

    def card_dataset(self, wanted) -> CardDataset:
        extra = (f" Sentences of at most {self.max_seq_length} pieces; each word tagged on its "
                 f"{'pieces' if self.label_all_tokens else 'first piece'}.{limits(self, wanted)}")
        return user_data(self, wanted, extra)

    def __post_init__(self):
        files = [name for name in ("train_file", "validation_file", "test_file") if getattr(self, name)]
        if not files and not self.dataset_name:
            raise InputError("no data: pass --train_file / --validation_file / --test_file (CoNLL or json) or "
                             "--dataset_name")
        if files and self.dataset_name:
            raise InputError("pass files (--train_file ...) or --dataset_name, not both")
        for name in files:
            if Path(getattr(self, name)).suffix.lower() not in CONLL_SUFFIXES + JSON_SUFFIXES:
                raise InputError(f"--{name} {getattr(self, name)}: unsupported extension; use a CoNLL file "
                                 f"({', '.join(CONLL_SUFFIXES)}) or {', '.join(JSON_SUFFIXES)}")


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_conll(path) -> Dataset:
    """The sentences of a CoNLL file: a token and its tag per line (the tag in the last whitespace-separated field), a
    blank line between sentences, `-DOCSTART-` lines skipped.

    Args:
        path (`str` or `os.PathLike`): the file (UTF-8; a BOM is dropped).

    Returns:
        `datasets.Dataset`: one row per sentence, `tokens` (`list[str]`) and `ner_tags` (`list[str]`, the tags as
        written); without `ner_tags` when no line has a tag (an unlabelled test file).

    Raises:
        InputError: the file is missing, empty or not UTF-8, has no sentence, or mixes lines with and without a tag.
    """
    path = Path(path)
    check_not_empty(path)
    sentences, tokens, tags, widths = [], [], [], set()
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error})") from None
    for number, line in enumerate(lines + [""], start=1):
        fields = line.split()
        if fields and fields[0] == "-DOCSTART-":
            continue
        if not fields:
            if tokens:
                sentences.append((tokens, tags))
            tokens, tags = [], []
            continue
        widths.add(min(len(fields), 2))
        if len(widths) > 1:
            problem = ("has no tag, where the lines before have one" if len(fields) == 1
                       else "has a tag, where the lines before have none")
            raise InputError(f"{path}: line {number}: {line.strip()!r} {problem} (a token and its tag, separated by "
                             "whitespace)")
        tokens.append(fields[0])
        tags.append(fields[-1])
    if not sentences:
        raise InputError(f"{path}: no sentences")
    columns = {"tokens": [s[0] for s in sentences]}
    if widths == {2}:
        columns["ner_tags"] = [s[1] for s in sentences]
    return Dataset.from_dict(columns)


def read_file(path, text_column: str, label_column: str) -> Dataset:
    path = Path(path)
    if path.suffix.lower() in CONLL_SUFFIXES:
        return read_conll(path)
    return renamed(read_with_datasets(path, "json"), text_column, label_column, str(path))


def renamed(dataset, text_column: str, label_column: str, where: str):
    """The token and tag columns as `tokens` / `ner_tags`; a missing token column stops the run."""
    if text_column not in dataset.column_names:
        raise InputError(f"{where}: no token column {text_column!r} (--text_column_name); found "
                         f"{dataset.column_names}")
    mapping = {text_column: "tokens", label_column: "ner_tags"}
    mapping = {old: new for old, new in mapping.items() if old in dataset.column_names and old != new}
    others = [new for new in mapping.values() if new in dataset.column_names and new not in mapping]
    return dataset.remove_columns(others).rename_columns(mapping)


def load_raw_splits(data_args, needed, cache_dir=None, token=None) -> tuple[DatasetDict, dict]:
    """The splits `needed` asks for and where each came from: --train_file / --validation_file / --test_file when any
    is given, else --dataset_name (`text_classification.load_hub_or_folder`).

    Args:
        data_args (`NerDataArguments`): the data arguments (the files, `dataset_name`, `dataset_config_name`,
            `text_column_name`, `label_column_name`).
        needed (`dict` or `set`): the splits to read, "train", "validation", "test" (`wanted`'s keys).
        cache_dir (`str`, *optional*): the `datasets` cache for a Hub dataset.
        token (`str`, *optional*): the Hub token for a Hub dataset.

    Returns:
        `tuple(DatasetDict, dict)`: the splits, with `tokens` and (optional for a test split) `ner_tags`, the tags not
        yet encoded; and split -> its file or `<dataset>[<split>]`.

    Raises:
        InputError: a needed split has no file or is not in the dataset, a file or the dataset cannot be read, a split
            has no token column, or a train or validation split has no tags.
    """
    splits, sources = DatasetDict(), {}
    files = {split: getattr(data_args, f"{split}_file") for split in SPLITS}
    if any(files.values()):
        for split in sorted(needed):
            if files[split] is None:
                raise InputError(f"{SPLIT_FLAGS[split]} needs {split} data: pass --{split}_file")
            splits[split] = read_file(files[split], data_args.text_column_name, data_args.label_column_name)
            sources[split] = str(files[split])
    else:
        found = load_hub_or_folder(data_args.dataset_name, data_args.dataset_config_name, cache_dir, token)
        for split in sorted(needed):
            if split not in found:
                raise InputError(f"{SPLIT_FLAGS[split]} needs {split} data: --dataset_name {data_args.dataset_name} "
                                 f"has the splits {list(found)}")
            sources[split] = f"{data_args.dataset_name}[{split}]"
            splits[split] = renamed(found[split], data_args.text_column_name, data_args.label_column_name,
                                    sources[split])
    for split, dataset in splits.items():
        if split != "test" and "ner_tags" not in dataset.column_names:
            raise InputError(f"{sources[split]}: no tags (CoNLL: a token and its tag per line; json/Hub: the column "
                             f"{data_args.label_column_name!r}, --label_column_name)")
        logger.info("%s: %d sentences from %s", split, len(dataset), sources[split])
    return splits, sources



# ----------------------------------------------------------------------------------------------------------------
# Tags


def tag_names(dataset: Dataset, where: str) -> tuple[str, ...]:
    """The tags in id order: a ClassLabel's names, else the tags found, `O` first, then sorted."""
    feature = dataset.features["ner_tags"]
    inner = feature.feature if isinstance(feature, Sequence) else getattr(feature, "feature", None)
    if isinstance(inner, ClassLabel):
        return tuple(inner.names)
    found = set()
    for row, (tokens, tags) in enumerate(zip(dataset["tokens"], dataset["ner_tags"])):
        check_row(tokens, tags, row, where)
        found.update(str(tag) for tag in tags)
    return tuple(sorted(found, key=lambda tag: (tag != "O", tag)))


def check_row(tokens, tags, row: int, where: str) -> None:
    if not isinstance(tokens, list) or not all(isinstance(token, str) for token in tokens):
        raise InputError(f"{where}: sentence {row}: the tokens are not a list of strings")
    if not isinstance(tags, list) or len(tags) != len(tokens):
        raise InputError(f"{where}: sentence {row}: {len(tokens)} tokens but "
                         f"{len(tags) if isinstance(tags, list) else 'no list of'} tags")


def encode_tags(dataset: Dataset, names: tuple[str, ...], where: str) -> Dataset:
    """`ner_tags` as ids into `names`; a tag the training data lacks stops the run, naming sentence and tag."""
    feature = dataset.features["ner_tags"]
    inner = feature.feature if isinstance(feature, Sequence) else getattr(feature, "feature", None)
    ids = {name: i for i, name in enumerate(names)}
    encoded = []
    for row, (tokens, tags) in enumerate(zip(dataset["tokens"], dataset["ner_tags"])):
        check_row(tokens, tags, row, where)
        if isinstance(inner, ClassLabel):
            tags = [inner.names[tag] for tag in tags]
        unknown = next((tag for tag in tags if str(tag) not in ids), None)
        if unknown is not None:
            raise InputError(f"{where}: sentence {row}: tag {unknown!r} is not among the training tags {list(names)}")
        encoded.append([ids[str(tag)] for tag in tags])
    return dataset.remove_columns("ner_tags").add_column("ner_tags", encoded)


def continuation_ids(names: tuple[str, ...]) -> list[int]:
    """For --label_all_tokens: the id a word's later pieces get, `I-X` for `B-X` when there is one."""
    ids = {name: i for i, name in enumerate(names)}
    return [ids.get("I-" + name[2:], i) if name.startswith("B-") else i for i, name in enumerate(names)]


def tags_of(raw_splits: DatasetDict, sources: dict, checkpoint_config, config_name: str,
            ignore_mismatched_sizes: bool) -> tuple[str, ...]:
    """The run's tags in id order: the training data's, reconciled with the checkpoint's labels, or without
    training the checkpoint's."""
    if "train" not in raw_splits:
        names = labels_without_training(checkpoint_config, config_name, what="tags")
    else:
        names = reconcile_labels(tag_names(raw_splits["train"], sources["train"]), checkpoint_config, config_name,
                                 sources["train"], ignore_mismatched_sizes, what="tags")
    logger.info("Tags: %s", list(names))
    return names


def encoded_splits(raw_splits: DatasetDict, sources: dict, names: tuple[str, ...], wanted: dict) -> dict:
    """Each split with its tags as ids into `names` (a test split may have none), cut to its max_samples."""
    return {split: limit(encode_tags(dataset, names, sources[split]) if "ner_tags" in dataset.column_names
                         else dataset, wanted[split]) for split, dataset in raw_splits.items()}


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")


def tokenize_splits(splits: dict, tokenizer, data_args: NerDataArguments, names: tuple[str, ...],
                    main_process_first) -> tuple[dict, dict]:
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
    tokenize = tokenize_function(tokenizer, data_args.max_seq_length, data_args.pad_to_max_length,
                                 data_args.label_all_tokens, names)
    with main_process_first(desc="tokenizing"):
        features = {split: dataset.map(tokenize, batched=True, num_proc=data_args.preprocessing_num_workers,
                                       load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenizing {split}")
                    for split, dataset in splits.items()}
    inputs = {split: dataset.remove_columns([c for c in dataset.column_names if c not in MODEL_INPUTS])
              for split, dataset in features.items()}
    return features, inputs


def tokenize_function(tokenizer, max_seq_length: int, pad_to_max_length: bool, label_all_tokens: bool,
                      names: tuple[str, ...]):
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
        encoded = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_seq_length,
                            padding="max_length" if pad_to_max_length else False, return_token_type_ids=True)
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


# ----------------------------------------------------------------------------------------------------------------
# Metrics


def word_tags(logits, first_pieces, names) -> list[list[str]]:
    """Each sentence's predicted tag per word, from its first piece (`O` for words cut off by truncation)."""
    predictions = np.argmax(logits, axis=-1)
    return [[names[predictions[row][position]] if position >= 0 else "O" for position in firsts]
            for row, firsts in enumerate(first_pieces)]


def compute_metrics_function(features: Dataset, names: tuple[str, ...], per_type: bool):
    """Trainer `compute_metrics` for `features` (the evaluation loop keeps their order): scores per word."""
    first_pieces = features["first_pieces"]
    gold = [[names[tag] for tag in tags] for tags in features["ner_tags"]]

    def compute_metrics(eval_prediction):
        logits = eval_prediction.predictions
        logits = logits[0] if isinstance(logits, tuple) else logits
        return entity_scores(gold, word_tags(logits, first_pieces, names), per_type)

    return compute_metrics


def write_predictions(path, logits, first_pieces, names) -> Path:
    """One line per sentence, its words' predicted tags separated by spaces (transformers' run_ner.py)."""
    path = Path(path)
    sentences = word_tags(logits, first_pieces, names)
    cut = sum(position < 0 for firsts in first_pieces for position in firsts)
    if cut:
        logger.warning("%d word(s) beyond --max_seq_length had no piece to tag: written as O in %s", cut, path)
    path.write_text("".join(" ".join(tags) + "\n" for tags in sentences), encoding="utf-8")
    return path


def predict_and_write(trainer, features: Dataset, inputs: Dataset, names: tuple[str, ...], per_type: bool,
                      output_dir) -> dict | None:
    """The test split's predictions file and, when its sentences have tags, its `predict_*` metrics.

    The file is PREDICTIONS_FILE (predictions.txt) in `output_dir`: one line per sentence, its words' predicted tags
    separated by spaces (`O` for words truncation cut off). Sets `trainer.compute_metrics` to this split's
    (None without tags). Every process calls it; only the main process writes the file.

    Args:
        trainer (`trainer.AlbertTrainer`): the run's trainer.
        features (`datasets.Dataset`): the test split's features (`tokenize_splits`), with `first_pieces`.
        inputs (`datasets.Dataset`): its model columns (`tokenize_splits`).
        names (`tuple[str, ...]`): the tags in id order.
        per_type (`bool`): also the scores of each entity type (--return_entity_level_metrics).
        output_dir (`str` or `os.PathLike`): the folder for the predictions file.

    Returns:
        `dict` or `None`: with tags, the `predict_*` metrics and `predict_samples`, as written to predict_results.json
        and all_results.json in the trainer's output_dir; None without.
    """
    labelled = "labels" in features.column_names
    trainer.compute_metrics = compute_metrics_function(features, names, per_type) if labelled else None
    output = trainer.predict(inputs, metric_key_prefix="predict")
    if trainer.is_world_process_zero():
        path = write_predictions(Path(output_dir) / PREDICTIONS_FILE, output.predictions, features["first_pieces"],
                                 names)
        logger.info("test predictions: %s", path)
    return save_results(trainer, "predict", {**output.metrics, "predict_samples": len(features)}) if labelled else None
