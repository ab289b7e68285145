"""The sources of a mixed run, as the user names them: `--sources` on the command line, `sources:` in a recipe.

A recipe writes each source as a mapping; the command line writes the same keys as `key=value` items joined by
commas, one source a word (a key given twice, `train_files=a,train_files=b`, gives a list):

    sources:                                       --sources name=books,weight=size,train_files=corpus/books \\
      - name: books                                          name=wiki,weight=size,dataset_name=wikimedia/wikipedia,\\
        weight: size                                         dataset_config_name=20231101.en
        train_files: [corpus/books]
      - name: wiki
        weight: size
        dataset_name: wikimedia/wikipedia
        dataset_config_name: 20231101.en

Each source is any corpus a one-source run takes (`train_files` with their `layout`, or `dataset_name` with its
`dataset_config_name`, `split` and `text_column`), or a folder written by --preprocess_only (`prepared_data`).
`weight` is the source's share of the training pairs (weights are normalised to sum to 1), or one shortcut for all
sources: `size` (in proportion to each source's size, as the paper's concatenated corpora) or `size^A` (to size to
the power A, 0 <= A <= 1: temperature sampling, as multilingual models sample languages). A weight of 0 holds a
source out: its held-out pairs are evaluated with the others', and it is never trained on (what a run on a domain
alone forgets of general text). The weights themselves are resolved, and the run's mix planned, in mixture.py.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from ...errors import InputError
from .corpus import LAYOUTS

KEYS = (
    "name",
    "weight",
    "train_files",
    "dataset_name",
    "dataset_config_name",
    "split",
    "text_column",
    "layout",
    "prepared_data",
)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,39}")  # it names metrics (eval_<name>_mlm_accuracy) and folders
SIZE = re.compile(r"size(?:\^(.+))?")


@dataclass(frozen=True)
class Source:
    """One source of a mixed run, checked (`parse_sources`)."""

    name: str
    weight: float | None  # the weight as given; None with a size shortcut (`alpha`)
    train_files: tuple[str, ...] = ()
    dataset_name: str | None = None
    dataset_config_name: str | None = None
    split: str = "train"
    text_column: str = "text"
    layout: str = "document_per_file"
    prepared_data: str | None = None

    def where(self) -> str:
        """Where its text comes from, for lines."""
        if self.prepared_data:
            return f"prepared_data {self.prepared_data}"
        if self.dataset_name:
            return f"dataset_name {self.dataset_name}" + (
                f" ({self.dataset_config_name})" if self.dataset_config_name else ""
            )
        files = " ".join(self.train_files[:3]) + (" ..." if len(self.train_files) > 3 else "")
        return f"train_files {files}"

    def mapping(self) -> dict:
        """The recipe's form of the source (as `sources:` writes it), without the keys left at their defaults."""
        values = asdict(self)
        values["train_files"] = list(self.train_files)
        return {
            key: value
            for key, value in values.items()
            if key in ("name", "weight") or value not in (None, (), [], "train", "text", "document_per_file")
        }


@dataclass(frozen=True)
class Sources:
    """The run's sources, and the shortcut their weights follow (`alpha`: weights proportional to size^alpha;
    None: each source's own weight)."""

    sources: tuple[Source, ...]
    alpha: float | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(source.name for source in self.sources)

    @property
    def trained(self) -> tuple[str, ...]:
        """The sources trained on: all but those of weight 0 (held out only)."""
        return tuple(source.name for source in self.sources if source.weight != 0)

    def mappings(self) -> list[dict]:
        """The sources in the recipe's form, each weight as it was given."""
        word = None if self.alpha is None else ("size" if self.alpha == 1 else f"size^{self.alpha:g}")
        return [{**source.mapping(), "weight": source.weight if word is None else word} for source in self.sources]

    def weighting(self) -> str:
        """The weights' rule in words, for lines."""
        if self.alpha is None:
            return "as given"
        return "by size" if self.alpha == 1 else f"by size^{self.alpha:g}"


def parse_sources(items, layout: str = "document_per_file", text_column: str = "text") -> Sources:
    """`--sources` words or `sources:` mappings -> the checked `Sources`; one line naming the source otherwise.

    Args:
        items: a list of `key=value,...` strings (the command line) or of mappings (a recipe), as KEYS name them.
        layout, text_column: the run's --layout and --text_column, each source's unless it gives its own.
    """
    if isinstance(items, (str, dict)):
        items = [items]
    sources, shortcuts = [], set()
    for number, item in enumerate(items, start=1):
        values = item if isinstance(item, dict) else parse_word(item, number)
        source, shortcut = make_source(values, number, layout, text_column)
        shortcuts.add(shortcut)
        sources.append(source)
    if not sources:
        raise InputError("--sources: no source given")
    seen = set()
    for source in sources:
        if source.name in seen:
            raise InputError(f"--sources: two sources are named {source.name}; give each its own name")
        seen.add(source.name)
    if not any(source.weight != 0 for source in sources):
        raise InputError(
            "--sources: every source has weight 0 (held out only, never trained on): give the sources to "
            "train on a weight above 0"
        )
    if len(shortcuts) > 1:
        kinds = sorted(
            "a number" if kind is None else ("size" if kind == 1 else f"size^{kind:g}") for kind in shortcuts
        )
        raise InputError(
            f"--sources: the weights mix {' and '.join(kinds)}; give every source a number, or every "
            "source the same size shortcut"
        )
    return Sources(tuple(sources), shortcuts.pop())


def parse_word(word, number: int) -> dict:
    """One command-line source, `name=books,weight=0.3,train_files=a,train_files=b` -> its mapping."""
    if not isinstance(word, str):
        raise InputError(f"--sources: source {number} is {word!r:.60}, not a mapping of {', '.join(KEYS)}")
    values: dict = {}
    for part in filter(None, word.split(",")):
        key, equals, value = part.partition("=")
        if not equals:
            raise InputError(f"--sources: source {number} ({word:.60}): {part!r} is not key=value")
        key = key.strip()
        if key == "train_files":
            values.setdefault(key, []).append(value)
        elif key in values:
            raise InputError(f"--sources: source {number} ({word:.60}) gives {key} twice")
        else:
            values[key] = value
    return values


def make_source(values: dict, number: int, layout: str, text_column: str) -> tuple[Source, float | None]:
    """One source's mapping checked -> (the `Source`, its size shortcut's alpha or None for a number)."""
    if not isinstance(values, dict):
        raise InputError(f"--sources: source {number} is {values!r:.60}, not a mapping of {', '.join(KEYS)}")
    name = values.get("name")
    label = f"--sources: source {name!r}" if name is not None else f"--sources: source {number}"
    unknown = sorted(set(values) - set(KEYS))
    if unknown:
        raise InputError(f"{label}: unknown key(s) {', '.join(map(str, unknown))}; a source takes {', '.join(KEYS)}")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InputError(
            f"{label}: needs a name of letters, digits, '_', '-' or '.' (at most 40), which names its metrics"
        )
    if "weight" not in values:
        raise InputError(f"{label}: needs a weight (a number >= 0, size or size^A)")
    weight, alpha = parse_weight(values["weight"], label)
    files = values.get("train_files") or ()
    files = (files,) if isinstance(files, str) else files
    if not isinstance(files, (list, tuple)) or not all(isinstance(f, str) and f for f in files):
        raise InputError(f"{label}: train_files must be a path or a list of paths")
    for key in ("dataset_name", "dataset_config_name", "split", "text_column", "layout", "prepared_data"):
        if values.get(key) is not None and not (isinstance(values[key], str) and values[key]):
            raise InputError(f"{label}: {key} must be a non-empty string")
    given = [key for key in ("train_files", "dataset_name", "prepared_data") if values.get(key)]
    if len(given) != 1:
        raise InputError(
            f"{label}: give one of train_files, dataset_name or prepared_data"
            + (f", not {' and '.join(given)}" if given else "")
        )
    source_layout = values.get("layout") or layout
    if source_layout not in LAYOUTS:
        raise InputError(f"{label}: layout {source_layout!r} is not one of {', '.join(LAYOUTS)}")
    if values.get("prepared_data") and set(values) - {"name", "weight", "prepared_data"}:
        extra = sorted(set(values) - {"name", "weight", "prepared_data"})
        raise InputError(f"{label}: a prepared_data folder holds its pairs already; drop {', '.join(extra)}")
    source = Source(
        name=name,
        weight=weight,
        train_files=tuple(files),
        dataset_name=values.get("dataset_name"),
        dataset_config_name=values.get("dataset_config_name"),
        split=values.get("split") or "train",
        text_column=values.get("text_column") or text_column,
        layout=source_layout,
        prepared_data=values.get("prepared_data"),
    )
    return source, alpha


def parse_weight(value, label: str) -> tuple[float | None, float | None]:
    """(weight, None) for a number >= 0 (0: held out only); (None, alpha) for `size` (alpha 1) or `size^A`
    (0 <= A <= 1)."""
    if isinstance(value, str):
        shortcut = SIZE.fullmatch(value.strip())
        if shortcut:
            if shortcut.group(1) is None:
                return None, 1.0
            try:
                alpha = float(shortcut.group(1))
            except ValueError:
                alpha = math.nan
            if not 0 <= alpha <= 1:
                raise InputError(
                    f"{label}: weight {value}: the temperature's exponent must be a number in [0, 1] "
                    "(1: by size; 0: all sources alike; multilingual models take 0.3 to 0.7)"
                )
            return None, alpha
        try:
            value = float(value)
        except ValueError:
            raise InputError(f"{label}: weight {value!r:.40} is not a number, size or size^A") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{label}: weight {value!r:.40} is not a number, size or size^A")
    if not math.isfinite(value) or value < 0:
        raise InputError(
            f"{label}: weight {value:g} must be a finite number >= 0 (0: held out only, evaluated and never trained on)"
        )
    return float(value), None


__all__ = ["KEYS", "Source", "Sources", "parse_sources"]
