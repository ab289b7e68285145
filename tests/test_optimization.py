"""Tests for albert_hf.optimization against plain-numpy references written from the spec (§4, §5.1)."""

import copy
import pickle

import numpy as np
import pytest
import torch

import albert_hf
from albert_hf.optimization import AdamWeightDecay, Lamb, get_official_schedule, parameter_groups

B1, B2, EPS, WD = 0.9, 0.999, 1e-6, 0.01


# ----------------------------------------------------------------------------------------------------------------
# Independent reference: the spec formulas, one parameter at a time, in numpy float64.


def reference_step(w, g, m, v, lr, wd, trust_ratio):
    m = B1 * m + (1 - B1) * g  # no bias correction
    v = B2 * v + (1 - B2) * g * g
    u = m / (np.sqrt(v) + EPS) + wd * w
    r = 1.0
    if trust_ratio:
        w_norm, u_norm = np.sqrt(np.sum(w * w)), np.sqrt(np.sum(u * u))
        if w_norm > 0 and u_norm > 0:
            r = w_norm / u_norm
    return w - lr * r * u, m, v


def make_problem(seed=0, steps=6):
    """Initial weights and per-step gradients for: a decayed matrix, a decayed zero-initialised vector (zero norm
    on the first step), an excluded 'bias' vector and a decayed param that never gets a gradient."""
    rng = np.random.default_rng(seed)
    init = {
        "matrix": rng.normal(size=(4, 3)),
        "zeros": np.zeros(5),
        "bias": rng.normal(size=(3,)),
        "no_grad": rng.normal(size=(2,)),
    }
    grads = [{name: rng.normal(size=init[name].shape) for name in ("matrix", "zeros", "bias")} for _ in range(steps)]
    return init, grads


def reference_run(init, grads, lrs, lamb):
    w = {k: x.copy() for k, x in init.items()}
    m = {k: np.zeros_like(x) for k, x in init.items()}
    v = {k: np.zeros_like(x) for k, x in init.items()}
    for lr, step_grads in zip(lrs, grads):
        for name, g in step_grads.items():
            excluded = name == "bias"
            w[name], m[name], v[name] = reference_step(
                w[name], g, m[name], v[name], lr, wd=0.0 if excluded else WD, trust_ratio=lamb and not excluded
            )
    return w


def torch_run(optimizer_cls, init, grads, lrs, dtype=torch.float64, gate=None, **kwargs):
    params = {k: torch.nn.Parameter(torch.tensor(x, dtype=dtype)) for k, x in init.items()}
    groups = [
        {"params": [params["matrix"], params["zeros"], params["no_grad"]]},
        {"params": [params["bias"]], "weight_decay": 0.0, "exclude_from_layer_adaptation": True},
    ]
    opt = optimizer_cls(groups, lr=lrs[0], betas=(B1, B2), eps=EPS, weight_decay=WD, **kwargs)
    opt.update_gate = gate
    for lr, step_grads in zip(lrs, grads):
        for group in opt.param_groups:
            group["lr"] = lr
        for name, g in step_grads.items():
            params[name].grad = torch.tensor(g, dtype=dtype)
        opt.step()
    return {k: p.detach().double().numpy() for k, p in params.items()}, opt, params


LRS = [0.1, 0.05, 0.2, 0.1, 0.01, 0.3]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("optimizer_cls, lamb", [(Lamb, True), (AdamWeightDecay, False)])
def test_optimizer_matches_numpy_reference_float64(optimizer_cls, lamb, foreach):
    init, grads = make_problem()
    expected = reference_run(init, grads, LRS, lamb=lamb)
    got, opt, params = torch_run(optimizer_cls, init, grads, LRS, foreach=foreach)
    for name in init:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, atol=1e-14, err_msg=name)
    # The param without a gradient is untouched and gets no state.
    np.testing.assert_array_equal(got["no_grad"], init["no_grad"])
    assert params["no_grad"] not in opt.state
    # Every other param really moved.
    for name in ("matrix", "zeros", "bias"):
        assert np.abs(got[name] - init[name]).max() > 1e-3, name


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("optimizer_cls, lamb", [(Lamb, True), (AdamWeightDecay, False)])
def test_an_update_gate_of_0_leaves_everything_as_it_was_and_1_takes_the_reference_step(optimizer_cls, lamb, foreach):
    """`update_gate` as the pretraining loop sets it: step 3's gradients are NaN and gated off (0). That step leaves
    every weight and moment bitwise as it was; the run ends where the numpy reference ends without step 3 (its
    gradients and its learning rate dropped), the other steps gated on (1)."""
    init, grads = make_problem(seed=2)
    expected = reference_run(init, grads[:2] + grads[3:], LRS[:2] + LRS[3:], lamb=lamb)
    params = {k: torch.nn.Parameter(torch.tensor(x, dtype=torch.float64)) for k, x in init.items()}
    groups = [
        {"params": [params["matrix"], params["zeros"], params["no_grad"]]},
        {"params": [params["bias"]], "weight_decay": 0.0, "exclude_from_layer_adaptation": True},
    ]
    opt = optimizer_cls(groups, lr=LRS[0], betas=(B1, B2), eps=EPS, weight_decay=WD, foreach=foreach)
    opt.update_gate = torch.ones(())
    for step, (lr, step_grads) in enumerate(zip(LRS, grads)):
        for group in opt.param_groups:
            group["lr"] = lr
        for name, g in step_grads.items():
            params[name].grad = (
                torch.full(g.shape, float("nan"), dtype=torch.float64)
                if step == 2
                else torch.tensor(g, dtype=torch.float64)
            )
        opt.update_gate.fill_(0.0 if step == 2 else 1.0)
        before = copy.deepcopy((params, opt.state_dict()["state"]))
        opt.step()
        if step == 2:
            for name in params:
                assert torch.equal(params[name], before[0][name]), name
            for index, state in opt.state_dict()["state"].items():
                assert all(torch.equal(state[key], before[1][index][key]) for key in ("exp_avg", "exp_avg_sq"))
    for name in init:
        np.testing.assert_allclose(params[name].detach().numpy(), expected[name], rtol=1e-12, atol=1e-14, err_msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("optimizer_cls", [Lamb, AdamWeightDecay])
def test_the_cpu_path_gated_on_rounds_exactly_as_without_a_gate(optimizer_cls, dtype):
    """The one-tensor-at-a-time path (the CPU's) with its update gate at 1 gives the ungated path's results bit for
    bit, so that a run that skips nothing trains as it did before the gate existed."""
    init, grads = make_problem(seed=3)
    plain, _, _ = torch_run(optimizer_cls, init, grads, LRS, dtype=dtype, foreach=False)
    gated, _, _ = torch_run(optimizer_cls, init, grads, LRS, dtype=dtype, gate=torch.ones(()), foreach=False)
    for name in init:
        np.testing.assert_array_equal(gated[name], plain[name], err_msg=name)


@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_matches_numpy_reference_float32(foreach):
    init, grads = make_problem(seed=1)
    expected = reference_run(init, grads, LRS, lamb=True)
    got, _, _ = torch_run(Lamb, init, grads, LRS, dtype=torch.float32, foreach=foreach)
    for name in init:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("scale", [0.01, 100.0])  # trust ratio well below and well above 1 (it is unclipped)
def test_lamb_trust_ratio_and_zero_norm_fallback(scale, foreach):
    """The trust ratio really changes the update, and a zero-norm weight gets ratio 1 (plain step)."""
    init, grads = make_problem(seed=2, steps=1)
    init["matrix"] = init["matrix"] * scale
    lamb, _, _ = torch_run(Lamb, init, grads, [0.1], foreach=foreach)
    adamw, _, _ = torch_run(AdamWeightDecay, init, grads, [0.1])
    # With ||w|| = 0 the first LAMB step equals the AdamWeightDecay step; so does the excluded param.
    np.testing.assert_allclose(lamb["zeros"], adamw["zeros"], rtol=1e-12)
    np.testing.assert_allclose(lamb["bias"], adamw["bias"], rtol=1e-12)
    # The adapted matrix step has norm lr * ||w|| exactly (ratio ||w||/||u|| times ||u||).
    step_norm = np.linalg.norm(lamb["matrix"] - init["matrix"])
    assert step_norm == pytest.approx(0.1 * np.linalg.norm(init["matrix"]), rel=1e-12)
    adamw_step_norm = np.linalg.norm(adamw["matrix"] - init["matrix"])  # = lr * ||u||
    assert (step_norm > 10 * adamw_step_norm) if scale > 1 else (step_norm < adamw_step_norm / 10)


def test_no_bias_correction_first_step():
    """First step without bias correction moves each coordinate by lr*(1-b1)/sqrt(1-b2) = 3.162*lr (wd=0)."""
    w = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    w.grad = torch.tensor([2.0, -5.0, 0.5], dtype=torch.float64)
    AdamWeightDecay([w], lr=0.01, weight_decay=0.0).step()
    expected = (
        -0.01
        * np.sign(w.grad.numpy())
        * 0.1
        * np.abs(w.grad.numpy())
        / (np.sqrt(0.001) * np.abs(w.grad.numpy()) + 1e-6)
    )
    np.testing.assert_allclose(w.detach().numpy(), expected, rtol=1e-12)
    assert abs(w[0].item()) == pytest.approx(0.031623, rel=1e-4)


@pytest.mark.parametrize("foreach", [False, True])
def test_bf16_params_keep_fp32_moments_and_round_once_per_step(foreach):
    """bf16 params: moments stay fp32 and each step equals the fp32 computation rounded to bf16."""
    torch.manual_seed(0)
    w0 = torch.randn(6, 4).bfloat16()
    grads = [torch.randn(6, 4).bfloat16() for _ in range(4)]
    low = torch.nn.Parameter(w0.clone())
    master = torch.nn.Parameter(w0.float())
    opt_low, opt_master = Lamb([low], lr=0.05, foreach=foreach), Lamb([master], lr=0.05, foreach=foreach)
    for g in grads:
        low.grad, master.grad = g.clone(), g.float()
        opt_low.step()
        opt_master.step()
        with torch.no_grad():
            master.copy_(master.bfloat16().float())  # emulate the bf16 storage of the param
        assert torch.equal(low.float(), master)
    assert low.dtype == torch.bfloat16
    assert opt_low.state[low]["exp_avg"].dtype == torch.float32
    assert torch.equal(opt_low.state[low]["exp_avg_sq"], opt_master.state[master]["exp_avg_sq"])


# ----------------------------------------------------------------------------------------------------------------
# Schedule: values hand-computed from spec §4 (peak 0.00176, warmup 3125, total 125k).


@pytest.mark.parametrize(
    "step, expected",
    [
        (0, 0.0),
        (1, 0.00176 / 3125),  # 5.632e-7
        (1000, 0.00176 * 0.32),
        (3124, 0.00176 * 3124 / 3125),
        (3125, 0.001716),  # 0.975 x peak: the drop right after warmup
        (62_500, 0.00088),
        (124_999, 0.00176 / 125_000),
        (125_000, 0.0),
        (200_000, 0.0),  # clamped past the end
    ],
)
def test_official_schedule_pretraining_values(step, expected):
    opt = Lamb([torch.nn.Parameter(torch.zeros(1))], lr=0.00176)
    sched = get_official_schedule(opt, num_warmup_steps=3125, num_training_steps=125_000)
    assert 0.00176 * sched.lr_lambdas[0](step) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_official_schedule_stepping_and_power():
    opt = AdamWeightDecay([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_official_schedule(opt, num_warmup_steps=4, num_training_steps=10)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warmup t/4 for t < 4, then 1 - t/10 (0.6 right after warmup, not 1.0), then 0.
    assert lrs == pytest.approx([0, 0.25, 0.5, 0.75, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0, 0], abs=1e-12)

    opt2 = Lamb([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched2 = get_official_schedule(opt2, num_warmup_steps=0, num_training_steps=10, power=2.0)
    assert sched2.get_last_lr() == [2.0]  # no warmup: starts at peak
    for _ in range(6):
        opt2.step()
        sched2.step()
    assert sched2.get_last_lr()[0] == pytest.approx(2.0 * 0.4**2, rel=1e-12)  # 0.32
    # The lambda is picklable and the scheduler state round-trips.
    restored = pickle.loads(pickle.dumps(sched2.lr_lambdas[0]))
    assert restored(6) == pytest.approx(0.16)
    assert sched2.state_dict()["last_epoch"] == 6


def test_foreach_and_single_tensor_paths_agree_on_tiny_model(tiny_model):
    models = [copy.deepcopy(tiny_model) for _ in range(2)]
    opts = [Lamb(parameter_groups(m), lr=0.01, foreach=f) for m, f in zip(models, (False, True))]
    torch.manual_seed(3)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in models[0].parameters()]
        for m, opt in zip(models, opts):
            for p, g in zip(m.parameters(), grads):
                p.grad = g.clone()
            opt.step()
    for (n, p), q, p0 in zip(models[0].named_parameters(), models[1].parameters(), tiny_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=n)
        assert not torch.equal(p, p0), n


def test_first_update_uses_lr_zero_like_tf():
    """TF applies the update with global_step = 0 first, so the first step does not move the weights."""
    w = torch.nn.Parameter(torch.ones(3))
    opt = Lamb([w], lr=0.1)
    sched = get_official_schedule(opt, num_warmup_steps=5, num_training_steps=20)
    w.grad = torch.ones(3)
    opt.step()
    sched.step()
    assert torch.equal(w.detach(), torch.ones(3))
    assert torch.count_nonzero(opt.state[w]["exp_avg"]) == 3  # but the moments were filled
    opt.step()
    assert not torch.equal(w.detach(), torch.ones(3))


# ----------------------------------------------------------------------------------------------------------------
# parameter_groups on the real model.

EXPECTED_DECAYED = {
    "albert.embeddings.word_embeddings.weight",
    "albert.embeddings.position_embeddings.weight",
    "albert.embeddings.token_type_embeddings.weight",
    "albert.encoder.embedding_hidden_mapping_in.weight",
    "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.query.weight",
    "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.key.weight",
    "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.value.weight",
    "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.dense.weight",
    "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn.weight",
    "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn_output.weight",
    "albert.pooler.weight",
    "predictions.dense.weight",
    "sop_classifier.classifier.weight",
}


@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(0)
    return albert_hf.AlbertHFForPreTraining(albert_hf.AlbertHFConfig.from_preset("tiny"))


def test_parameter_groups_on_tiny_model(tiny_model):
    groups = parameter_groups(tiny_model, weight_decay=0.01)
    assert len(groups) == 2
    decay, no_decay = groups
    assert (decay["weight_decay"], decay["exclude_from_layer_adaptation"]) == (0.01, False)
    assert (no_decay["weight_decay"], no_decay["exclude_from_layer_adaptation"]) == (0.0, True)

    name_of = {id(p): n for n, p in tiny_model.named_parameters()}
    decay_names = {name_of[id(p)] for p in decay["params"]}
    no_decay_names = {name_of[id(p)] for p in no_decay["params"]}
    assert decay_names == EXPECTED_DECAYED
    assert "predictions.bias" in no_decay_names
    for name in (
        "albert.embeddings.LayerNorm.weight",
        "albert.embeddings.LayerNorm.bias",
        "albert.encoder.albert_layer_groups.0.albert_layers.0.attention.LayerNorm.weight",
        "albert.encoder.albert_layer_groups.0.albert_layers.0.full_layer_layer_norm.weight",
        "albert.encoder.albert_layer_groups.0.albert_layers.0.full_layer_layer_norm.bias",
        "predictions.LayerNorm.weight",
        "sop_classifier.classifier.bias",
    ):
        assert name in no_decay_names, name

    # Every trainable parameter exactly once, tied decoder weight included only via the word embeddings.
    all_params = [p for g in groups for p in g["params"]]
    assert len(all_params) == len({id(p) for p in all_params})
    assert {id(p) for p in all_params} == {id(p) for p in tiny_model.parameters()}
    assert tiny_model.get_output_embeddings().weight is tiny_model.get_input_embeddings().weight
    assert len(all_params) == 32


def test_parameter_groups_skip_frozen_and_work_with_all_optimizers(tiny_model):
    model = copy.deepcopy(tiny_model)
    model.albert.pooler.weight.requires_grad_(False)
    groups = parameter_groups(model)
    assert sum(len(g["params"]) for g in groups) == 31
    assert all(p is not model.albert.pooler.weight for g in groups for p in g["params"])
    for cls in (Lamb, AdamWeightDecay, torch.optim.AdamW):
        opt = cls(parameter_groups(model), lr=1e-3)
        assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]


# ----------------------------------------------------------------------------------------------------------------
# Closure, resume, validation.


def test_closure_is_called_and_loss_returned():
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = Lamb([w], lr=0.1)
    calls = []

    def closure():
        opt.zero_grad()
        loss = (w**2).sum()
        loss.backward()
        calls.append(loss.item())
        return loss

    loss = opt.step(closure)
    assert calls == [5.0] and loss.item() == 5.0
    assert w.grad is not None and not torch.equal(w.detach(), torch.tensor([1.0, -2.0]))


@pytest.mark.parametrize("optimizer_cls", [Lamb, AdamWeightDecay])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_dict_resume_continues_identically(tiny_model, optimizer_cls, dtype):
    """Save after 3 steps and go on for 3; a fresh model/optimizer/scheduler loaded from the save ends bit-identical."""
    torch.manual_seed(1)
    model = copy.deepcopy(tiny_model).to(dtype)
    grads = [{n: torch.randn_like(p) for n, p in model.named_parameters()} for _ in range(6)]

    def run(model, opt, sched, steps):
        for step_grads in steps:
            for n, p in model.named_parameters():
                p.grad = step_grads[n].clone()
            opt.step()
            sched.step()

    opt = optimizer_cls(parameter_groups(model), lr=0.01)
    sched = get_official_schedule(opt, num_warmup_steps=2, num_training_steps=10)
    run(model, opt, sched, grads[:3])
    saved = copy.deepcopy((model.state_dict(), opt.state_dict(), sched.state_dict()))
    run(model, opt, sched, grads[3:])

    resumed = copy.deepcopy(tiny_model).to(dtype)
    resumed.load_state_dict(saved[0])
    opt2 = optimizer_cls(parameter_groups(resumed), lr=0.01)
    sched2 = get_official_schedule(opt2, num_warmup_steps=2, num_training_steps=10)
    opt2.load_state_dict(saved[1])
    sched2.load_state_dict(saved[2])
    any_moment = next(iter(opt2.state.values()))["exp_avg"]
    assert any_moment.dtype == torch.float32  # fp32 moments survive the load, even for bf16 params
    run(resumed, opt2, sched2, grads[3:])

    assert sched2.get_last_lr() == sched.get_last_lr()
    for (n, p), p2 in zip(model.named_parameters(), resumed.parameters()):
        assert torch.equal(p, p2), n
    for p, p2 in zip(opt.state, opt2.state):
        assert torch.equal(opt.state[p]["exp_avg_sq"], opt2.state[p2]["exp_avg_sq"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lr=-1.0), "lr"),
        (dict(eps=-1e-6), "eps"),
        (dict(weight_decay=-0.01), "weight_decay"),
        (dict(betas=(1.0, 0.999)), "betas"),
        (dict(betas=(0.9, -0.1)), "betas"),
        (dict(betas=(0.9,)), "betas"),
    ],
)
@pytest.mark.parametrize("optimizer_cls", [Lamb, AdamWeightDecay])
def test_invalid_optimizer_arguments(optimizer_cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        optimizer_cls([torch.nn.Parameter(torch.zeros(1))], **kwargs)


def test_invalid_group_and_sparse_gradient():
    opt = Lamb([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="weight_decay"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))], "weight_decay": -1.0})
    emb = torch.nn.Embedding(4, 2, sparse=True)
    emb(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="sparse"):
        AdamWeightDecay(emb.parameters()).step()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_warmup_steps=11, num_training_steps=10), "num_warmup_steps"),
        (dict(num_warmup_steps=-1, num_training_steps=10), "num_warmup_steps"),
        (dict(num_warmup_steps=0, num_training_steps=0), "num_training_steps"),
        (dict(num_warmup_steps=1.5, num_training_steps=10), "num_warmup_steps"),
        (dict(num_warmup_steps=1, num_training_steps=10, power=0.0), "power"),
    ],
)
def test_invalid_schedule_arguments(kwargs, match):
    opt = Lamb([torch.nn.Parameter(torch.zeros(1))])
    with pytest.raises(ValueError, match=match):
        get_official_schedule(opt, **kwargs)
