"""RACE (Lai et al., 2017) for run_race.py: reading the data, the official ALBERT input formatting, accuracy.

Three ways in, all turned into one row per question with the columns
`example_id` (`<article id>-<question index>`, e.g. `high132.txt-0`), `subset` ("high", "middle" or "" when
unknown), `article`, `question`, `options` (4 strings) and `label` (0-3 for A-D):

- the official layout, `--data_dir RACE` with `RACE/{train,dev,test}/{high,middle}/*.txt`, one JSON article per
  file with the fields `id`, `article`, `questions`, `options`, `answers` (the subset is the folder name);
- `--train_file/--validation_file/--test_file` naming a folder of such JSON article files (*.txt or *.json, any
  depth; the subset is a `high`/`middle` folder on the way, else the `high`/`middle` prefix of the article id);
  or a .json/.jsonl/.parquet file holding either the Hub's flattened rows (`example_id`, `article`, `question`,
  `options`, `answer`; the subset is the `high`/`middle` prefix of `example_id`, which is the article file name)
  or articles in the official fields, one per line;
- `--dataset_name ehovy/race` (or `race`) from the Hub, with `--subset` as the config name.

The questions of one article keep their order in every format, so `<article id>-<i>` names the same question
whichever way it was read.
"""

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from datasets import Dataset, load_dataset
from transformers import DataCollatorForMultipleChoice

from ..errors import InputError, datasets_read_errors, input_errors
from ..hub.model_card import CardDataset, from_sources, hub_dataset_id, limits
from ..runtime.input_files import check_json_start
from .finetuning import check_columns, fit_max_seq_length
from .recipe import OFFICIAL_FINETUNING, best_on_dev
from .seeds import Baseline

logger = logging.getLogger("albert_hf.tasks.race")

ANSWER_LETTERS = "ABCD"
SUBSETS = ("middle", "high")  # the official code reads middle, then high
OFFICIAL_SPLIT_FOLDERS = {"train": "train", "validation": "dev", "test": "test"}
ARTICLE_FIELDS = ("id", "article", "questions", "options", "answers")  # official RACE JSON
FLAT_FIELDS = ("example_id", "article", "question", "options", "answer")  # the Hub's `race` dataset
FLAT_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}

# The RACE rows of the recipe (docs/official_recipe.md). v2 models: the official run_race.py defaults and README
# (lr 1e-5, the v2 configs' dropout 0); v1 models: the paper's Table 14 (lr 2e-5, dropout 0.1), which the official
# README warns makes v2 models diverge. Both: total batch 32, 12000 steps, 1000 warm-up, 512 tokens with the
# question+option part at 128, head dropout 0.1 (run_race.py's dropout_prob), the official optimizer.
PAPER_HPARAMS = {
    "v2": dict(learning_rate=1e-5, albert_dropout=0.0),
    "v1": dict(learning_rate=2e-5, albert_dropout=0.1),
}
PAPER_COMMON = dict(batch_size=32, max_steps=12000, warmup_steps=1000, max_seq_length=512, max_qa_length=128,
                    classifier_dropout_prob=0.1, **OFFICIAL_FINETUNING, **best_on_dev(1000))
MAIN_METRIC = "accuracy"
# Every RACE question has four options: a model that learned nothing is right one time in four.
BASELINE = Baseline(MAIN_METRIC, 0.25, "chance (1 of 4 options)")


@dataclass
class RaceDataArguments:
    """Where the RACE data comes from and how it is turned into model inputs (official defaults)."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset with RACE's flattened fields, e.g. ehovy/race (needs network)"}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "the official layout: a folder holding {train,dev,test}/{high,middle}/*.txt "
                                        "(or holding RACE/ with them)"}
    )
    train_file: str | None = field(
        default=None, metadata={"help": "a folder of RACE JSON articles, or a .json/.jsonl/.parquet file of RACE rows"}
    )
    validation_file: str | None = field(default=None, metadata={"help": "as --train_file, evaluated with --do_eval"})
    test_file: str | None = field(default=None, metadata={"help": "as --train_file, evaluated with --do_predict"})
    subset: Literal["all", "high", "middle"] = field(
        default="all", metadata={"help": "RACE-H, RACE-M or both (official: both, concatenated)"}
    )
    max_seq_length: int = field(default=512, metadata={"help": "tokens per (passage, question+option) input"})
    max_qa_length: int = field(
        default=128, metadata={"help": "question+option keeps its LAST this many tokens (official: 128)"}
    )
    pad_to_max_length: bool = field(
        default=False, metadata={"help": "pad every input to max_seq_length (default: to the longest in the batch)"}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N train questions"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N validation questions"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "use only the first N test questions"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for tokenization"})
    overwrite_cache: bool = field(default=False, metadata={"help": "recompute cached tokenized datasets"})
    race_recipe: Literal["v2", "v1"] = field(
        default="v2", metadata={"help": "the RACE row --paper_hparams applies: v2 for ALBERT v2 models (official "
                                        "run_race.py: lr 1e-5, dropout 0) or v1 for v1 models (the paper: lr 2e-5, "
                                        "dropout 0.1; it makes v2 models diverge)"}
    )

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "multiple-choice", "AutoModelForMultipleChoice", "run_race.py"

    def card_tags(self) -> list[str]:
        return ["race"]

    def card_dataset(self, wanted) -> CardDataset:
        name = {"all": "RACE", "high": "RACE-H", "middle": "RACE-M"}[self.subset]
        sources = {}
        for split in wanted:
            path = getattr(self, f"{split}_file", None)
            if path:  # folders or files of RACE-format articles or rows: not necessarily RACE's own split
                sources[split] = (None, f"`{Path(path).name}`")
            elif self.data_dir:  # the official layout, {train,dev,test}/{high,middle}/*.txt
                sources[split] = ("ehovy/race", f"the official layout in `{Path(self.data_dir).name}`")
            elif self.dataset_name:
                hub_id = hub_dataset_id(self.dataset_name)
                sources[split] = (hub_id, f"the Hub's {hub_id}")
        extra = (f" Inputs: at most {self.max_seq_length} tokens, the question and option keeping their last "
                 f"{self.max_qa_length}.{limits(self, wanted)}")
        return from_sources(name, sources, self.subset, extra)

    def __post_init__(self):
        if self.dataset_name and self.data_dir:
            raise InputError("Give either --dataset_name or --data_dir, not both")
        # [CLS] passage [SEP] qa [SEP]: a longer qa part is capped (encode_questions) so that one passage token fits.
        if self.max_seq_length < 5:
            raise InputError(f"--max_seq_length {self.max_seq_length} is too short for RACE: [CLS] passage [SEP] "
                             "question+option [SEP] needs at least 5 tokens (--max_qa_length is capped at "
                             "max_seq_length - 4 to leave the passage one)")
        if self.max_qa_length < 1:
            raise InputError(f"--max_qa_length {self.max_qa_length}: the question+option part needs at least 1 token")


def paper_recipe(data_args: RaceDataArguments) -> tuple[str, dict]:
    """(name, recipe) of the --race_recipe row, for `recipe.apply_paper_hparams`."""
    row = data_args.race_recipe
    return f"RACE, {row} models", {**PAPER_HPARAMS[row], **PAPER_COMMON}


# ----------------------------------------------------------------------------------------------------------------
# Reading: every format -> one row per question


def question_row(where: str, article_id, question_index: int, subset: str, article, question, options, answer):
    """One validated question; `where` (file and position) is named in every error."""
    if not isinstance(article, str) or not isinstance(question, str):
        raise InputError(f"{where}: 'article' and 'question' must be strings")
    if not isinstance(options, (list, tuple)) or len(options) != len(ANSWER_LETTERS):
        count = len(options) if isinstance(options, (list, tuple)) else type(options).__name__
        raise InputError(f"{where}: {count} options; RACE questions have exactly 4 (A-D)")
    if not all(isinstance(option, str) for option in options):
        raise InputError(f"{where}: every option must be a string")
    if not isinstance(answer, str) or answer.strip() not in tuple(ANSWER_LETTERS):
        raise InputError(f"{where}: answer {answer!r} is not one of A, B, C, D")
    return {"example_id": f"{article_id}-{question_index}", "subset": subset, "article": article,
            "question": question, "options": list(options), "label": ANSWER_LETTERS.index(answer.strip())}


def article_rows(record, where: str, subset: str):
    """The questions of one article in the official JSON fields, in order."""
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with the fields {list(ARTICLE_FIELDS)}")
    missing = [name for name in ARTICLE_FIELDS if record.get(name) is None]  # JSON lines fill gaps with None
    if missing:
        raise InputError(f"{where}: missing field(s) {missing}; RACE articles have {list(ARTICLE_FIELDS)}")
    questions, options, answers = record["questions"], record["options"], record["answers"]
    if not (isinstance(questions, list) and isinstance(options, list) and isinstance(answers, list)):
        raise InputError(f"{where}: 'questions', 'options' and 'answers' must be lists")
    if not len(questions) == len(options) == len(answers):
        raise InputError(f"{where}: {len(questions)} questions, {len(options)} option lists and "
                         f"{len(answers)} answers; they must match")
    subset = subset or subset_from_id(record["id"])
    return [question_row(f"{where} question {i}", record["id"], i, subset, record["article"], questions[i],
                         options[i], answers[i]) for i in range(len(questions))]


def subset_from_id(article_id) -> str:
    """`high132.txt` -> "high"; ids without the official prefix give "" (unknown)."""
    for subset in SUBSETS:
        if str(article_id).startswith(subset):
            return subset
    return ""


def read_article_folder(folder: Path, subset: str = "all") -> list[dict]:
    """Every *.txt / *.json article file under `folder`, as the official RaceProcessor.read_examples reads them.

    A `high`/`middle` folder on the way gives the subset (official layout); files in the other subset's folder are
    not read at all, as with the official `high_only`/`middle_only`.
    """
    paths = sorted(p for p in folder.rglob("*") if p.suffix in (".txt", ".json") and p.is_file()
                   and not p.name.startswith("."))
    if not paths:
        raise InputError(f"{folder}: no RACE article files (*.txt or *.json) found")
    rows = []
    for path in paths:
        folder_subset = next((part for part in path.relative_to(folder).parts[:-1] if part in SUBSETS), "")
        if subset != "all" and folder_subset and folder_subset != subset:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InputError(f"{path}: not a RACE JSON article ({error})") from None
        rows.extend(article_rows(record, str(path), folder_subset))
    return rows


def read_official_split(data_dir: Path, split: str, subset: str) -> list[dict]:
    """`<data_dir>/{train,dev,test}/{middle,high}/*.txt`, the folders the official run_race.py reads."""
    if not (data_dir / "train").is_dir() and not (data_dir / "dev").is_dir() and (data_dir / "RACE").is_dir():
        data_dir = data_dir / "RACE"  # the official --data_dir is the folder that holds RACE/
    rows = []
    for level in SUBSETS:
        if subset in ("all", level):
            level_dir = data_dir / OFFICIAL_SPLIT_FOLDERS[split] / level
            if not level_dir.is_dir():
                raise InputError(f"{level_dir}: missing (the official RACE layout is "
                                        "{train,dev,test}/{high,middle}/*.txt; use --subset for one level)")
            level_rows = read_article_folder(level_dir)
            for row in level_rows:  # the folder, not the id, says which level a question is
                row["subset"] = level
            rows.extend(level_rows)
    return rows


def flat_rows_to_questions(dataset: Dataset, where: str, subset_hint: str = "") -> Dataset:
    """Hub-style rows (one question each, `example_id` = the article id) -> the question rows.

    The question index is the row's position among its article's rows, which the Hub keeps in the file's order.
    """
    check_columns(dataset, FLAT_FIELDS, where, f"; RACE rows have {list(FLAT_FIELDS)} (or the official article "
                  f"fields {list(ARTICLE_FIELDS)})")
    seen = Counter()
    question_index = []
    for article_id in dataset["example_id"]:
        question_index.append(seen[article_id])
        seen[article_id] += 1
    dataset = dataset.add_column("_question_index", question_index)

    def convert(batch, indices):
        rows = [question_row(f"{where} row {index}", article_id, number, subset_hint or subset_from_id(article_id),
                             article, question, options, answer)
                for index, article_id, number, article, question, options, answer in zip(
                    indices, batch["example_id"], batch["_question_index"], batch["article"], batch["question"],
                    batch["options"], batch["answer"])]
        return {name: [row[name] for row in rows] for name in rows[0]} if rows else {}

    return dataset.map(convert, batched=True, with_indices=True, remove_columns=dataset.column_names,
                       desc=f"Checking {where}")


def read_flat_file(path: Path, cache_dir: str | None = None) -> Dataset:
    """A .json/.jsonl/.parquet file of Hub-style rows, or of official articles (one JSON object per line)."""
    builder = FLAT_FILE_BUILDERS.get(path.suffix)
    if builder is None:
        raise InputError(f"{path}: unsupported file type; give a folder of RACE article files or a "
                         f"{'/'.join(FLAT_FILE_BUILDERS)} file")
    if builder == "json":
        check_json_start(path)
    with input_errors(f"{path}: cannot be read as RACE rows ({builder})", *datasets_read_errors()):
        dataset = load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir)
    if "questions" in dataset.column_names:  # official article records
        rows = [row for index, record in enumerate(dataset)
                for row in article_rows(record, f"{path} line {index + 1}", "")]
        return questions_dataset(rows)
    return flat_rows_to_questions(dataset, str(path))


def questions_dataset(rows: list[dict]) -> Dataset:
    """The question rows as a Dataset (with its columns even when there are none)."""
    if rows:
        return Dataset.from_list(rows)
    return Dataset.from_dict({"example_id": [], "subset": [], "article": [], "question": [], "options": [],
                              "label": []})


def select_subset(questions: Dataset, subset: str, where: str) -> Dataset:
    """Keep one level; questions whose level is unknown stop the run rather than being silently kept or dropped."""
    if subset == "all":
        return questions
    unknown = sum(1 for level in questions["subset"] if not level)
    if unknown:
        raise InputError(f"{where}: --subset {subset} needs each question's level, but {unknown} question(s) have "
                         "neither a high/ or middle/ folder nor an article id starting with high/middle")
    return questions.filter(lambda level: level == subset, input_columns="subset")


def load_race_split(data_args: RaceDataArguments, split: str, cache_dir=None, token=None) -> Dataset:
    """The questions of one split, from its --*_file, else --data_dir (the official layout), else --dataset_name.

    A --*_file is a folder of JSON article files or a .json/.jsonl/.parquet file (see the module's docstring);
    --data_dir reads the article files in `{train,dev,test}/{middle,high}/` (dev for "validation"); a Hub dataset is
    loaded with --subset as its config. The questions are then narrowed to --subset.

    Args:
        data_args (`RaceDataArguments`): the data arguments (the files, `data_dir`, `dataset_name`, `subset`).
        split (`str`): "train", "validation" or "test".
        cache_dir (`str`, *optional*): the `datasets` cache, for a data file or the Hub dataset.
        token (`str`, *optional*): the Hub token for the Hub dataset.

    Returns:
        `datasets.Dataset`: one row per question, with `example_id`, `subset`, `article`, `question`, `options` (4
        strings) and `label` (0-3).

    Raises:
        InputError: the split has no source, a file or folder is missing or not RACE data, --subset needs a level a
            question lacks, or no question is left.
    """
    explicit = {"train": data_args.train_file, "validation": data_args.validation_file,
                "test": data_args.test_file}[split]
    source = explicit or data_args.data_dir or data_args.dataset_name
    if source is None:
        raise InputError(f"No data for the {split} split: give --data_dir, --dataset_name or --{split}_file")
    path = Path(source)
    if explicit and path.is_dir():
        questions = questions_dataset(read_article_folder(path, data_args.subset))
    elif explicit and path.is_file():
        questions = read_flat_file(path, cache_dir)
    elif explicit:
        raise InputError(f"{source}: no such file or folder (--{split}_file)")
    elif data_args.data_dir:
        if not path.is_dir():
            raise InputError(f"{source}: no such folder (--data_dir)")
        questions = questions_dataset(read_official_split(path, split, data_args.subset))
    else:
        # The Hub's configs are the subsets (all, high, middle); its splits are train/validation/test.
        hub = load_dataset(source, data_args.subset, split=split, cache_dir=cache_dir, token=token)
        questions = flat_rows_to_questions(hub, f"{source}/{data_args.subset} {split}",
                                           "" if data_args.subset == "all" else data_args.subset)
    questions = select_subset(questions, data_args.subset, source)
    if len(questions) == 0:
        raise InputError(f"{source}: no RACE questions for the {split} split (subset {data_args.subset})")
    levels = Counter(questions["subset"])
    logger.info("RACE %s: %d questions from %s (high %d, middle %d, level unknown %d)", split, len(questions),
                source, levels["high"], levels["middle"], levels[""])
    return questions


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
    qa_ids = list(qa_ids[-min(max_qa_length, max_seq_length - 4):])
    passage_ids = list(passage_ids[:max_seq_length - 3 - len(qa_ids)])
    input_ids = [cls_id, *passage_ids, sep_id, *qa_ids, sep_id]
    token_type_ids = [0] * (len(passage_ids) + 2) + [1] * (len(qa_ids) + 1)
    return input_ids, token_type_ids


def fit_lengths(data_args: RaceDataArguments, config) -> RaceDataArguments:
    """The lengths made to compose: --max_seq_length capped at the model's positions
    (`finetuning.fit_max_seq_length`); a --max_qa_length that could leave no passage token in the window is
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
            "its last %d tokens", data_args.max_qa_length, data_args.max_seq_length, qa_length)
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
        article_ids = dict(zip(distinct_articles,
                               tokenizer(distinct_articles, add_special_tokens=False, verbose=False)["input_ids"]))
        qa_texts = [fill_option(question, option)
                    for question, options in zip(batch["question"], batch["options"]) for option in options]
        qa_ids = tokenizer(qa_texts, add_special_tokens=False, verbose=False)["input_ids"]
        features = {"input_ids": [], "token_type_ids": [], "attention_mask": []}
        for row, article in enumerate(batch["article"]):
            choices = [build_choice_input(article_ids[article], qa_ids[row * 4 + choice], tokenizer.cls_token_id,
                                          tokenizer.sep_token_id, data_args.max_seq_length, data_args.max_qa_length)
                       for choice in range(len(ANSWER_LETTERS))]
            features["input_ids"].append([ids for ids, _ in choices])
            features["token_type_ids"].append([types for _, types in choices])
            features["attention_mask"].append([[1] * len(ids) for ids, _ in choices])
        return features

    return questions.map(encode, batched=True, remove_columns=["article", "question", "options"],
                         num_proc=data_args.preprocessing_num_workers,
                         load_from_cache_file=not data_args.overwrite_cache, desc=f"Formatting {description} inputs")


def data_collator(tokenizer, data_args: RaceDataArguments, half_precision: bool = False):
    """Pads the 4 inputs of every question in a batch to one length and stacks them to (batch, 4, length)."""
    if data_args.pad_to_max_length:
        return DataCollatorForMultipleChoice(tokenizer, padding="max_length", max_length=data_args.max_seq_length)
    return DataCollatorForMultipleChoice(tokenizer, pad_to_multiple_of=8 if half_precision else None)


# ----------------------------------------------------------------------------------------------------------------
# Metrics and predictions


def accuracy_by_subset(predicted, labels, subsets) -> dict:
    """Accuracy overall and, for the levels present, per level (the paper reports RACE-M, RACE-H and RACE)."""
    predicted, labels, subsets = np.asarray(predicted), np.asarray(labels), np.asarray(subsets, dtype=object)
    correct = predicted == labels
    metrics = {"accuracy": float(correct.mean())}
    for level in ("high", "middle"):
        chosen = subsets == level
        if chosen.any():
            metrics[f"accuracy_{level}"] = float(correct[chosen].mean())
            metrics[f"num_{level}"] = int(chosen.sum())
    return metrics


def compute_accuracy(eval_prediction) -> dict:
    """Trainer's compute_metrics (used for evaluations during training and best-checkpoint selection)."""
    return {"accuracy": float((eval_prediction.predictions.argmax(-1) == eval_prediction.label_ids).mean())}


def evaluate_and_write_predictions(trainer, split: str, dataset: Dataset, prefix: str = "eval") -> dict:
    """`finetuning.evaluate_splits`' callback for RACE: the metrics of one set, and its chosen letters in
    `predictions_<split>.json` in the trainer's output_dir (question id -> "A" to "D").

    Every process calls it (`Trainer.predict` is distributed); only the main process writes the file.

    Args:
        trainer (`trainer.AlbertTrainer`): the run's trainer.
        split (`str`): the set's name, in the file's name: "validation" or "test".
        dataset (`datasets.Dataset`): its encoded questions (`encode_questions`), with `example_id`, `subset` and
            `label`.
        prefix (`str`, defaults to `"eval"`): the metric keys' prefix: "eval" (dev set) or "predict" (test set).

    Returns:
        `dict`: `Trainer.predict`'s metrics (`<prefix>_loss`, `<prefix>_accuracy`, runtime) with the accuracy per
        level present, `<prefix>_accuracy_high` / `<prefix>_accuracy_middle`, and their counts `<prefix>_num_high` /
        `<prefix>_num_middle`. `evaluate_splits` writes them.
    """
    output = trainer.predict(dataset, metric_key_prefix=prefix)
    predicted = output.predictions.argmax(-1)
    metrics = dict(output.metrics)
    metrics.update({f"{prefix}_{name}": value for name, value in
                    accuracy_by_subset(predicted, dataset["label"], dataset["subset"]).items()})
    if trainer.is_world_process_zero():
        letters = {example_id: ANSWER_LETTERS[choice] for example_id, choice in zip(dataset["example_id"], predicted)}
        path = Path(trainer.args.output_dir) / f"predictions_{split}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(letters, indent=2) + "\n")
    return metrics
