"""Where run_pretraining.py runs: the distributed mode is decided here once, named in the run's start line, and
refused with one line when it cannot be had. There is no silent fallback.

The mode comes from `accelerate launch` (its config or flags):
- `--multi_gpu` / `MULTI_GPU`: DDP. On a machine without GPUs this becomes accelerate's CPU mode (gloo), so the same
  config runs on a laptop or a CPU server.
- `FSDP` (fsdp_version 2): parameters, gradients and optimizer state are sharded over the processes with torch's
  `fully_shard`. accelerate 1.x turns FSDP on only for GPU-like backends, but torch's FSDP2 also runs on CPUs with
  gloo, so on CPUs we switch accelerate's state to FSDP ourselves (`_enable_fsdp2_on_cpu`).
- `DEEPSPEED`: needs CUDA GPUs. On a machine without them the run stops and says so.

ALBERT's units of sharding (`shard_for_fsdp2`): each distinct `AlbertHFLayer` (with all layers shared that is one
module applied L times; the shipped configs set fsdp_reshard_after_forward false, so it is gathered once per pass
rather than once per use); the tied word table together with the MLM head, whose decoder uses that table and whose
bias is one parameter under two names; the root (embedding projection, pooler, SOP).
"""

import gc
import os
import time
import weakref

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .modeling_albert_hf import AlbertHFLayer

FSDP_CPU_CONFIG = "examples/accelerate_configs/fsdp_cpu.yaml"
_MODE_NAMES = {DistributedType.NO: "one process", DistributedType.MULTI_CPU: "DDP", DistributedType.MULTI_GPU: "DDP",
               DistributedType.FSDP: "FSDP2", DistributedType.DEEPSPEED: "DeepSpeed"}


def _asked(name: str) -> bool:
    # what `accelerate launch` passes on from its config: ACCELERATE_USE_FSDP, ACCELERATE_USE_DEEPSPEED
    return os.environ.get(name, "false").lower() == "true"


def make_accelerator(**kwargs) -> Accelerator:
    """`Accelerator(**kwargs)` in the mode the launcher asked for, or SystemExit with the reason it cannot be had."""
    has_gpu = torch.cuda.is_available()
    if _asked("ACCELERATE_USE_DEEPSPEED") and not has_gpu:
        _stop("the accelerate config asks for DeepSpeed, which needs CUDA GPUs, and this machine has none; on CPUs "
              f"use FSDP (--config_file {FSDP_CPU_CONFIG}) or DDP (--multi_gpu)")
    fsdp = FullyShardedDataParallelPlugin() if _asked("ACCELERATE_USE_FSDP") else None  # the launcher's FSDP_* env
    if fsdp is not None and fsdp.fsdp_version != 2:
        _stop("the accelerate config asks for FSDP version 1; run_pretraining.py supports FSDP2 only: set "
              "`fsdp_version: 2` in its fsdp_config")
    if fsdp is not None and fsdp.activation_checkpointing:
        _stop("fsdp_activation_checkpointing is not supported; use run_pretraining.py --gradient_checkpointing")
    if fsdp is not None and fsdp.cpu_ram_efficient_loading:
        # transformers would then load --model_name_or_path on the first process only; we shard what each built
        _stop("fsdp_cpu_ram_efficient_loading is not supported: every process builds the model; set it to false")
    # Without a GPU, accelerate runs several processes only in its CPU mode (gloo).
    accelerator = Accelerator(cpu=not has_gpu, **kwargs)
    if fsdp is not None:
        if accelerator.distributed_type == DistributedType.MULTI_CPU:
            _enable_fsdp2_on_cpu(accelerator, fsdp)
        if accelerator.distributed_type != DistributedType.FSDP:
            mode = _MODE_NAMES.get(accelerator.distributed_type, accelerator.distributed_type.value)
            _stop(f"the accelerate config asks for FSDP, but this run is {mode}: start it with "
                  "`accelerate launch --config_file ...`")
    return accelerator


def _stop(reason: str):
    # One line from the first process; the others stop quietly (the launcher reports their exit codes).
    raise SystemExit(f"error: {reason}" if os.environ.get("RANK", "0") == "0" else 1)


def _enable_fsdp2_on_cpu(accelerator: Accelerator, plugin: FullyShardedDataParallelPlugin):
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState itself records it


def shard_for_fsdp2(model: torch.nn.Module, plugin: FullyShardedDataParallelPlugin) -> torch.nn.Module:
    """Shards `model` in place with FSDP2 (the plugin's resharding, mixed precision and offload settings), before
    the optimizer is built and `accelerator.prepare` is called (which then keeps our units).

    accelerate's own wrapping puts the MLM decoder in a unit with the word table but leaves the head's `bias`,
    the same parameter as `decoder.bias`, in the root unit; torch refuses a parameter in two units."""
    options = {"mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
               "offload_policy": plugin.cpu_offload}
    layers = {id(module): module for module in model.modules() if isinstance(module, AlbertHFLayer)}
    for layer in layers.values():
        fully_shard(layer, reshard_after_forward=plugin.reshard_after_forward, **options)
    head = getattr(model, "predictions", None)
    if head is not None:
        # used at the start (embedding lookup) and the end (MLM logits) of every forward: kept gathered between
        fully_shard([model.get_input_embeddings(), head], reshard_after_forward=False, **options)
    fully_shard(model, **options)
    return model


def local_share(model: torch.nn.Module) -> float:
    """The fraction of the model's parameter values this process holds (1.0 unless sharded)."""
    total = local = 0
    for param in model.parameters():
        total += param.numel()
        local += param.to_local().numel() if hasattr(param, "to_local") else param.numel()
    return local / total


def describe(accelerator: Accelerator, model: torch.nn.Module) -> str:
    """The start line's account of where the run is, e.g. 'FSDP2 over 2 processes on 1 machine (gloo, cpu):
    this process holds 50.1% of the parameters'."""
    n = accelerator.num_processes
    mode = _MODE_NAMES.get(accelerator.distributed_type, accelerator.distributed_type.value)
    if n == 1:
        return f"{mode} ({accelerator.device.type})"
    machines = n // int(os.environ.get("LOCAL_WORLD_SIZE", n))
    text = (f"{mode} over {n} processes on {machines} machine{'s' * (machines > 1)} "
            f"({accelerator.state.backend}, {accelerator.device.type})")
    if accelerator.distributed_type == DistributedType.FSDP:
        text += f": this process holds {100 * local_share(model):.1f}% of the parameters"
    return text


def gather_full_model(accelerator: Accelerator, model: torch.nn.Module):
    """The trained model with full weights as a plain module on the main process, None on the others.

    Every process must call it: under FSDP the full weights are gathered from all of them."""
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.distributed_type != DistributedType.FSDP:
        return unwrapped if accelerator.is_main_process else None
    state_dict = accelerator.get_state_dict(model)  # collective; the full tensors land on the main process
    if not accelerator.is_main_process:
        return None
    original_class = next(c for c in type(unwrapped).__mro__ if not issubclass(c, FSDPModule))
    plain = original_class(unwrapped.config)
    plain.load_state_dict(state_dict)
    return plain.eval()


def end_distributed(accelerator: Accelerator | None = None, timeout: float = 5.0) -> int:
    """The last call of a distributed run, in every process, after a barrier and after the caller has dropped its
    own references to the model and optimizer: destroys the process group and frees it while the interpreter is
    still whole. Returns how many process groups are still alive afterwards (0 when all went).

    `destroy_process_group` only unregisters a group; its gloo backend, with the worker threads that release each
    collective's work and the tensors it holds, lives until its last reference goes. A DDP or FSDP2 model, its
    optimizer's sharded parameters, and the DeviceMesh objects that DTensor keeps in its caches all hold one. Left to
    the interpreter's exit, a worker thread still releasing the last barrier (which holds the tensors of earlier
    all-gathers) must take the GIL of a finalizing interpreter, and the process aborts with "terminate called without
    an active exception": 3 of 174 two-process FSDP runs of the tests' tiny model here, always the second process.
    Freed here, the group's destructor joins its worker threads while Python still runs.

    Right after the barrier a worker may not yet have released the last work, and through the work's tensors the
    model stays reachable for a moment; so this polls (10 ms steps, up to `timeout` seconds) until the groups are
    gone. In the tests 2 of 32 calls needed one more step; without it 3 of 12 runs kept the group alive.
    """
    if not dist.is_initialized():
        if accelerator is not None:
            accelerator.end_training()  # the trackers
        return 0
    watched = [weakref.ref(dist.group.WORLD)]
    if accelerator is not None:
        accelerator.free_memory()  # accelerate's references to what it prepared
        accelerator.end_training()  # trackers, then destroy_process_group
    else:
        dist.destroy_process_group()
    deadline = time.monotonic() + timeout
    while True:
        # Scanned again on every step: with one scan before the loop, 3 of 6 test runs kept the groups alive to the
        # timeout (which object held them then was not pinned down).
        for obj in gc.get_objects():
            # `type(...) is`: isinstance on every object would call torch's __instancecheck__ hooks (warnings)
            registry = getattr(obj, "_pg_registry", None) if type(obj) is DeviceMesh else None
            if registry:  # the groups a mesh resolved, kept alive by it
                watched += [weakref.ref(group) for group in registry.values()]
                registry.clear()
        gc.collect()
        alive = sum(ref() is not None for ref in watched)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)
