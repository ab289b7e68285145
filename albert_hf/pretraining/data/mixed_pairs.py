"""Reading a mixed run's pairs on its schedule (mixture.py): `MixedPairs`, a map-style dataset whose item i is the
run's pair number `first + i` (accelerate's loader splits it over the processes as it splits one source's), and
under --streaming `MixedStream` (each process draws its own micro-batches' pairs from its own streams of each source,
on the same schedule). Each source's pairs come epoch by epoch in a seeded permutation (`SourcePermutations`); the
start line says the plan over the run (`start_lines`)."""

from __future__ import annotations

import logging

import numpy as np
import torch

from .mixture import MixPlan, permutation_seed, plan_lines

logger = logging.getLogger(__name__)


class SourcePermutations:
    """Each source's pair at a position: epoch by epoch, a seeded permutation of its pairs (the last two kept)."""

    def __init__(self, names, sizes, seed: int):
        self.names, self.sizes, self.seed, self.cache = list(names), list(sizes), seed, {}

    def indices(self, source: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index into the source's pairs, epoch) of each position."""
        epochs, within = np.divmod(positions, self.sizes[source])
        index = np.empty_like(positions)
        for epoch in np.unique(epochs):
            key = (source, int(epoch))
            if key not in self.cache:
                if len(self.cache) > 2 * len(self.names):
                    self.cache.pop(next(iter(self.cache)))
                rng = np.random.default_rng(permutation_seed(self.seed, "source", self.names[source], int(epoch)))
                self.cache[key] = rng.permutation(self.sizes[source])
            chosen = epochs == epoch
            index[chosen] = self.cache[key][within[chosen]]
        return index, epochs


class MixedPairs(torch.utils.data.Dataset):
    """The run's training pairs from several sources: item i is the run's pair number `first + i` (`MixPlan`),
    with its source's index ("source") and its epoch in that source ("mask_epoch": the collator's masks differ
    from epoch to epoch). `first` is the pairs drawn before this loader (a resume's)."""

    def __init__(self, sources: list, plan: MixPlan, seed: int, total_pairs: int):
        self.plan, self.seed = plan, seed
        self.first, self.total = 0, total_pairs
        self._batch = (None, None, None)
        self.use(sources)

    def use(self, sources: list) -> None:
        """The sources' pairs, in the order of the plan's names (None for a source dropped at a resume). Pairs of
        one shape are read as one table (a micro-batch is then one read, whatever its sources)."""
        import datasets

        self.sources = sources
        present = [pairs for pairs in sources if pairs is not None]
        self.pool, self.offsets = None, np.zeros(len(sources), np.int64)
        if len({repr(pairs.features) for pairs in present}) == 1:
            self.pool = datasets.concatenate_datasets(present)
            sizes = [0 if pairs is None else len(pairs) for pairs in sources]
            self.offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        self.permutations = SourcePermutations(
            self.plan.names, [1 if pairs is None else len(pairs) for pairs in sources], self.seed
        )

    def __len__(self) -> int:
        return max(0, self.total - self.first)

    def align(self, built) -> None:
        """After a resume: the sources' pairs in the order of the continued plan's names (`built`: the names
        they were built in; a dropped source has none)."""
        by_name = dict(zip(built, self.sources))
        self.use([by_name.get(name) for name in self.plan.names])

    def _batch_start(self, pair: int) -> tuple[int, int]:
        """(the first pair of the global batch that holds `pair`, that batch's size)."""
        segment = self.plan.segment_of(pair)
        return pair - (pair - segment.start) % segment.batch, segment.batch

    def _layout(self, start: int):
        """The sources and positions of the global batch that begins at pair `start` (the last one kept)."""
        if self._batch[0] != start:
            sources, positions, _ = self.plan.batch(start, self.seed)
            self._batch = (start, sources, positions)
        return self._batch[1], self._batch[2]

    def __getitems__(self, indices) -> list[dict]:
        pairs = self.first + np.asarray(indices, dtype=np.int64)
        sources, positions = np.empty_like(pairs), np.empty_like(pairs)
        start, batch = self._batch_start(int(pairs[0]))
        within = pairs - start
        if ((within >= 0) & (within < batch)).all():  # a micro-batch within one global batch: one lookup
            layout = self._layout(start)
            sources[:], positions[:] = layout[0][within], layout[1][within]
        else:
            for i, pair in enumerate(pairs.tolist()):
                start, _ = self._batch_start(pair)
                layout = self._layout(start)
                sources[i], positions[i] = layout[0][pair - start], layout[1][pair - start]
        index, epochs = np.empty_like(pairs), np.empty_like(pairs)
        for source in np.unique(sources):
            chosen = np.flatnonzero(sources == source)
            index[chosen], epochs[chosen] = self.permutations.indices(int(source), positions[chosen])
        if self.pool is not None:
            fetched = self.pool.__getitems__((self.offsets[sources] + index).tolist())
        else:
            fetched = [self.sources[s].__getitems__([int(i)])[0] for s, i in zip(sources, index)]
        return [
            {**row, "source": int(source), "mask_epoch": int(epoch)}
            for row, source, epoch in zip(fetched, sources, epochs)
        ]

    def __getitem__(self, i: int) -> dict:
        return self.__getitems__([i])[0]


class MixedStream(torch.utils.data.IterableDataset):
    """--streaming: this process's pairs from its own endless stream of each source. The process draws its
    micro-batches' pairs on the same schedule (`MixPlan`, on its own draws: each process's share is the mix), in
    groups of `batch` (its micro-batch x the accumulation). Its position is its draws and each stream's own
    `state_dict()` (JSON), saved with each checkpoint."""

    def __init__(self, streams: list, plan: MixPlan, seed: int, process_index: int):
        self.streams, self.plan, self.seed, self.process_index = streams, plan, seed, process_index
        self.draws = 0  # this process's pairs taken so far

    def __iter__(self):
        iterators = [None if stream is None else iter(stream) for stream in self.streams]
        while True:
            sources, _, _ = self.plan.batch(self.draws, self.seed + self.process_index)
            for source in sources:
                row = next(iterators[source])
                self.draws += 1
                yield {**row, "source": int(source), "mask_epoch": 0}

    def align(self, built) -> None:
        """After a resume: the streams in the order of the continued plan's names (`built`: the names they were
        built in; a dropped source has none)."""
        by_name = dict(zip(built, self.streams))
        self.streams = [by_name.get(name) for name in self.plan.names]

    def state_dict(self) -> dict:
        return {
            "draws": self.draws,
            "plan": self.plan.state(self.draws),
            "streams": {
                name: stream.state_dict() for name, stream in zip(self.plan.names, self.streams) if stream is not None
            },
        }

    def load_state_dict(self, state: dict) -> None:
        self.draws = state["draws"]
        for name, stream in zip(self.plan.names, self.streams):
            if stream is not None and name in state["streams"]:
                stream.load_state_dict(state["streams"][name])


def start_lines(dataset, max_train_steps: int, global_batch: int) -> list[str]:
    """The plan per source over the run (`plan_lines`), for the start line: a `MixedPairs`' global one, or a
    `MixedStream`'s (its pairs per process)."""
    if isinstance(dataset, MixedStream):
        batch = dataset.plan.segments[-1].batch
        return [f"{line} (per process)" for line in plan_lines(dataset.plan, max_train_steps * batch)]
    return plan_lines(dataset.plan, max_train_steps * global_batch)
