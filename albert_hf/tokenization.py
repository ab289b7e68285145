"""ALBERT's SentencePiece tokenizer: train one from a corpus, or load an existing `spiece.model`, offline.

Both paths end in the same place: `transformers.AlbertTokenizer(vocab=[(piece, score), ...])` saved as
tokenizer.json + tokenizer_config.json, which `AutoTokenizer.from_pretrained(dir)` loads with no network, no
sentencepiece and no protobuf. Two pitfalls of transformers 5's AlbertTokenizer are avoided on purpose:
`AlbertTokenizer(vocab_file=...)` silently ignores the file, and a directory holding only spiece.model needs
protobuf to load. The saved tokenizer also lists token_type_ids in `model_input_names`, so sentence pairs return
them by default (the stock AlbertTokenizer does not).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import logging
import os
import re
import shutil
import struct
import unicodedata
from pathlib import Path

from .errors import InputError
from .protobuf_wire import proto_fields

logger = logging.getLogger(__name__)

# The official 30k-clean.model layout: <pad>=0 and <unk>=1, then three control symbols.
PAD, UNK, CLS, SEP, MASK = "<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]
# Pieces the official spm model always keeps whole (README flags of spm_train).
USER_DEFINED_SYMBOLS = ["(", ")", '"', "-", ".", "–", "£", "€"]
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]
TOKENIZER_CACHE_VERSION = 1
# A blank line may still hold spaces or tabs.
_BLANK_LINE = re.compile(r"\n[ \t\f\v]*\n")


def cache_root() -> Path:
    """Where albert_hf keeps what it builds once (trained tokenizers, the embedded corpus)."""
    if os.environ.get("ALBERT_HF_CACHE"):
        return Path(os.environ["ALBERT_HF_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "albert_hf"
    return Path.home() / ".cache" / "huggingface" / "albert_hf"


# ----------------------------------------------------------------------------------------------------------------
# Sentence splitting: documents into sentences, before pieces (the corpus, the tokenizer's training text)


def paragraphs(text: str) -> list[str]:
    """Blocks of text between blank lines, stripped, without empty ones."""
    return [p.strip() for p in _BLANK_LINE.split(text) if p.strip()]


def split_sentences(text: str, sentence_per_line: bool = False, language: str = "en") -> list[str]:
    """The sentences of one document, in order.

    With `sentence_per_line` every non-blank line is one sentence (the official input format). Otherwise each
    paragraph is re-flowed (hard-wrapped lines joined) and split by sentencex; a sentence never crosses a
    paragraph break.
    """
    if sentence_per_line:
        return [line.strip() for line in text.split("\n") if line.strip()]
    from sentencex import segment  # imported here so reading files does not need it

    sentences = []
    for paragraph in paragraphs(text):
        flat = " ".join(paragraph.split())
        sentences.extend(s.strip() for s in segment(language, flat) if s.strip())
    return sentences


# ----------------------------------------------------------------------------------------------------------------
# Reading a SentencePiece model without protobuf


def precompiled_charsmap(model_proto: bytes) -> bytes | None:
    """The normalizer's precompiled character map of a SentencePiece model (ModelProto.normalizer_spec = 3,
    NormalizerSpec.precompiled_charsmap = 2). It carries spm's nmt_nfkc normalisation into the HF tokenizer."""
    for field, value in proto_fields(model_proto):
        if field == 3:
            for sub_field, sub_value in proto_fields(value):
                if sub_field == 2 and sub_value:
                    return bytes(sub_value)
    return None


def tokenizer_from_spm_proto(model_proto: bytes, source: str = "<spm model>", model_max_length: int = 512):
    """An `AlbertTokenizer` with the pieces, scores and normaliser of a serialized SentencePiece model."""
    import sentencepiece as spm
    from transformers import AlbertTokenizer

    try:
        processor = spm.SentencePieceProcessor(model_proto=model_proto)
    except Exception as error:  # sentencepiece raises RuntimeError or OSError on garbage
        raise InputError(f"{source} is not a valid SentencePiece model: {error}") from error
    vocab = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    pieces = [piece for piece, _ in vocab]
    missing = [token for token in SPECIAL_TOKENS if token not in pieces]
    if missing:
        raise InputError(f"{source} lacks ALBERT's special pieces {missing}; its first pieces are {pieces[:6]}")
    if pieces.index(UNK) != 1:
        # AlbertTokenizer builds its Unigram model with unk_id=1; anything else would mis-map unknown pieces.
        raise InputError(f"{source} has <unk> at id {pieces.index(UNK)}; ALBERT expects it at id 1")
    return AlbertTokenizer(
        vocab=vocab,
        _spm_precompiled_charsmap=precompiled_charsmap(model_proto),
        do_lower_case=True,
        keep_accents=False,
        model_input_names=MODEL_INPUT_NAMES,
        model_max_length=model_max_length,
    )


def load_spiece_model(path, output_dir=None, model_max_length: int = 512):
    """Load an existing ALBERT `spiece.model` (a file, or a directory holding one) offline.

    Returns an `AlbertTokenizer`; with `output_dir` it is also saved there as tokenizer.json +
    tokenizer_config.json (and a copy of spiece.model), loadable by `AutoTokenizer.from_pretrained`.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "spiece.model"
    if not path.is_file():
        raise InputError(f"SentencePiece model not found: {path}")
    tokenizer = tokenizer_from_spm_proto(path.read_bytes(), source=str(path), model_max_length=model_max_length)
    if output_dir is not None:
        tokenizer.save_pretrained(output_dir)
        shutil.copyfile(path, Path(output_dir) / "spiece.model")
    return tokenizer


# ----------------------------------------------------------------------------------------------------------------
# Encoding sentences fast for pretraining data


def _spm_normalizer_flags(model_proto: bytes) -> dict:
    """NormalizerSpec's add_dummy_prefix (3), remove_extra_whitespaces (4) and escape_whitespaces (5); absent
    fields are true, protobuf's declared defaults."""
    flags = {3: 1, 4: 1, 5: 1}
    for field, value in proto_fields(model_proto):
        if field == 3:
            for sub_field, sub_value in proto_fields(value):
                if sub_field in flags:
                    flags[sub_field] = sub_value
    return {"add_dummy_prefix": flags[3], "remove_extra_whitespaces": flags[4], "escape_whitespaces": flags[5]}


# Segmentations of equal score arise from pieces that commute, which are powers of one root ("**" + "*" or
# "*" + "**" for "***"), and the two implementations break such ties differently: 13 of 165,301 sentences of the
# project's corpus with a 1000-piece model, all on runs of one character. Text with a character three times in a
# row goes to the backend (about 2% of sentences: "...", "***", "000"), and so does text holding three times a
# longer root of which the vocabulary has two powers ("haha" and "ha": "hahaha"), see `_repeated_roots`.
_RUN_OF_THREE = re.compile(r"(.)\1\1")


def _repeated_roots(pieces: list[str]) -> list[str]:
    """root x 3 for every root of two or more characters that has two different powers among `pieces` (those
    starting with "▁" excluded: a power of them would hold a "▁" inside)."""
    powers = {}
    for piece in pieces:
        if piece.startswith("▁") or len(piece) < 2:
            continue
        size = next(n for n in range(1, len(piece) + 1) if len(piece) % n == 0
                    and piece[:n] * (len(piece) // n) == piece)
        powers.setdefault(piece[:size], set()).add(len(piece) // size)
    return [root * 3 for root, exponents in powers.items()
            if len(root) >= 2 and len(exponents | ({1} if root in pieces else set())) >= 2]


def _float32(value: float) -> bytes:
    return struct.pack("<f", value)


class SentencePieceEncoder:
    """Token ids of sentences, the same as the tokenizer's Rust backend gives, about 4 times faster.

    The Rust backend encodes about 2 MB of text a second on one core here, nine tenths of the whole splitting and
    tokenizing stage. SentencePiece's own encoder, after ALBERT's preprocessing done in Python (the quote
    replacements, NFKD, accents stripped, lowercase; spm applies the precompiled character map itself), is what the
    official code ran. `for_tokenizer` only returns an encoder when the two agree by construction (the tokenizer's
    normaliser, pre-tokenizer and every piece and score are those of its spiece.model). Three kinds of sentence go
    to the backend: those holding the text of an added token ("<unk>", "[MASK]", ...), which the backend matches as
    a token and spm would spell out; those holding spm's "▁"; and those with a repeated unit, where the two break
    ties between equal-score segmentations differently (`_RUN_OF_THREE`). Then the ids were the same on all 165,301
    sentences of the project's 24 MB corpus, with a 1000- and an 8000-piece model.
    """

    def __init__(self, model_proto: bytes, added: list[str], backend, repeated_roots: list[str]):
        self.model_proto, self.added, self.backend = model_proto, added, backend
        self.repeated_roots = repeated_roots
        self._processor = None

    def __getstate__(self):  # a datasets worker rebuilds the processor from the model's bytes
        return {**self.__dict__, "_processor": None}

    @classmethod
    def for_tokenizer(cls, tokenizer, backend) -> "SentencePieceEncoder | None":
        """The encoder for `tokenizer` (whose padding-free backend is `backend`), or None when its spiece.model is
        not at hand or differs from its tokenizer.json in anything that shapes the ids."""
        import sentencepiece as spm

        path = getattr(tokenizer, "vocab_file", None)
        if not path or not Path(path).is_file():
            return None
        model_proto = Path(path).read_bytes()
        try:
            processor = spm.SentencePieceProcessor(model_proto=model_proto)
        except Exception:  # not a SentencePiece model after all
            return None
        config = json.loads(backend.to_str())
        steps = (config.get("normalizer") or {}).get("normalizers") or []
        expected_steps = [("Replace", "``", '"'), ("Replace", "''", '"'), ("NFKD",), ("StripAccents",),
                          ("Lowercase",), ("Precompiled",)]
        found_steps = [(step["type"], step["pattern"].get("String"), step["content"]) if step["type"] == "Replace"
                       else (step["type"],) for step in steps]
        charsmap = precompiled_charsmap(model_proto)
        model = config.get("model") or {}
        pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
        same = (
            found_steps == expected_steps
            and charsmap is not None
            and steps[-1].get("precompiled_charsmap") == base64.b64encode(charsmap).decode()
            and config.get("pre_tokenizer") == {"type": "Sequence", "pretokenizers": [
                {"type": "WhitespaceSplit"},
                {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]}
            and _spm_normalizer_flags(model_proto) == {"add_dummy_prefix": 1, "remove_extra_whitespaces": 1,
                                                       "escape_whitespaces": 1}
            and model.get("type") == "Unigram" and not model.get("byte_fallback")
            and model.get("unk_id") == processor.unk_id()
            # the scores compared as the float32 that both hold (tokenizer.json prints them as longer decimals)
            and [(piece, _float32(score)) for piece, score in model.get("vocab", [])]
            == [(piece, _float32(score)) for piece, score in pieces]
            # no piece spans a word boundary, so the backend's word-by-word segmentation is spm's whole-sentence one
            and not any("▁" in piece[1:] for piece, _ in pieces)
        )
        if not same:
            return None
        added = [token["content"] for token in config.get("added_tokens", [])]
        return cls(model_proto, added, backend, _repeated_roots([piece for piece, _ in pieces]))

    @staticmethod
    def preprocess(text: str) -> str:
        """ALBERT's preprocessing, as the backend's normaliser does it before the precompiled map."""
        text = text.replace("``", '"').replace("''", '"')
        if text.isascii():  # most sentences: NFKD changes nothing, and there are no accents to strip
            return text.lower()
        text = unicodedata.normalize("NFKD", text)
        return "".join(char for char in text if unicodedata.category(char) != "Mn").lower()

    def encode(self, sentences: list[str]) -> list[list[int]]:
        if self._processor is None:
            import sentencepiece as spm

            self._processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        ids = [None] * len(sentences)
        by_spm, by_backend, texts = [], [], []
        for k, sentence in enumerate(sentences):
            text = self.preprocess(sentence)
            if ("▁" in sentence or any(token in sentence for token in self.added) or _RUN_OF_THREE.search(text)
                    or any(root in text for root in self.repeated_roots)):
                by_backend.append(k)
            else:
                by_spm.append(k)
                texts.append(text)
        if by_spm:
            encoded = self._processor.encode(texts, num_threads=1)
            for k, sentence_ids in zip(by_spm, encoded):
                ids[k] = sentence_ids
        if by_backend:
            encoded = self.backend.encode_batch_fast([sentences[k] for k in by_backend], add_special_tokens=False)
            for k, encoding in zip(by_backend, encoded):
                ids[k] = encoding.ids
        return ids


# ----------------------------------------------------------------------------------------------------------------
# Training


def _albert_normalizer():
    # The exact normalisation AlbertTokenizer applies before its model (quotes, NFKD, strip accents, lowercase):
    # the spm model must be trained on text that looks like what it will later be asked to segment.
    from transformers import AlbertTokenizer

    return AlbertTokenizer().backend_tokenizer.normalizer


def _corpus_fingerprint(corpus, text_column: str) -> str | None:
    """A stable key for the corpus, or None when it cannot be had without reading it (plain iterators)."""
    if hasattr(corpus, "_fingerprint"):  # datasets.Dataset
        return corpus._fingerprint
    if isinstance(corpus, (list, tuple)):
        digest = hashlib.sha256()
        for text in _documents(corpus, text_column):  # strings, or rows holding them
            digest.update((text or "").encode("utf-8", "surrogatepass") + b"\x00")
        return digest.hexdigest()
    return None


def _documents(corpus, text_column: str):
    """Document strings from a (Iterable)Dataset's text column or from an iterable of strings."""
    columns = getattr(corpus, "column_names", None)
    if columns is not None:
        if text_column not in columns:
            raise InputError(f"The corpus has no text column {text_column!r}; its columns are {columns}")
        corpus = corpus.select_columns([text_column])
    for item in corpus:
        yield item[text_column] if isinstance(item, dict) else item


def train_spm_model(corpus, text_column: str, sentence_per_line: bool, vocab_size: int,
                    character_coverage: float, input_sentence_size: int, seed: int,
                    hard_vocab_limit: bool = True) -> bytes:
    """The serialized SentencePiece unigram model trained with ALBERT's spm_train flags on the corpus's sentences
    (split, then normalized as ALBERT's tokenizer normalizes); a corpus it cannot train on stops the run. Without
    `hard_vocab_limit`, `vocab_size` is at most the pieces the corpus supports (spm_train's soft limit)."""
    import sentencepiece as spm

    normalizer = _albert_normalizer()
    counts = {"documents": 0, "sentences": 0}

    def sentences():
        for text in _documents(corpus, text_column):
            counts["documents"] += 1
            for sentence in split_sentences(text or "", sentence_per_line=sentence_per_line):
                counts["sentences"] += 1
                yield normalizer.normalize_str(sentence)

    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(),
            model_writer=model,
            model_type="unigram",
            vocab_size=vocab_size,
            pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
            control_symbols=[CLS, SEP, MASK],
            user_defined_symbols=USER_DEFINED_SYMBOLS,
            character_coverage=character_coverage,
            input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True,
            num_threads=os.cpu_count() or 1,
            hard_vocab_limit=hard_vocab_limit,
            minloglevel=2,
        )
    except RuntimeError as error:
        if counts["sentences"] == 0:
            raise InputError("Cannot train a tokenizer: the corpus has no text") from error
        raise InputError(
            f"SentencePiece training failed on {counts['documents']} documents / {counts['sentences']} "
            f"sentences with vocab_size={vocab_size}: {error}. A small corpus needs a smaller vocab_size."
        ) from error
    logger.info("Trained a %d-piece unigram model on %s of %d sentences", vocab_size,
                f"a sample of {input_sentence_size:,}" if counts["sentences"] > input_sentence_size else "all",
                counts["sentences"])
    return model.getvalue()


def train_tokenizer(
    corpus,
    vocab_size: int = 30000,
    output_dir=None,
    *,
    text_column: str = "text",
    sentence_per_line: bool = False,
    input_sentence_size: int = 10_000_000,
    character_coverage: float = 0.99995,
    seed: int = 12345,
    model_max_length: int = 512,
    use_cache: bool = True,
    fingerprint: str | None = None,
):
    """Train ALBERT's SentencePiece-unigram tokenizer on `corpus` and return it as an `AlbertTokenizer`.

    The spm_train flags are those of the ALBERT README: unigram, <pad>=0, <unk>=1, [CLS]/[SEP]/[MASK] control
    symbols, the user-defined pieces above, no <s>/</s>, lowercased input. Trained once per (corpus, settings)
    and cached under `cache_root()/tokenizers/` when the corpus has a cache key: a `datasets.Dataset` and a list or
    tuple of strings have one, a stream or another iterable only through `fingerprint`.

    Args:
        corpus: a `datasets.Dataset` (or `IterableDataset`) with a text column, or an iterable of document strings.
        vocab_size (`int`, defaults to 30000): the number of pieces, the special ones included.
        output_dir (*optional*): a folder that gets tokenizer.json, tokenizer_config.json and the spm model as
            spiece.model.
        text_column (`str`, defaults to `"text"`): the column of a `datasets` corpus that holds the documents.
        sentence_per_line (`bool`, defaults to `False`): every line is a sentence; otherwise sentencex splits them.
        input_sentence_size (`int`, defaults to 10_000_000): the most sentences spm_train samples.
        character_coverage (`float`, defaults to 0.99995): spm_train's share of the characters the pieces cover.
        seed (`int`, defaults to 12345): SentencePiece's random seed.
        model_max_length (`int`, defaults to 512): the tokenizer's `model_max_length`.
        use_cache (`bool`, defaults to `True`): read and write the cache; False always trains and caches nothing.
        fingerprint (`str`, *optional*): the corpus's cache key, in place of the one read from it.

    Returns:
        The `AlbertTokenizer`; a cached one as `AutoTokenizer` loads it from the cache.

    Raises:
        InputError: a corpus without `text_column` or without text, or one SentencePiece cannot train `vocab_size`
            pieces on (a small corpus needs a smaller `vocab_size`).
    """
    from transformers import AutoTokenizer

    settings = dict(
        vocab_size=vocab_size, text_column=text_column, sentence_per_line=sentence_per_line,
        input_sentence_size=input_sentence_size, character_coverage=character_coverage, seed=seed,
        model_max_length=model_max_length, version=TOKENIZER_CACHE_VERSION,
    )
    if use_cache and fingerprint is None:
        fingerprint = _corpus_fingerprint(corpus, text_column)
    elif not use_cache:
        fingerprint = None
    cache_dir = None
    if fingerprint is not None:
        key = hashlib.sha256(json.dumps([fingerprint, settings], sort_keys=True).encode()).hexdigest()[:16]
        cache_dir = cache_root() / "tokenizers" / f"spm-unigram-{vocab_size}-{key}"

    if cache_dir is None or not (cache_dir / "tokenizer.json").exists():
        model = train_spm_model(corpus, text_column, sentence_per_line, vocab_size, character_coverage,
                                 input_sentence_size, seed)
        tokenizer = tokenizer_from_spm_proto(model, model_max_length=model_max_length)
        if cache_dir is None:
            if output_dir is not None:
                tokenizer.save_pretrained(output_dir)
                (Path(output_dir) / "spiece.model").write_bytes(model)
            return tokenizer
        _save_to_cache(tokenizer, model, cache_dir)
    else:
        logger.info("Using the cached tokenizer %s", cache_dir)

    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "spiece.model"):
            shutil.copyfile(cache_dir / name, Path(output_dir) / name)
    # Always hand back the tokenizer as AutoTokenizer loads it from disk, the form every later run will see.
    return AutoTokenizer.from_pretrained(str(cache_dir))


def _save_to_cache(tokenizer, spm_model: bytes, cache_dir: Path) -> None:
    # Save into a temporary sibling and rename it, so a concurrent process never loads half a tokenizer.
    tmp = cache_dir.with_name(f"{cache_dir.name}.tmp{os.getpid()}")
    try:
        tokenizer.save_pretrained(tmp)
        (tmp / "spiece.model").write_bytes(spm_model)
    except BaseException:  # a failed write, or a stop signal (runtime/preemption.py): no half-saved folder left
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, cache_dir)
    except OSError:  # another process finished the same tokenizer first; theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)


__all__ = [
    "SPECIAL_TOKENS",
    "USER_DEFINED_SYMBOLS",
    "MODEL_INPUT_NAMES",
    "precompiled_charsmap",
    "tokenizer_from_spm_proto",
    "load_spiece_model",
    "train_tokenizer",
]
