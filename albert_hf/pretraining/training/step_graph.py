"""The whole pretraining step as one CUDA graph: `--torch_compile_mode whole-step-graph`.

A small model's eager step on a GPU waits on the host: the H200's kernels of a base step at 32 x 128 take about 10
ms of its 34-51 ms, and at 128 x 128 about 30 of 38-52 (BENCHMARKS.md, "CUDA graphs"). Captured once as a CUDA
graph (forward and backward of every micro-batch, clipping, the optimizer's update), a step is a copy of its batches
into static buffers and one replay, with nothing read back to the host; the blocks are compiled first (the default
mode), so the graph replays fused kernels. What makes it possible:
- the step reads nothing from the device (`step.accumulate_and_update`): the loss weights, the clipping
  norm and LAMB's trust ratios stay there, and every batch has one shape on CUDA (the collator's static shapes and
  fixed-size masked positions);
- the learning rate is a 0-dim device tensor that the schedule fills in place, so the captured update reads each
  step's (`optimization.Lamb` takes either);
- autocast's cache of cast weights is off (accelerate's `AutocastKwargs`), as graph capture requires;
- under DDP the step averages the gradients itself, in one all-reduce that the graph holds (NCCL's collectives can
  be captured), instead of DDP's reducer, which autograd's hooks drive from the host. FSDP and DeepSpeed, whose
  collectives run from their own hooks, are refused.
Capture needs warm-up steps on a side stream (allocations, the optimizer's lazily built state, compilation); they
are undone: the weights, the optimizer's state and the RNGs are put back, so the graph starts where the run stands
(a resumed run too). A step whose batches differ from the captured one in shape (the shorter last batch of an
epoch) runs eagerly, and the log says so. What cannot be captured is refused at the start (`refusal`).
"""

import contextlib
import logging

import torch

from ...runtime.distributed import requested_sharding
from .step import accumulate_and_update

logger = logging.getLogger(__name__)

MODE = "whole-step-graph"  # the --torch_compile_mode that asks for it
WARMUP_STEPS = 3  # before capture: allocator, optimizer state and compiled kernels settle


def obstacle(
    device_type: str, sharding: str | None, mixed_precision: str, checkpointing: bool, rollback: bool = False
) -> tuple[str, str] | None:
    """What keeps this run's step from being captured as one CUDA graph, and what to do about it; None when it can
    be. One process or DDP can (the step then averages the gradients itself: `accumulate_and_update`); `sharding`
    names FSDP or DeepSpeed, whose collectives run from their own hooks."""
    if sharding:
        return (
            f"this run shards the model with {sharding}, whose collectives the graph does not hold",
            "use DDP, or --torch_compile_mode default or reduce-overhead",
        )
    if device_type != "cuda":
        return f"this run is on {device_type}, not a CUDA device", "drop it or use another mode"
    if mixed_precision == "fp16":
        return "fp16's loss scaler reads the device every step", "use --mixed_precision bf16 or no"
    if checkpointing:
        return (
            "activation checkpointing (--gradient_checkpointing or the FSDP config's) is not captured in this form",
            "drop one of them",
        )
    if rollback:
        return (
            "--on_divergence rollback loads checkpoints, replacing the optimizer state the captured step reads",
            "drop one of them",
        )
    return None


def refusal(accelerator, checkpointing: bool) -> str | None:
    """Why this run's step cannot be captured as one CUDA graph, in one line; None when it can."""
    found = obstacle(
        accelerator.device.type, requested_sharding(accelerator), accelerator.mixed_precision, checkpointing
    )
    return (
        None
        if found is None
        else (f"--torch_compile_mode {MODE} captures the training step as a CUDA graph: {found[0]}; {found[1]}")
    )


def default_mode(
    device_type: str, processes: int, sharding: str | None, mixed_precision: str, checkpointing: bool, rollback: bool
) -> tuple[str | None, str | None]:
    """The step a run gets when it asks for none (--torch_compile_mode auto, the default): on one CUDA device the
    whole-step graph of the compiled blocks, the fastest step measured there (BENCHMARKS.md, "CUDA graphs"); where
    that cannot run, and under DDP, whose graph has not yet run on GPUs (asked for, it runs), the eager step and the
    start line's reason; elsewhere the eager step, without a note (on CPUs compiling did not pay for itself:
    test_compile, BENCHMARKS.md, "What each optimisation bought"). Returns (the --torch_compile_mode to use or None
    for eager, the note)."""
    if device_type != "cuda":
        return None, None
    found = obstacle(device_type, sharding, mixed_precision, checkpointing, rollback)
    if found is None and processes > 1:
        found = (
            f"under DDP ({processes} processes) the graph is not yet the default, not having run on GPUs: "
            f"--torch_compile_mode {MODE} asks for it",
        )
    if found is None:
        return MODE, None
    return None, (
        f"eager step, not the whole-step graph a CUDA device gets by default: {found[0]} "
        "(--torch_compile_mode none asks for eager and silences this)"
    )


def shapes(micro_batches) -> tuple:
    """What a replay needs to match: the number of micro-batches and each tensor's name, shape and dtype."""
    return tuple(
        tuple((key, tuple(value.shape), value.dtype) for key, value in batch.items()) for batch in micro_batches
    )


class CudaGraph:
    """torch.cuda.CUDAGraph behind the two calls `StepGraph` makes; warm-up runs on a side stream, as capture needs."""

    runs_at_capture = False  # capture records kernels; nothing runs until a replay

    def __init__(self):
        self.graph = torch.cuda.CUDAGraph()
        self.side_stream = torch.cuda.Stream()

    @contextlib.contextmanager
    def warming_up(self):
        self.side_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side_stream):
            yield
        torch.cuda.current_stream().wait_stream(self.side_stream)

    def capture(self, body):
        """Records `body()`'s kernels without running them; returns its output tensor, which replays write."""
        with torch.cuda.graph(self.graph):
            return body()

    def replay(self):
        self.graph.replay()


class RunsEagerly:
    """`CudaGraph`'s stand-in where there is no CUDA device, for checking StepGraph's bookkeeping there (the tests,
    benchmarks/check_ddp_graph.py on a CPU): its capture and each replay run the step."""

    runs_at_capture = True

    def warming_up(self):
        return contextlib.nullcontext()

    def capture(self, body):
        self.body = body
        self.output = body()
        return self.output

    def replay(self):
        self.output.copy_(self.body())


class StepGraph:
    """A process's training step, captured at its first call and replayed after (see the module docstring)."""

    def __init__(self, model, optimizer, accelerator, max_grad_norm, normalization: str, graph_factory=CudaGraph):
        self.model, self.optimizer, self.accelerator = model, optimizer, accelerator
        self.max_grad_norm, self.normalization = max_grad_norm, normalization
        self.graph_factory = graph_factory
        self.graph, self.static, self.signature, self.counts, self.eager_steps = None, None, None, None, 0

    def __call__(self, micro_batches) -> torch.Tensor:
        """One step's device work (`accumulate_and_update`): the six counts of `step_counts`, summed."""
        if self.graph is None:
            self.capture(micro_batches)
        if shapes(micro_batches) != self.signature:
            return self.eager_step(micro_batches)
        for static, batch in zip(self.static, micro_batches):
            for key, value in batch.items():
                static[key].copy_(value, non_blocking=True)
        self.graph.replay()
        return self.counts.clone()  # the next replay writes over the captured output

    def body(self) -> torch.Tensor:
        return accumulate_and_update(
            self.model,
            self.static,
            self.optimizer,
            self.accelerator,
            self.max_grad_norm,
            self.normalization,
            own_all_reduce=True,
        )

    def eager_step(self, micro_batches) -> torch.Tensor:
        self.eager_steps += 1
        if self.eager_steps == 1:
            logger.info(
                "%s: a step whose batches differ in shape from the captured one (an epoch's last) runs "
                "eagerly; logged once",
                MODE,
            )
        self.optimizer.zero_grad(set_to_none=True)  # the graph's last gradients are not this step's
        return accumulate_and_update(
            self.model, micro_batches, self.optimizer, self.accelerator, self.max_grad_norm, self.normalization
        )

    def capture(self, micro_batches):
        device = micro_batches[0]["input_ids"].device
        for group in self.optimizer.param_groups:  # the schedule fills the tensor in place; the graph reads it
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32, device=device)
        self.static = [{key: value.clone() for key, value in batch.items()} for batch in micro_batches]
        self.signature = shapes(self.static)  # what a batch must match to be replayed
        saved = RunState.save(self.model, self.optimizer, device)
        self.graph = self.graph_factory()
        with self.graph.warming_up():
            for _ in range(WARMUP_STEPS):
                self.body()
        saved.restore(self.model, self.optimizer)
        self.counts = self.graph.capture(self.body)
        if self.graph.runs_at_capture:  # a stand-in (the tests' on a CPU) that ran the step it captured
            saved.restore(self.model, self.optimizer)


class RunState:
    """The weights, the optimizer's state and the RNGs, saved before the warm-up steps and put back in place after
    (the same tensors, which the graph reads). Optimizer state the warm-up created is zeroed: a fresh state of
    albert_hf's optimizers is zeros (moments without a step counter)."""

    def __init__(self, weights, optimizer_state, rng):
        self.weights, self.optimizer_state, self.rng = weights, optimizer_state, rng

    @classmethod
    def save(cls, model, optimizer, device: torch.device) -> "RunState":
        weights = [param.detach().clone() for param in model.parameters()]
        optimizer_state = {
            id(value): value.clone()
            for state in optimizer.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor)
        }
        rng = (torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None)
        return cls(weights, optimizer_state, rng)

    @torch.no_grad()
    def restore(self, model, optimizer):
        for param, weight in zip(model.parameters(), self.weights):
            param.copy_(weight)
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    saved = self.optimizer_state.get(id(value))
                    value.copy_(saved) if saved is not None else value.zero_()
        torch.set_rng_state(self.rng[0])
        if self.rng[1] is not None:
            torch.cuda.set_rng_state(self.rng[1])
