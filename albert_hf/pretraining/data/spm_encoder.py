"""Token ids of pretraining sentences with SentencePiece's own encoder, where it gives exactly the ids of the
tokenizer's Rust backend (`SentencePieceEncoder`, about 4 times faster): data/sentences.py uses it when a tokenizer's
spiece.model is at hand."""

import base64
import json
import re
import struct
import unicodedata
from pathlib import Path

from ...protobuf_wire import proto_fields
from ...tokenization import precompiled_charsmap


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
        size = next(
            n for n in range(1, len(piece) + 1) if len(piece) % n == 0 and piece[:n] * (len(piece) // n) == piece
        )
        powers.setdefault(piece[:size], set()).add(len(piece) // size)
    return [
        root * 3
        for root, exponents in powers.items()
        if len(root) >= 2 and len(exponents | ({1} if root in pieces else set())) >= 2
    ]


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
        expected_steps = [
            ("Replace", "``", '"'),
            ("Replace", "''", '"'),
            ("NFKD",),
            ("StripAccents",),
            ("Lowercase",),
            ("Precompiled",),
        ]
        found_steps = [
            (step["type"], step["pattern"].get("String"), step["content"])
            if step["type"] == "Replace"
            else (step["type"],)
            for step in steps
        ]
        charsmap = precompiled_charsmap(model_proto)
        model = config.get("model") or {}
        pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
        same = (
            found_steps == expected_steps
            and charsmap is not None
            and steps[-1].get("precompiled_charsmap") == base64.b64encode(charsmap).decode()
            and config.get("pre_tokenizer")
            == {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "WhitespaceSplit"},
                    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
                ],
            }
            and _spm_normalizer_flags(model_proto)
            == {"add_dummy_prefix": 1, "remove_extra_whitespaces": 1, "escape_whitespaces": 1}
            and model.get("type") == "Unigram"
            and not model.get("byte_fallback")
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
            if (
                "▁" in sentence
                or any(token in sentence for token in self.added)
                or _RUN_OF_THREE.search(text)
                or any(root in text for root in self.repeated_roots)
            ):
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
