"""The fill-mask examples of a pretraining run's summary: the masked word picked, the top guesses read at its
position, each sentence at its own mask in a padded batch."""

import torch

from helpers import tiny_config

# One maskable word: "value" (one piece, 5 letters); "which" and "then" are function words, "xylophonequartz" is
# many pieces, "got." has punctuation, the rest are short.
FILL_MASK_SENTENCE = "So we set x to the value of an xylophonequartz which we then got."


def test_fill_mask_picks_a_one_piece_content_word_of_a_mid_length_sentence():
    from albert_hf.reports.fill_mask import maskable, pick_fill_mask_sentences
    from data_fixtures import tokenizer

    tok = tokenizer()
    assert tok.tokenize("value") == ["▁value"] and len(tok.tokenize("xylophonequartz")) > 1
    assert [word for word in FILL_MASK_SENTENCE.split() if maskable(word, tok)] == ["value"]
    document = "\n\n".join(
        [
            "Return the value.",  # too short
            " ".join(["value"] * 31) + ".",  # too long
            FILL_MASK_SENTENCE,
        ]
    )
    assert pick_fill_mask_sentences([document], tok, seed=3) == [(FILL_MASK_SENTENCE, 6)]
    assert pick_fill_mask_sentences([document], tok, max_length=10) == []  # longer than the model reads
    many = [FILL_MASK_SENTENCE.replace("value", word) for word in ("file", "object", "module", "string", "number")]
    picked = pick_fill_mask_sentences(many, tok, count=3, seed=3)
    assert [sentence.split()[6] for sentence, _ in picked] == ["file", "object", "module"]  # one per document
    assert pick_fill_mask_sentences(many, tok, count=3, seed=3) == picked


def test_fill_mask_examples_report_the_top_predictions_at_the_masked_word():
    from albert_hf import AlbertHFForPreTraining
    from albert_hf.reports.fill_mask import fill_mask_examples
    from data_fixtures import tokenizer

    tok = tokenizer()
    model = AlbertHFForPreTraining(tiny_config(vocab_size=len(tok))).train()
    with torch.no_grad():  # a huge output bias for "▁file": the model's first guess everywhere
        model.get_output_embeddings().bias[tok.convert_tokens_to_ids("▁file")] = 100.0
    examples = fill_mask_examples(model, tok, [(FILL_MASK_SENTENCE, 6), ("Return the module object.", 1)], top_k=3)
    assert model.training  # left as it was found
    first = examples[0]
    assert first["masked_sentence"] == "So we set x to the [MASK] of an xylophonequartz which we then got."
    assert first["true_word"] == "value" and examples[1]["true_word"] == "the"
    assert first["predictions"][0] == "file" and first["probabilities"][0] > 0.99
    assert len(first["predictions"]) == len(first["probabilities"]) == 3


def test_fill_mask_examples_read_each_sentence_at_its_own_mask_in_a_padded_batch():
    """A stand-in model that predicts the previous token: each sentence's first guess is the word before its
    [MASK], which only holds if every row is read at its own masked position (at different places, the shorter
    row padded)."""
    from types import SimpleNamespace

    from albert_hf.reports.fill_mask import fill_mask_examples
    from data_fixtures import tokenizer

    tok = tokenizer()

    class PreviousToken(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device

        def forward(self, input_ids, **kwargs):
            previous = torch.roll(input_ids, 1, dims=1)
            return SimpleNamespace(prediction_logits=10.0 * torch.nn.functional.one_hot(previous, len(tok)).float())

    sentences = [("the file value is read here", 2), ("when the work is done we return the object to the caller", 7)]
    examples = fill_mask_examples(PreviousToken(), tok, sentences)
    assert [e["predictions"][0] for e in examples] == ["file", "return"]
    assert [e["true_word"] for e in examples] == ["value", "the"]
