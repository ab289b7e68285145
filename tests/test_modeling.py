from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from albert_hf import (
    AlbertHFConfig,
    AlbertHFForMaskedLM,
    AlbertHFForMultipleChoice,
    AlbertHFForPreTraining,
    AlbertHFForQuestionAnswering,
    AlbertHFForQuestionAnsweringWithAnswerability,
    AlbertHFForSequenceClassification,
    AlbertHFForTokenClassification,
    AlbertHFModel,
)
from albert_hf import modeling_albert_hf as modeling
from albert_hf.modeling_albert_hf import SummedSoftmaxCrossEntropy
from helpers import BATCH, LENGTH, make_inputs, mlm_labels, padded_batch, tiny_config


def test_every_head_gives_the_documented_shapes():
    config = tiny_config(num_labels=3)
    inputs = make_inputs()
    with torch.no_grad():
        base = AlbertHFModel(config).eval()(**inputs)
        assert base.last_hidden_state.shape == (BATCH, LENGTH, config.hidden_size)
        assert base.pooler_output.shape == (BATCH, config.hidden_size)
        pre = AlbertHFForPreTraining(config).eval()(**inputs)
        assert pre.prediction_logits.shape == (BATCH, LENGTH, config.vocab_size)
        assert pre.sop_logits.shape == (BATCH, 2) and pre.loss is None
        assert AlbertHFForMaskedLM(config).eval()(**inputs).logits.shape == (BATCH, LENGTH, config.vocab_size)
        assert AlbertHFForSequenceClassification(config).eval()(**inputs).logits.shape == (BATCH, 3)
        assert AlbertHFForTokenClassification(config).eval()(**inputs).logits.shape == (BATCH, LENGTH, 3)
        qa = AlbertHFForQuestionAnswering(config).eval()(**inputs)
        assert qa.start_logits.shape == qa.end_logits.shape == (BATCH, LENGTH)
        choices = {k: v.unsqueeze(0).expand(2, -1, -1) for k, v in inputs.items()}
        assert AlbertHFForMultipleChoice(config).eval()(**choices).logits.shape == (2, BATCH)


def test_return_dict_false_gives_a_tuple():
    config = tiny_config()
    model = AlbertHFForSequenceClassification(config).eval()
    inputs = make_inputs()
    output = model(**inputs, labels=torch.tensor([0, 1, 0]), return_dict=False)
    assert isinstance(output, tuple)
    assert torch.equal(output[1], model(**inputs).logits)


def test_sparse_mlm_head_predicts_only_masked_positions():
    model = AlbertHFForPreTraining(tiny_config()).eval()
    inputs = make_inputs(pad_from=18)
    labels = mlm_labels(inputs["input_ids"])
    labels[1, 18:] = -100
    with torch.no_grad():
        full = model(**inputs).prediction_logits
        sparse = model(**inputs, labels=labels)
    masked = labels != -100
    assert sparse.prediction_logits.shape == (int(masked.sum()), model.config.vocab_size)
    torch.testing.assert_close(sparse.prediction_logits, full[masked], rtol=0, atol=1e-5)
    # the loss is the mean cross-entropy over all masked tokens of the batch (not a per-sequence mean)
    expected = F.cross_entropy(full.view(-1, full.shape[-1]), labels.view(-1), ignore_index=-100)
    torch.testing.assert_close(sparse.mlm_loss, expected, rtol=0, atol=1e-5)
    assert sparse.loss is sparse.mlm_loss and sparse.sop_loss is None


@pytest.mark.parametrize("with_padding_removal", [True, False])
def test_fixed_size_masked_positions_give_the_sparse_heads_logits_loss_and_gradients(with_padding_removal, monkeypatch):
    """The official masked_lm_positions / masked_lm_weights form (rows of weight 0 padding a short row): the
    valid rows are the sparse head's rows, the loss and every gradient are the same."""
    from albert_hf.modeling_albert_hf import RealTokens
    from albert_hf.pretraining.data.collator import fixed_size_positions

    if not with_padding_removal:
        monkeypatch.setattr(RealTokens, "pays_on", staticmethod(lambda device: False))
    torch.manual_seed(0)
    model = AlbertHFForPreTraining(tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    inputs = make_inputs(pad_from=18)
    labels = mlm_labels(inputs["input_ids"], every=3)
    labels[1, 18:] = -100
    labels[2, 10:] = -100  # rows with 8, 6 and 3 masked tokens: padding in the fixed-size form
    positions, weights = (torch.from_numpy(a) for a in fixed_size_positions(labels.numpy()))
    assert positions.shape == (3, 8) and weights.sum() == (labels != -100).sum()
    order = torch.tensor([0, 1, 1])
    sparse = model(**inputs, labels=labels, sentence_order_label=order)
    sparse.loss.backward()
    expected = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    model.zero_grad()
    fixed = model(
        **inputs, labels=labels, sentence_order_label=order, masked_lm_positions=positions, masked_lm_weights=weights
    )
    fixed.loss.backward()
    assert fixed.prediction_logits.shape == (3 * 8, model.config.vocab_size)
    valid = weights.flatten().bool()
    torch.testing.assert_close(fixed.prediction_logits[valid], sparse.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(fixed.mlm_loss, sparse.mlm_loss, rtol=1e-6, atol=1e-6)
    for name, param in model.named_parameters():
        if name in expected:
            torch.testing.assert_close(param.grad, expected[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlm_loss_function_matches_cross_entropy_in_value_and_gradient(dtype):
    generator = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(50, 3000, generator=generator)).to(dtype)
    targets = torch.randint(0, 3000, (50,), generator=generator)
    targets[:5] = logits[:5].float().argmax(-1)  # confident rows (p near 1) as well as unlikely ones
    ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = SummedSoftmaxCrossEntropy.apply(ours_in, targets)
    reference = F.cross_entropy(ref_in.float(), targets, reduction="sum")
    (0.37 * ours).backward()
    (0.37 * reference).backward()
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-3)
    assert ours_in.grad.dtype == dtype
    # bf16 gradients: one rounding of the same fp32 value either way
    tolerance = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-6)
    torch.testing.assert_close(ours_in.grad.float(), ref_in.grad.float(), **tolerance)


def test_mlm_loss_function_refuses_a_second_backward_instead_of_a_wrong_gradient():
    # backward scales the saved probabilities in place; autograd's version check must catch a reuse
    logits = torch.randn(4, 10, requires_grad=True)
    loss = SummedSoftmaxCrossEntropy.apply(logits, torch.tensor([1, 2, 3, 4]))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_pretraining_loss_is_mlm_plus_sop():
    model = AlbertHFForPreTraining(tiny_config()).eval()
    inputs = make_inputs()
    order = torch.tensor([0, 1, 1])
    with torch.no_grad():
        out = model(**inputs, labels=mlm_labels(inputs["input_ids"]), sentence_order_label=order)
        sop_only = model(**inputs, sentence_order_label=order)
    torch.testing.assert_close(out.loss, out.mlm_loss + out.sop_loss)
    torch.testing.assert_close(out.sop_loss, F.cross_entropy(out.sop_logits, order))
    assert sop_only.mlm_loss is None
    torch.testing.assert_close(sop_only.loss, out.sop_loss)


def test_batch_without_masked_tokens_has_zero_mlm_loss_not_nan():
    model = AlbertHFForPreTraining(tiny_config())
    inputs = make_inputs()
    out = model(**inputs, labels=torch.full_like(inputs["input_ids"], -100))
    assert out.mlm_loss.item() == 0.0
    out.loss.backward()  # and it still backpropagates


def test_padding_does_not_change_the_real_tokens():
    model = AlbertHFModel(tiny_config()).eval()
    inputs = make_inputs(pad_from=15)
    alone = {k: v[1:2, :15] for k, v in inputs.items()}
    with torch.no_grad():
        padded = model(**inputs).last_hidden_state[1, :15]
        unpadded = model(**alone).last_hidden_state[0]
    torch.testing.assert_close(padded, unpadded, rtol=0, atol=1e-5)


def ffn_rows_seen(model):
    """Number of token rows each application of the first block's FFN receives."""
    rows = []
    ffn = next(m for n, m in model.named_modules() if n.endswith("albert_layers.0"))
    ffn.ffn.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[:-1].numel()))
    return rows


@pytest.mark.parametrize("head", ["model", "pretraining", "sequence", "token", "qa", "choice"])
def test_unpadded_path_gives_the_padded_results_at_real_tokens(head):
    torch.manual_seed(0)
    inputs = padded_batch()
    real = inputs["attention_mask"].bool()
    config = tiny_config(num_hidden_groups=2, num_labels=3)
    classes = dict(
        model=AlbertHFModel,
        pretraining=AlbertHFForPreTraining,
        sequence=AlbertHFForSequenceClassification,
        token=AlbertHFForTokenClassification,
        qa=AlbertHFForQuestionAnswering,
        choice=AlbertHFForMultipleChoice,
    )
    unpadded = classes[head](config).eval()  # no dropout; gradients still flow
    padded = classes[head](tiny_config(num_hidden_groups=2, num_labels=3, unpad_inputs=False)).eval()
    padded.load_state_dict(unpadded.state_dict())
    extra = {}
    if head == "pretraining":
        labels = mlm_labels(inputs["input_ids"], every=3)
        extra = dict(labels=labels.masked_fill(~real, -100), sentence_order_label=torch.tensor([0, 1, 1, 0]))
    if head == "choice":
        inputs = {k: v.view(2, 2, -1) for k, v in inputs.items()}
        extra = dict(labels=torch.tensor([1, 0]))
    rows = ffn_rows_seen(unpadded)
    a, b = unpadded(**inputs, **extra), padded(**inputs, **extra)
    if head == "qa":  # its softmax reads the padded positions too: the padding is kept, and they equal
        assert rows[0] == 4 * 24
    else:
        assert rows[0] == 64  # the FFN saw the 53 real tokens (in a pack of 64 rows), not 4 x 24 positions
    for name in ("last_hidden_state", "start_logits", "end_logits", "logits"):
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x is None:
            continue
        if x.dim() >= 2 and x.shape[:2] == real.shape and head != "qa":  # per position: compare the real tokens
            x, y = x[real], y[real]
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5, msg=name)
    if head == "pretraining":
        torch.testing.assert_close(a.prediction_logits, b.prediction_logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(a.sop_logits, b.sop_logits, rtol=0, atol=1e-5)
    if head == "model":
        assert a.last_hidden_state[~real].abs().max() == 0  # padded positions come out as zeros
        a.pooler_output.sum().backward(), b.pooler_output.sum().backward()
    else:
        loss = (lambda out: out.loss) if head in ("pretraining", "choice") else (lambda out: out.logits.float().sum())
        if head == "qa":
            loss = lambda out: out.start_logits[real].sum() + out.end_logits[real].sum()  # noqa: E731
        if head == "token":
            loss = lambda out: out.logits[real].sum()  # noqa: E731
        loss(a).backward(), loss(b).backward()
    grads = dict(padded.named_parameters())
    for name, param in unpadded.named_parameters():
        if param.grad is not None or grads[name].grad is not None:
            torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


def test_unpadding_is_off_when_per_layer_outputs_are_requested_or_nothing_is_padded():
    model = AlbertHFModel(tiny_config()).eval()
    rows = ffn_rows_seen(model)
    with torch.no_grad():
        out = model(**padded_batch(), output_hidden_states=True)
        assert rows[-1] == 4 * 24 and out.hidden_states[1].shape == (4, 24, 32)
        model(**make_inputs())
        assert rows[-1] == BATCH * LENGTH
        model(**padded_batch())
        assert rows[-1] == 64  # 53 real tokens, packed in multiples of 64 rows
        model(**make_inputs(pad_from=22))  # 70 real of 72: a pack of 128 rows would cost more than the padding
        assert rows[-1] == BATCH * LENGTH


@pytest.mark.parametrize("head", ["pretraining", "sequence", "choice"])
def test_last_block_computes_only_the_positions_the_head_reads(head):
    torch.manual_seed(0)
    config = tiny_config(num_hidden_groups=2, inner_group_num=2, num_labels=3)  # last block: group 1, layer 1
    inputs = padded_batch()
    model = dict(
        pretraining=AlbertHFForPreTraining, sequence=AlbertHFForSequenceClassification, choice=AlbertHFForMultipleChoice
    )[head](config).eval()
    extra = dict(labels=torch.tensor([0, 2, 1, 1]))
    if head == "pretraining":
        labels = torch.full_like(inputs["input_ids"], -100)
        labels[0, [3, 7, 20]] = 11
        labels[2, [16, 1]] = 12  # rows with 3, 0, 2 and 0 masked tokens
        extra = dict(labels=labels, sentence_order_label=torch.tensor([0, 1, 1, 0]))
    if head == "choice":
        inputs, extra = {k: v.view(2, 2, -1) for k, v in inputs.items()}, dict(labels=torch.tensor([1, 0]))
    rows = []
    last_block = model.albert.encoder.albert_layer_groups[1].albert_layers[1]
    last_block.ffn.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[:-1].numel()))
    fast = model(**inputs, **extra)
    assert rows[-1] == {"pretraining": 4 * (1 + 3), "sequence": 4, "choice": 4}[head]
    fast.loss.backward()
    fast_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    full = model(**inputs, **extra, output_hidden_states=True)  # per-layer outputs requested: every position
    assert rows[-1] == 4 * 24  # (and padding included: unpadding is off then too)
    full.loss.backward()
    torch.testing.assert_close(fast.loss, full.loss, rtol=0, atol=1e-6)
    for name in ("logits", "prediction_logits", "sop_logits"):
        if hasattr(fast, name):
            torch.testing.assert_close(getattr(fast, name), getattr(full, name), rtol=0, atol=1e-5, msg=name)
    assert fast_grads.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, param in model.named_parameters():
        if param.grad is not None:
            torch.testing.assert_close(fast_grads[name], param.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_last_layer_positions_refuses_what_it_cannot_honour():
    model = AlbertHFModel(tiny_config()).eval()
    inputs = make_inputs()
    cls = torch.zeros(BATCH, 1, dtype=torch.long)
    assert model(**inputs, last_layer_positions=cls).last_hidden_state.shape == (BATCH, 1, 32)
    with pytest.raises(ValueError, match="output_hidden_states"):
        model(**inputs, last_layer_positions=cls, output_hidden_states=True)


def test_eager_and_sdpa_attention_agree_and_eager_returns_attentions():
    config = tiny_config(num_hidden_groups=2, inner_group_num=2)
    inputs = make_inputs(pad_from=10)
    sdpa = AlbertHFModel(config).eval()
    eager = AlbertHFModel._from_config(config, attn_implementation="eager").eval()
    eager.load_state_dict(sdpa.state_dict())
    with torch.no_grad():
        a = sdpa(**inputs).last_hidden_state
        out = eager(**inputs, output_attentions=True, output_hidden_states=True)
    real = inputs["attention_mask"].bool()  # sdpa ran unpadded: padded positions are zeros there
    torch.testing.assert_close(a[real], out.last_hidden_state[real], rtol=0, atol=1e-5)
    blocks = config.num_hidden_layers * config.inner_group_num
    assert len(out.attentions) == blocks
    assert out.attentions[0].shape == (BATCH, config.num_attention_heads, LENGTH, LENGTH)
    # padded keys get no attention
    assert out.attentions[0][1, :, :, 10:].abs().max() == 0
    # one hidden state per block application, after the projected embedding (transformers 5.x convention)
    assert len(out.hidden_states) == 1 + blocks
    torch.testing.assert_close(out.hidden_states[-1], out.last_hidden_state)


def test_cpu_training_computes_short_sdpa_attention_as_matmuls_with_the_same_result(monkeypatch):
    from albert_hf import modeling_albert_hf as modeling

    model = AlbertHFModel(tiny_config()).train()  # tiny: no dropout
    config = model.config
    assert config._attn_implementation == "sdpa"
    key = torch.zeros(2, 4, 128, 8)
    assert modeling.use_matmul_attention(config, key, training=True)
    assert not modeling.use_matmul_attention(config, torch.zeros(2, 4, 512, 8), training=True)
    # evaluation (with or without grad): SDPA's forward is the faster one
    assert not modeling.use_matmul_attention(config, key, training=False)
    assert not modeling.use_matmul_attention(config, key.to("meta"), training=True)  # not a CPU: SDPA
    eager = AlbertHFModel._from_config(tiny_config(), attn_implementation="eager")
    assert not modeling.use_matmul_attention(eager.config, key, training=True)

    calls = []
    original = modeling.eager_attention_forward
    monkeypatch.setattr(
        modeling, "eager_attention_forward", lambda *args, **kwargs: calls.append(args[4]) or original(*args, **kwargs)
    )
    inputs = make_inputs(pad_from=10)
    with torch.no_grad():
        kernel = model.eval()(**inputs).last_hidden_state
    assert calls == []
    trained = model.train()(**inputs).last_hidden_state
    assert calls and all(mask is None or mask.dtype == torch.bool for mask in calls)  # SDPA's boolean mask
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(trained[real], kernel[real], rtol=0, atol=1e-5)


HEADS = [
    AlbertHFModel,
    AlbertHFForPreTraining,
    AlbertHFForMaskedLM,
    AlbertHFForSequenceClassification,
    AlbertHFForTokenClassification,
    AlbertHFForQuestionAnswering,
    AlbertHFForQuestionAnsweringWithAnswerability,
    AlbertHFForMultipleChoice,
]


@pytest.mark.parametrize("head", HEADS, ids=lambda head: head.__name__)
def test_every_head_traces_to_one_graph_with_tracings_own_check(head):
    """torch.jit.trace runs the model again (under no_grad) to check the trace: the path taken depends on the
    module's mode and device, never on grad mode, so both runs record the same graph."""
    torch.manual_seed(0)
    model = head(tiny_config()).eval()
    inputs = make_inputs(pad_from=10)
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if head is AlbertHFForMultipleChoice:
        ids, mask = ids.unsqueeze(0), mask.unsqueeze(0)
    traced = torch.jit.trace(model, (ids, mask), check_trace=True, strict=False)  # raises if the graphs differ
    with torch.no_grad():
        expected = model(ids, mask, return_dict=False)[0]
    torch.testing.assert_close(next(iter(traced(ids, mask).values())), expected)


def test_padding_removal_is_for_cpus(monkeypatch):
    """On CUDA the padded batch goes to SDPA as it is: the model packs the real tokens only where it pays."""
    from albert_hf import modeling_albert_hf as modeling

    assert modeling.RealTokens.pays_on(torch.device("cpu"))
    assert not modeling.RealTokens.pays_on(torch.device("cuda", 0))
    packed = []
    model = AlbertHFModel(tiny_config()).eval()
    inputs = make_inputs(pad_from=10)
    for pays in (True, False):
        monkeypatch.setattr(modeling.RealTokens, "pays_on", staticmethod(lambda device: pays))
        monkeypatch.setattr(modeling.RealTokens, "pack_if_smaller", classmethod(lambda cls, mask: packed.append(pays)))
        model(**inputs)
    assert packed == [True]


def test_inputs_embeds_equals_input_ids():
    model = AlbertHFModel(tiny_config()).eval()
    inputs = make_inputs()
    embeds = model.embeddings.word_embeddings(inputs["input_ids"])
    with torch.no_grad():
        a = model(**inputs).last_hidden_state
        b = model(
            inputs_embeds=embeds, attention_mask=inputs["attention_mask"], token_type_ids=inputs["token_type_ids"]
        ).last_hidden_state
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="exactly one"):
        model(**inputs, inputs_embeds=embeds)


def test_sequences_over_the_position_limit_get_a_clear_error():
    config = tiny_config()
    model = AlbertHFModel(config)
    too_long = torch.randint(5, 100, (1, config.max_position_embeddings + 1))
    with pytest.raises(ValueError, match="max_position_embeddings=128"):
        model(too_long)


def test_all_shared_layers_are_one_module_applied_many_times():
    config = tiny_config(num_hidden_layers=6)
    model = AlbertHFModel(config)
    assert len(model.encoder.albert_layer_groups) == 1
    calls = []
    layer = model.encoder.albert_layer_groups[0].albert_layers[0]
    layer.register_forward_hook(lambda *args: calls.append(1))
    model(**make_inputs())
    assert len(calls) == 6


@pytest.mark.parametrize("sharing", ["attention", "ffn"])
def test_partial_sharing_stores_the_shared_block_once(sharing):
    config = tiny_config(sharing=sharing, num_hidden_layers=4)
    model = AlbertHFModel(config)
    layers = [group.albert_layers[0] for group in model.encoder.albert_layer_groups]
    assert len(layers) == 4
    shared_name = "attention" if sharing == "attention" else "ffn"
    own_name = "ffn" if sharing == "attention" else "attention"
    assert all(getattr(layer, shared_name) is getattr(layers[0], shared_name) for layer in layers)
    assert len({id(getattr(layer, own_name)) for layer in layers}) == 4
    # the shared block is stored once, under layer 0
    stored = [key for key in model.state_dict() if f".{shared_name}" in key]
    assert stored and all(key.startswith("encoder.albert_layer_groups.0.") for key in stored)
    # every layer's use of the shared block sends gradient into that single copy
    shared_weight = layers[0].ffn.weight if sharing == "ffn" else layers[0].attention.query.weight
    shared_weight.register_hook(lambda grad: uses.append(1))
    uses = []
    model(**make_inputs()).last_hidden_state.sum().backward()
    assert len(uses) == 1 and shared_weight.grad.abs().sum() > 0
    # parameter count against the spec's per-component formulas (ALBERT_SPEC.md §2.1), 4 layers vs all-shared
    h, i = config.hidden_size, config.intermediate_size
    attention_block = 4 * (h * h + h) + 2 * h
    ffn_block = 2 * h * i + i + h + 2 * h
    extra_blocks = 3 * (ffn_block if sharing == "attention" else attention_block)
    all_shared = AlbertHFModel(tiny_config(num_hidden_layers=4))
    assert count_parameters(model) - count_parameters(all_shared) == extra_blocks


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


def test_ffn_dropout_is_applied_and_sop_head_has_no_dropout():
    config = tiny_config(hidden_dropout_prob=0.3, classifier_dropout_prob=0.9)
    model = AlbertHFForPreTraining(config).train()
    layer = model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    zeroed = []
    layer.dropout.register_forward_hook(lambda module, args, out: zeroed.append((out == 0).float().mean().item()))
    model(**make_inputs())
    assert len(zeroed) == config.num_hidden_layers  # transformers never calls this dropout; we do
    assert 0.2 < sum(zeroed) / len(zeroed) < 0.4
    # SOP: no dropout on the pooled output, so the head is deterministic given the pooled output
    pooled = torch.randn(4, config.hidden_size)
    torch.testing.assert_close(model.sop_classifier(pooled), model.sop_classifier(pooled))


def test_gradient_checkpointing_gives_the_same_gradients():
    config = tiny_config(num_hidden_groups=2)
    inputs = make_inputs(pad_from=7)  # padded: the recomputation goes through the unpadded path too
    labels = dict(labels=mlm_labels(inputs["input_ids"]), sentence_order_label=torch.tensor([0, 1, 1]))
    model = AlbertHFForPreTraining(config).train()
    model(**inputs, **labels).loss.backward()
    reference = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_enable()
    assert model.is_activation_checkpointing
    calls = []
    model.albert.encoder.albert_layer_groups[0].albert_layers[0].attention.register_forward_hook(
        lambda *args: calls.append(1)
    )
    model(**inputs, **labels).loss.backward()
    # group 0 runs at 2 of the 4 layers; each block is recomputed once in the backward pass
    assert len(calls) == 4
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, reference[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bf16_autocast_trains_close_to_fp32():
    model = AlbertHFForPreTraining(tiny_config())
    inputs = make_inputs()
    labels = mlm_labels(inputs["input_ids"])
    order = torch.tensor([0, 1, 0])
    fp32 = model(**inputs, labels=labels, sentence_order_label=order).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**inputs, labels=labels, sentence_order_label=order)
    assert out.prediction_logits.dtype == torch.bfloat16
    assert out.loss.dtype == torch.float32
    assert abs(out.loss.item() - fp32.item()) < 0.05 * fp32.item()
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_official_initialisation():
    config = tiny_config(hidden_size=64, intermediate_size=256, num_attention_heads=4)
    model = AlbertHFForPreTraining(config)
    ffn = model.albert.encoder.albert_layer_groups[0].albert_layers[0].ffn.weight
    # truncated normal cut at +-2 std without rescaling (TF): std ~ 0.88 * 0.02
    assert ffn.abs().max() <= 0.04
    assert 0.016 < ffn.std().item() < 0.0192
    assert torch.all(model.predictions.bias == 0)
    assert torch.all(model.albert.embeddings.LayerNorm.weight == 1)
    assert torch.all(model.albert.pooler.bias == 0)


def test_decoder_is_tied_to_word_embeddings_also_after_resize():
    model = AlbertHFForPreTraining(tiny_config())
    assert model.predictions.decoder.weight is model.albert.embeddings.word_embeddings.weight
    assert model.predictions.decoder.bias is model.predictions.bias
    model.resize_token_embeddings(1010)
    assert model.predictions.decoder.weight is model.albert.embeddings.word_embeddings.weight
    assert model.predictions.decoder.weight.shape == (1010, model.config.embedding_size)
    assert model.predictions.bias.shape == (1010,)


def test_sequence_classification_regression_and_classification_losses():
    inputs = make_inputs()
    regression = AlbertHFForSequenceClassification(tiny_config(num_labels=1)).eval()
    targets = torch.tensor([0.5, 2.0, 4.5])
    out = regression(**inputs, labels=targets)
    torch.testing.assert_close(out.loss, F.mse_loss(out.logits.squeeze(-1), targets))
    classifier = AlbertHFForSequenceClassification(tiny_config(num_labels=3)).eval()
    classes = torch.tensor([2, 0, 1])
    out = classifier(**inputs, labels=classes)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits, classes))


def test_multiple_choice_scores_each_choice_independently():
    config = tiny_config()
    model = AlbertHFForMultipleChoice(config).eval()
    choices = make_inputs(batch=4)
    batched = {k: v.unsqueeze(0) for k, v in choices.items()}  # (1, 4 choices, length)
    with torch.no_grad():
        logits = model(**batched, labels=torch.tensor([2])).logits
        single = [
            model.classifier(model.albert(**{k: v[i : i + 1] for k, v in choices.items()}).pooler_output)
            for i in range(4)
        ]
    torch.testing.assert_close(logits[0], torch.cat(single).view(-1))


def test_question_answering_loss_ignores_positions_outside_the_sequence():
    model = AlbertHFForQuestionAnswering(tiny_config()).eval()
    inputs = make_inputs()
    start, end = torch.tensor([3, 5, 500]), torch.tensor([4, 9, 500])
    out = model(**inputs, start_positions=start, end_positions=end)
    expected = (F.cross_entropy(out.start_logits[:2], start[:2]) + F.cross_entropy(out.end_logits[:2], end[:2])) / 2
    torch.testing.assert_close(out.loss, expected)


def test_token_classification_ignores_minus_100():
    model = AlbertHFForTokenClassification(tiny_config(num_labels=4)).eval()
    inputs = make_inputs()
    labels = torch.randint(0, 4, (BATCH, LENGTH))
    labels[:, :5] = -100
    out = model(**inputs, labels=labels)
    expected = F.cross_entropy(out.logits[:, 5:].reshape(-1, 4), labels[:, 5:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)


def test_projection_is_skipped_when_asked_and_e_equals_h():
    model = AlbertHFModel(tiny_config(embedding_size=32, project_when_equal=False))
    assert model.encoder.embedding_hidden_mapping_in is None
    assert model(**make_inputs()).last_hidden_state.shape[-1] == 32
    assert AlbertHFModel(tiny_config(embedding_size=32)).encoder.embedding_hidden_mapping_in is not None


# ----------------------------------------------------------------------------------------------------------------
# The blocks' weights made ready once per training forward (`AlbertHFTransformer.ready_weights`)


@pytest.fixture
def ready_weights_on_cpus(monkeypatch):
    """The ready weights (a CUDA device's path) on this CPU, as `ready_weights_on_cpus.ready = False` turns off."""
    switch = SimpleNamespace(ready=True)
    monkeypatch.setattr(modeling.AlbertHFTransformer, "ready_weights_pay_on", staticmethod(lambda device: switch.ready))
    return switch


def gradients_of_a_training_forward(model, inputs, switch, bf16=False, ready=True):
    """(loss, {name: grad}) of one forward and backward, with the ready weights or with every Linear as a module."""
    model.zero_grad(set_to_none=True)
    switch.ready = ready
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(**inputs).loss
    loss.backward()
    return loss.detach().float(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("sharing", ["all", "none", "attention", "ffn"])
def test_ready_weights_give_the_module_paths_loss_and_gradients(sharing, ready_weights_on_cpus):
    torch.manual_seed(0)
    config = tiny_config(
        sharing=sharing,
        num_hidden_layers=4,
        inner_group_num=2 if sharing == "all" else 1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = AlbertHFForPreTraining(config).train()
    inputs = make_inputs(pad_from=9)  # padded: the packed rows (CPU) and the last block's positions both taken
    inputs.update(labels=mlm_labels(inputs["input_ids"]), sentence_order_label=torch.tensor([0, 1, 1]))
    loss, grads = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus)
    reference_loss, reference = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus, ready=False)
    assert grads.keys() == reference.keys()
    torch.testing.assert_close(loss, reference_loss, rtol=1e-6, atol=0)
    for name, grad in reference.items():
        # atol on the tensor's scale: a key bias's gradient is 0 up to rounding (softmax ignores it)
        torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5 * float(grad.abs().max()) + 1e-9, msg=name)
    # bf16: both paths round the activations alike, so each is as far from the fp32 gradient as the other
    bf16_loss, bf16 = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus, bf16=True)
    module_loss, module = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus, bf16=True, ready=False)
    torch.testing.assert_close(bf16_loss, module_loss, rtol=2e-3, atol=0)
    for name, grad in reference.items():
        if name.endswith("key.bias"):
            continue
        error, module_error = (float((g[name] - grad).norm() / grad.norm()) for g in (bf16, module))
        assert error < 1.5 * module_error + 0.01, (name, error, module_error)


# ----------------------------------------------------------------------------------------------------------------
# The bf16 residual stream of a GPU's training forward (`residual_dtype`, `residual_layer_norm`)


@pytest.fixture
def bf16_residual_on_cpus(monkeypatch):
    monkeypatch.setattr(modeling, "LOW_PRECISION_RESIDUAL_DEVICES", ("cuda", "cpu"))


def test_residual_layer_norm_sums_and_normalises_in_fp32_and_rounds_once(bf16_residual_on_cpus):
    torch.manual_seed(0)
    norm = nn.LayerNorm(64, eps=1e-12)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-0.5, 0.5)
    # a residual much larger than the block's output: their bf16 sum would lose most of the output's bits
    x, residual = torch.randn(8, 64).bfloat16(), (100 * torch.randn(8, 64)).bfloat16()
    total = x.double() + residual.double()
    centred = total - total.mean(-1, keepdim=True)
    exact = centred / (centred.pow(2).mean(-1, keepdim=True) + 1e-12).sqrt() * norm.weight.double() + norm.bias.double()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = modeling.residual_layer_norm(norm, x, residual)
    assert fused.dtype == torch.bfloat16
    torch.testing.assert_close(fused.double(), exact.bfloat16().double(), rtol=2**-8, atol=1e-6)  # one rounding
    with torch.no_grad():  # not a training forward: the LayerNorm's own output
        assert modeling.residual_layer_norm(norm, x.float(), residual.float()).dtype == torch.float32


def layer_outputs(model, inputs, bf16: bool) -> set:
    """The dtypes of the blocks' outputs in a training forward."""
    dtypes, hooks = (
        set(),
        [
            layer.register_forward_hook(lambda module, args, output: dtypes.add(output.dtype))
            for layer in model.modules()
            if isinstance(layer, modeling.AlbertHFLayer)
        ],
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        model(**inputs)
    for hook in hooks:
        hook.remove()
    return dtypes


def test_the_residual_stream_is_bf16_only_in_a_gpus_bf16_training_forward(monkeypatch):
    x = torch.zeros(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert modeling.residual_dtype(x) is None  # a CPU: LayerNorm as autocast runs it there
        monkeypatch.setattr(modeling, "LOW_PRECISION_RESIDUAL_DEVICES", ("cuda", "cpu"))  # this CPU as a GPU
        assert modeling.residual_dtype(x) == torch.bfloat16
        with torch.no_grad():  # inference: LayerNorm's own output, as transformers' ALBERT
            assert modeling.residual_dtype(x) is None
    assert modeling.residual_dtype(x) is None  # no autocast
    with torch.autocast("cpu", dtype=torch.float16):  # fp16: too narrow a range for the residual sums
        assert modeling.residual_dtype(x) is None
    model, inputs = AlbertHFForPreTraining(tiny_config()).train(), make_inputs()
    assert layer_outputs(model, inputs, bf16=True) == {torch.bfloat16}
    assert layer_outputs(model, inputs, bf16=False) == {torch.float32}
    monkeypatch.undo()
    assert modeling.LOW_PRECISION_RESIDUAL_DEVICES == ("cuda",)


@pytest.mark.parametrize("preset, sharing", [("tiny", "all"), ("tiny", "none"), ("small", "all")])
def test_bf16_residual_stream_is_as_close_to_fp32_as_autocasts_own(preset, sharing, ready_weights_on_cpus, monkeypatch):
    """As on a GPU (the ready weights, the stream's fp32 sums), against fp32 and against this CPU's autocast, which
    keeps LayerNorm in bf16 (a bf16 stream summed in bf16; on a GPU autocast's is fp32); 3 seeds, padded rows."""
    torch.manual_seed(0)
    config = AlbertHFConfig.from_preset(
        preset,
        vocab_size=1000,
        num_hidden_layers=6,
        sharing=sharing,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    for seed in range(3):
        torch.manual_seed(seed)
        model = AlbertHFForPreTraining(config).train()
        inputs = make_inputs(batch=4, length=64, pad_from=40)
        inputs.update(labels=mlm_labels(inputs["input_ids"]), sentence_order_label=torch.tensor([0, 1, 1, 0]))
        exact_loss, exact = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus)
        autocast_loss, autocast = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus, True)
        monkeypatch.setattr(modeling, "LOW_PRECISION_RESIDUAL_DEVICES", ("cuda", "cpu"))
        stream_loss, stream = gradients_of_a_training_forward(model, inputs, ready_weights_on_cpus, True)
        monkeypatch.setattr(modeling, "LOW_PRECISION_RESIDUAL_DEVICES", ("cuda",))
        assert stream.keys() == exact.keys()
        assert abs(stream_loss - exact_loss) < 2 * abs(autocast_loss - exact_loss) + 2e-4 * exact_loss
        for name, grad in exact.items():
            if name.endswith("key.bias"):  # 0 up to rounding
                continue
            error, autocast_error = (float((g[name] - grad).norm() / grad.norm()) for g in (stream, autocast))
            assert error < 1.5 * autocast_error + 0.005, (seed, name, error, autocast_error)


def test_a_shared_weights_gradient_adds_its_applications_in_fp32():
    """12 applications of one bf16-cast weight: the gradient is their fp32 sum, each a bf16 GEMM rounded once,
    where autocast's cast cache (eager) sums them on the bf16 copy, rounding the running sum at every add."""
    torch.manual_seed(0)
    inputs = [torch.randn(256, 64) for _ in range(12)]
    output_grads = [torch.randn(256, 64) for _ in range(12)]
    exact = sum(g.bfloat16().double().T @ x.bfloat16().double() for g, x in zip(output_grads, inputs))
    ready_linear, cast_linear = nn.Linear(64, 64), nn.Linear(64, 64)
    ready = modeling.ready_linears([ready_linear], torch.bfloat16)
    torch.autograd.backward([modeling.shared_linear(x, ready, [ready_linear]) for x in inputs], output_grads)
    cast = cast_linear.weight.to(torch.bfloat16)
    torch.autograd.backward([F.linear(x.bfloat16(), cast) for x in inputs], [g.bfloat16() for g in output_grads])
    assert ready_linear.weight.grad.dtype == torch.float32
    ready_error, cast_error = (
        float((linear.weight.grad.double() - exact).norm() / exact.norm()) for linear in (ready_linear, cast_linear)
    )
    assert ready_error < 0.5 * cast_error, (ready_error, cast_error)
    assert ready_linear.bias.grad.dtype == torch.float32
    exact_bias = sum(g.bfloat16().double().sum(0) for g in output_grads)
    torch.testing.assert_close(ready_linear.bias.grad.double(), exact_bias, rtol=1e-5, atol=1e-4)


def test_ready_weights_are_made_once_per_forward_and_only_where_they_apply(monkeypatch, ready_weights_on_cpus):
    made = []
    original = modeling.ready_linears
    monkeypatch.setattr(
        modeling, "ready_linears", lambda linears, dtype: made.append(dtype) or original(linears, dtype)
    )
    model = AlbertHFForPreTraining(tiny_config(num_hidden_layers=6)).train()  # one block applied 6 times
    inputs = make_inputs()
    inputs["labels"] = mlm_labels(inputs["input_ids"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(**inputs).loss.backward()
    assert made == [torch.bfloat16] * 4  # Q|K|V, the attention's output, the FFN's two: once, not 6 times
    made.clear()
    model(**inputs)
    assert made == [torch.float32] * 4
    made.clear()
    with torch.no_grad():  # inference: each Linear as a module
        model(**inputs)
    assert not made
    # an adapter or a hook on a Linear (PEFT, accelerate's offloading) sees its module called
    block = model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    calls = []
    block.attention.value.register_forward_hook(lambda *args: calls.append(1))
    model(**inputs).loss.backward()
    assert not made and len(calls) == 6
    # a CPU's eager step keeps the modules (what pays there)
    monkeypatch.undo()
    assert not modeling.AlbertHFTransformer.ready_weights_pay_on(torch.device("cpu"))
    assert modeling.AlbertHFTransformer.ready_weights_pay_on(torch.device("cuda"))
