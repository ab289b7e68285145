#!/usr/bin/env python
"""Write small example datasets in the formats docs/your_data.md fine-tunes on, so that its commands run as shown:

    python examples/own_data.py data/own

- reviews_{train,dev,test}.csv: `sentence,label` rows, labels `positive` / `negative` (the test file unlabelled);
- ratings_{train,dev}.jsonl: `{"review": ..., "stars": 1.0-5.0}` rows, a float label: regression;
- reviews_dataset/: the reviews as a `datasets` DatasetDict (ClassLabel labels) written by save_to_disk, as a
  downloaded Hub dataset would be read;
- people_{train,dev,test}.conll: sentences of people and places in CoNLL's layout (a token and its IOB2 tag per
  line), the test file without tags.

The sentences come from templates over small word lists: a model learns them in minutes, which shows the scripts
working end to end, not how well ALBERT does on real data.
"""

import argparse
import csv
import json
import random
from pathlib import Path

POSITIVE = ["great", "wonderful", "excellent", "moving", "fantastic", "superb", "charming", "brilliant"]
NEGATIVE = ["awful", "terrible", "boring", "clumsy", "dreadful", "poor", "tedious", "dull"]
THINGS = ["film", "book", "meal", "show", "trip", "album", "play", "novel"]
STARS = {"terrible": 1.0, "poor": 2.0, "fine": 3.0, "good": 4.0, "superb": 5.0}
PEOPLE = ["Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "Jack"]
SURNAMES = ["Smith", "Jones", "Brown", "Taylor", "Wilson"]
PLACES = ["Paris", "London", "Berlin", "Madrid", "Rome", "Vienna", "New York", "Buenos Aires", "Cape Town"]
VERBS = ["lives in", "moved to", "visited", "works in", "flew to"]


def review(rng):
    label = rng.choice(["positive", "negative"])
    word = rng.choice(POSITIVE if label == "positive" else NEGATIVE)
    return {"sentence": f"The {rng.choice(THINGS)} was {word} and I said so.", "label": label}


def rating(rng):
    word = rng.choice(list(STARS))
    return {"review": f"The {rng.choice(THINGS)} was {word}.", "stars": STARS[word]}


def tagged_sentence(rng):
    tokens, tags = [], []
    if rng.random() < 0.5:
        tokens, tags = ["Yesterday", ","], ["O", "O"]
    tokens.append(rng.choice(PEOPLE))
    tags.append("B-PER")
    if rng.random() < 0.5:
        tokens.append(rng.choice(SURNAMES))
        tags.append("I-PER")
    verb, place = rng.choice(VERBS).split(), rng.choice(PLACES).split()
    tokens += verb + place + ["."]
    tags += ["O"] * len(verb) + ["B-LOC"] + ["I-LOC"] * (len(place) - 1) + ["O"]
    return tokens, tags


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = args.folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    sizes = {"train": 1000, "dev": 200, "test": 50}

    reviews = {split: [review(rng) for _ in range(count)] for split, count in sizes.items()}
    for split, rows in reviews.items():
        columns = ["sentence"] if split == "test" else ["sentence", "label"]
        with open(folder / f"reviews_{split}.csv", "w", newline="", encoding="utf-8") as file:
            writer = csv.DictWriter(file, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    for split in ("train", "dev"):
        with open(folder / f"ratings_{split}.jsonl", "w", encoding="utf-8") as file:
            file.writelines(json.dumps(rating(rng)) + "\n" for _ in range(sizes[split]))
    for split, count in sizes.items():
        with open(folder / f"people_{split}.conll", "w", encoding="utf-8") as file:
            for _ in range(count):
                tokens, tags = tagged_sentence(rng)
                file.writelines(f"{t}\n" if split == "test" else f"{t} {g}\n" for t, g in zip(tokens, tags))
                file.write("\n")

    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    features = Features({"text": Value("string"), "label": ClassLabel(names=["negative", "positive"])})
    DatasetDict(
        {
            name: Dataset.from_list(
                [{"text": r["sentence"], "label": r["label"]} for r in reviews[split]], features=features
            )
            for name, split in (("train", "train"), ("validation", "dev"))
        }
    ).save_to_disk(str(folder / "reviews_dataset"))
    print(f"wrote {', '.join(sorted(p.name for p in folder.iterdir()))} in {folder}")


if __name__ == "__main__":
    main()
