"""albert_hf/flops.py: the model FLOPs of a training step, against torch's own counter (FlopCounterMode) on the
modules that run, in every sharing mode, with E != H, for albert_hf's sparse MLM head and transformers' dense one,
at two sequence lengths."""

import pytest
import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from albert_hf import AlbertHFForPreTraining
from albert_hf.flops import finetuning_flops_per_token, training_flops_per_token
from helpers import tiny_config

SHARING = {
    "all": {},
    "attention": {"sharing": "attention"},
    "ffn": {"sharing": "ffn"},
    "none": {"sharing": "none", "num_hidden_groups": 4},
    "groups": {"num_hidden_groups": 2, "inner_group_num": 2, "num_hidden_layers": 4},
}


def counted(model, batch: int, seq: int, predicted: int) -> int:
    """FLOPs torch counts for one forward and backward with `predicted` labelled positions a sequence."""
    torch.manual_seed(0)
    ids = torch.randint(5, model.config.vocab_size, (batch, seq))
    labels = torch.full_like(ids, -100)
    labels[:, 1 : 1 + predicted] = ids[:, 1 : 1 + predicted]
    with FlopCounterMode(display=False) as counter:
        loss = model(input_ids=ids, labels=labels, sentence_order_label=torch.zeros(batch, dtype=torch.long)).loss
        loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("seq", [16, 48])
@pytest.mark.parametrize("sharing", SHARING)
def test_the_count_is_what_torch_counts_in_every_sharing_mode(sharing, seq):
    config = tiny_config(max_position_embeddings=64, **SHARING[sharing])
    assert config.embedding_size != config.hidden_size
    batch, predicted = 3, 5
    # albert_hf's last layer computes the predicted positions and [CLS] only: what it executes
    executed = training_flops_per_token(config, seq, predicted, last_layer_queries=predicted + 1) * batch * seq
    assert executed == counted(AlbertHFForPreTraining(config).train(), batch, seq, predicted)
    # the model's FLOPs (what MFU divides) have that layer at every position
    model = training_flops_per_token(config, seq, predicted) * batch * seq
    assert model > executed


@pytest.mark.parametrize("seq", [16, 48])
def test_the_dense_head_count_is_what_torch_counts_for_transformers_albert(seq):
    config = tiny_config(max_position_embeddings=64)
    theirs = transformers.AlbertForPreTraining(config.to_albert_config()).train()
    theirs.set_attn_implementation("eager")  # FlopCounterMode does not count SDPA's CPU kernel
    batch, predicted = 3, 5
    assert training_flops_per_token(config, seq, predicted, mlm_rows=seq) * batch * seq == counted(
        theirs, batch, seq, predicted
    )


def test_the_count_by_hand_at_base():
    """base at 512 tokens with 20 predicted, the module docstring's terms written out: 12 layers of
    8 H^2 + 4 H I + 4 S H, the projection, the pooler and head once a sequence, the MLM head at 20 rows."""
    from albert_hf import AlbertHFConfig

    config = AlbertHFConfig.from_preset("base")
    h, e, i, v, s = 768, 128, 3072, 30000, 512
    per_sequence = (
        2 * s * e * h + 12 * s * (8 * h * h + 4 * h * i + 4 * s * h) + 2 * h * h + 4 * h + 2 * 20 * (h * e + e * v)
    )
    assert training_flops_per_token(config, s, 20) == pytest.approx(3 * per_sequence / s, rel=1e-12)


def counted_head(model, head: str, batch: int, seq: int) -> int:
    """FLOPs torch counts for one fine-tuning forward and backward of `batch` sequences (for multiple choice: `batch`
    examples of 2 choices) of `seq` tokens, with labels."""
    torch.manual_seed(0)
    shape = (batch, 2, seq) if head == "multiple_choice" else (batch, seq)
    inputs = {"input_ids": torch.randint(5, model.config.vocab_size, shape)}
    labels = {
        "sequence_classification": {"labels": torch.zeros(batch, dtype=torch.long)},
        "multiple_choice": {"labels": torch.zeros(batch, dtype=torch.long)},
        "question_answering": {
            "start_positions": torch.ones(batch, dtype=torch.long),
            "end_positions": torch.full((batch,), 2),
        },
        "token_classification": {"labels": torch.zeros(shape, dtype=torch.long)},
    }[head]
    with FlopCounterMode(display=False) as counter:
        model(**inputs, **labels).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("seq", [16, 48])
@pytest.mark.parametrize(
    "head, model_class, pooled",
    [
        ("sequence_classification", "AlbertHFForSequenceClassification", True),
        ("multiple_choice", "AlbertHFForMultipleChoice", True),
        ("question_answering", "AlbertHFForQuestionAnswering", False),
        ("token_classification", "AlbertHFForTokenClassification", False),
    ],
)
def test_the_fine_tuning_count_is_what_torch_counts_for_each_task_head(head, model_class, pooled, seq):
    import albert_hf

    config = tiny_config(max_position_embeddings=64, num_labels=3, sharing="attention")
    model = getattr(albert_hf, model_class)(config).train()
    batch = 3
    sequences = batch * 2 if head == "multiple_choice" else batch
    # the pooled heads' last layer computes [CLS] only: what albert_hf executes
    executed = (
        finetuning_flops_per_token(config, seq, head, num_labels=3, last_layer_queries=1 if pooled else None)
        * sequences
        * seq
    )
    assert executed == counted_head(model, head, batch, seq)
    assert finetuning_flops_per_token(config, seq, head, num_labels=3) >= executed / (sequences * seq)


def test_an_unknown_head_is_refused():
    with pytest.raises(ValueError, match="^head must be one of sequence_classification, "):
        finetuning_flops_per_token(tiny_config(), 16, "regression")
