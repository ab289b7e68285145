"""The whole data side feeding the model: embedded corpus -> trained tokenizer (saved, reloaded) -> pairs by
`datasets.map` -> collator batches -> AlbertHFForPreTraining forward, backward and a few training steps."""

import math

import pytest
import torch
from transformers import AutoTokenizer

from albert_hf import AlbertHFConfig, AlbertHFForPreTraining, DataCollatorForAlbertPretraining
from albert_hf.pretraining.data.pairs import build_pretraining_dataset
from albert_hf.tokenization import train_tokenizer
from data_fixtures import TEST_VOCAB_SIZE, embedded


@pytest.mark.quick
@pytest.mark.trains
@pytest.mark.rounding
def test_embedded_corpus_to_albert_pretraining(tmp_path):
    train_tokenizer(embedded(), vocab_size=TEST_VOCAB_SIZE, output_dir=tmp_path / "tokenizer")
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))  # as a later run would load it
    documents = embedded().select(range(3000))
    pairs = build_pretraining_dataset(documents, tok, max_seq_length=128, dupe_factor=1, num_proc=2, seed=1)
    assert len(pairs) > 500

    collator = DataCollatorForAlbertPretraining(tokenizer=tok, seed=0)
    loader = torch.utils.data.DataLoader(pairs, batch_size=16, shuffle=True, collate_fn=collator)
    model = AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", vocab_size=len(tok)))

    batch = next(iter(loader))
    assert batch["input_ids"].shape[1] % 8 == 0 and batch["input_ids"].shape[1] <= 128
    out = model(**batch)
    num_masked = int((batch["labels"] != -100).sum())
    assert out.prediction_logits.shape == (num_masked, len(tok))  # the sparse head saw the masked tokens only
    assert math.isfinite(out.loss.item())
    # At initialisation: MLM loss near ln(V), SOP loss near ln(2).
    assert abs(out.mlm_loss.item() - math.log(len(tok))) < 1.0
    assert abs(out.sop_loss.item() - math.log(2)) < 0.3
    assert torch.allclose(out.loss, out.mlm_loss + out.sop_loss)

    # Training on collator batches lowers the loss (a fixed batch, so the drop is not noise).
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.75 * losses[0], losses
    # And a pass over fresh batches runs without error.
    for step, fresh in enumerate(loader):
        model(**fresh).loss.backward()
        if step == 3:
            break
