"""torch.compile wherever albert_hf offers it: `compile_blocks` (regional, dynamic shapes on CPUs, static on GPUs)
against eager in every block layout a run meets, a whole model, the tanh GELU, and run_pretraining.py's
--torch_compile.

The layouts test and the GPU-form test run dynamo with the aot_eager backend (their graphs, guards and recompiles are
inductor's, without code generation: 2.5 minutes and 50 s there); the --torch_compile run (the form a CPU run
compiles, dynamic shapes), the whole model and the tanh GELU compile with inductor (a cold compile is the suite's
largest single cost on a 2-core CPU: BENCHMARKS.md, "The test suite")."""

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from albert_hf import AlbertHFForPreTraining, AlbertHFForSequenceClassification
from helpers import make_inputs, mlm_labels, padded_batch, tiny_config
from pretraining_runs import metrics, pretrain_runs

pytestmark = pytest.mark.compiles


def eager_and_compiled(config, **compile_kwargs):
    """Two pretraining models with the same weights, the second with `compile_blocks(**compile_kwargs)`."""
    eager = AlbertHFForPreTraining(config)
    compiled = AlbertHFForPreTraining(config)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled.compile_blocks(**compile_kwargs)


def assert_same_gradients(compiled, eager, compiled_loss, eager_loss):
    """Backward through both losses; every parameter's gradient equal to eager's."""
    compiled.zero_grad(), eager.zero_grad()
    compiled_loss.backward(), eager_loss.backward()
    grads = dict(eager.named_parameters())
    for name, param in compiled.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture
def dynamo_counters():
    """A clean torch.compile state (caches and counters) for the test, and reset afterwards even if it fails."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield counters
    torch._dynamo.reset()


def test_compiled_blocks_match_eager_in_every_layout_and_never_fall_back_to_eager(dynamo_counters):
    """compile_blocks against eager, values and gradients, over every block variant a run meets: packed rows
    whose count and masked-token count change (padding removal and last-block selection on), padded with a mask,
    unpadded; in training and in evaluation without grad. No recompiling once shapes are dynamic,
    and more graphs than torch's default limit of 8, past which dynamo would silently run the rest eager (it
    raises here instead). Dropout is 0 so that training-mode values can be compared."""
    torch.manual_seed(0)
    config = tiny_config(
        num_hidden_groups=2,
        inner_group_num=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
    )
    # aot_eager: dynamo's graphs, guards and recompiles and AOT autograd's joint graphs as inductor gets them, without
    # inductor's code generation (2.5 minutes of this test's 3 on 2 cores); inductor's values on changing packs are
    # test_torch_compile_compiles_the_blocks_and_follows_the_eager_loss_curve's
    eager, compiled = eager_and_compiled(config, backend="aot_eager")
    seen = []  # what the (eager) encoder hands the compiled blocks: the rows of its input, whether positions
    compiled.albert.encoder.register_forward_pre_hook(
        lambda module, args: seen.append((args[0].shape[:-1].numel(), args[3] is not None))
    )
    # (real lengths of 8 x 32, the packed rows the blocks get or None where the batch is not packed)
    layouts = [
        ((32, 9, 5, 3, 1, 1, 1, 1), 64),
        ((32, 32, 20, 2, 10, 10, 2, 2), 128),
        ((32, 32, 32, 32, 10, 6, 3, 3), 192),
        ((32,) * 7 + (31,), None),
        ((32,) * 8, None),
    ]
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):  # falling back to eager raises here
        for training, grad in ((True, True), (False, False)):
            compiled.train(training), eager.train(training)
            graphs = []
            for step, (real_lengths, packed_rows) in enumerate(layouts):
                inputs = padded_batch(batch=8, length=32, real_lengths=real_lengths)
                real = inputs["attention_mask"].bool()
                labels = mlm_labels(inputs["input_ids"], every=2 + step).masked_fill(~real, -100)
                extra = dict(labels=labels, sentence_order_label=torch.arange(8) % 2)
                with torch.set_grad_enabled(grad):
                    a, b = compiled(**inputs, **extra), eager(**inputs, **extra)
                if packed_rows is not None:
                    assert seen[-1] == (packed_rows, True)  # packs of the real tokens while padded
                torch.testing.assert_close(a.prediction_logits, b.prediction_logits, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
                if grad:
                    assert_same_gradients(compiled, eager, a.loss, b.loss)
                graphs.append(dynamo_counters["stats"]["unique_graphs"])
            assert graphs[0] > 0  # the blocks did compile
            assert graphs[2] == graphs[1], (training, grad)  # a new pack size and masked-token count: no new graph
    assert dynamo_counters["stats"]["unique_graphs"] > 8  # the workload did need more graphs than torch's default
    assert not dynamo_counters["graph_break"], dict(dynamo_counters["graph_break"])


@pytest.mark.parametrize("bf16", [False, True])
def test_compiled_blocks_in_the_gpu_form_compile_each_region_once_without_breaks(bf16, dynamo_counters, monkeypatch):
    """compile_blocks as run_pretraining uses it on a GPU: static shapes (dynamic=False), padding removal off, the
    collator's fixed-size masked positions, the blocks' weights made ready once per forward (`ready_weights`), and
    under bf16 autocast the bf16 residual stream (`residual_dtype`). Each distinct block is one compiled region (two
    shared groups here, 4 layers), so is the MLM head with its loss; no graph breaks; after the first training step
    no new graph; the loss and gradients are eager's."""
    from albert_hf import modeling_albert_hf as modeling
    from albert_hf.pretraining.data.collator import fixed_size_positions

    monkeypatch.setattr(modeling.AlbertHFTransformer, "ready_weights_pay_on", staticmethod(lambda device: True))
    monkeypatch.setattr(modeling, "LOW_PRECISION_RESIDUAL_DEVICES", ("cuda", "cpu"))

    config = tiny_config(
        num_hidden_groups=2,
        unpad_inputs=False,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout_prob=0.0,
    )
    # aot_eager, as the layouts test: on a GPU inductor generates Triton kernels, which a CPU cannot run; its C++
    # kernels for static shapes (50 s here) are a form no CPU run takes (CPUs compile with dynamic shapes)
    eager, compiled = eager_and_compiled(config, dynamic=False, backend="aot_eager")
    eager.train(), compiled.train()
    regions = [name for name, module in compiled.named_modules() if module._compiled_call_impl is not None]
    assert regions == [
        "albert.encoder.albert_layer_groups.0.albert_layers.0",
        "albert.encoder.albert_layer_groups.1.albert_layers.0",
    ]
    assert compiled.mlm_logits_and_loss is not eager.mlm_logits_and_loss  # the head and its loss: a region too
    graphs = []
    for step in range(3):
        inputs = padded_batch(batch=4, length=24, real_lengths=(24, 9 + step, 17, 3))
        labels = mlm_labels(inputs["input_ids"], every=3 + step).masked_fill(~inputs["attention_mask"].bool(), -100)
        positions, weights = (torch.from_numpy(a) for a in fixed_size_positions(labels.numpy(), 8))
        extra = dict(
            labels=labels,
            sentence_order_label=torch.arange(4) % 2,
            masked_lm_positions=positions,
            masked_lm_weights=weights,
        )
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            a, b = compiled(**inputs, **extra), eager(**inputs, **extra)
        if bf16:  # the traced graph rounds to bf16 in places of its own: within bf16's precision
            torch.testing.assert_close(a.loss, b.loss, rtol=1e-3, atol=0)
            compiled.zero_grad(), eager.zero_grad()
            a.loss.backward(), b.loss.backward()
            grads = dict(eager.named_parameters())
            for name, param in compiled.named_parameters():
                grad = grads[name].grad
                assert float((param.grad - grad).norm()) <= 0.04 * float(grad.norm()) + 1e-6, name  # 1.2% seen
        else:
            torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
            assert_same_gradients(compiled, eager, a.loss, b.loss)
        graphs.append(dynamo_counters["stats"]["unique_graphs"])
    assert not dynamo_counters["graph_break"], dict(dynamo_counters["graph_break"])
    # the block without and with the last block's positions, and the head with its loss
    assert graphs == [3, 3, 3]


def test_an_unpacked_batchs_first_layer_compiles_no_graph_of_its_own(dynamo_counters):
    """A batch without padding is not packed, and the E->H projection of its (batch, seq) embeddings is a view of
    the GEMM's output, where every block's output is not. With dynamic shapes a compiled block guards on its input's
    base, so the first layer would compile a forward and a backward of its own (a fifth of a CPU run's first-step
    compile) were it not handed a copy: one graph for the blocks, one for the last block with its positions, and the
    head with its loss."""
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0)
    assert config.embedding_size != config.hidden_size  # the projection is there
    eager, compiled = eager_and_compiled(config, backend="aot_eager")
    eager.train(), compiled.train()
    inputs = padded_batch(batch=4, length=24, real_lengths=(24,) * 4)
    extra = dict(labels=mlm_labels(inputs["input_ids"], every=3), sentence_order_label=torch.arange(4) % 2)
    a, b = compiled(**inputs, **extra), eager(**inputs, **extra)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)
    assert_same_gradients(compiled, eager, a.loss, b.loss)
    assert dynamo_counters["stats"]["unique_graphs"] == 3


def test_torch_compile_matches_eager():
    model = AlbertHFForSequenceClassification(tiny_config(num_hidden_layers=2)).eval()
    inputs = make_inputs()
    with torch.no_grad():
        eager = model(**inputs).logits
        compiled = torch.compile(model)(**inputs).logits
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-5)


@pytest.mark.quick
def test_tanh_gelu_compiles_to_the_same_function_and_gradient(dynamo_counters):
    """Compiled, TanhGELU switches to its sigmoid form (fast on CPU); it must stay the tanh formula."""
    from albert_hf.modeling_albert_hf import TanhGELU

    x = torch.linspace(-8, 8, 4001, dtype=torch.float64).float().requires_grad_()
    expected = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))  # the official formula
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    for gelu in (TanhGELU(), torch.compile(TanhGELU(), backend="inductor")):
        y = gelu(x)
        (grad,) = torch.autograd.grad(y.sum(), x)
        torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5)
    assert torch.equal(TanhGELU()(x), F.gelu(x, approximate="tanh"))  # eager: torch's fused kernel itself


# Not `rounding`: both runs are fp32 (FAST), and compiled and eager losses agree to a few 1e-8 relative, against the
# 1e-3 asserted (BENCHMARKS.md, "Tolerance margins under the AVX2 caps"): the kernels' rounding cannot flip it.
@pytest.mark.trains
def test_torch_compile_compiles_the_blocks_and_follows_the_eager_loss_curve(tmp_path):
    steps = ["--max_train_steps", "4", "--eval_steps", "0", "--max_seq_length", "48"]  # 48: the batches are padded
    # a mode turns --torch_compile on, as in transformers
    compiled_run = [*steps, "--torch_compile_mode", "default"]
    # 600 s, not pretrain_runs' 300: on 2 busy cores (no cached kernels) the compiled run's first step alone once
    # took 247 s; a hang still ends the test.
    results, done = pretrain_runs([(tmp_path / "eager", steps), (tmp_path / "compiled", compiled_run)], timeout=600)
    assert [result["status"] for result in results] == [0, 0], results
    assert done.stdout.count("AutoModel -> AlbertHFModel") == 2
    log = done.stdout + done.stderr
    assert log.count("torch.compile (mode default, dynamic shapes) of each distinct block and the MLM head") == 1
    assert log.count("torch.compile: the first step took ") == 1
    eager, compiled = (
        [row for row in metrics(tmp_path / name) if "train_mlm_loss" in row] for name in ("eager", "compiled")
    )
    assert [row["step"] for row in compiled] == [row["step"] for row in eager] == [2, 4]
    for a, b in zip(eager, compiled):
        assert abs(a["train_mlm_loss"] - b["train_mlm_loss"]) < 1e-3 * a["train_mlm_loss"]
        assert abs(a["train_sop_loss"] - b["train_sop_loss"]) < 1e-3 * a["train_sop_loss"]
    saved = [load_file(tmp_path / name / "model.safetensors") for name in ("eager", "compiled")]
    assert saved[0].keys() == saved[1].keys()  # in-place compiling leaves the state-dict keys alone
