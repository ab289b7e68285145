"""ALBERT's SentencePiece tokenizer: train one from a corpus, or load an existing `spiece.model`, offline.

Both paths end in the same place: `transformers.AlbertTokenizer(vocab=[(piece, score), ...])` saved as
tokenizer.json + tokenizer_config.json, which `AutoTokenizer.from_pretrained(dir)` loads with no network, no
sentencepiece and no protobuf. Two pitfalls of transformers 5's AlbertTokenizer are avoided on purpose:
`AlbertTokenizer(vocab_file=...)` silently ignores the file, and a directory holding only spiece.model needs
protobuf to load. The saved tokenizer also lists token_type_ids in `model_input_names`, so sentence pairs return
them by default (the stock AlbertTokenizer does not).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
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
# Training


def albert_normalizer():
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


def train_spm_model(
    corpus,
    text_column: str,
    sentence_per_line: bool,
    vocab_size: int,
    character_coverage: float,
    input_sentence_size: int,
    seed: int,
    hard_vocab_limit: bool = True,
) -> bytes:
    """The serialized SentencePiece unigram model trained with ALBERT's spm_train flags on the corpus's sentences
    (split, then normalized as ALBERT's tokenizer normalizes); a corpus it cannot train on stops the run. Without
    `hard_vocab_limit`, `vocab_size` is at most the pieces the corpus supports (spm_train's soft limit)."""
    import sentencepiece as spm

    normalizer = albert_normalizer()
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
            pad_id=0,
            unk_id=1,
            bos_id=-1,
            eos_id=-1,
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
    logger.info(
        "Trained a %d-piece unigram model on %s of %d sentences",
        vocab_size,
        f"a sample of {input_sentence_size:,}" if counts["sentences"] > input_sentence_size else "all",
        counts["sentences"],
    )
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
        vocab_size=vocab_size,
        text_column=text_column,
        sentence_per_line=sentence_per_line,
        input_sentence_size=input_sentence_size,
        character_coverage=character_coverage,
        seed=seed,
        model_max_length=model_max_length,
        version=TOKENIZER_CACHE_VERSION,
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
        model = train_spm_model(
            corpus, text_column, sentence_per_line, vocab_size, character_coverage, input_sentence_size, seed
        )
        tokenizer = tokenizer_from_spm_proto(model, model_max_length=model_max_length)
        if cache_dir is None:
            if output_dir is not None:
                tokenizer.save_pretrained(output_dir)
                (Path(output_dir) / "spiece.model").write_bytes(model)
            return tokenizer
        save_to_cache(tokenizer, model, cache_dir)
    else:
        logger.info("Using the cached tokenizer %s", cache_dir)

    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        for name in ("tokenizer.json", "tokenizer_config.json", "spiece.model"):
            shutil.copyfile(cache_dir / name, Path(output_dir) / name)
    # Always hand back the tokenizer as AutoTokenizer loads it from disk, the form every later run will see.
    return AutoTokenizer.from_pretrained(str(cache_dir))


def save_to_cache(tokenizer, spm_model: bytes, cache_dir: Path) -> None:
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
