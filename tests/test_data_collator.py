"""DataCollatorForAlbertPretraining: masking statistics on thousands of real sequences, exactness of the static
(official) loop, output format, reproducibility and bad input."""

import random

import numpy as np
import pytest
import torch

from albert_hf import DataCollatorForAlbertPretraining
from albert_hf.pretraining.data.collator import official_masked_lm_predictions
from data_fixtures import embedded_pair_features, tokenizer

# ----------------------------------------------------------------------------------------------------------------
# Test-side transcriptions of the official rules (create_pretraining_data.py), on piece strings.

OFFICIAL_SPECIAL_PIECES = set(list('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')) | {"€".encode(), "£".encode()}
ENGLISH_CHARS = set(list("abcdefghijklmnopqrstuvwxyz"))


def official_is_start_piece(piece):
    return (
        piece.startswith("▁")
        or piece.startswith("<")
        or piece in OFFICIAL_SPECIAL_PIECES
        or not all(str(i).lower() in ENGLISH_CHARS.union(OFFICIAL_SPECIAL_PIECES) for i in piece)
    )


def official_create_masked_lm_predictions(
    tokens, masked_lm_prob, max_predictions_per_seq, vocab_words, rng, np_rng, ngram=3
):
    cand_indexes = []
    for i, tok in enumerate(tokens):
        if tok == "[CLS]" or tok == "[SEP]":
            continue
        if len(cand_indexes) >= 1 and not official_is_start_piece(tok):
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    output_tokens = list(tokens)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(tokens) * masked_lm_prob))))
    ngrams = np.arange(1, ngram + 1, dtype=np.int64)
    pvals = 1.0 / np.arange(1, ngram + 1)
    pvals /= pvals.sum(keepdims=True)
    ngram_indexes = []
    for idx in range(len(cand_indexes)):
        ngram_index = []
        for n in ngrams:
            ngram_index.append(cand_indexes[idx : idx + n])
        ngram_indexes.append(ngram_index)
    rng.shuffle(ngram_indexes)
    masked_lms = []
    covered_indexes = set()
    for cand_index_set in ngram_indexes:
        if len(masked_lms) >= num_to_predict:
            break
        if not cand_index_set:
            continue
        n = np_rng.choice(
            ngrams[: len(cand_index_set)],
            p=pvals[: len(cand_index_set)] / pvals[: len(cand_index_set)].sum(keepdims=True),
        )
        index_set = sum(cand_index_set[n - 1], [])
        n -= 1
        while len(masked_lms) + len(index_set) > num_to_predict:
            if n == 0:
                break
            index_set = sum(cand_index_set[n - 1], [])
            n -= 1
        if len(masked_lms) + len(index_set) > num_to_predict:
            continue
        is_any_index_covered = False
        for index in index_set:
            if index in covered_indexes:
                is_any_index_covered = True
                break
        if is_any_index_covered:
            continue
        for index in index_set:
            covered_indexes.add(index)
            if rng.random() < 0.8:
                masked_token = "[MASK]"
            else:
                if rng.random() < 0.5:
                    masked_token = tokens[index]
                else:
                    masked_token = vocab_words[rng.randint(0, len(vocab_words) - 1)]
            output_tokens[index] = masked_token
            masked_lms.append(index)
    return output_tokens, sorted(masked_lms)


def words_of(pieces, skip):
    """Official whole-word grouping: indices of each word, skipping the pieces in `skip`."""
    words = []
    for i, piece in enumerate(pieces):
        if piece in skip:
            continue
        if words and not official_is_start_piece(piece):
            words[-1].append(i)
        else:
            words.append([i])
    return words


def python_budget(length, p=0.15, cap=20):
    return min(cap, max(1, int(round(length * p))))


# ----------------------------------------------------------------------------------------------------------------


def collate_all(collator, features, batch_size=64):
    """Collate `features` batch by batch; return (input lengths, originals, outputs) per sequence."""
    results = []
    for start in range(0, len(features), batch_size):
        chunk = features[start : start + batch_size]
        batch = collator(list(chunk))
        for i, f in enumerate(chunk):
            n = len(f["input_ids"])
            results.append(
                (
                    np.array(f["input_ids"]),
                    batch["input_ids"][i, :n].numpy(),
                    batch["labels"][i].numpy(),
                    batch["attention_mask"][i].numpy(),
                )
            )
    return results


@pytest.fixture(scope="module")
def real_features():
    return embedded_pair_features(max_seq_length=128, count=4000)


@pytest.fixture(scope="module")
def dynamic_results(real_features):
    return collate_all(DataCollatorForAlbertPretraining(tokenizer=tokenizer(), seed=1), real_features)


@pytest.fixture(scope="module")
def static_results(real_features):
    collator = DataCollatorForAlbertPretraining(tokenizer=tokenizer(), seed=1, static_masking=True)
    return collate_all(collator, real_features[:1500])


@pytest.fixture(scope="module")
def epoch_results(real_features):
    collator = DataCollatorForAlbertPretraining(tokenizer=tokenizer(), seed=1)
    collator.set_epoch(3)
    return collate_all(collator, real_features)


@pytest.fixture(params=["dynamic", "epoch", "static"])
def results(request, dynamic_results, epoch_results, static_results):
    rows = {"dynamic": dynamic_results, "epoch": epoch_results, "static": static_results}[request.param]
    return request.param, rows


def test_enough_real_sequences(real_features):
    assert len(real_features) == 4000
    assert np.mean([len(f["input_ids"]) for f in real_features]) > 60


def test_budget_per_sequence(results):
    _, rows = results
    exact = 0
    for original, _, labels, _ in rows:
        predicted = int((labels != -100).sum())
        budget = python_budget(len(original))
        assert 1 <= predicted <= budget
        exact += predicted == budget
    assert exact / len(rows) > 0.99  # the span search fills the budget except in rare dead ends


def test_80_10_10_replacement(results):
    mode, rows = results
    vocab = len(tokenizer())
    mask_id = tokenizer().mask_token_id
    outcome = {"mask": 0, "kept": 0, "random": 0}
    random_ids = []
    for original, masked, labels, _ in rows:
        where = np.flatnonzero(labels[: len(original)] != -100)
        assert np.array_equal(labels[where], original[where])  # the label is the original token
        for position in where:
            if masked[position] == mask_id:
                outcome["mask"] += 1
            elif masked[position] == original[position]:
                outcome["kept"] += 1
            else:
                outcome["random"] += 1
                random_ids.append(masked[position])
        unmasked = np.setdiff1d(np.arange(len(original)), where)
        assert np.array_equal(masked[unmasked], original[unmasked])  # nothing else changes
    total = sum(outcome.values())
    assert total > 10 * len(rows)  # over 15 000 predictions
    tolerance = 4 * np.sqrt(0.8 * 0.2 / total)
    assert abs(outcome["mask"] / total - 0.8) < tolerance
    # A random replacement equals the original with probability 1/V: count it as "kept".
    assert abs(outcome["kept"] / total - (0.1 + 0.1 / vocab)) < tolerance
    assert abs(outcome["random"] / total - 0.1 * (1 - 1 / vocab)) < tolerance
    # Random replacements are uniform over the whole vocabulary.
    random_ids = np.array(random_ids)
    assert abs(np.mean(random_ids < vocab / 2) - 0.5) < 4 * 0.5 / np.sqrt(len(random_ids))
    assert random_ids.min() < 50 and random_ids.max() > vocab - 50


def test_whole_words_and_no_special_tokens(results):
    mode, rows = results
    tok = tokenizer()
    never = {tok.cls_token, tok.sep_token} if mode == "static" else set(tok.all_special_tokens)
    partial = 0
    for original, _, labels, attention in rows:
        pieces = tok.convert_ids_to_tokens(original.tolist())
        predicted = labels != -100
        assert not predicted[len(original) :].any() and not attention[len(original) :].any()  # padding
        assert not any(predicted[i] for i, p in enumerate(pieces) if p in never)
        for word in words_of(pieces, never):
            states = {bool(predicted[i]) for i in word}
            partial += len(states) > 1
    assert partial == 0


NGRAM_PATTERNS = {  # with single-piece words and a budget of 3, from p(n) = (6/11, 3/11, 2/11) and the back-off
    (3,): 2 / 11,
    (1, 2): 3 / 11 + 6 / 11 * 5 / 11,  # n1 = 2 then a 1-gram, or n1 = 1 then n2 in {2, 3} cut to 2
    (1, 1, 1): (6 / 11) ** 2,
}


@pytest.mark.parametrize("mode,count", [("dynamic", 4000), ("epoch", 4000), ("static", 1500)])
def test_ngram_lengths_follow_one_over_n(mode, count):
    tok = tokenizer()
    words = [
        i
        for p, i in tok.get_vocab().items()
        if p.startswith("▁") and len(p) > 2 and p[1:].isalpha() and p[1:].isascii()
    ]
    rng = np.random.default_rng(0)
    features = []
    for _ in range(count):
        body = rng.choice(words, size=509).tolist()  # every piece is a whole word: spans are visible
        features.append(
            {"input_ids": [tok.cls_token_id] + body[:254] + [tok.sep_token_id] + body[254:] + [tok.sep_token_id]}
        )
    collator = DataCollatorForAlbertPretraining(
        tokenizer=tok, seed=3, max_predictions_per_seq=3, static_masking=mode == "static"
    )
    if mode == "epoch":
        collator.set_epoch(0)
    patterns = {}
    for start in range(0, count, 100):
        labels = collator(features[start : start + 100])["labels"].numpy()
        for row in labels != -100:
            edges = np.diff(np.concatenate([[0], row.astype(int), [0]]))
            runs = tuple(sorted(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)))
            patterns[runs] = patterns.get(runs, 0) + 1
    # Two spans side by side read as one longer run; with ~500 words that is rare (well inside the tolerance).
    for runs, probability in NGRAM_PATTERNS.items():
        observed = patterns.get(runs, 0) / count
        assert abs(observed - probability) < 4 * np.sqrt(probability * (1 - probability) / count) + 0.01, runs


def test_static_masking_is_the_official_loop():
    tok = tokenizer()
    vocab_words = tok.convert_ids_to_tokens(list(range(len(tok))))
    word_start = np.array([official_is_start_piece(p) for p in vocab_words])
    features = embedded_pair_features(max_seq_length=128, count=4000)[:300]
    for seed, feature in enumerate(features):
        ids = list(feature["input_ids"])
        tokens = tok.convert_ids_to_tokens(ids)
        expected_tokens, expected_positions = official_create_masked_lm_predictions(
            tokens, 0.15, 20, vocab_words, random.Random(seed), np.random.RandomState(seed)
        )
        output, positions = official_masked_lm_predictions(
            ids,
            word_start,
            {tok.cls_token_id, tok.sep_token_id},
            tok.mask_token_id,
            len(tok),
            random.Random(seed),
            np.random.RandomState(seed),
        )
        assert positions == expected_positions
        assert tok.convert_ids_to_tokens(output) == expected_tokens


# ----------------------------------------------------------------------------------------------------------------


def test_output_format_and_pass_through(real_features):
    tok = tokenizer()
    features = list(real_features[:37])
    batch = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0)(features)
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "sentence_order_label"}
    assert all(v.dtype == torch.long for v in batch.values())
    longest = max(len(f["input_ids"]) for f in features)
    assert batch["input_ids"].shape == (37, -(-longest // 8) * 8)
    for i, f in enumerate(features):
        n = len(f["input_ids"])
        assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (batch["input_ids"].shape[1] - n)
        assert batch["token_type_ids"][i, :n].tolist() == list(f["token_type_ids"])
        assert not batch["token_type_ids"][i, n:].any()
        assert (batch["input_ids"][i, n:] == tok.pad_token_id).all()
    assert batch["sentence_order_label"].tolist() == [f["sentence_order_label"] for f in features]


def test_masked_positions_give_the_official_fixed_size_form(real_features):
    tok = tokenizer()
    features = list(real_features[:37])
    plain = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0)(features)
    batch = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0, masked_positions=True)(features)
    assert set(batch) == set(plain) | {"masked_lm_positions", "masked_lm_weights"}
    assert all(torch.equal(batch[k], plain[k]) for k in plain)  # the same masks
    positions, weights = batch["masked_lm_positions"], batch["masked_lm_weights"]
    masked = batch["labels"] != -100
    assert positions.dtype == torch.long and weights.dtype == torch.float32
    assert positions.shape == weights.shape == (37, int(masked.sum(1).max()))
    for row in range(37):
        count = int(masked[row].sum())
        assert positions[row, :count].tolist() == masked[row].nonzero().squeeze(1).tolist()  # ascending
        assert weights[row].tolist() == [1.0] * count + [0.0] * (positions.shape[1] - count)
        assert not positions[row, count:].any()


def test_static_shapes_give_every_batch_one_shape_with_the_same_masks(real_features):
    """As on a GPU (pretraining_inputs.build_inputs): rows of max_length, max_predictions_per_seq positions."""
    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining

    tok = tokenizer()
    static = DataCollatorForAlbertPretraining(
        tokenizer=tok, seed=0, masked_positions=True, static_shapes=True, max_length=160, max_predictions_per_seq=20
    )
    dynamic = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0, masked_positions=True, max_predictions_per_seq=20)
    for collator in (static, dynamic):
        collator.set_epoch(0)  # masks keyed on the example, whatever the batch's width
    short = [f for f in real_features if len(f["input_ids"]) < 40][:5]
    for features in (list(real_features[:7]), short):
        batch, plain = static(features), dynamic(features)
        assert batch["input_ids"].shape == batch["labels"].shape == (len(features), 160)
        assert batch["masked_lm_positions"].shape == batch["masked_lm_weights"].shape == (len(features), 20)
        width, count = plain["input_ids"].shape[1], plain["masked_lm_positions"].shape[1]
        assert width < 160 and count < 20 or features is not short
        assert torch.equal(batch["input_ids"][:, :width], plain["input_ids"])  # the same masks, more padding
        assert (batch["input_ids"][:, width:] == tok.pad_token_id).all()
        assert not batch["attention_mask"][:, width:].any()
        assert torch.equal(batch["masked_lm_positions"][:, :count], plain["masked_lm_positions"])
        assert not batch["masked_lm_weights"][:, count:].any()
    # The model's losses do not depend on the extra padding and the unused positions.
    model = AlbertHFForPreTraining(
        AlbertHFConfig.from_preset("tiny", vocab_size=len(tok), unpad_inputs=False, max_position_embeddings=160)
    ).eval()
    with torch.no_grad():
        a, b = model(**static(short)), model(**dynamic(short))
    torch.testing.assert_close(a.mlm_loss, b.mlm_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.sop_loss, b.sop_loss, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="static_shapes needs max_length and masked_positions"):
        DataCollatorForAlbertPretraining(tokenizer=tok, static_shapes=True, max_length=64)


def test_token_types_derived_when_absent():
    tok = tokenizer()
    encoded = tok("Return the value.", "Raise an error otherwise.")
    feature = {"input_ids": encoded["input_ids"]}  # no token_type_ids, no sentence_order_label
    batch = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0)([feature])
    n = len(encoded["input_ids"])
    assert batch["token_type_ids"][0, :n].tolist() == encoded["token_type_ids"]
    assert "sentence_order_label" not in batch


def test_seeded_and_reproducible(real_features):
    tok = tokenizer()
    features = list(real_features[:64])
    make = lambda **kw: DataCollatorForAlbertPretraining(tokenizer=tok, **kw)  # noqa: E731
    first, again = make(seed=5), make(seed=5)
    a = first(features)
    assert torch.equal(a["labels"], again(features)["labels"])
    assert not torch.equal(a["labels"], first(features)["labels"])  # dynamic: a new mask every batch
    assert not torch.equal(a["labels"], make(seed=6)(features)["labels"])
    # Static: an example's mask depends on the example only, not on its batch or position.
    static = make(seed=5, static_masking=True)
    whole = static(features)
    alone = make(seed=5, static_masking=True)(features[10:11])
    n = len(features[10]["input_ids"])
    assert torch.equal(whole["labels"][10, :n], alone["labels"][0, :n])
    assert torch.equal(static(features)["labels"], whole["labels"])
    assert not torch.equal(make(seed=6, static_masking=True)(features)["labels"], whole["labels"])


def test_epoch_keyed_masks_ignore_batching_and_change_per_epoch(real_features):
    tok = tokenizer()
    features = list(real_features[:16])
    whole, halves = (DataCollatorForAlbertPretraining(tokenizer=tok, seed=2) for _ in range(2))
    whole.set_epoch(4)
    halves.set_epoch(4)
    batch = whole(features)
    # Two "processes" with half the batch each, in the other order: the same masks per example.
    for part in (features[8:], features[:8]):
        labels = halves(part)["labels"]
        for i, f in enumerate(part):
            n = len(f["input_ids"])
            assert torch.equal(labels[i, :n], batch["labels"][features.index(f), :n])
    assert torch.equal(whole(features)["input_ids"], batch["input_ids"])  # same epoch, same masks
    whole.set_epoch(5)
    assert not torch.equal(whole(features)["labels"], batch["labels"])
    # The checkpointable state carries the epoch (and the stream position, for runs without set_epoch).
    restored = DataCollatorForAlbertPretraining(tokenizer=tok, seed=2)
    restored.load_state_dict(halves.state_dict())
    assert torch.equal(restored(features)["labels"], batch["labels"])
    stream = DataCollatorForAlbertPretraining(tokenizer=tok, seed=2)
    stream(features)
    saved = stream.state_dict()
    expected = stream(features)["labels"]
    resumed = DataCollatorForAlbertPretraining(tokenizer=tok, seed=99)
    resumed.load_state_dict(saved)
    assert torch.equal(resumed(features)["labels"], expected)
    with pytest.raises(ValueError, match="seed"):
        DataCollatorForAlbertPretraining(tokenizer=tok).set_epoch(0)


def test_dataloader_workers_draw_different_masks():
    tok = tokenizer()
    feature = dict(embedded_pair_features(max_seq_length=128, count=4000)[0])
    collator = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0)

    def run():
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader([feature] * 64, batch_size=16, num_workers=2, collate_fn=collator)
        return [batch["labels"] for batch in loader]

    batches = run()
    assert not torch.equal(batches[0], batches[1])  # worker 0 and worker 1 see the same examples
    assert all(torch.equal(x, y) for x, y in zip(batches, run()))  # and torch's seed makes it repeatable


@pytest.mark.parametrize(
    "make_batch, message",
    [
        (
            lambda tok, features: [
                dict(features[0]),
                {"input_ids": [tok.cls_token_id] + [10] * 600 + [tok.sep_token_id]},
            ],
            "602 tokens, more than max_length=512",
        ),
        (lambda tok, features: [{**features[0], "labels": [1, 2]}], "labels"),
        (lambda tok, features: [dict(features[0]), {"input_ids": features[1]["input_ids"]}], "sentence_order_label"),
        (lambda tok, features: [], "empty batch"),
    ],
    ids=["too long", "labels given", "no sentence_order_label", "empty"],
)
def test_a_bad_batch_is_a_clear_error(real_features, make_batch, message):
    tok = tokenizer()
    with pytest.raises(ValueError, match=message):
        DataCollatorForAlbertPretraining(tokenizer=tok, seed=0)(make_batch(tok, real_features))


def test_a_bad_mlm_probability_is_a_clear_error():
    with pytest.raises(ValueError, match="mlm_probability"):
        DataCollatorForAlbertPretraining(tokenizer=tokenizer(), mlm_probability=1.5)
