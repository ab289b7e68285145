"""Sentence-pair building: the official algorithm, SOP/NSP semantics, determinism, caching and bad input."""

import logging
import random
from types import SimpleNamespace

import datasets
import numpy as np
import pytest

from albert_hf.pretraining.data.corpus import load_text_files
from albert_hf.pretraining.data.pairs import BatchDocuments, create_pretraining_pairs, instances_from_document
from albert_hf.pretraining.data.sentences import tokenize_documents
from data_fixtures import embedded_pairs, tokenized_embedded, tokenizer
from helpers import shared_data

CLS, SEP = 2, 3
FAKE_TOKENIZER = SimpleNamespace(cls_token_id=CLS, sep_token_id=SEP, model_max_length=512)


# ----------------------------------------------------------------------------------------------------------------
# Synthetic documents whose every token says where it came from: 10 + doc * 10000 + sentence * 100 + position.


def token(doc, sentence, position):
    return 10 + doc * 10000 + sentence * 100 + position


def origin(tok):
    t = int(tok) - 10
    return t // 10000, (t % 10000) // 100, t % 100


def synthetic_documents(num_docs, seed, max_sentences=12, max_len=40):
    rng = random.Random(seed)
    docs = []
    for d in range(num_docs):
        n = rng.randint(1, max_sentences)
        docs.append([[token(d, s, j) for j in range(rng.randint(1, max_len))] for s in range(n)])
    return docs


def as_tokenized_dataset(docs):
    ids = [[t for sentence in doc for t in sentence] for doc in docs]
    offsets = [list(np.cumsum([0] + [len(s) for s in doc])) for doc in docs]
    features = datasets.Features(
        {
            "input_ids": datasets.List(datasets.Value("int32")),
            "sentence_offsets": datasets.List(datasets.Value("int32")),
        }
    )
    return datasets.Dataset.from_dict({"input_ids": ids, "sentence_offsets": offsets}, features=features)


def official_instances(all_documents, document_index, max_seq_length, short_seq_prob, random_next_sentence, rng):
    """A literal transcription of the official create_instances_from_document, minus the masking step."""
    document = all_documents[document_index]
    max_num_tokens = max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances = []
    current_chunk = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b = []
                if len(current_chunk) == 1 or (random_next_sentence and rng.random() < 0.5):
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    num_unused_segments = len(current_chunk) - a_end
                    i -= num_unused_segments
                elif not random_next_sentence and rng.random() < 0.5:
                    is_random_next = True
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                    tokens_a, tokens_b = tokens_b, tokens_a
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                while len(tokens_a) + len(tokens_b) > max_num_tokens:
                    trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
                    if rng.random() < 0.5:
                        del trunc_tokens[0]
                    else:
                        trunc_tokens.pop()
                instances.append((tokens_a, tokens_b, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


@pytest.mark.parametrize("random_next_sentence", [False, True])
@pytest.mark.parametrize("max_seq_length,short_seq_prob", [(64, 0.1), (24, 0.5), (512, 0.3)])
def test_same_instances_as_the_official_algorithm(random_next_sentence, max_seq_length, short_seq_prob):
    docs = synthetic_documents(40, seed=max_seq_length)
    arrays = [(np.array([t for s in d for t in s], np.int32), np.cumsum([0] + [len(s) for s in d])) for d in docs]
    pool = BatchDocuments(arrays, list(range(len(docs))))
    total = 0
    for seed in range(3):
        ours_rng, official_rng = random.Random(seed), random.Random(seed)
        for index in range(len(docs)):
            for _ in range(2):  # two dupe passes share one stream, as officially
                expected = official_instances(
                    docs, index, max_seq_length, short_seq_prob, random_next_sentence, official_rng
                )
                ours = [
                    (a[0][a[1] : a[2]].tolist(), b[0][b[1] : b[2]].tolist(), label)
                    for a, b, label in instances_from_document(
                        index,
                        *arrays[index],
                        pool,
                        ours_rng,
                        max_seq_length=max_seq_length,
                        short_seq_prob=short_seq_prob,
                        random_next_sentence=random_next_sentence,
                    )
                ]
                assert ours == expected
                total += len(ours)
    assert total > 200


# ----------------------------------------------------------------------------------------------------------------
# Semantics of the built dataset


def split_instance(ids, types):
    ids, types = list(ids), list(types)
    assert ids[0] == CLS and ids[-1] == SEP and ids.count(SEP) == 2
    first_sep = ids.index(SEP)
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    return ids[1:first_sep], ids[first_sep + 1 : -1]


def sentences_of(segment):
    return sorted({origin(t)[:2] for t in segment})


def test_sop_pairs_are_in_order_or_swapped_never_foreign():
    docs = synthetic_documents(150, seed=1)
    pairs = create_pretraining_pairs(
        as_tokenized_dataset(docs),
        FAKE_TOKENIZER,
        max_seq_length=128,
        dupe_factor=4,
        one_chunk="skip",
        min_sentences=2,
        seed=7,
    )
    labels = np.array(pairs["sentence_order_label"])
    assert len(labels) > 500
    assert abs(labels.mean() - 0.5) < 4 * 0.5 / np.sqrt(len(labels))
    for ids, types, label in zip(pairs["input_ids"], pairs["token_type_ids"], labels):
        assert len(ids) <= 128
        a, b = split_instance(ids, types)
        assert a and b
        a_sents, b_sents = sentences_of(a), sentences_of(b)
        assert {d for d, _ in a_sents + b_sents} == {a_sents[0][0]}  # one document only
        first, second = (a_sents, b_sents) if label == 0 else (b_sents, a_sents)
        assert first[-1][1] < second[0][1]  # label 1 <=> the later sentences come first
        if len(ids) < 128:  # not truncated: whole, consecutive sentences
            assert [s for _, s in first + second] == list(range(first[0][1], second[-1][1] + 1))


def test_nsp_negatives_come_from_other_documents():
    docs = synthetic_documents(150, seed=2)
    pairs = create_pretraining_pairs(
        as_tokenized_dataset(docs), FAKE_TOKENIZER, max_seq_length=96, dupe_factor=2, task="nsp", seed=3
    )
    labels = np.array(pairs["sentence_order_label"])
    foreign = []
    for ids, types, label in zip(pairs["input_ids"], pairs["token_type_ids"], labels):
        a, b = split_instance(ids, types)
        a_doc, b_docs = origin(a[0])[0], {origin(t)[0] for t in b}
        assert len(b_docs) == 1
        foreign.append(b_docs != {a_doc})
        if label == 0:  # the true continuation: B's sentences follow A's
            assert not foreign[-1] and sentences_of(a)[-1][1] < sentences_of(b)[0][1]
    assert np.array_equal(np.array(foreign), labels == 1)  # label 1 <=> B from another document
    # NSP: half random, plus the forced random B of one-sentence chunks.
    assert 0.5 <= labels.mean() < 0.65


def test_one_chunk_quirk_is_kept_by_default_and_can_be_skipped():
    docs = synthetic_documents(150, seed=4, max_len=60)
    tokenized = as_tokenized_dataset(docs)
    kwargs = dict(max_seq_length=64, dupe_factor=2, seed=5, shuffle=False)
    official = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, **kwargs)
    foreign = [
        origin(split_instance(i, t)[0][0])[0] != origin(split_instance(i, t)[1][0])[0]
        for i, t in zip(official["input_ids"], official["token_type_ids"])
    ]
    assert sum(foreign) > 20  # SOP data with random-document negatives, as the official code makes
    assert all(label == 1 for label, f in zip(official["sentence_order_label"], foreign) if f)
    skipped = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, one_chunk="skip", **kwargs)
    assert not any(
        origin(split_instance(i, t)[0][0])[0] != origin(split_instance(i, t)[1][0])[0]
        for i, t in zip(skipped["input_ids"], skipped["token_type_ids"])
    )


def test_truncation_keeps_both_sides_and_the_limit():
    docs = [[[token(d, s, j) for j in range(90)] for s in range(6)] for d in range(30)]  # long sentences
    pairs = create_pretraining_pairs(
        as_tokenized_dataset(docs), FAKE_TOKENIZER, max_seq_length=64, dupe_factor=2, short_seq_prob=0.0
    )
    lengths = [len(ids) for ids in pairs["input_ids"]]
    assert max(lengths) == 64 and min(lengths) == 64  # every pair needed cutting, to exactly the limit
    for ids, types in zip(pairs["input_ids"], pairs["token_type_ids"]):
        a, b = split_instance(ids, types)
        assert abs(len(a) - len(b)) <= 1  # the longer side is always the one cut
        for segment in (a, b):  # cut only at the ends: what is left is contiguous
            positions = [origin(t) for t in segment]
            assert positions == sorted(positions)


def test_short_seq_prob_draws_short_targets():
    docs = [[[token(d, s, j) for j in range(5)] for s in range(400)] for d in range(200)]
    long_only = create_pretraining_pairs(
        as_tokenized_dataset(docs),
        FAKE_TOKENIZER,
        max_seq_length=128,
        short_seq_prob=0.0,
        dupe_factor=1,
        one_chunk="skip",
    )
    assert min(len(ids) for ids in long_only["input_ids"]) >= 125 - 5
    mixed = create_pretraining_pairs(
        as_tokenized_dataset(docs),
        FAKE_TOKENIZER,
        max_seq_length=128,
        short_seq_prob=0.5,
        dupe_factor=1,
        one_chunk="skip",
    )
    short = np.mean([len(ids) < 120 for ids in mixed["input_ids"]])
    assert short > 0.3  # a short target makes many short pairs out of its document


def test_deterministic_whatever_num_proc_and_batch_size():
    tokenized = as_tokenized_dataset(synthetic_documents(60, seed=9))
    kwargs = dict(max_seq_length=64, dupe_factor=2, seed=11, shuffle=False)
    one = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, batch_size=7, **kwargs)
    two = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, batch_size=256, num_proc=2, **kwargs)
    assert one["input_ids"] == two["input_ids"]
    assert one["sentence_order_label"] == two["sentence_order_label"]
    other = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, **{**kwargs, "seed": 12})
    assert other["input_ids"] != one["input_ids"]


def test_dupe_factor_makes_differently_cut_copies():
    tokenized = as_tokenized_dataset(synthetic_documents(80, seed=13))
    single = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=1)
    quad = create_pretraining_pairs(tokenized, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=4)
    assert 3 * len(single) < len(quad) < 5 * len(single)
    distinct = {tuple(ids) for ids in quad["input_ids"]}
    assert len(distinct) > 2 * len(single)


def test_pairs_from_disk_are_cached(tmp_path):
    tokenized = as_tokenized_dataset(synthetic_documents(30, seed=15))
    tokenized.save_to_disk(str(tmp_path / "tok"))
    on_disk = datasets.load_from_disk(str(tmp_path / "tok"))
    first = create_pretraining_pairs(on_disk, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=1, shuffle=False)
    again = create_pretraining_pairs(on_disk, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=1, shuffle=False)
    assert first.cache_files and first.cache_files == again.cache_files
    changed = create_pretraining_pairs(on_disk, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=2, shuffle=False)
    assert changed.cache_files != first.cache_files


def test_short_documents_are_skipped_and_counted(caplog):
    docs = synthetic_documents(22, seed=17)
    docs[0], docs[21] = [[token(0, 0, 0), token(0, 0, 1)]], []  # one sentence; empty
    expected_short = sum(1 for d in docs if len(d) == 1)
    with caplog.at_level(logging.INFO, logger="albert_hf"):
        pairs = create_pretraining_pairs(as_tokenized_dataset(docs), FAKE_TOKENIZER, max_seq_length=64, dupe_factor=1)
    assert f"skipped 1 empty and {expected_short} with fewer than 2 sentences" in caplog.text
    used_docs = {origin(t)[0] for ids in pairs["input_ids"] for t in ids if t > SEP}
    assert not used_docs & {d for d, doc in enumerate(docs) if len(doc) < 2}


def test_one_document_warns_only_when_a_random_segment_can_be_drawn(caplog):
    one = as_tokenized_dataset([synthetic_documents(1, seed=23, max_sentences=12)[0] * 2])
    for task, one_chunk, warns in (("nsp", "skip", True), ("sop", "random_next", True), ("sop", "skip", False)):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="albert_hf"):
            create_pretraining_pairs(
                one, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=1, task=task, one_chunk=one_chunk
            )
        assert ("Only one usable document" in caplog.text) is warns, (task, one_chunk)


@pytest.mark.parametrize(
    "make_documents, options, message",
    [
        (
            lambda: as_tokenized_dataset(synthetic_documents(5, seed=19)),
            {"max_seq_length": 600},
            "max_seq_length=600 exceeds .*512",
        ),
        (lambda: as_tokenized_dataset(synthetic_documents(5, seed=19)), {"task": "mlm"}, "task"),
        (lambda: datasets.Dataset.from_dict({"input_ids": [[1, 2]]}), {}, "sentence_offsets"),
        (
            lambda: as_tokenized_dataset([[[token(d, 0, 0)]] for d in range(4)]),
            {},
            "No document has 2 or more sentences",
        ),
    ],
    ids=["too long", "unknown task", "not sentence-split", "one sentence each"],
)
def test_bad_documents_or_options_are_a_clear_error(make_documents, options, message):
    with pytest.raises(ValueError, match=message):
        create_pretraining_pairs(make_documents(), FAKE_TOKENIZER, **options)


def test_documents_without_the_text_column_are_a_clear_error():
    with pytest.raises(ValueError, match="no text column 'text'"):
        tokenize_documents(datasets.Dataset.from_dict({"body": ["Some text."]}), tokenizer())


# ----------------------------------------------------------------------------------------------------------------
# Real text


def test_real_pairs_from_the_embedded_corpus():
    tok = tokenizer()
    pairs = embedded_pairs(max_seq_length=128)
    assert len(pairs) > 3000
    labels = np.array(pairs["sentence_order_label"])
    # SOP's 50% plus the one-chunk random-document pairs; far from all-one or all-zero.
    assert 0.48 < labels.mean() < 0.65
    for ids, types in zip(pairs["input_ids"][:2000], pairs["token_type_ids"][:2000]):
        assert len(ids) <= 128
        first_sep = ids.index(tok.sep_token_id)
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and ids.count(tok.sep_token_id) == 2
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
    # Tokenized documents decode back to their text (lowercased, spaces normalised).
    docs = tokenized_embedded()
    from data_fixtures import embedded

    texts = embedded()["text"]
    plain = [i for i, t in enumerate(texts[:500]) if t.isascii() and len(t) > 200][:20]
    assert plain
    for i in plain:
        expected = "".join(texts[i].lower().split()).replace("``", '"').replace("''", '"')  # ALBERT's quotes
        assert tok.decode(docs[i]["input_ids"]).replace(" ", "") == expected


def test_streaming_corpus_builds_pairs_from_each_batch():
    docs = synthetic_documents(50, seed=21)
    streamed = as_tokenized_dataset(docs).to_iterable_dataset()
    pairs = list(
        create_pretraining_pairs(streamed, FAKE_TOKENIZER, max_seq_length=64, dupe_factor=1, batch_size=10, task="nsp")
    )
    assert len(pairs) > 50
    for row in pairs:
        a, b = split_instance(row["input_ids"], row["token_type_ids"])
        if row["sentence_order_label"] == 1 and origin(a[0])[0] != origin(b[0])[0]:
            assert origin(a[0])[0] // 10 == origin(b[0])[0] // 10  # random B from the same map batch


def test_real_books_make_long_pairs(tmp_path):
    folder = shared_data("corpus", "inaugural")
    corpus = load_text_files(folder, cache_dir=str(tmp_path))
    tok = tokenizer()
    pairs = create_pretraining_pairs(tokenize_documents(corpus, tok), tok, max_seq_length=512, dupe_factor=1)
    lengths = np.array([len(ids) for ids in pairs["input_ids"]])
    assert lengths.max() == 512
    assert np.mean(lengths >= 500) > 0.6  # mostly full-length pairs, as the official data
    assert np.mean(lengths < 400) > 0.03  # and some short ones (short_seq_prob, document ends)
    assert abs(np.mean(pairs["sentence_order_label"]) - 0.5) < 0.08


def test_tokenizing_ignores_padding_left_on_by_an_earlier_tokenizer_call():
    """A fast tokenizer keeps padding/truncation switched on after tokenizer(..., padding=True, truncation=True);
    the document tokenizer must not pad every sentence because of that."""
    import datasets

    from albert_hf.pretraining.data.sentences import tokenize_documents

    tok = tokenizer()
    documents = datasets.Dataset.from_dict({"text": ["A short one. Then another sentence here."]})
    clean = tokenize_documents(documents, tok)[0]
    tok(["a", "a much longer sentence"], padding="max_length", truncation=True, max_length=32)
    try:
        assert tok.backend_tokenizer.padding is not None  # the state the earlier call leaves behind
        after = tokenize_documents(documents, tok)[0]
    finally:
        tok.backend_tokenizer.no_padding()
        tok.backend_tokenizer.no_truncation()
    assert after["input_ids"] == clean["input_ids"] and after["sentence_offsets"] == clean["sentence_offsets"]
    assert tok.pad_token_id not in after["input_ids"]
