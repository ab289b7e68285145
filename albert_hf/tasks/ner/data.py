"""Token classification's data (named entities, part-of-speech tags) for run_ner.py: its arguments, the files read
and the tags encoded. The word-to-piece alignment is in features.py, the entity metrics in definition.py,
the predictions file in evaluation.py.

- Data: CoNLL files (`.conll`, `.txt`, `.iob`, `.bio`: a token and its tag per line, the tag in the last column, a blank
  line between sentences, `-DOCSTART-` lines skipped), `.json`/`.jsonl` rows with a list of tokens and a list of
  tags, or --dataset_name (a Hub dataset, a folder of data files, or a `save_to_disk` folder).
- Tags: a ClassLabel keeps its names and order; otherwise the training tags, `O` first, then sorted.
- Alignment (features.py): each word's tag goes to its first SentencePiece piece, the others are ignored (-100), or with
  --label_all_tokens tagged too (a `B-X` continues as `I-X`). Metrics and predictions are per word, from the first
  piece, whichever is used.
- Metrics (definition.py): seqeval's entity precision, recall and F1 in its default mode, which counts entities as
  the CoNLL evaluation script (conlleval) does and is what transformers' run_ner.py reports: an entity is a maximal
  span of one type, opened by `B-`/`S-`, or by `I-`/`E-` after another type or `O` (IOB1); plus the word accuracy.
  A tag without a prefix (`PER`, or a part-of-speech tag) is scored as the inside of its own type."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from datasets import ClassLabel, Dataset, DatasetDict, Sequence

from ...errors import InputError
from ...hub.model_card import CardDataset, limits, user_data
from ...runtime.input_files import check_not_empty, read_with_datasets
from ..inputs import SPLIT_FLAGS, limit
from ..own_data.data import load_hub_or_folder
from ..own_data.features import labels_without_training, reconcile_labels

logger = logging.getLogger(__name__)

CONLL_SUFFIXES = (".conll", ".txt", ".iob", ".bio")
JSON_SUFFIXES = (".json", ".jsonl")
SPLITS = ("train", "validation", "test")
IGNORED = -100


@dataclass
class NerDataArguments:
    """Data arguments, named as in transformers' run_ner.py."""

    train_file: str | None = field(
        default=None, metadata={"help": "a CoNLL file (.conll/.txt/.iob/.bio) or .json/.jsonl"}
    )
    validation_file: str | None = field(default=None, metadata={"help": "dev data, as --train_file"})
    test_file: str | None = field(default=None, metadata={"help": "test data (its tags, when present, are scored)"})
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "used when no file is given: a Hub dataset (e.g. conll2003), a folder of data files or a "
            "save_to_disk folder"
        },
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "the Hub dataset's config"})
    text_column_name: str = field(default="tokens", metadata={"help": "json/Hub: the column of token lists"})
    label_column_name: str = field(default="ner_tags", metadata={"help": "json/Hub: the column of tag lists"})
    max_seq_length: int = field(default=128, metadata={"help": "pieces per sentence; longer ones are truncated"})
    pad_to_max_length: bool = field(default=False, metadata={"help": "pad every sentence to max_seq_length"})
    label_all_tokens: bool = field(
        default=False,
        metadata={"help": "train on every piece of a word (B-X continues as I-X), not only on its first piece"},
    )
    return_entity_level_metrics: bool = field(
        default=False, metadata={"help": "also precision/recall/F1 per entity type (e.g. eval_PER_f1)"}
    )
    overwrite_cache: bool = field(default=False, metadata={"help": "recompute the tokenized datasets"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    max_train_samples: int | None = field(default=None, metadata={"help": "keep only the first N train sentences"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "keep only the first N dev sentences"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "keep only the first N test sentences"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "token-classification", "AutoModelForTokenClassification", "run_ner.py"

    def card_tags(self) -> list[str]:
        return []

    def card_dataset(self, wanted) -> CardDataset:
        extra = (
            f" Sentences of at most {self.max_seq_length} pieces; each word tagged on its "
            f"{'pieces' if self.label_all_tokens else 'first piece'}.{limits(self, wanted)}"
        )
        return user_data(self, wanted, extra)

    def __post_init__(self):
        files = [name for name in ("train_file", "validation_file", "test_file") if getattr(self, name)]
        if not files and not self.dataset_name:
            raise InputError(
                "no data: pass --train_file / --validation_file / --test_file (CoNLL or json) or --dataset_name"
            )
        if files and self.dataset_name:
            raise InputError("pass files (--train_file ...) or --dataset_name, not both")
        for name in files:
            if Path(getattr(self, name)).suffix.lower() not in CONLL_SUFFIXES + JSON_SUFFIXES:
                raise InputError(
                    f"--{name} {getattr(self, name)}: unsupported extension; use a CoNLL file "
                    f"({', '.join(CONLL_SUFFIXES)}) or {', '.join(JSON_SUFFIXES)}"
                )


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
            problem = (
                "has no tag, where the lines before have one"
                if len(fields) == 1
                else "has a tag, where the lines before have none"
            )
            raise InputError(
                f"{path}: line {number}: {line.strip()!r} {problem} (a token and its tag, separated by whitespace)"
            )
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
        raise InputError(f"{where}: no token column {text_column!r} (--text_column_name); found {dataset.column_names}")
    mapping = {text_column: "tokens", label_column: "ner_tags"}
    mapping = {old: new for old, new in mapping.items() if old in dataset.column_names and old != new}
    others = [new for new in mapping.values() if new in dataset.column_names and new not in mapping]
    return dataset.remove_columns(others).rename_columns(mapping)


def load_raw_splits(data_args, needed, cache_dir=None, token=None) -> tuple[DatasetDict, dict]:
    """The splits `needed` asks for and where each came from: --train_file / --validation_file / --test_file when any
    is given, else --dataset_name (`own_data.data.load_hub_or_folder`).

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
                raise InputError(
                    f"{SPLIT_FLAGS[split]} needs {split} data: --dataset_name {data_args.dataset_name} "
                    f"has the splits {list(found)}"
                )
            sources[split] = f"{data_args.dataset_name}[{split}]"
            splits[split] = renamed(
                found[split], data_args.text_column_name, data_args.label_column_name, sources[split]
            )
    for split, dataset in splits.items():
        if split != "test" and "ner_tags" not in dataset.column_names:
            raise InputError(
                f"{sources[split]}: no tags (CoNLL: a token and its tag per line; json/Hub: the column "
                f"{data_args.label_column_name!r}, --label_column_name)"
            )
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
        raise InputError(
            f"{where}: sentence {row}: {len(tokens)} tokens but "
            f"{len(tags) if isinstance(tags, list) else 'no list of'} tags"
        )


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


def tags_of(
    raw_splits: DatasetDict, sources: dict, checkpoint_config, config_name: str, ignore_mismatched_sizes: bool
) -> tuple[str, ...]:
    """The run's tags in id order: the training data's, reconciled with the checkpoint's labels, or without
    training the checkpoint's."""
    if "train" not in raw_splits:
        names = labels_without_training(checkpoint_config, config_name, what="tags")
    else:
        names = reconcile_labels(
            tag_names(raw_splits["train"], sources["train"]),
            checkpoint_config,
            config_name,
            sources["train"],
            ignore_mismatched_sizes,
            what="tags",
        )
    logger.info("Tags: %s", list(names))
    return names


def encoded_splits(raw_splits: DatasetDict, sources: dict, names: tuple[str, ...], wanted: dict) -> dict:
    """Each split with its tags as ids into `names` (a test split may have none), cut to its max_samples."""
    return {
        split: limit(
            encode_tags(dataset, names, sources[split]) if "ner_tags" in dataset.column_names else dataset,
            wanted[split],
        )
        for split, dataset in raw_splits.items()
    }


# ----------------------------------------------------------------------------------------------------------------
# Metrics
