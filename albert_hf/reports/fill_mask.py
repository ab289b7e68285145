"""Fill-mask examples: a model's top guesses for one masked content word in a few sentences, a check a person can
judge beside the MLM accuracy (a model that has learned little guesses "the", "," and "." everywhere).

`run_pretraining.py` prints them for held-out sentences at the end of a run and writes fill_mask_examples.json.
"""

import random

import torch

# Frequent words of four letters or more that carry little meaning: masking them tells little about the model.
FUNCTION_WORDS = frozenset(
    "that this these those with from into onto than then when where which while what whether there their they them "
    "have been being will would should could must does were also only such each other some more most very just "
    "about after before because".split()
)


def maskable(word: str, tokenizer) -> bool:
    """A content word (letters only, at least 4, not a function word) that the vocabulary holds as one piece,
    so that one [MASK] stands for the whole word."""
    if not (word.isalpha() and len(word) >= 4 and word.lower() not in FUNCTION_WORDS):
        return False
    pieces = tokenizer.tokenize(word)
    return len(pieces) == 1 and pieces[0] != tokenizer.unk_token


def pick_fill_mask_sentences(texts, tokenizer, count=4, seed=0, max_length=128, sentence_per_line=False):
    """Up to `count` (sentence, word index) pairs from the documents `texts`, in their order: one sentence of 8 to
    30 words (at most `max_length` tokens) per document that has one, and in it one `maskable` word (the index
    counts whitespace-separated words). Both are drawn with `seed`, so a run shows the same examples every time."""
    from ..tokenization import split_sentences

    rng = random.Random(seed)
    picked = []
    for text in texts:
        candidates = []
        for sentence in split_sentences(text or "", sentence_per_line=sentence_per_line):
            words = sentence.split()
            if not 8 <= len(words) <= 30 or len(tokenizer(sentence)["input_ids"]) > max_length:
                continue
            indices = [i for i, word in enumerate(words) if maskable(word, tokenizer)]
            if indices:
                candidates.append((" ".join(words), indices))
        if candidates:
            sentence, indices = rng.choice(candidates)
            picked.append((sentence, rng.choice(indices)))
            if len(picked) == count:
                break
    return picked


@torch.no_grad()
def fill_mask_examples(model, tokenizer, sentences, top_k=5) -> list[dict]:
    """For each (sentence, word index) pair: the sentence with that word replaced by the tokenizer's mask token,
    the true word, and the model's `top_k` predictions (decoded pieces) with their probabilities at the masked
    position. The word should be one piece (`maskable`): a single [MASK] replaces it, so a longer word would be
    scored against its first piece only. One padded batch, in eval mode; the model's mode is restored."""
    words = [sentence.split() for sentence, _ in sentences]
    masked = [" ".join(w[:i] + [tokenizer.mask_token] + w[i + 1 :]) for w, (_, i) in zip(words, sentences)]
    if not masked:
        return []
    was_training = model.training
    model.eval()
    batch = tokenizer(masked, padding=True, return_tensors="pt").to(next(model.parameters()).device)
    outputs = model(**batch)
    logits = outputs.prediction_logits if hasattr(outputs, "prediction_logits") else outputs.logits
    model.train(was_training)
    rows, positions = (batch["input_ids"] == tokenizer.mask_token_id).nonzero(as_tuple=True)
    first = [positions[rows == row][0] for row in range(len(masked))]  # the first [MASK] of each sentence
    probabilities = logits[torch.arange(len(masked)), torch.stack(first)].float().softmax(-1)
    top = probabilities.topk(top_k)
    return [
        {
            "masked_sentence": text,
            "true_word": w[i],
            # a piece that decodes to nothing (SentencePiece's bare word start "▁") is shown as itself
            "predictions": [
                tokenizer.decode([token]).strip() or tokenizer.convert_ids_to_tokens(token) for token in ids.tolist()
            ],
            "probabilities": [round(p, 4) for p in values.tolist()],
        }
        for text, w, (_, i), ids, values in zip(masked, words, sentences, top.indices, top.values)
    ]


def format_fill_mask(examples: list[dict]) -> list[str]:
    if not examples:
        return []
    lines = [f"  fill-mask (held-out sentences; true word, then the model's top {len(examples[0]['predictions'])}):"]
    for example in examples:
        lines.append(
            f'    "{example["masked_sentence"]}" — true: {example["true_word"]}; '
            f"predicted: {' | '.join(example['predictions'])}"
        )  # not commas: "," is often one
    return lines
