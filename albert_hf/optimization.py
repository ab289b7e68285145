"""The optimizers and learning-rate schedules: the official ALBERT code's (google-research/albert) and a WSD one.

- `Lamb`: the LAMB optimizer (You et al., 2019, arXiv:1904.00962) exactly as ALBERT's `lamb_optimizer.py` runs it
  for pretraining: no bias correction, decoupled weight decay inside the update, an unclipped trust ratio.
- `AdamWeightDecay`: the fine-tuning optimizer (`AdamWeightDecayOptimizer` in the official `optimization.py`), Adam
  without bias correction plus decoupled weight decay.
- `parameter_groups`: the official exclusions (no weight decay and no trust ratio for LayerNorm and bias).
- `get_official_schedule`: linear warmup, then polynomial decay counted from step 0.
- `get_wsd_schedule`: warm-up, the peak held, a 1-sqrt decay at the end (long runs that can be extended or branched).

Gradient clipping is not part of either optimizer: the official code clips the gradients to global norm 1.0
*before* calling the optimizer, so call `torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)` (or
`accelerator.clip_grad_norm_`) before `optimizer.step()`.

Typical use (ALBERT pretraining with the official values; docs/official_recipe.md, Pretraining):

    optimizer = Lamb(parameter_groups(model, weight_decay=0.01), lr=0.00176)
    scheduler = get_official_schedule(optimizer, num_warmup_steps=3125, num_training_steps=125_000)
    for batch in data:
        model(**batch).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
"""

import functools
import math
import numbers
import re
from collections import defaultdict

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

# The official `exclude_from_weight_decay` regexes (also used for `exclude_from_layer_adaptation`).
NO_DECAY_PATTERNS = ("LayerNorm", "layer_norm", "bias")


def parameter_groups(model: torch.nn.Module, weight_decay: float = 0.01, no_decay_patterns=NO_DECAY_PATTERNS):
    """Split `model`'s trainable parameters into the official decay / no-decay groups.

    A parameter whose name matches any of `no_decay_patterns` (`re.search`, as the official code does on TF
    variable names) gets weight_decay 0 and no LAMB trust ratio. With the default patterns this excludes every
    LayerNorm weight and bias, every bias, and the MLM output bias (the parameter predictions.bias); the embeddings
    are decayed.
    Tied or shared parameters appear once (`named_parameters` deduplicates them). Frozen parameters are left out.

    The returned list of dicts works with `Lamb`, `AdamWeightDecay` and `torch.optim.AdamW` alike (the last simply
    ignores the extra `exclude_from_layer_adaptation` key). Empty groups are dropped.

    Args:
        model (`torch.nn.Module`): the model whose parameters are grouped.
        weight_decay (`float`, defaults to 0.01): the decay of the decayed group.
        no_decay_patterns (defaults to `NO_DECAY_PATTERNS`, `("LayerNorm", "layer_norm", "bias")`): regular
            expressions searched in each parameter's name.

    Returns:
        A list of up to two param groups, `{"params", "weight_decay", "exclude_from_layer_adaptation"}`: the decayed
        parameters (`weight_decay`, False), then the excluded ones (0.0, True).
    """
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        excluded = any(re.search(pattern, name) for pattern in no_decay_patterns)
        (no_decay if excluded else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "exclude_from_layer_adaptation": False},
        {"params": no_decay, "weight_decay": 0.0, "exclude_from_layer_adaptation": True},
    ]
    return [group for group in groups if group["params"]]


def _working_dtype(param: torch.Tensor) -> torch.dtype:
    # Moments and arithmetic in fp32 for bf16/fp16 params (the TF code keeps adam_m/adam_v in fp32), else in the
    # param's own dtype (fp32, or fp64 for exact tests).
    return torch.promote_types(param.dtype, torch.float32)


def _trust_ratio(w_norm: torch.Tensor, u_norm: torch.Tensor) -> torch.Tensor:
    # ||w|| / ||u||, unclipped, and 1 when either norm is 0 (official `tf.where` fallback). Stays on device.
    return torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))


def _gated(gate: torch.Tensor, betas, lr, dtype) -> tuple:
    """The step's coefficients under an update gate (1: the step as usual; 0: m, v and w left exactly as they are):
    decays b1, b2 (1 when gated off), gradient shares 1-b1, 1-b2 (0) and learning rate (0), as device tensors."""
    keep = gate.to(dtype) > 0
    beta1, beta2 = betas
    one, zero = torch.ones((), dtype=dtype, device=gate.device), torch.zeros((), dtype=dtype, device=gate.device)
    return (
        torch.where(keep, beta1, one),
        torch.where(keep, 1.0 - beta1, zero),
        torch.where(keep, beta2, one),
        torch.where(keep, 1.0 - beta2, zero),
        torch.where(keep, lr, zero),
        keep,
    )


def _single_tensor_update(
    params, grads, exp_avgs, exp_avg_sqs, *, dtype, lr, betas, eps, weight_decay, trust_ratio, gate=None
):
    """One parameter at a time, in place where possible (one temporary per param). The default on CPU."""
    beta1, beta2 = betas
    if gate is not None:
        plain_lr = not isinstance(lr, torch.Tensor)
        decay1, share1, decay2, share2, gated_lr, keep = _gated(gate, betas, lr, dtype)
        minus_lr = -gated_lr if plain_lr else None
        lr = lr if plain_lr else gated_lr  # a float lr stays a float: the update uses minus_lr
    for param, grad, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        # `.to` is a no-op in the working dtype; bf16/fp16 params and grads get fp32 copies.
        w, g = param.to(dtype), grad.to(dtype)
        if gate is None:
            m.mul_(beta1).add_(g, alpha=1.0 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        else:  # a gradient gated off may hold NaN: replaced by 0, so that 0 x it leaves the moments exact
            # (gated on, these round exactly as the two lines above: the same products, the same additions)
            g = torch.where(keep, g, 0.0)
            m.mul_(decay1).addcmul_(share1, g)
            v.mul_(decay2).addcmul_(g * share2, g)
        u = v.sqrt().add_(eps)
        torch.div(m, u, out=u)  # u = m / (sqrt(v) + eps)
        if weight_decay != 0.0:
            u.add_(w, alpha=weight_decay)
        if trust_ratio:
            u.mul_(_trust_ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(u)))
        if gate is not None and not isinstance(lr, torch.Tensor):  # as `w.add_(u, alpha=-lr)`, bit for bit
            w.addcmul_(minus_lr, u)
        elif isinstance(lr, torch.Tensor):  # a device tensor (a captured step reads each step's value)
            w.sub_(u.mul_(lr))
        else:
            w.add_(u, alpha=-lr)
        if w is not param:  # low-precision param: write back the fp32 result, rounded once
            param.copy_(w)


def _foreach_update(
    params, grads, exp_avgs, exp_avg_sqs, *, dtype, lr, betas, eps, weight_decay, trust_ratio, gate=None
):
    """The same arithmetic as `_single_tensor_update` on whole lists of tensors. The default on GPU."""
    beta1, beta2 = betas
    weights = [p.to(dtype) for p in params]
    grads = [g.to(dtype) for g in grads]

    if gate is None:
        torch._foreach_mul_(exp_avgs, beta1)
        torch._foreach_add_(exp_avgs, grads, alpha=1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
    else:  # as in `_single_tensor_update`
        decay1, share1, decay2, share2, lr, keep = _gated(gate, betas, lr, dtype)
        grads = [torch.where(keep, g, 0.0) for g in grads]
        torch._foreach_mul_(exp_avgs, decay1)
        torch._foreach_add_(exp_avgs, torch._foreach_mul(grads, share1))
        torch._foreach_mul_(exp_avg_sqs, decay2)
        squares = torch._foreach_mul(grads, grads)
        torch._foreach_mul_(squares, share2)
        torch._foreach_add_(exp_avg_sqs, squares)
        del squares

    denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denom, eps)
    updates = torch._foreach_div(exp_avgs, denom)
    del denom
    if weight_decay != 0.0:
        torch._foreach_add_(updates, weights, alpha=weight_decay)
    if trust_ratio:
        ratio = _trust_ratio(torch.stack(torch._foreach_norm(weights)), torch.stack(torch._foreach_norm(updates)))
        torch._foreach_mul_(updates, list(ratio.unbind(0)))

    if isinstance(lr, torch.Tensor):  # a device tensor (a captured step reads each step's value)
        torch._foreach_mul_(updates, lr)
        torch._foreach_sub_(weights, updates)
    else:
        torch._foreach_add_(weights, updates, alpha=-lr)
    for param, weight in zip(params, weights):
        if weight is not param:
            param.copy_(weight)


class _UncorrectedAdam(Optimizer):
    """Shared step of both official optimizers.

    Per parameter w with gradient g (all arithmetic in the working dtype, see `_working_dtype`):
        m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2          (no bias correction, no step counter)
        u = m / (sqrt(v) + eps) + wd*w                       (decoupled weight decay, part of the update)
        r = ||w|| / ||u|| (1 if either is 0) for LAMB groups that are not excluded, else 1
        w = w - lr * r * u
    """

    use_trust_ratio = False  # LAMB turns this on

    def __init__(self, params, lr, betas, eps, weight_decay, exclude_from_layer_adaptation=False, foreach=None):
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            exclude_from_layer_adaptation=exclude_from_layer_adaptation,
            foreach=foreach,
        )
        super().__init__(params, defaults)
        self.update_gate: torch.Tensor | None = None  # `gate_on`

    def gate_on(self, device: torch.device) -> torch.Tensor:
        """The update gate: a 0-dim tensor on the params' `device`, read by each step on the device. 1 applies the
        step as above, 0 leaves every weight and moment exactly as it is (a step whose gradients are not finite: the
        pretraining step writes it from the gradients' norm, `pretraining.training.step.training_step`). Made on
        first use and kept, so a captured step writes and reads the same one."""
        if self.update_gate is None:
            self.update_gate = torch.ones((), dtype=torch.float32, device=device)
        return self.update_gate

    def add_param_group(self, param_group):
        # Validate every group (including the defaults it inherits), not just the constructor arguments.
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if not 0.0 <= float(group["lr"]):  # a float, or a 0-dim tensor (`pretraining.training.step_graph`)
            raise ValueError(f"Invalid lr: {group['lr']} (must be >= 0)")
        if not 0.0 <= group["eps"]:
            raise ValueError(f"Invalid eps: {group['eps']} (must be >= 0)")
        if not 0.0 <= group["weight_decay"]:
            raise ValueError(f"Invalid weight_decay: {group['weight_decay']} (must be >= 0)")
        betas = group["betas"]
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"Invalid betas: {betas} (need two values in [0, 1))")

    @torch.no_grad()
    def step(self, closure=None):
        """Performs one update. `closure` re-evaluates the model and returns the loss, as in torch.optim."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()

        for group in self.param_groups:
            # Bucket by (device, working dtype): each bucket is one batch of _foreach kernels.
            buckets = defaultdict(lambda: ([], [], [], []))
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
                state = self.state[param]
                if not state:
                    dtype = _working_dtype(param)
                    state["exp_avg"] = torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=dtype, memory_format=torch.preserve_format)
                params, grads, exp_avgs, exp_avg_sqs = buckets[(param.device, state["exp_avg"].dtype)]
                params.append(param)
                grads.append(param.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])

            trust_ratio = self.use_trust_ratio and not group["exclude_from_layer_adaptation"]
            for (device, dtype), tensors in buckets.items():
                # Like torch.optim: _foreach kernels pay off on accelerators (fewer launches); on CPU a plain loop is
                # faster (albert-base, 2 cores: ~19 vs ~25-57 ms/step) and keeps only one param's temporaries alive.
                foreach = group["foreach"] if group["foreach"] is not None else device.type != "cpu"
                update = _foreach_update if foreach else _single_tensor_update
                update(
                    *tensors,
                    dtype=dtype,
                    lr=group["lr"],
                    betas=group["betas"],
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    trust_ratio=trust_ratio,
                    gate=self.update_gate,
                )
        return loss

    def load_state_dict(self, state_dict):
        """As `Optimizer.load_state_dict`, but keeps fp32 moments for bf16/fp16 params.

        torch casts every floating-point state tensor to its param's dtype on load, which would round the moments
        of low-precision params to bf16/fp16; we restore them from `state_dict` in the working dtype instead.
        """
        super().load_state_dict(state_dict)
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, param in zip(saved_ids, params):
            saved = state_dict["state"].get(saved_id)
            if saved is None or _working_dtype(param) == param.dtype:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                self.state[param][key] = saved[key].to(device=param.device, dtype=_working_dtype(param), copy=True)


class Lamb(_UncorrectedAdam):
    """LAMB as in the official ALBERT pretraining (`LAMBOptimizer` in google-research/albert's `lamb_optimizer.py`).

    Differences from the LAMB paper's Algorithm 2 and from Apex/DeepSpeed FusedLAMB, all deliberate to match the
    official code: no bias correction; the trust ratio ||w|| / ||u|| is unclipped (no phi, no min/max coefficient)
    and falls back to 1 when either norm is 0; groups with `exclude_from_layer_adaptation=True` get ratio 1.

    Args:
        params: parameters or groups, normally `parameter_groups(model)` (which sets the official exclusions per
            group: weight_decay 0 and exclude_from_layer_adaptation True for LayerNorm and bias).
        lr: peak learning rate (official pretraining: 0.00176 at batch 4096). A group's lr may also be a 0-dim
            tensor on the params' device, which torch's schedules fill in place: a step captured in a CUDA graph then
            reads each step's value (`pretraining.training.step_graph.StepGraph`).
        betas, eps, weight_decay: official values by default (0.9, 0.999), 1e-6, 0.01.
        exclude_from_layer_adaptation: default for groups that do not set it.
        foreach: use the batched `torch._foreach_*` kernels (None: only for params not on CPU, as torch.optim does).

    Moments live in fp32 for bf16/fp16 params (each step computes in fp32 and rounds the param once), but
    low-precision params still lose small updates to rounding: keep fp32 master params (e.g. accelerate's
    mixed precision, which autocasts the forward and leaves params fp32) for real training.
    """

    use_trust_ratio = True

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-6,
        weight_decay=0.01,
        exclude_from_layer_adaptation=False,
        foreach=None,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, exclude_from_layer_adaptation, foreach)


class AdamWeightDecay(_UncorrectedAdam):
    """The official fine-tuning optimizer (`AdamWeightDecayOptimizer` in the official `optimization.py`, as in BERT).

    Adam **without bias correction**, with decoupled weight decay added to the update:
    u = m / (sqrt(v) + eps) + wd*w;  w = w - lr*u.
    This is not `torch.optim.AdamW`, which bias-corrects m and v: without the correction the first update moves
    each coordinate by (1-b1)/sqrt(1-b2) = 3.16 x lr instead of about 1 x lr, and the gap closes only over the first
    few thousand steps. (AdamW's decay, w *= 1 - lr*wd before the Adam step, is the same as ours; its defaults
    eps=1e-8 and weight_decay=0.01 differ only in eps.) Use `parameter_groups(model)` for the official exclusions;
    the `exclude_from_layer_adaptation` group key is accepted and ignored. `foreach` and the handling of bf16/fp16
    params are as in `Lamb`.

    Args:
        params: parameters or groups, normally `parameter_groups(model)` (weight_decay 0 for LayerNorm and bias).
        lr (`float`, defaults to 1e-3): the learning rate; a schedule (`get_official_schedule`) scales it.
        betas (`tuple[float, float]`, defaults to `(0.9, 0.999)`): the moments' decay rates b1, b2.
        eps (`float`, defaults to 1e-6): added to sqrt(v), as the official code does.
        weight_decay (`float`, defaults to 0.01): wd, for groups that do not set their own.
        foreach (`bool`, *optional*): use the batched `torch._foreach_*` kernels (None: only for params not on CPU).
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, foreach=None):
        super().__init__(params, lr, betas, eps, weight_decay, foreach=foreach)


# --optimizer of run_pretraining.py: the official code's two optimizers by name
OPTIMIZERS = {"lamb": Lamb, "adamw": AdamWeightDecay}
# --lr_scheduler_type of run_pretraining.py: `get_official_schedule`, `get_wsd_schedule`
SCHEDULES = ("official", "wsd")


def _official_lr_factor(step: int, num_warmup_steps: int, num_training_steps: int, power: float) -> float:
    # Same as the TF graph: warmup while global_step < num_warmup_steps, then tf.train.polynomial_decay with
    # end_learning_rate 0 and cycle=False, i.e. the step is clamped to num_training_steps.
    if step < num_warmup_steps:
        return step / num_warmup_steps
    return (1.0 - min(step, num_training_steps) / num_training_steps) ** power


def get_official_schedule(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, power: float = 1.0, last_epoch: int = -1
) -> LambdaLR:
    """The official ALBERT/BERT learning-rate schedule (`create_optimizer` in the official `optimization.py`).

    At step t (the number of optimizer steps taken so far, starting at 0, like TF's global_step):
        lr = peak * t / num_warmup_steps                          if t < num_warmup_steps
        lr = peak * (1 - min(t, num_training_steps) / num_training_steps) ** power   otherwise
    The decay is counted from step 0, not from the end of warmup, so the lr drops from just under peak to
    (1 - warmup/total) * peak when warmup ends (0.975x peak for 3125/125k). transformers'
    `get_linear_schedule_with_warmup` decays from the peak instead and does not reproduce this. With warmup, the
    very first update uses lr 0 (it still fills the moments), exactly as in TF.

    Call `scheduler.step()` once after each `optimizer.step()`. The lambda is a `functools.partial` of a module-level
    function, so the scheduler pickles and its state_dict round-trips.

    Args:
        optimizer (`torch.optim.Optimizer`): its param groups' learning rates are the peak.
        num_warmup_steps (`int`): steps of linear warmup, at least 0 and at most `num_training_steps`.
        num_training_steps (`int`): the step at which the lr reaches 0 (and stays), positive.
        power (`float`, defaults to 1.0): the decay's exponent (1.0: linear), positive.
        last_epoch (`int`, defaults to -1): as `LambdaLR`'s; -1 starts a new schedule.

    Returns:
        A `torch.optim.lr_scheduler.LambdaLR` that multiplies each group's peak lr by the factor above.

    Raises:
        ValueError: a step count that is not an int or is out of range (warmup longer than training included), or
            `power` <= 0.
    """
    if not isinstance(num_training_steps, numbers.Integral) or num_training_steps <= 0:
        raise ValueError(f"num_training_steps must be a positive int, got {num_training_steps!r}")
    if not isinstance(num_warmup_steps, numbers.Integral) or num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps must be a non-negative int, got {num_warmup_steps!r}")
    if num_warmup_steps > num_training_steps:
        raise ValueError(
            f"num_warmup_steps ({num_warmup_steps}) must not exceed num_training_steps ({num_training_steps})"
        )
    if not power > 0:
        raise ValueError(f"power must be > 0, got {power!r}")
    lr_lambda = functools.partial(
        _official_lr_factor,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        power=float(power),
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch=last_epoch)


def _wsd_lr_factor(step: int, num_warmup_steps: int, num_decay_steps: int, num_training_steps: int) -> float:
    if step < num_warmup_steps:
        return step / num_warmup_steps
    decayed = min(step, num_training_steps) - (num_training_steps - num_decay_steps)
    return 1.0 if decayed <= 0 else 1.0 - math.sqrt(decayed / num_decay_steps)


def get_wsd_schedule(
    optimizer: Optimizer, num_warmup_steps: int, num_decay_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """A warmup-stable-decay ("trapezoidal") schedule: the official warm-up, the peak held, then a 1-sqrt decay to 0
    over the last `num_decay_steps` steps (Hägele et al., 2024, arXiv:2405.18392; ModernBERT's decay).

    At step t (optimizer steps taken so far, from 0, as in `get_official_schedule`), with s = T - D the decay's
    start, T = num_training_steps, D = num_decay_steps:
        lr = peak * t / num_warmup_steps                 if t < num_warmup_steps
        lr = peak                                        if num_warmup_steps <= t <= s
        lr = peak * (1 - sqrt((min(t, T) - s) / D))      otherwise (0 from step T on)
    Until the decay starts the learning rate does not depend on T, so a run can be extended (T raised) from any
    step up to s, and a decay can branch off any step of the stable phase (T = that step + D). The 1-sqrt shape
    keeps the rate high longer than a linear or cosine decay of the same length and ends lower than either in
    Hägele et al.'s comparison of cooldowns.

    Args:
        optimizer (`torch.optim.Optimizer`): its param groups' learning rates are the peak.
        num_warmup_steps (`int`): steps of linear warm-up, at least 0.
        num_decay_steps (`int`): the decay's length, positive; warm-up and decay fit in `num_training_steps`.
        num_training_steps (`int`): the step at which the lr reaches 0 (and stays).
        last_epoch (`int`, defaults to -1): as `LambdaLR`'s; -1 starts a new schedule.

    Returns:
        A `torch.optim.lr_scheduler.LambdaLR` that multiplies each group's peak lr by the factor above.

    Raises:
        ValueError: a step count that is not an int, or out of range.
    """
    for name, value, least in (
        ("num_warmup_steps", num_warmup_steps, 0),
        ("num_decay_steps", num_decay_steps, 1),
        ("num_training_steps", num_training_steps, 1),
    ):
        if not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"{name} must be an int of at least {least}, got {value!r}")
    if num_warmup_steps + num_decay_steps > num_training_steps:
        raise ValueError(
            f"num_warmup_steps ({num_warmup_steps}) and num_decay_steps ({num_decay_steps}) must fit in "
            f"num_training_steps ({num_training_steps})"
        )
    lr_lambda = functools.partial(
        _wsd_lr_factor,
        num_warmup_steps=num_warmup_steps,
        num_decay_steps=num_decay_steps,
        num_training_steps=num_training_steps,
    )
    return LambdaLR(optimizer, lr_lambda, last_epoch=last_epoch)
