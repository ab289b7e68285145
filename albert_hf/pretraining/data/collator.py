"""`DataCollatorForAlbertPretraining`: ALBERT's n-gram masked LM, on the fly, for sentence-pair batches.

The masking is the official `create_masked_lm_predictions` (google-research/albert's `create_pretraining_data.py`):
- words: a SentencePiece piece starts a word if it begins with "▁" or "<", is one punctuation character, or
  holds a character outside a-z and that punctuation; other pieces join the previous word (whole words);
- budget per sequence: min(max_predictions_per_seq, max(1, round(mlm_probability * length))), where length
  counts [CLS] and [SEP] (so sequences of 130+ tokens get 20 predictions, not 15%);
- spans: word start positions in random order; each draws n in 1..max_ngram with p(n) ∝ 1/n, backs off to
  shorter n when the span would overflow the budget, and is skipped if it overlaps a covered word;
- each covered piece independently: 80% [MASK], 10% unchanged, 10% a uniformly random vocabulary id.

Two ways to run it:
- dynamic (default): fresh masks every batch, vectorised over the batch with numpy. The same sequential span
  selection as the official loop, carried out for all rows at once (one numpy step per candidate rank), so the
  statistics are the official ones while the random stream is numpy's. After `set_epoch(epoch)` the random
  numbers come from (seed, epoch, example) instead of a running stream: masks still change every epoch but no
  longer depend on batch composition, process count, DataLoader workers or resuming (call it every epoch).
- `static_masking=True`: the official per-example loop itself (`official_masked_lm_predictions`), with its
  Python-random / numpy-random call order, seeded per example from `seed` and the example's content. The same
  example therefore always gets the same mask, as in the official static TFRecords (use `dupe_factor` in
  `create_pretraining_pairs` for several static masks of each document).

Labels are -100 where nothing is predicted, and AlbertHFForPreTraining can find the predicted positions from them
(`labels != -100`, the sparse head). With `masked_positions=True` the collator also gives the official fixed-size
`masked_lm_positions` and `masked_lm_weights`, which run_pretraining uses: the model then reads the positions
instead of searching the labels. [CLS], [SEP] and padding are never masked; in dynamic mode no special
token (<unk>, [MASK], <pad>) is either. The official loop, and so static mode, treats <unk> as a normal word.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...errors import InputError

# The official `_is_start_piece_sp` punctuation (no apostrophe, no < = >); its € and £ entries are UTF-8 bytes
# in the official code and never match under Python 3, so they are left out here.
_START_PUNCTUATION = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~')
_ENGLISH_OR_PUNCTUATION = frozenset("abcdefghijklmnopqrstuvwxyz") | _START_PUNCTUATION


def is_start_piece(piece: str) -> bool:
    """Official rule: does this SentencePiece piece begin a new word for whole-word masking?"""
    return (
        piece.startswith("▁")
        or piece.startswith("<")
        or piece in _START_PUNCTUATION
        or not all(ch.lower() in _ENGLISH_OR_PUNCTUATION for ch in piece)
    )


def ngram_probabilities(max_ngram: int, favor_shorter_ngram: bool = True) -> np.ndarray:
    """p(n) ∝ 1/n for n = 1..max_ngram (0.5455, 0.2727, 0.1818 for 3); reversed without favor_shorter_ngram."""
    p = 1.0 / np.arange(1, max_ngram + 1)
    p /= p.sum()
    return p if favor_shorter_ngram else p[::-1].copy()


def fixed_size_positions(labels: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The masked positions of each row (labels != -100), ascending, as the official `masked_lm_positions` /
    `masked_lm_weights`: (batch, P) arrays, padded with 0 / 0.0; P is `width`, or the widest row's count (at
    least 1)."""
    masked = labels != -100
    counts = masked.sum(axis=1)
    widest = int(counts.max()) if len(counts) else 0
    if width is not None and widest > width:
        raise ValueError(f"a row has {widest} masked positions, more than the {width} asked for")
    width = width or max(1, widest)
    order = np.argsort(~masked, axis=1, kind="stable")[:, :width]  # masked first, in order
    valid = np.arange(width)[None, :] < counts[:, None]
    return np.where(valid, order, 0).astype(np.int64), valid.astype(np.float32)


def masking_budget(length: int | np.ndarray, mlm_probability: float, max_predictions_per_seq: int):
    """min(max_predictions, max(1, round(p · length))); numpy's rint rounds half to even like Python's round."""
    return np.minimum(max_predictions_per_seq, np.maximum(1, np.rint(np.asarray(length) * mlm_probability)))


def official_masked_lm_predictions(
    input_ids: list[int],
    word_start: np.ndarray,
    never_candidate: set[int],
    mask_token_id: int,
    vocab_size: int,
    rng: random.Random,
    np_rng: np.random.RandomState,
    mlm_probability: float = 0.15,
    max_predictions_per_seq: int = 20,
    max_ngram: int = 3,
    favor_shorter_ngram: bool = True,
) -> tuple[list[int], list[int]]:
    """The official per-example masking loop, decision for decision. Returns (masked ids, sorted positions).

    `word_start[id]` is `is_start_piece` of each vocabulary piece; `never_candidate` holds the [CLS] and [SEP]
    ids. n is drawn with `np_rng` (the official code uses numpy's global RNG), everything else with `rng`.
    """
    words: list[list[int]] = []
    for i, token in enumerate(input_ids):
        if token in never_candidate:
            continue
        if words and not word_start[token]:
            words[-1].append(i)  # joins the previous word, even across a skipped [SEP], as officially
        else:
            words.append([i])

    budget = int(masking_budget(len(input_ids), mlm_probability, max_predictions_per_seq))
    ngrams = np.arange(1, max_ngram + 1)
    p = ngram_probabilities(max_ngram, favor_shorter_ngram)
    # For every word, its 1..max_ngram-word windows (shorter near the end, never fewer entries).
    spans = [[words[start : start + n] for n in ngrams] for start in range(len(words))]
    rng.shuffle(spans)

    output = list(input_ids)
    covered: set[int] = set()
    masked: list[int] = []
    for windows in spans:
        if len(masked) >= budget:
            break
        n = int(np_rng.choice(ngrams, p=p))
        positions = [i for word in windows[n - 1] for i in word]
        while len(masked) + len(positions) > budget and n > 1:  # back off to shorter n-grams
            n -= 1
            positions = [i for word in windows[n - 1] for i in word]
        if len(masked) + len(positions) > budget or any(i in covered for i in positions):
            continue
        for i in positions:
            covered.add(i)
            if rng.random() < 0.8:
                output[i] = mask_token_id
            elif rng.random() < 0.5:
                pass  # kept unchanged, still predicted
            else:
                output[i] = rng.randint(0, vocab_size - 1)
            masked.append(i)
    return output, sorted(masked)


@dataclass
class DataCollatorForAlbertPretraining:
    """Pads ALBERT sentence pairs and applies n-gram masking; returns what AlbertHFForPreTraining takes.

    Input features: "input_ids" ([CLS] A [SEP] B [SEP]), optionally "token_type_ids" (else 0 up to the first
    [SEP], 1 after it), "attention_mask" (ignored, rebuilt), "sentence_order_label" (passed through when every
    feature has it). Output: input_ids, attention_mask, token_type_ids, labels, [sentence_order_label],
    padded to a multiple of `pad_to_multiple_of`. With `masked_positions`, also the official fixed-size form of
    the masked tokens: masked_lm_positions (batch, P) and masked_lm_weights (batch, P), float32, P the widest row's
    count (at least 1), each row's positions ascending, padded with position 0 and weight 0. Given them,
    `AlbertHFForPreTraining` sizes its MLM head from their shape instead of reading counts from the device.
    With `static_shapes` (and `masked_positions`), every batch has the same shape, as the official TPU inputs:
    rows padded to `max_length`, and P = `max_predictions_per_seq`; a GPU then runs the same kernels every step
    and the step can be captured as a graph.

    Args:
        tokenizer: an ALBERT tokenizer with [MASK], <pad>, [CLS] and [SEP]; its pieces decide where words start.
        mlm_probability (`float`, defaults to 0.15): the share of each sequence's tokens to predict, in (0, 1).
        max_ngram (`int`, defaults to 3): the longest span, in whole words, masked as one.
        max_predictions_per_seq (`int`, defaults to 20): the most predicted tokens per sequence.
        seed (`int`, *optional*): the masks' seed. Dynamic masking: it seeds the random stream (with each DataLoader
            worker's seed), or after `set_epoch` each example's draws; None takes fresh entropy and allows no
            `set_epoch`. Static masking: part of each example's key (None is a seed like any other there).
        static_masking (`bool`, defaults to `False`): the official per-example loop, the same mask for the same
            example every time.
        favor_shorter_ngram (`bool`, defaults to `True`): p(n) ∝ 1/n; False reverses it, favouring long spans.
        pad_to_multiple_of (`int`, *optional*, defaults to 8): round each batch's width up to a multiple of this;
            None for the longest row's width.
        max_length (`int`, *optional*): the longest example allowed (a longer one stops the run, InputError), and
            the padded width with `static_shapes`; None takes the tokenizer's `model_max_length` when it is set.
        return_tensors (`str`, defaults to `"pt"`): `"pt"` for torch tensors, `"np"` for numpy arrays.
        masked_positions (`bool`, defaults to `False`): also return `masked_lm_positions` and `masked_lm_weights`.
        static_shapes (`bool`, defaults to `False`): every batch of one shape; needs `max_length` and
            `masked_positions`.

    Raises:
        InputError: the tokenizer lacks [MASK], <pad>, [CLS] or [SEP].
        ValueError: `mlm_probability`, `max_ngram`, `max_predictions_per_seq` or `return_tensors` out of range, or
            `static_shapes` where `max_length` or `masked_positions` is missing.
    """

    tokenizer: Any
    mlm_probability: float = 0.15
    max_ngram: int = 3
    max_predictions_per_seq: int = 20
    seed: int | None = None
    static_masking: bool = False
    favor_shorter_ngram: bool = True
    pad_to_multiple_of: int | None = 8
    max_length: int | None = None
    return_tensors: str = "pt"
    masked_positions: bool = False
    static_shapes: bool = False
    _rng: Any = field(default=None, init=False, repr=False)
    _rng_key: Any = field(default=None, init=False, repr=False)
    _epoch: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self):
        tok = self.tokenizer
        for name in ("mask_token_id", "pad_token_id", "cls_token_id", "sep_token_id"):
            if getattr(tok, name, None) is None:
                raise InputError(f"The tokenizer has no {name.removesuffix('_id')}; ALBERT pretraining needs it")
        if not 0 < self.mlm_probability < 1 or self.max_ngram < 1 or self.max_predictions_per_seq < 1:
            raise ValueError("Need 0 < mlm_probability < 1, max_ngram >= 1 and max_predictions_per_seq >= 1")
        if self.return_tensors not in ("pt", "np"):
            raise ValueError(f"return_tensors must be 'pt' or 'np', got {self.return_tensors!r}")
        self.vocab_size = len(tok)
        pieces = tok.convert_ids_to_tokens(list(range(self.vocab_size)))
        self.word_start = np.array([is_start_piece(p) for p in pieces], dtype=bool)
        self.special = np.zeros(self.vocab_size, dtype=bool)
        self.special[[i for i in tok.all_special_ids if i < self.vocab_size]] = True
        self.pad_id, self.mask_id = tok.pad_token_id, tok.mask_token_id
        self.cls_id, self.sep_id = tok.cls_token_id, tok.sep_token_id
        self.ngram_p = ngram_probabilities(self.max_ngram, self.favor_shorter_ngram)
        if self.max_length is None:
            limit = getattr(tok, "model_max_length", None)
            self.max_length = limit if limit is not None and limit < 10**9 else None
        if self.static_shapes and (self.max_length is None or not self.masked_positions):
            raise ValueError("static_shapes needs max_length and masked_positions")

    # ------------------------------------------------------------------------------------------------------------

    def _generator(self) -> np.random.Generator:
        # DataLoader workers each hold a copy of the collator: key the stream on torch's per-worker seed (it
        # differs per worker and per epoch, and follows torch.manual_seed) so that workers never repeat masks.
        info = torch.utils.data.get_worker_info()
        key = None if info is None else info.seed
        if self._rng is None or self._rng_key != key:
            entropy = None if self.seed is None else [self.seed] + ([] if key is None else [key])
            self._rng, self._rng_key = np.random.default_rng(entropy), key
        return self._rng

    def set_epoch(self, epoch: int) -> None:
        """Key dynamic masks on (seed, epoch, example) instead of a running random stream.

        A sequence then gets the same mask in a given epoch whatever its batch, the number of processes or
        DataLoader workers, and across an exact resume; a new epoch gives new masks. Needs a seed.
        """
        if self.seed is None:
            raise ValueError("set_epoch needs a collator seed")
        self._epoch = int(epoch)

    def state_dict(self) -> dict:
        """For `accelerator.register_for_checkpointing(collator)`: the epoch key and the stream's position."""
        return {
            "epoch": self._epoch,
            "worker_key": self._rng_key,
            "bit_generator": self._generator().bit_generator.state,
        }

    def load_state_dict(self, state: dict) -> None:
        self._epoch, self._rng, self._rng_key = state["epoch"], np.random.default_rng(), state["worker_key"]
        self._rng.bit_generator.state = state["bit_generator"]

    def _pad(self, features):
        lengths = np.array([len(f["input_ids"]) for f in features])
        if self.max_length is not None and lengths.max() > self.max_length:
            i = int(lengths.argmax())
            raise InputError(
                f"Example {i} of the batch has {lengths[i]} tokens, more than max_length={self.max_length} (the "
                "model's position limit); build pairs with a smaller max_seq_length"
            )
        if lengths.min() == 0:
            raise ValueError(f"Example {int(lengths.argmin())} of the batch has no input_ids")
        width = self.max_length if self.static_shapes else int(lengths.max())
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = np.full((len(features), width), self.pad_id, dtype=np.int64)
        for i, f in enumerate(features):
            input_ids[i, : lengths[i]] = np.asarray(f["input_ids"])
        if all("token_type_ids" in f for f in features):
            token_type_ids = np.zeros_like(input_ids)
            for i, f in enumerate(features):
                token_type_ids[i, : lengths[i]] = np.asarray(f["token_type_ids"])
        else:  # ALBERT layout: segment 1 starts after the first [SEP]
            after_sep = np.cumsum(input_ids == self.sep_id, axis=1) - (input_ids == self.sep_id)
            token_type_ids = (after_sep > 0).astype(np.int64)
        attention_mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
        token_type_ids *= attention_mask
        return input_ids, token_type_ids, attention_mask, lengths

    def __call__(self, features: list[dict]) -> dict:
        if not features:
            raise ValueError("Cannot collate an empty batch")
        if any("labels" in f for f in features):
            raise ValueError("Features already hold 'labels'; this collator makes the MLM labels itself")
        input_ids, token_type_ids, attention_mask, lengths = self._pad(features)
        if self.static_masking:
            masked_ids, labels = self._mask_static(input_ids, token_type_ids, lengths, features)
        else:
            # a mixed run's pair carries its epoch in its source (data/mixture.py): its masks follow that epoch
            epochs = [f.get("mask_epoch") for f in features] if "mask_epoch" in features[0] else None
            masked_ids, labels = self._mask_dynamic(input_ids, lengths, epochs)
        batch = {
            "input_ids": masked_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "labels": labels,
        }
        has_label = ["sentence_order_label" in f for f in features]
        if any(has_label):
            if not all(has_label):
                raise ValueError("Some features have a sentence_order_label and some do not")
            batch["sentence_order_label"] = np.array([int(f["sentence_order_label"]) for f in features])
        if "source" in features[0]:  # a mixed run's: which source each pair came from (its tokens are counted)
            batch["source"] = np.array([int(f["source"]) for f in features])
        if self.masked_positions:
            width = self.max_predictions_per_seq if self.static_shapes else None
            batch["masked_lm_positions"], weights = fixed_size_positions(labels, width)
        if self.return_tensors == "pt":
            batch = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for k, v in batch.items()}
        if self.masked_positions:
            batch["masked_lm_weights"] = torch.from_numpy(weights) if self.return_tensors == "pt" else weights
        return batch

    # ------------------------------------------------------------------------------------------------------------

    def _mask_dynamic(self, input_ids: np.ndarray, lengths: np.ndarray, epochs: list[int] | None = None):
        """Official span selection for every row at once; returns (masked ids, labels)."""
        batch, width = input_ids.shape
        rows = np.arange(batch)
        candidate = ~self.special[input_ids]  # padding is <pad>, a special token
        # Word = a start piece plus the continuation pieces after it; a row's first candidate always starts one.
        first = candidate & (np.cumsum(candidate, axis=1) == 1)
        starts = candidate & (self.word_start[input_ids] | first)
        word_of = np.where(candidate, np.cumsum(starts, axis=1) - 1, -1)  # word index of every token
        n_words = starts.sum(axis=1)
        max_words = int(n_words.max())
        if max_words == 0:
            return input_ids.copy(), np.full_like(input_ids, -100)

        # Token count of every word and their running sums, so a span of words [s, e) has csum[e] - csum[s].
        flat = (rows[:, None] * max_words + word_of)[candidate]
        word_len = np.bincount(flat, minlength=batch * max_words).reshape(batch, max_words)
        csum = np.zeros((batch, max_words + 1), dtype=np.int64)
        np.cumsum(word_len, axis=1, out=csum[:, 1:])

        remaining = masking_budget(lengths, self.mlm_probability, self.max_predictions_per_seq).astype(np.int64)
        # Each row visits its words in a random order (padding words last) and draws n for each of them.
        keys, ngram, u, random_ids = self._draws(input_ids, lengths, n_words, max_words, epochs)
        keys[np.arange(max_words)[None, :] >= n_words[:, None]] = 2.0
        order = np.argsort(keys, axis=1)
        sizes = np.arange(1, self.max_ngram + 1)
        covered = np.zeros((batch, max_words + self.max_ngram), dtype=bool)

        for k in range(max_words):
            active = (remaining > 0) & (k < n_words)
            if not active.any():
                break
            start, n = order[:, k], ngram[:, k]
            ends = np.minimum(start[:, None] + sizes[None, :], n_words[:, None])  # (batch, max_ngram)
            counts = csum[rows[:, None], ends] - csum[rows, start][:, None]
            # Longest m <= n whose span fits the remaining budget (the official back-off); 0 = skip.
            m = ((counts <= remaining[:, None]) & (sizes[None, :] <= n[:, None])).sum(axis=1)
            span = start[:, None] + sizes[None, :] - 1  # word indices the span would cover
            in_span = (sizes[None, :] <= m[:, None]) & (span < n_words[:, None])
            overlap = (covered[rows[:, None], span] & in_span).any(axis=1)
            take = active & (m > 0) & ~overlap
            covered[rows[:, None], span] |= in_span & take[:, None]
            remaining -= np.where(take, counts[rows, np.maximum(m, 1) - 1], 0)

        predicted = candidate & covered[rows[:, None], np.maximum(word_of, 0)]
        # 80% [MASK], 10% unchanged, 10% a random id, per predicted token.
        labels = np.where(predicted, input_ids, -100)
        masked = np.where(predicted & (u < 0.8), self.mask_id, input_ids)
        masked = np.where(predicted & (u >= 0.9), random_ids, masked)
        return masked, labels

    def _draws(self, input_ids, lengths, n_words, max_words, epochs=None):
        """All random numbers of a batch: word-order keys, n-gram sizes (1..max_ngram), replacement uniforms and
        random ids. From the running stream, or after `set_epoch` from one generator per example (keyed on its own
        epoch where `epochs` gives one)."""
        batch, width = input_ids.shape
        if self._epoch is None:
            rng = self._generator()
            return (
                rng.random((batch, max_words)),
                rng.choice(self.max_ngram, size=(batch, max_words), p=self.ngram_p) + 1,
                rng.random((batch, width)),
                rng.integers(0, self.vocab_size, size=(batch, width)),
            )
        keys, u = np.ones((batch, max_words)), np.ones((batch, width))
        ngram, random_ids = np.ones((batch, max_words), np.int64), np.zeros((batch, width), np.int64)
        for i in range(batch):
            n, w = int(lengths[i]), int(n_words[i])
            digest = hashlib.blake2b(input_ids[i, :n].astype(np.int32).tobytes(), digest_size=16).digest()
            epoch = self._epoch if epochs is None else epochs[i]
            rng = np.random.default_rng([self.seed, epoch, int.from_bytes(digest, "little")])
            keys[i, :w] = rng.random(w)
            ngram[i, :w] = rng.choice(self.max_ngram, size=w, p=self.ngram_p) + 1
            u[i, :n] = rng.random(n)
            random_ids[i, :n] = rng.integers(0, self.vocab_size, size=n)
        return keys, ngram, u, random_ids

    def _mask_static(self, input_ids, token_type_ids, lengths, features):
        """The official per-example loop, seeded by (seed, example content): same example, same mask."""
        masked_ids, labels = input_ids.copy(), np.full_like(input_ids, -100)
        never = {self.cls_id, self.sep_id}
        for i, n in enumerate(lengths):
            ids = input_ids[i, :n]
            digest = hashlib.blake2b(digest_size=16)
            digest.update(repr(self.seed).encode())
            digest.update(ids.astype(np.int32).tobytes())
            digest.update(token_type_ids[i, :n].astype(np.int8).tobytes())
            digest.update(str(features[i].get("sentence_order_label", "")).encode())
            key = int.from_bytes(digest.digest(), "little")
            output, positions = official_masked_lm_predictions(
                ids.tolist(),
                self.word_start,
                never,
                self.mask_id,
                self.vocab_size,
                random.Random(key),
                np.random.RandomState(key % 2**32),
                self.mlm_probability,
                self.max_predictions_per_seq,
                self.max_ngram,
                self.favor_shorter_ngram,
            )
            masked_ids[i, :n] = output
            labels[i, positions] = ids[positions]
        return masked_ids, labels


__all__ = [
    "DataCollatorForAlbertPretraining",
    "official_masked_lm_predictions",
    "is_start_piece",
    "ngram_probabilities",
    "masking_budget",
]
