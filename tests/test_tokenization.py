"""Training ALBERT's SentencePiece tokenizer and loading spiece.model files, all offline."""

import io
import json
import os
import subprocess
import sys
import textwrap
import unicodedata

import pytest
import sentencepiece as spm

from albert_hf.errors import InputError
from albert_hf.tokenization import load_spiece_model, split_sentences, train_tokenizer
from data_fixtures import TEST_VOCAB_SIZE, embedded, tokenizer
from helpers import shared_data


def _fresh_process(script: str, **env) -> str:
    """Run `script` in a new interpreter that cannot import sentencepiece and has no Hub access."""
    code = "import sys; sys.modules['sentencepiece'] = None\n" + textwrap.dedent(script)
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **env},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_trained_tokenizer_has_albert_layout():
    tok = tokenizer()
    assert len(tok) == TEST_VOCAB_SIZE
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 4]) == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    ids = (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id, tok.mask_token_id)
    assert ids == (0, 1, 2, 3, 4)
    # The official user-defined pieces are single pieces.
    for symbol in ["(", ")", '"', "-", "."]:
        assert symbol in tok.get_vocab()
    # Lowercased and accent-stripped, as ALBERT's preprocessing does.
    assert tok("Café RÉSUMÉ Naïve")["input_ids"] == tok("cafe resume naive")["input_ids"]
    assert tok.model_max_length == 512


def test_pairs_return_token_type_ids_by_default():
    tok = tokenizer()
    encoded = tok("Return the value.", "Raise an error otherwise.")
    ids, types = encoded["input_ids"], encoded["token_type_ids"]
    first_sep = ids.index(tok.sep_token_id)
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)


def test_saved_tokenizer_loads_offline_without_sentencepiece(tmp_path):
    train_tokenizer(embedded(), vocab_size=TEST_VOCAB_SIZE, output_dir=tmp_path)
    assert {"tokenizer.json", "tokenizer_config.json", "spiece.model"} <= set(os.listdir(tmp_path))
    out = _fresh_process(f"""
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained({str(tmp_path)!r})
        enc = tok("The first part.", "The second part.")
        print(type(tok).__name__, len(tok), sum(enc["token_type_ids"]) > 0, enc["input_ids"][0])
    """)
    assert out.split() == ["AlbertTokenizer", str(TEST_VOCAB_SIZE), "True", "2"]


def test_training_is_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("ALBERT_HF_CACHE", str(tmp_path / "cache"))
    texts = [" ".join(split_sentences(t)) for t in embedded()["text"][:1500]]
    first = train_tokenizer(texts, vocab_size=300)
    assert (tmp_path / "cache" / "tokenizers").is_dir()

    def no_training(*args, **kwargs):
        raise AssertionError("trained again instead of using the cache")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    again = train_tokenizer(texts, vocab_size=300)
    assert again.get_vocab() == first.get_vocab()
    rows = train_tokenizer([{"text": text} for text in texts], vocab_size=300)  # rows are read as their text
    assert rows.get_vocab() == first.get_vocab()
    with pytest.raises(AssertionError, match="trained again"):  # other settings are another tokenizer
        train_tokenizer(texts, vocab_size=310)


def test_bad_training_input_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no text"):
        train_tokenizer(["", "   "], vocab_size=100, use_cache=False)
    with pytest.raises(ValueError, match="vocab_size=30000"):
        train_tokenizer(["A short corpus. With few pieces."] * 20, vocab_size=30000, use_cache=False)
    import datasets

    with pytest.raises(ValueError, match="no text column 'text'"):
        train_tokenizer(datasets.Dataset.from_dict({"body": ["x"]}), vocab_size=100)


def _spm_model(sentences, **flags) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, minloglevel=2, **flags)
    return model.getvalue()


ALBERT_SPM_FLAGS = dict(
    model_type="unigram",
    vocab_size=600,
    pad_id=0,
    unk_id=1,
    bos_id=-1,
    eos_id=-1,
    control_symbols=["[CLS]", "[SEP]", "[MASK]"],
    user_defined_symbols=["(", ")", '"', "-", "."],
)


def official_preprocess(text: str) -> str:
    """The official tokenization.preprocess_text(lower=True): spaces, `` and '' quotes, accents, case."""
    text = " ".join(text.strip().split()).replace("``", '"').replace("''", '"')
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return text.lower()


def test_load_spiece_model_matches_sentencepiece(tmp_path):
    sentences = [s for t in embedded()["text"][:3000] for s in split_sentences(t)]
    preprocessed = [official_preprocess(s) for s in sentences]  # what ALBERT trains spm on
    (tmp_path / "spiece.model").write_bytes(_spm_model(preprocessed, **ALBERT_SPM_FLAGS))
    processor = spm.SentencePieceProcessor(model_file=str(tmp_path / "spiece.model"))

    tok = load_spiece_model(tmp_path, output_dir=tmp_path / "hf")  # a directory holding spiece.model
    assert len(tok) == processor.get_piece_size()
    assert tok.convert_ids_to_tokens(list(range(10))) == [processor.id_to_piece(i) for i in range(10)]
    for sentence in sentences[:500]:
        expected = processor.encode(official_preprocess(sentence))
        assert tok(sentence, add_special_tokens=False)["input_ids"] == expected, sentence
    # spm's nmt_nfkc normalisation travels along: a full-width string segments like its ASCII form.
    assert tok("ｒｅｔｕｒｎ ｔｈｅ")["input_ids"] == tok("return the")["input_ids"]

    out = _fresh_process(f"""
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained({str(tmp_path / "hf")!r})
        print(tok("return the value", "and more")["token_type_ids"][-1], len(tok))
    """)
    assert out.split() == ["1", str(processor.get_piece_size())]


def test_load_spiece_model_rejects_bad_models(tmp_path):
    with pytest.raises(InputError, match="missing.model"):
        load_spiece_model(tmp_path / "missing.model")
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"this is not a sentencepiece model")
    with pytest.raises(ValueError, match="garbage.model"):
        load_spiece_model(garbage)
    # A default spm model (<unk>=0, <s>, </s>, no [CLS]/[SEP]/[MASK]) is not an ALBERT model.
    generic = tmp_path / "generic.model"
    generic.write_bytes(_spm_model([f"sentence number {i} of a few" for i in range(200)], vocab_size=40))
    with pytest.raises(ValueError, match=r"generic.model lacks ALBERT's special pieces \['<pad>', '\[CLS\]'"):
        load_spiece_model(generic)


def test_training_reads_a_bounded_sample_of_the_sentences(caplog):
    """--tokenizer_sample_sentences is SentencePiece's input_sentence_size: it trains on that many sentences drawn
    from all of them. 3,000 distinct sentences give 300 pieces; a sample of 5 cannot (too few characters and words)."""
    import logging

    texts = [" ".join(split_sentences(t)) for t in embedded()["text"][:1500]]
    with caplog.at_level(logging.INFO, logger="albert_hf"):
        train_tokenizer(texts, vocab_size=300, use_cache=False, input_sentence_size=1_000_000)
    assert "Trained a 300-piece unigram model on all of" in caplog.text
    with pytest.raises(ValueError, match="A small corpus needs a smaller vocab_size"):
        train_tokenizer(texts, vocab_size=300, use_cache=False, input_sentence_size=5)


# Strings where normalisation, whitespace or added tokens could make two encoders part ways.
TRICKY = [
    "",
    "   ",
    "Hello world.",
    "``Quoted'' text",
    "Ünïcödé naïve café",
    "non\u00a0breaking\tand\ttabs",
    "zero\u200bwidth",
    "ﬁne ligatures ﬂow",
    "İstanbul straße ΣΊΣΥΦΟΣ",
    "ｒｅｔｕｒｎ ｔｈｅ",
    "漢字とかな",
    "emoji 🙂 here",
    "a <unk> b",
    "[MASK] at the start",
    "x▁y",
    "e\u0301 combining",
    "control\x07bell",
    "dashes – and — £5 €3 (brackets)",
    "a  b   c",
    "ǅ ǈ ǋ title case",
    "ﬀ ﬃ Ⅻ ½",
    "***START***",
    "_______ regiment",
    "Hahahaha!",
    "1000000 dollars...",
]


def test_the_sentencepiece_encoder_gives_the_tokenizers_ids():
    from albert_hf.pretraining.data.sentences import plain_backend
    from albert_hf.pretraining.data.spm_encoder import SentencePieceEncoder

    tok = tokenizer()
    backend = plain_backend(tok)
    encoder = SentencePieceEncoder.for_tokenizer(tok, backend)
    assert encoder is not None  # a trained tokenizer keeps its spiece.model beside tokenizer.json
    sentences = TRICKY + [s for t in embedded()["text"][:2000] for s in split_sentences(t)]
    expected = [encoding.ids for encoding in backend.encode_batch_fast(sentences, add_special_tokens=False)]
    assert encoder.encode(sentences) == expected


@pytest.mark.corpus
def test_the_sentencepiece_encoder_gives_the_tokenizers_ids_on_the_real_corpus():
    from albert_hf.pretraining.data.corpus import find_text_files, read_text_documents
    from albert_hf.pretraining.data.sentences import plain_backend
    from albert_hf.pretraining.data.spm_encoder import SentencePieceEncoder

    files = find_text_files(shared_data("corpus"))
    tok = tokenizer()
    backend = plain_backend(tok)
    encoder = SentencePieceEncoder.for_tokenizer(tok, backend)
    sentences = [s for row in read_text_documents(files) for s in split_sentences(row["text"])]
    assert len(sentences) > 150_000  # Gutenberg books, speeches, WikiText-2 (whose "<unk>" goes to the backend)
    expected = [encoding.ids for encoding in backend.encode_batch_fast(sentences, add_special_tokens=False)]
    assert encoder.encode(sentences) == expected


def test_the_sentencepiece_encoder_is_only_used_where_it_agrees_by_construction(tmp_path):
    from transformers import AlbertTokenizer, AutoTokenizer

    from albert_hf.pretraining.data.sentences import BackendEncoder, plain_backend, sentence_encoder
    from albert_hf.pretraining.data.spm_encoder import SentencePieceEncoder

    tok = tokenizer()
    # the same pieces without their spiece.model, or with other normalisation (accents kept, case kept)
    tok.save_pretrained(tmp_path / "no_spm")
    (tmp_path / "no_spm" / "spiece.model").unlink(missing_ok=True)

    without_model = AutoTokenizer.from_pretrained(tmp_path / "no_spm")
    assert SentencePieceEncoder.for_tokenizer(without_model, plain_backend(without_model)) is None
    assert isinstance(sentence_encoder(without_model), BackendEncoder)
    vocab = [tuple(entry) for entry in json.loads(tok.backend_tokenizer.to_str())["model"]["vocab"]]
    for options in ({"keep_accents": True}, {"do_lower_case": False}):
        other = AlbertTokenizer(vocab=vocab, **options)
        other.vocab_file = tok.vocab_file  # the same spiece.model, but the tokenizer normalises otherwise
        assert SentencePieceEncoder.for_tokenizer(other, plain_backend(other)) is None, options


def test_roots_with_two_powers_in_the_vocabulary_are_sent_to_the_backend():
    """Equal-score segmentations come from pieces that are powers of one root: such text takes the backend's."""
    from albert_hf.pretraining.data.spm_encoder import _repeated_roots

    pieces = ["ha", "haha", "*", "**", "▁x", "▁x▁x", "abab", "ab", "xyz", "xyzxyz0", "aa", "a", "cdcd", "cdcdcd"]
    # single characters ("*", "a") are caught by the run-of-three rule; "▁" pieces cannot repeat inside a word
    assert sorted(_repeated_roots(pieces)) == ["ababab", "cdcdcd", "hahaha"]
