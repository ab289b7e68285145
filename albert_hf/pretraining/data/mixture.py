"""Mixing sources: which source each training pair of the run comes from, and which of its pairs.

The schedule. A source's weight w_s is its share of the training pairs. The draws follow a schedule, not coin
flips: the run's j-th pair comes from the source whose next draw is due first, source s's n-th draw being due at
(n + 1/2) / w_s (Webster's divisor method; ties go to the source listed first). After J draws, source s has
given c_s(J) = #{n : (n + 1/2) / w_s <= theta_J} of them, within one pair of w_s J, so over any 100 optimizer steps
of B pairs each source's share is within 2 / (100 B) of its weight; c_s never decreases as J grows, so every
global batch takes c_s((k+1)B) - c_s(kB) >= 0 pairs of source s (`drawn_counts`, `batch_draws`). The order within a
batch is a seeded permutation, so a batch is not sorted by source.

A source's pairs. Source s's n-th draw is its pair at position n: epoch e = n // size_s, and the (n % size_s)-th
pair of a permutation of its pairs seeded by (seed, its name, e). A source whose weight asks for more pairs than it
holds is repeated, each epoch in a new order; one that runs out begins a new epoch; none ends the run.

Segments. A run's mix is a list of segments (`MixPlan`): from global pair index `start` on, weights w with each
source's position `offsets` (its pairs drawn before). A resume with other weights, an added or a dropped source,
or another global batch opens a new segment whose offsets are the positions reached, so no pair of a source repeats
before its epoch ends and none is skipped. The plan is saved in every checkpoint as JSON.

The pairs are read on this schedule by mixed_pairs.py (`mixed_pairs.MixedPairs`, and under --streaming
`mixed_pairs.MixedStream`).
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field

import numpy as np

from ...errors import InputError
from ...tokenization import split_sentences
from .sources import Sources

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# The schedule


def due(n, weights: np.ndarray) -> np.ndarray:
    """When each source's n-th draw is due (n: an array, one per source)."""
    return (np.asarray(n, dtype=np.float64) + 0.5) / weights


def drawn_counts(weights: np.ndarray, draws: int) -> np.ndarray:
    """c_s(J) for J = `draws`: how many of the first `draws` pairs each source gives (the module docstring)."""
    count = len(weights)
    counts = np.maximum(np.floor(draws * weights + 0.5).astype(np.int64), 0)
    # the exact count of draws due by `draws`, with the same expression as the comparisons below
    for s in range(count):
        while counts[s] > 0 and due(counts[s] - 1, weights[s]) > draws:
            counts[s] -= 1
        while due(counts[s], weights[s]) <= draws:
            counts[s] += 1
    while counts.sum() > draws:  # drop the latest draw taken: the largest (due time, source)
        last = [(due(counts[s] - 1, weights[s]), s) if counts[s] else (-math.inf, s) for s in range(count)]
        counts[max(last)[1]] -= 1
    while counts.sum() < draws:  # add the earliest draw not taken: the smallest (due time, source)
        counts[min((due(counts[s], weights[s]), s) for s in range(count))[1]] += 1
    return counts


def batch_draws(weights: np.ndarray, batch: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k-th batch of `batch` draws of a segment: (each source's draws before it, its draws in it)."""
    before = drawn_counts(weights, k * batch)
    return before, drawn_counts(weights, (k + 1) * batch) - before


def permutation_seed(seed: int, *parts) -> list[int]:
    """A numpy seed from the run's seed and names or numbers (a source's permutation does not depend on the others)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return [int(seed) % 2**63, int.from_bytes(digest, "little")]


# ----------------------------------------------------------------------------------------------------------------
# The plan: the segments of a run's mix


@dataclass
class Segment:
    """From global pair `start` (optimizer step `step`) on: `weights` (normalised, by source name), global batches
    of `batch` pairs, each source starting at position `offsets[name]`."""

    start: int
    step: int
    batch: int
    weights: dict[str, float]
    offsets: dict[str, int]

    def arrays(self, names):
        return np.array([self.weights[n] for n in names]), np.array([self.offsets[n] for n in names], np.int64)


@dataclass
class MixPlan:
    """The run's mix: its sources (names, and sizes in pairs: None for a stream) and segments. As data in each
    checkpoint (`state`, `from_state`)."""

    names: tuple[str, ...]
    sizes: dict[str, int | None]
    segments: list[Segment] = field(default_factory=list)

    @classmethod
    def start(cls, names, sizes: dict, weights: dict, batch: int) -> "MixPlan":
        return cls(tuple(names), dict(sizes), [Segment(0, 0, batch, dict(weights), {n: 0 for n in names})])

    def segment_of(self, pair: int) -> Segment:
        return next(segment for segment in reversed(self.segments) if segment.start <= pair)

    def drawn(self, pairs: int) -> dict[str, int]:
        """Each source's position after the run's first `pairs` pairs."""
        segment = self.segment_of(pairs)
        names = list(segment.weights)
        weights, offsets = segment.arrays(names)
        counts = drawn_counts(weights, pairs - segment.start) + offsets
        return dict(zip(names, counts.tolist()))

    def positions(self, pairs: int) -> dict[str, int]:
        """Every source's position after the run's first `pairs` pairs, those of earlier segments too (a source
        dropped, then given again, goes on from where it was)."""
        found, end = {}, pairs
        for segment in reversed([segment for segment in self.segments if segment.start <= pairs]):
            names = list(segment.weights)
            weights, offsets = segment.arrays(names)
            counts = drawn_counts(weights, end - segment.start) + offsets
            for name, count in zip(names, counts.tolist()):
                found.setdefault(name, count)
            end = segment.start
        return found

    def epochs(self, pairs: int) -> dict[str, float | None]:
        """Each source's epochs after the run's first `pairs` pairs (None: a stream, its size unknown)."""
        return {
            name: (count / self.sizes[name] if self.sizes.get(name) else None)
            for name, count in self.drawn(pairs).items()
        }

    def batch(self, pair: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
        """The global batch that starts at `pair`: (its sources' indices into `names`, each pair's position in its
        source), in the batch's seeded order, and the batch's size."""
        segment = self.segment_of(pair)
        names = list(segment.weights)
        weights, offsets = segment.arrays(names)
        k, within = divmod(pair - segment.start, segment.batch)
        if within:
            raise ValueError(f"pair {pair} does not start a global batch")
        before, taken = batch_draws(weights, segment.batch, k)
        local = np.repeat(np.arange(len(names)), taken)
        rank = np.arange(segment.batch) - np.repeat(np.cumsum(taken) - taken, taken)
        positions = offsets[local] + before[local] + rank
        order = np.random.default_rng(permutation_seed(seed, "batch", segment.step + k)).permutation(segment.batch)
        index = np.array([self.names.index(name) for name in names])
        return index[local][order], positions[order], segment.batch

    def state(self, pairs: int) -> dict:
        """The plan as data, with the position after `pairs` pairs (a checkpoint's)."""
        return {
            "pairs": pairs,
            "names": list(self.names),
            "sizes": self.sizes,
            "drawn": self.drawn(pairs),
            "segments": [vars(segment) for segment in self.segments if segment.start <= pairs],
        }

    @classmethod
    def from_state(cls, state, where: str) -> tuple["MixPlan", int]:
        """(the plan, the pairs drawn) of a checkpoint's `state`; one line naming `where` if it is not one."""
        try:
            names = tuple(state["names"])
            sizes = {str(n): (None if v is None else int(v)) for n, v in state["sizes"].items()}
            segments = [
                Segment(
                    int(s["start"]),
                    int(s["step"]),
                    int(s["batch"]),
                    {str(n): float(w) for n, w in s["weights"].items()},
                    {str(n): int(o) for n, o in s["offsets"].items()},
                )
                for s in state["segments"]
            ]
            pairs = int(state["pairs"])
            ok = (
                segments
                and segments[0].start == 0
                and pairs >= segments[-1].start
                and all(
                    s.batch > 0
                    and s.weights
                    and set(s.weights) == set(s.offsets) <= set(names)
                    and all(w > 0 and math.isfinite(w) for w in s.weights.values())
                    and all(o >= 0 for o in s.offsets.values())
                    for s in segments
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            raise InputError(f"{where}: its mix of sources is not a valid plan (names, sizes, segments, pairs)")
        return cls(names, sizes, segments), pairs

    def resumed(
        self,
        pairs: int,
        step: int,
        names,
        sizes: dict,
        weights: dict,
        batch: int,
        dropped=(),
        where: str = "the checkpoint",
    ) -> tuple["MixPlan", str | None]:
        """This plan continued at `pairs` (optimizer `step`) with the run's sources and weights: (the plan, the
        line that says what changed, or None). A source of the checkpoint missing from the run stops the run unless
        `dropped` names it; a source whose size changed stops it too (its position would mean other pairs)."""
        for name in self.names:
            if name in names and self.sizes.get(name) != sizes.get(name):
                raise InputError(
                    f"source {name}: {sizes.get(name) or 'a stream of'} pairs now, "
                    f"{self.sizes.get(name) or 'a stream'} in {where}: its position cannot be "
                    "continued; prepare it as it was, or start a new run"
                )
        current = self.segment_of(pairs)
        missing = [name for name in current.weights if name not in names and name not in dropped]
        if missing:
            raise InputError(
                f"source {missing[0]} is in {where} but not in --sources: give it again, or pass "
                f"--drop_sources {missing[0]} to go on without it"
            )
        unknown = [name for name in dropped if name not in current.weights]
        if unknown:
            raise InputError(
                f"--drop_sources {unknown[0]}: {where} has no such source (it has {', '.join(current.weights)})"
            )
        position = self.positions(pairs)
        same = (
            list(current.weights) == list(names)
            and current.batch == batch
            and all(math.isclose(current.weights[n], weights[n], rel_tol=1e-12) for n in names)
        )
        all_names = tuple(dict.fromkeys([*self.names, *names]))
        plan = MixPlan(
            all_names, {**self.sizes, **sizes}, [segment for segment in self.segments if segment.start <= pairs]
        )
        if same:
            return plan, None
        plan.segments = [segment for segment in plan.segments if segment.start < pairs]
        plan.segments.append(
            Segment(pairs, step, batch, dict(weights), {name: position.get(name, 0) for name in names})
        )
        changes = [
            f"{n} {current.weights[n]:.3g} → {weights[n]:.3g}"
            for n in names
            if n in current.weights and not math.isclose(current.weights[n], weights[n], rel_tol=1e-12)
        ]
        changes += [f"{n} added at {weights[n]:.3g}" for n in names if n not in current.weights]
        changes += [f"{n} dropped (was {current.weights[n]:.3g})" for n in current.weights if n not in names]
        if current.batch != batch:
            changes.append(f"global batch {current.batch} → {batch}")
        return plan, f"mix changed at step {step}: {', '.join(changes)}"


@dataclass
class Mix:
    """A mixed run's sources as built: the names of those trained on, in order, their weights (normalised) and sizes
    (pairs; None for a stream), and the rule the weights followed (for the start line and the card). `held_out`:
    every source's name, by the index its held-out pairs carry, those of weight 0 (held out only) among them."""

    names: tuple[str, ...]
    weights: dict[str, float]
    sizes: dict[str, int | None]
    weighting: str = "as given"
    held_out: tuple[str, ...] = ()

    def __post_init__(self):
        self.held_out = self.held_out or self.names

    @property
    def held_out_only(self) -> tuple[str, ...]:
        return tuple(name for name in self.held_out if name not in self.names)


def held_out_lines(mix: Mix) -> list[str]:
    """The start line's and the plan's words for each source of weight 0."""
    return [f"{name}: weight 0, held out only (evaluated, never trained on)" for name in mix.held_out_only]


def normalised(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {name: weight / total for name, weight in weights.items()}


def resolve_weights(sources: Sources, sizes: dict[str, float | None], unit: str = "pairs") -> dict[str, float]:
    """Each trained source's share of the training pairs: its own weight, or with a size shortcut size^alpha (sizes
    in `unit`), normalised to sum to 1."""
    if sources.alpha is None:  # the sources of weight 0 are held out only: not in the schedule
        return normalised({source.name: source.weight for source in sources.sources if source.weight})
    unknown = [name for name, size in sizes.items() if not size]
    if unknown:
        raise InputError(
            f"source {unknown[0]}: weight {'size' if sources.alpha == 1 else f'size^{sources.alpha:g}'}"
            f", but its size in {unit} is not known before it is read (a stream of a Hub dataset "
            "without its size in the dataset's info): give every source a number as its weight"
        )
    return normalised({name: float(sizes[name]) ** sources.alpha for name in sources.names})


def plan_lines(plan: MixPlan, pairs: int, start_pairs: int = 0, sizes_unit: str = "pairs") -> list[str]:
    """Per source: weight, size, pairs drawn by the run's end and its epochs (the start line, --dry_run)."""
    segment = plan.segment_of(start_pairs)
    end, begin = plan.drawn(pairs), plan.drawn(start_pairs)
    lines = []
    for name in segment.weights:
        size = plan.sizes.get(name)
        drawn = end[name] - begin.get(name, 0)
        epochs = f"×{end[name] / size:.3g} epochs" if size else "epochs unknown (a stream)"
        lines.append(
            f"{name}: weight {segment.weights[name]:.3g}, {f'{size:,} {sizes_unit}' if size else 'streamed'}"
            f", {drawn:,} pairs drawn, {epochs}"
        )
    return lines


# ----------------------------------------------------------------------------------------------------------------
# The tokenizer's sample


def sentences_of(documents, layout: str):
    """A source's sentences, one line each."""
    for row in documents:
        for sentence in split_sentences(row["text"] or "", sentence_per_line=layout == "sentence_per_line"):
            sentence = " ".join(sentence.split())
            if sentence:
                yield sentence


def tokenizer_sample(
    documents: dict,
    weights: dict[str, float] | None,
    layouts: dict[str, str],
    sample_size: int,
    seed: int,
    alpha: float | None = None,
) -> tuple[list[str], dict[str, int]]:
    """The sentences a tokenizer is trained on, each source giving its weight's share of them: (the sentences,
    one a string, and how many each source gave). At most `sample_size` in all, and no more than the sources hold
    together; a source with fewer sentences than its share repeats them. `weights` None: each source's sentences
    to the power `alpha` (weights by size), counted in a first pass. Then one pass over each source's training
    documents, a uniform sample (a reservoir) of its share kept."""
    if weights is None:
        counts = {name: sum(1 for _ in sentences_of(docs, layouts[name])) for name, docs in documents.items()}
        empty = [name for name, count in counts.items() if not count]
        if empty:
            raise InputError(f"source {empty[0]}: its training documents hold no sentence")
        weights = normalised({name: count**alpha for name, count in counts.items()})
    reservoirs, counts = {}, {}
    for name, docs in documents.items():
        keep = max(1, math.ceil(weights[name] * sample_size))
        rng = np.random.default_rng(permutation_seed(seed, "tokenizer", name))
        reservoir, seen = [], 0
        for sentence in sentences_of(docs, layouts[name]):
            if len(reservoir) < keep:
                reservoir.append(sentence)
            else:
                slot = int(rng.integers(0, seen + 1))
                if slot < keep:
                    reservoir[slot] = sentence
            seen += 1
        if not seen:
            raise InputError(f"source {name}: its training documents hold no sentence")
        order = rng.permutation(len(reservoir))  # a share smaller than the reservoir: a uniform part of it
        reservoirs[name], counts[name] = [reservoir[i] for i in order], seen
    total = min(sample_size, sum(counts.values()))
    sample, given = [], {}
    for name, reservoir in reservoirs.items():
        share = max(1, round(weights[name] * total))
        repeats = -(-share // len(reservoir))
        sample += (reservoir * repeats)[:share]
        given[name] = share
    return sample, given


__all__ = ["Mix", "MixPlan", "drawn_counts", "resolve_weights", "tokenizer_sample", "plan_lines"]
