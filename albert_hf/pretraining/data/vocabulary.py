"""A domain's own vocabulary for a continued run (--extend_vocabulary N): the loaded tokenizer with N new pieces.

ALBERT's SentencePiece vocabulary has no unused slots to repurpose (BERT's usual trick), so pieces are appended:

1. a SentencePiece unigram model is trained on a sample of the domain's training sentences (ALBERT's spm_train
   flags, as many pieces as the loaded vocabulary at most: spm's soft limit, for a small domain);
2. the sample is segmented with it, and of its pieces that the loaded vocabulary lacks, the N that would save the
   most pieces are taken: each one's uses in that segmentation times the pieces the loaded vocabulary needs for it,
   less one (ties by the piece). By uses alone, short fragments the loaded vocabulary nearly has come first; each
   piece keeps its score there (its log-probability in the domain model);
3. they are appended after the last piece of the loaded SentencePiece model, edited as the sentencepiece package's
   own `sentencepiece_model_pb2.ModelProto` (the tokenizer's spiece.model, or one written from its tokenizer.json
   when the folder has none), and the fast tokenizer is rebuilt from it (`tokenization.tokenizer_from_spm_proto`),
   so that the two encoders agree as for any tokenizer here.

Old pieces keep their ids, so text the new pieces do not touch is encoded as before. Each new piece also carries its
segmentation by the loaded vocabulary, from which the model's new rows start (`training.model.extend_embeddings`).
"""

import base64
import collections
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError
from ...tokenization import (
    SPECIAL_TOKENS,
    UNK,
    albert_normalizer,
    cache_root,
    save_to_cache,
    tokenizer_from_spm_proto,
    train_spm_model,
)
from .mixture import tokenizer_sample
from .sentences import plain_backend

logger = logging.getLogger(__name__)

VOCABULARY_CACHE_VERSION = 1
MEASURED_DOCUMENTS = 2000  # held-out documents the pieces per word are counted on


@dataclass(frozen=True)
class VocabularyExtension:
    """What --extend_vocabulary added: the new pieces (ids from `base_size` on, in order) and each one's segmentation
    by the loaded vocabulary; `asked` the N asked for; `pieces_per_word` on the domain's held-out documents, before
    and after (None without held-out documents)."""

    domain: str
    asked: int
    base_size: int
    pieces: tuple[str, ...]
    splits: tuple[tuple[int, ...], ...]
    pieces_per_word: tuple[float, float] | None

    def note(self) -> str:
        """The start line's account."""
        line = (
            f"--extend_vocabulary {self.asked}: {len(self.pieces)} pieces learned from {self.domain} added "
            f"({self.base_size:,} -> {self.base_size + len(self.pieces):,})"
        )
        if len(self.pieces) < self.asked:
            line += f", all the domain's SentencePiece model had that the vocabulary lacks ({self.asked} asked)"
        if self.pieces_per_word:
            line += (
                f"; pieces per word on its held-out documents {self.pieces_per_word[0]:.3f} -> "
                f"{self.pieces_per_word[1]:.3f}"
            )
        return line + (
            "; each new embedding row starts as the mean of the rows of the pieces the loaded vocabulary "
            "split it into, its output bias as their biases' mean"
        )

    def results(self) -> dict:
        """The all_results.json entries."""
        found = {"vocabulary_added": len(self.pieces), "vocabulary_size": self.base_size + len(self.pieces)}
        if self.pieces_per_word:
            found.update(pieces_per_word_before=self.pieces_per_word[0], pieces_per_word_after=self.pieces_per_word[1])
        return found


def extend_vocabulary(
    tokenizer,
    n: int,
    domain: str,
    documents,
    layout: str,
    held_out,
    sample_sentences: int,
    seed: int,
    fingerprint: str | None = None,
):
    """(the extended tokenizer, its `VocabularyExtension`): `n` pieces learned from `documents` (the domain's
    training documents, "text" column) added to `tokenizer`. Built once per (tokenizer, documents, n, seed) and
    cached beside the trained tokenizers, the documents known by `fingerprint` (a text-file stream's), a dataset's
    own, or else the sample of their sentences; loaded from there as AutoTokenizer loads it, its spiece.model beside
    it."""
    from transformers import AutoTokenizer

    base = base_model_proto(tokenizer, domain)
    fingerprint = fingerprint or getattr(documents, "_fingerprint", None)
    sample = None
    key = hashlib.sha256(
        json.dumps(
            [
                tokenizer.backend_tokenizer.to_str(),
                n,
                seed,
                sample_sentences,
                layout,
                fingerprint,
                VOCABULARY_CACHE_VERSION,
            ]
        ).encode()
    )
    if fingerprint is None:  # the documents are known by their sample alone (read once, here)
        sample, _ = tokenizer_sample({domain: documents}, {domain: 1.0}, {domain: layout}, sample_sentences, seed)
        for sentence in sample:
            key.update(sentence.encode("utf-8", "surrogatepass") + b"\x00")
    folder = cache_root() / "tokenizers" / f"extended-{len(base.pieces)}+{n}-{key.hexdigest()[:16]}"
    if not (folder / "tokenizer.json").is_file():
        if sample is None:
            sample, _ = tokenizer_sample({domain: documents}, {domain: 1.0}, {domain: layout}, sample_sentences, seed)
        learned = domain_pieces(sample, tokenizer.backend_tokenizer, n, len(base.pieces), seed)
        for piece, score in learned:
            added = base.pieces.add()
            added.piece, added.score, added.type = piece, score, added.NORMAL
        base.trainer_spec.vocab_size = len(base.pieces)
        proto = base.SerializeToString()
        extended = tokenizer_from_spm_proto(proto, source=domain, model_max_length=tokenizer.model_max_length)
        check_extension(tokenizer, extended, domain)
        save_to_cache(extended, proto, folder)
    extended = AutoTokenizer.from_pretrained(str(folder))
    pieces = tuple(extended.convert_ids_to_tokens(list(range(len(tokenizer), len(extended)))))
    model = tokenizer.backend_tokenizer.model  # the loaded vocabulary's segmentation of each new piece, as is
    splits = tuple(tuple(token.id for token in model.tokenize(piece)) for piece in pieces)
    extension = VocabularyExtension(
        domain, n, len(tokenizer), pieces, splits, pieces_per_word(tokenizer, extended, held_out)
    )
    return extended, extension


def base_model_proto(tokenizer, domain: str):
    """The loaded tokenizer as a `ModelProto`: its spiece.model when that holds the fast tokenizer's pieces and
    scores, else one written from tokenizer.json (a folder saved by transformers 5 keeps no spiece.model)."""
    from sentencepiece import sentencepiece_model_pb2

    config = json.loads(tokenizer.backend_tokenizer.to_str())
    model = config.get("model") or {}
    if model.get("type") != "Unigram":
        raise InputError(
            f"--extend_vocabulary adds SentencePiece unigram pieces, and the tokenizer of this run is "
            f"a {model.get('type')} one"
        )
    vocab = [(piece, float(score)) for piece, score in model["vocab"]]
    proto = sentencepiece_model_pb2.ModelProto()
    path = getattr(tokenizer, "vocab_file", None)
    if path and Path(path).is_file():
        try:
            proto.ParseFromString(Path(path).read_bytes())
        except Exception:  # not a SentencePiece model: written anew below
            proto.Clear()
        if [piece.piece for piece in proto.pieces] == [piece for piece, _ in vocab]:
            return proto
        proto.Clear()
    steps = (config.get("normalizer") or {}).get("normalizers") or []
    charsmap = next((step.get("precompiled_charsmap") for step in steps if step.get("type") == "Precompiled"), None)
    if not charsmap or [piece for piece, _ in vocab[: len(SPECIAL_TOKENS)]] != SPECIAL_TOKENS:
        raise InputError(
            "--extend_vocabulary: the tokenizer of this run is not ALBERT's SentencePiece form (its "
            f"first pieces {[piece for piece, _ in vocab[:5]]}, a precompiled normaliser), and there is "
            "no spiece.model beside it"
        )
    spec = proto.trainer_spec
    spec.model_type, spec.vocab_size = spec.UNIGRAM, len(vocab)
    spec.pad_id, spec.unk_id, spec.bos_id, spec.eos_id = 0, 1, -1, -1
    normalizer = proto.normalizer_spec
    normalizer.name, normalizer.precompiled_charsmap = "nmt_nfkc", base64.b64decode(charsmap)
    normalizer.add_dummy_prefix = normalizer.remove_extra_whitespaces = normalizer.escape_whitespaces = True
    for piece, score in vocab:
        entry = proto.pieces.add()
        entry.piece, entry.score = piece, score
        # spm_train's types: <unk>; the control symbols; the user-defined ones, the only others scored 0
        entry.type = (
            entry.UNKNOWN
            if piece == UNK
            else entry.CONTROL
            if piece in SPECIAL_TOKENS
            else entry.USER_DEFINED
            if score == 0
            else entry.NORMAL
        )
    return proto


def domain_pieces(sample: list[str], loaded, n: int, vocab_size: int, seed: int) -> list[tuple[str, float]]:
    """The `n` pieces of a SentencePiece model trained on `sample` that the `loaded` vocabulary (a tokenizers
    `Tokenizer` of a Unigram model) lacks and that would save the most pieces: each one's uses in the model's
    segmentation of `sample` times the pieces `loaded` needs for it, less one. With their scores; fewer when the
    model has fewer."""
    import sentencepiece as spm

    proto = train_spm_model(
        sample,
        "text",
        True,
        vocab_size,
        character_coverage=0.99995,
        input_sentence_size=len(sample),
        seed=seed,
        hard_vocab_limit=False,
    )
    processor = spm.SentencePieceProcessor(model_proto=proto)
    uses = collections.Counter()
    normalizer = albert_normalizer()  # what spm was trained on (`train_spm_model`)
    for ids in processor.encode([normalizer.normalize_str(sentence) for sentence in sample], num_threads=1):
        uses.update(ids)
    known = loaded.get_vocab(with_added_tokens=True)
    saved = {}
    for i, count in uses.items():
        piece = processor.id_to_piece(i)
        if piece not in known and not processor.is_control(i) and not processor.is_unknown(i):
            saved[piece] = count * (len(loaded.model.tokenize(piece)) - 1)
    chosen = sorted(saved, key=lambda piece: (-saved[piece], piece))[:n]
    return [(piece, processor.get_score(processor.piece_to_id(piece))) for piece in chosen]


def check_extension(tokenizer, extended, domain: str) -> None:
    """The extended tokenizer keeps every loaded piece at its id and processes text as the loaded one: a
    tokenizer whose normaliser or pre-tokenizer the SentencePiece model cannot carry is refused here."""
    old, new = json.loads(tokenizer.backend_tokenizer.to_str()), json.loads(extended.backend_tokenizer.to_str())
    for part in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        if old.get(part) != new.get(part):
            raise InputError(
                f"--extend_vocabulary: the tokenizer of this run has a {part} of its own, which an "
                f"extended SentencePiece model would not keep (learning from {domain})"
            )
    if new["model"]["vocab"][: len(old["model"]["vocab"])] != old["model"]["vocab"]:
        raise InputError("--extend_vocabulary: the SentencePiece model does not hold the tokenizer's pieces in order")


def pieces_per_word(tokenizer, extended, held_out) -> tuple[float, float] | None:
    """Pieces per whitespace-separated word of the first held-out documents, under each tokenizer."""
    if held_out is None:
        return None
    texts = [row["text"] for _, row in zip(range(MEASURED_DOCUMENTS), held_out)]
    words = sum(len(text.split()) for text in texts)
    if not words:
        return None
    counts = [
        sum(len(encoding.ids) for encoding in plain_backend(t).encode_batch(texts, add_special_tokens=False))
        for t in (tokenizer, extended)
    ]
    return counts[0] / words, counts[1] / words
