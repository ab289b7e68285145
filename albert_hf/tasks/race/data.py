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

from datasets import Dataset, load_dataset

from ...errors import InputError, datasets_read_errors, input_errors
from ...hub.model_card import CardDataset, from_sources, hub_dataset_id, limits
from ...runtime.input_files import check_json_start
from ..inputs import check_columns

logger = logging.getLogger(__name__)

ANSWER_LETTERS = "ABCD"
SUBSETS = ("middle", "high")  # the official code reads middle, then high
OFFICIAL_SPLIT_FOLDERS = {"train": "train", "validation": "dev", "test": "test"}
ARTICLE_FIELDS = ("id", "article", "questions", "options", "answers")  # official RACE JSON
FLAT_FIELDS = ("example_id", "article", "question", "options", "answer")  # the Hub's `race` dataset
FLAT_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet"}


@dataclass
class RaceDataArguments:
    """Where the RACE data comes from and how it is turned into model inputs (official defaults)."""

    dataset_name: str | None = field(
        default=None, metadata={"help": "Hub dataset with RACE's flattened fields, e.g. ehovy/race (needs network)"}
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "the official layout: a folder holding {train,dev,test}/{high,middle}/*.txt "
            "(or holding RACE/ with them)"
        },
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
        default="v2",
        metadata={
            "help": "the RACE row --paper_hparams applies: v2 for ALBERT v2 models (official "
            "run_race.py: lr 1e-5, dropout 0) or v1 for v1 models (the paper: lr 2e-5, "
            "dropout 0.1; it makes v2 models diverge)"
        },
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
        extra = (
            f" Inputs: at most {self.max_seq_length} tokens, the question and option keeping their last "
            f"{self.max_qa_length}.{limits(self, wanted)}"
        )
        return from_sources(name, sources, self.subset, extra)

    def __post_init__(self):
        if self.dataset_name and self.data_dir:
            raise InputError("Give either --dataset_name or --data_dir, not both")
        # [CLS] passage [SEP] qa [SEP]: a longer qa part is capped (encode_questions) so that one passage token fits.
        if self.max_seq_length < 5:
            raise InputError(
                f"--max_seq_length {self.max_seq_length} is too short for RACE: [CLS] passage [SEP] "
                "question+option [SEP] needs at least 5 tokens (--max_qa_length is capped at "
                "max_seq_length - 4 to leave the passage one)"
            )
        if self.max_qa_length < 1:
            raise InputError(f"--max_qa_length {self.max_qa_length}: the question+option part needs at least 1 token")


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
    return {
        "example_id": f"{article_id}-{question_index}",
        "subset": subset,
        "article": article,
        "question": question,
        "options": list(options),
        "label": ANSWER_LETTERS.index(answer.strip()),
    }


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
        raise InputError(
            f"{where}: {len(questions)} questions, {len(options)} option lists and "
            f"{len(answers)} answers; they must match"
        )
    subset = subset or subset_from_id(record["id"])
    return [
        question_row(
            f"{where} question {i}", record["id"], i, subset, record["article"], questions[i], options[i], answers[i]
        )
        for i in range(len(questions))
    ]


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
    paths = sorted(
        p for p in folder.rglob("*") if p.suffix in (".txt", ".json") and p.is_file() and not p.name.startswith(".")
    )
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
                raise InputError(
                    f"{level_dir}: missing (the official RACE layout is "
                    "{train,dev,test}/{high,middle}/*.txt; use --subset for one level)"
                )
            level_rows = read_article_folder(level_dir)
            for row in level_rows:  # the folder, not the id, says which level a question is
                row["subset"] = level
            rows.extend(level_rows)
    return rows


def flat_rows_to_questions(dataset: Dataset, where: str, subset_hint: str = "") -> Dataset:
    """Hub-style rows (one question each, `example_id` = the article id) -> the question rows.

    The question index is the row's position among its article's rows, which the Hub keeps in the file's order.
    """
    check_columns(
        dataset,
        FLAT_FIELDS,
        where,
        f"; RACE rows have {list(FLAT_FIELDS)} (or the official article fields {list(ARTICLE_FIELDS)})",
    )
    seen = Counter()
    question_index = []
    for article_id in dataset["example_id"]:
        question_index.append(seen[article_id])
        seen[article_id] += 1
    dataset = dataset.add_column("_question_index", question_index)

    def convert(batch, indices):
        rows = [
            question_row(
                f"{where} row {index}",
                article_id,
                number,
                subset_hint or subset_from_id(article_id),
                article,
                question,
                options,
                answer,
            )
            for index, article_id, number, article, question, options, answer in zip(
                indices,
                batch["example_id"],
                batch["_question_index"],
                batch["article"],
                batch["question"],
                batch["options"],
                batch["answer"],
            )
        ]
        return {name: [row[name] for row in rows] for name in rows[0]} if rows else {}

    return dataset.map(
        convert, batched=True, with_indices=True, remove_columns=dataset.column_names, desc=f"Checking {where}"
    )


def read_flat_file(path: Path, cache_dir: str | None = None) -> Dataset:
    """A .json/.jsonl/.parquet file of Hub-style rows, or of official articles (one JSON object per line)."""
    builder = FLAT_FILE_BUILDERS.get(path.suffix)
    if builder is None:
        raise InputError(
            f"{path}: unsupported file type; give a folder of RACE article files or a "
            f"{'/'.join(FLAT_FILE_BUILDERS)} file"
        )
    if builder == "json":
        check_json_start(path)
    with input_errors(f"{path}: cannot be read as RACE rows ({builder})", *datasets_read_errors()):
        dataset = load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir)
    if "questions" in dataset.column_names:  # official article records
        rows = [
            row for index, record in enumerate(dataset) for row in article_rows(record, f"{path} line {index + 1}", "")
        ]
        return questions_dataset(rows)
    return flat_rows_to_questions(dataset, str(path))


def questions_dataset(rows: list[dict]) -> Dataset:
    """The question rows as a Dataset (with its columns even when there are none)."""
    if rows:
        return Dataset.from_list(rows)
    return Dataset.from_dict(
        {"example_id": [], "subset": [], "article": [], "question": [], "options": [], "label": []}
    )


def select_subset(questions: Dataset, subset: str, where: str) -> Dataset:
    """Keep one level; questions whose level is unknown stop the run rather than being silently kept or dropped."""
    if subset == "all":
        return questions
    unknown = sum(1 for level in questions["subset"] if not level)
    if unknown:
        raise InputError(
            f"{where}: --subset {subset} needs each question's level, but {unknown} question(s) have "
            "neither a high/ or middle/ folder nor an article id starting with high/middle"
        )
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
    explicit = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}[
        split
    ]
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
        questions = flat_rows_to_questions(
            hub, f"{source}/{data_args.subset} {split}", "" if data_args.subset == "all" else data_args.subset
        )
    questions = select_subset(questions, data_args.subset, source)
    if len(questions) == 0:
        raise InputError(f"{source}: no RACE questions for the {split} split (subset {data_args.subset})")
    levels = Counter(questions["subset"])
    logger.info(
        "RACE %s: %d questions from %s (high %d, middle %d, level unknown %d)",
        split,
        len(questions),
        source,
        levels["high"],
        levels["middle"],
        levels[""],
    )
    return questions
