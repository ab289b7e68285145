"""Inputs several test files share: the embedded corpus, its tokenizer and pairs (plain functions, cached per
session: pytest fixtures imported into several modules would be built once per module), and the synthetic files of
the fine-tuning tests (reviews of a user's own data, RACE, SQuAD)."""

from __future__ import annotations

import csv
import functools
import json
import random
from pathlib import Path

TEST_VOCAB_SIZE = 1000


@functools.lru_cache(maxsize=None)
def embedded():
    from albert_hf.pretraining.data.embedded_corpus import embedded_corpus

    return embedded_corpus()


@functools.lru_cache(maxsize=None)
def tokenizer():
    """A 1000-piece ALBERT tokenizer trained on the embedded corpus (cached on disk too)."""
    from albert_hf.tokenization import train_tokenizer

    return train_tokenizer(embedded(), vocab_size=TEST_VOCAB_SIZE)


@functools.lru_cache(maxsize=None)
def tokenized_embedded():
    from albert_hf.pretraining.data.sentences import tokenize_documents

    return tokenize_documents(embedded(), tokenizer())


@functools.lru_cache(maxsize=None)
def embedded_pairs(max_seq_length: int = 128, dupe_factor: int = 1, task: str = "sop"):
    from albert_hf.pretraining.data.pairs import create_pretraining_pairs

    return create_pretraining_pairs(
        tokenized_embedded(), tokenizer(), max_seq_length=max_seq_length, dupe_factor=dupe_factor, task=task
    )


@functools.lru_cache(maxsize=None)
def embedded_pair_features(max_seq_length: int = 128, count: int = 4000):
    """`count` real pair features (python lists, as a DataLoader hands them to a collator)."""
    pairs = embedded_pairs(max_seq_length=max_seq_length, dupe_factor=1)
    return tuple(pairs.select(range(min(count, len(pairs)))).to_list())


# A user's own labelled data (run_glue.py without --task_name): reviews whose positive or negative word is the label
POSITIVE = ["great", "wonderful", "excellent", "loved", "fantastic", "superb"]
NEGATIVE = ["awful", "terrible", "boring", "hated", "dreadful", "poor"]
THINGS = ["film", "book", "meal", "show", "trip", "album"]


def reviews(count, seed):
    """`count` one-sentence reviews, {"sentence", "label"}, labelled "positive" or "negative" by their word."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        label = rng.choice(["positive", "negative"])
        word = rng.choice(POSITIVE if label == "positive" else NEGATIVE)
        rows.append({"sentence": f"The {rng.choice(THINGS)} was {word} and I said so.", "label": label})
    return rows


def write_csv(path, rows, columns=("sentence", "label")):
    """`rows` as a csv file of `columns`, with a header; returns `path`."""
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows([row[c] for c in columns] for row in rows)
    return path


# RACE in the official layout (run_race.py --data_dir): the correct option is always the same phrase, so a few
# training steps teach a tiny model to find it and the expected accuracies can be worked out by hand.
RIGHT = "yes it is true"  # the phrase the fixtures' correct option always is
WRONG = ["no", "never", "perhaps not"]


def article(article_id: str, right_positions: str, gold: str | None = None) -> dict:
    """An official-format article; question i has RIGHT at letter right_positions[i], gold answers `gold`."""
    options = []
    for letter in right_positions:
        choices = list(WRONG)
        choices.insert("ABCD".index(letter), RIGHT)
        options.append(choices)
    questions = ["The children went to the _ .", "What did the children do?", "Where is the old school?"]
    return {
        "id": article_id,
        "article": f"Story {article_id}. The children walked to the old school and read "
        "books together in the morning. " * 2,
        "questions": questions[: len(right_positions)],
        "options": options,
        "answers": list(gold or right_positions),
    }


# dev: high all consistent (4/4 right), middle with 2 of 4 gold answers not on RIGHT (2/4 right) -> overall 6/8.
DEV = {
    "high": {"5.txt": article("high5.txt", "ABC"), "6.txt": article("high6.txt", "D")},
    "middle": {"7.txt": article("middle7.txt", "CA", gold="CB"), "8.txt": article("middle8.txt", "BD", gold="AD")},
}
TRAIN = {
    level: {
        f"{n}.txt": article(f"{level}{n}.txt", positions) for n, positions in enumerate(["ABC", "DCB", "BAD", "CDA"])
    }
    for level in ("high", "middle")
}


def write_official_layout(root: Path) -> Path:
    for split, levels in {"train": TRAIN, "dev": DEV, "test": DEV}.items():
        for level, files in levels.items():
            (root / split / level).mkdir(parents=True)
            for name, record in files.items():
                (root / split / level / name).write_text(json.dumps(record))
    return root


# SQuAD in the official format (run_squad.py --train_file): three questions on two paragraphs (v2.0: four, two of them
# unanswerable).
FOX = "The quick brown fox jumps over the lazy dog near the river bank in Paris."
CURIE = "Marie Curie won the Nobel Prize in 1903 and again in 1911 for chemistry."
SQUAD_V1 = {
    "version": "1.1",
    "data": [
        {
            "title": "Fixture",
            "paragraphs": [
                {
                    "context": FOX,
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Who jumps over the dog?",
                            "answers": [{"text": "quick brown fox", "answer_start": 4}],
                        },
                        {
                            "id": "q2",
                            "question": "Where is the river bank?",
                            "answers": [{"text": "Paris", "answer_start": 67}],
                        },
                    ],
                },
                {
                    "context": CURIE,
                    "qas": [
                        {
                            "id": "q3",
                            "question": "When did Curie win for chemistry?",
                            "answers": [{"text": "1911", "answer_start": 53}],
                        }
                    ],
                },
            ],
        }
    ],
}
SQUAD_V2 = {
    "version": "v2.0",
    "data": [
        {
            "title": "Fixture",
            "paragraphs": [
                {
                    "context": FOX,
                    "qas": [
                        {
                            "id": "p1",
                            "question": "Who jumps over the dog?",
                            "is_impossible": False,
                            "answers": [{"text": "quick brown fox", "answer_start": 4}],
                        },
                        {
                            "id": "p2",
                            "question": "What colour is the cat?",
                            "is_impossible": True,
                            "answers": [],
                            "plausible_answers": [{"text": "brown", "answer_start": 10}],
                        },
                    ],
                },
                {
                    "context": CURIE,
                    "qas": [
                        {
                            "id": "p3",
                            "question": "When did Curie win for chemistry?",
                            "is_impossible": False,
                            "answers": [{"text": "1911", "answer_start": 53}],
                        },
                        {"id": "p4", "question": "Who won the Turing Award?", "is_impossible": True, "answers": []},
                    ],
                },
            ],
        }
    ],
}


def write_json(path, content):
    """`content` as a JSON file; returns `path`."""
    path.write_text(json.dumps(content))
    return path
