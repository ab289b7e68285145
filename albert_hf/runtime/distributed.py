"""Where a run goes: the distributed mode of run_pretraining.py (`make_accelerator`) and of the Trainer-based
fine-tuning scripts (`tasks.trainer.AlbertTrainer`) is decided here once, named in the run's start line, and refused
with one line when it cannot be had. There is no silent fallback.

The mode comes from `accelerate launch` (its config or flags):
- `--multi_gpu` / `MULTI_GPU`: DDP. On a machine without GPUs this becomes accelerate's CPU mode (gloo), so the same
  config runs on a laptop or a CPU server.
- `FSDP`: parameters, gradients and optimizer state are sharded over the processes with torch's `fully_shard`
  (FSDP2). accelerate 1.x turns FSDP on only for GPU-like backends, but torch's FSDP2 also runs on CPUs with gloo,
  so on CPUs we switch accelerate's state to FSDP ourselves (`_enable_fsdp2_on_cpu`). What an FSDP config written
  by `accelerate config` asks for is read in `fsdp_plugin_from_launcher`: version 1 runs as FSDP2, the auto-wrap
  policy gives way to ALBERT's own units, activation checkpointing becomes the model's gradient checkpointing, and
  CPU-RAM-efficient loading reads a checkpoint on the first process only; each such translation is named in the
  start line.
- `DEEPSPEED`: needs CUDA GPUs. On a machine without them the run stops and says so.

ALBERT's units of sharding (`shard_for_fsdp2`): each distinct `AlbertHFLayer` (with all layers shared that is one
module applied L times; the shipped configs set fsdp_reshard_after_forward false, so it is gathered once per pass
rather than once per use); under sharing="attention" / "ffn", the one attention / FFN that every block borrows;
the tied word table together with the MLM head, whose decoder uses that table and whose bias is one parameter under
two names; the root (embedding projection, pooler, SOP).
"""

import gc
import logging
import os
import time
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin, broadcast_object_list
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import distribute_tensor

from ..errors import InputError
from ..modeling_albert_hf import AlbertHFLayer

FSDP_CPU_CONFIG = "examples/accelerate_configs/fsdp_cpu.yaml"
_MODE_NAMES = {
    DistributedType.NO: "one process",
    DistributedType.MULTI_CPU: "DDP",
    DistributedType.MULTI_GPU: "DDP",
    DistributedType.FSDP: "FSDP2",
    DistributedType.DEEPSPEED: "DeepSpeed",
}

logger = logging.getLogger(__name__)


def _asked(name: str) -> bool:
    # what `accelerate launch` passes on from its config: ACCELERATE_USE_FSDP, ACCELERATE_USE_DEEPSPEED
    return os.environ.get(name, "false").lower() == "true"


# FSDP version 1's sharding strategies (accelerate's names and numbers) and what runs instead
_FSDP1_STRATEGIES = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
_FSDP1_AS_FSDP2 = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}  # -> reshard_after_forward


@dataclass
class FsdpRequest:
    """What the FSDP config asked for that albert_hf carries out itself, and the start line's notes about it."""

    activation_checkpointing: bool = False  # -> the model's own gradient checkpointing
    ram_efficient_loading: bool = False  # -> a checkpoint is read by the first process and sent to the others
    notes: list[str] = field(default_factory=list)


def fsdp_plugin_from_launcher() -> tuple[FullyShardedDataParallelPlugin, FsdpRequest]:
    """The FSDP settings `accelerate launch` exported from its config (the FSDP_* variables) as the FSDP2 plugin
    albert_hf runs, with what it carries out itself. Stops with one line on what cannot run.

    - FSDP version 1 (accelerate 1.x's default, so most configs ask for it) runs as FSDP2: FULL_SHARD as
      reshard_after_forward true, SHARD_GRAD_OP as false. Its prefetch, use_orig_params and sync_module_states
      settings have no FSDP2 counterpart (FSDP2 always uses the original parameters, and every process starts from
      the same weights). NO_SHARD (that is DDP) and the HYBRID strategies (a 2-D mesh) stop.
    - Any auto-wrap policy is replaced by ALBERT's own units (`shard_for_fsdp2`): a policy can see neither that
      the one shared layer is applied L times nor that the MLM head's bias and its decoder's are one parameter.
    - fsdp_activation_checkpointing turns on the model's gradient checkpointing (the same recomputation, placed
      where ALBERT's layers are); accelerate's own would wrap modules the policy picks.
    - fsdp_cpu_ram_efficient_loading: with --model_name_or_path the first process reads the checkpoint and the
      others receive their shards (`load_on_first_process`); from scratch there is nothing to load.
    """
    env = os.environ
    request = FsdpRequest()
    version = int(env.get("FSDP_VERSION", "1"))
    reshard = env.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower()
    if version == 1:
        # `accelerate config` writes version 1's strategy into fsdp_reshard_after_forward; older configs and flags
        # into fsdp_sharding_strategy; either may be a name or accelerate's number (1-5)
        strategy = reshard.upper() if reshard.upper() in _FSDP1_STRATEGIES or reshard.isdigit() else None
        strategy = strategy or env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").upper()
        if strategy.isdigit() and 1 <= int(strategy) <= len(_FSDP1_STRATEGIES):
            strategy = _FSDP1_STRATEGIES[int(strategy) - 1]
        if strategy == "NO_SHARD":
            _stop(
                "the accelerate config asks for FSDP version 1 with NO_SHARD, which replicates the model as DDP "
                "does: use a DDP config (distributed_type: MULTI_GPU) instead"
            )
        if strategy not in _FSDP1_AS_FSDP2:
            _stop(
                f"the accelerate config asks for FSDP version 1 with {strategy}, which shards within a machine and "
                "replicates across machines (a 2-D device mesh); albert_hf runs FSDP2 over one mesh: use "
                "FULL_SHARD or SHARD_GRAD_OP"
            )
        reshard = _FSDP1_AS_FSDP2[strategy]
        request.notes.append(
            f"the config's FSDP version 1 ({strategy}) runs as FSDP2 with reshard_after_forward {str(reshard).lower()}"
        )
    elif version == 2:
        reshard = reshard not in ("false", "0", "no")
    else:
        _stop(f"the accelerate config asks for FSDP version {version}; there are versions 1 and 2")
    # Everything but version, resharding and prefetch (version 1 only) as accelerate reads it from the environment.
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, reshard_after_forward=reshard, backward_prefetch="NO_PREFETCH"
    )
    if plugin.auto_wrap_policy is not None:
        policy = env.get("FSDP_AUTO_WRAP_POLICY", "")
        detail = {
            "TRANSFORMER_BASED_WRAP": env.get("FSDP_TRANSFORMER_CLS_TO_WRAP") or "_no_split_modules",
            "SIZE_BASED_WRAP": f"min_num_params {env.get('FSDP_MIN_NUM_PARAMS', '0')}",
        }.get(policy)
        request.notes.append(
            f"the config's auto-wrap policy {policy}{f' ({detail})' if detail else ''} is replaced "
            "by ALBERT's units: each distinct AlbertHFLayer, the word table with the MLM head, the "
            "root"
        )
        plugin.auto_wrap_policy, plugin.transformer_cls_names_to_wrap, plugin.min_num_params = None, None, None
    if plugin.activation_checkpointing:
        request.activation_checkpointing = True
        request.notes.append("fsdp_activation_checkpointing: the model's gradient checkpointing is on")
        plugin.activation_checkpointing = False
    if plugin.cpu_ram_efficient_loading:
        request.ram_efficient_loading = True
        plugin.cpu_ram_efficient_loading = False  # carried out by albert_hf (load_on_first_process), not accelerate
    return plugin, request


def requested_sharding(accelerator: Accelerator | None = None) -> str | None:
    """The sharding of the run by name ("FSDP", "DeepSpeed"): the accelerator's, or before one exists what the
    launcher asked for; None for one process or DDP."""
    if accelerator is not None:
        return {DistributedType.FSDP: "FSDP", DistributedType.DEEPSPEED: "DeepSpeed"}.get(accelerator.distributed_type)
    if _asked("ACCELERATE_USE_FSDP"):
        return "FSDP"
    return "DeepSpeed" if _asked("ACCELERATE_USE_DEEPSPEED") else None


def requested_mode() -> tuple[FullyShardedDataParallelPlugin | None, FsdpRequest | None]:
    """What the launcher asked for, checked before an Accelerator exists: the FSDP plugin albert_hf runs and
    what it carries out itself (None, None without FSDP); InputError for what cannot be had."""
    has_gpu = torch.cuda.is_available()
    if _asked("ACCELERATE_USE_DEEPSPEED") and not has_gpu:
        _stop(
            "the accelerate config asks for DeepSpeed, which needs CUDA GPUs, and this machine has none; on CPUs "
            f"use FSDP (--config_file {FSDP_CPU_CONFIG}) or DDP (--multi_gpu)"
        )
    if not _asked("ACCELERATE_USE_FSDP"):
        return None, None
    fsdp, request = fsdp_plugin_from_launcher()
    if not has_gpu and isinstance(fsdp.cpu_offload, CPUOffloadPolicy):
        # its pinned host buffers need a GPU, and without one the parameters are in CPU memory already
        fsdp.cpu_offload = OffloadPolicy()
        request.notes.append("fsdp_offload_params: nothing to offload on a machine without GPUs")
    return fsdp, request


def use_fsdp(accelerator: Accelerator, fsdp: FullyShardedDataParallelPlugin):
    """Puts a freshly built Accelerator (given `fsdp` as its fsdp_plugin) into FSDP mode on CPUs too, or stops
    with one line when the run is not several processes.

    The plugin is handed to the Accelerator: left to itself, accelerate would build one from the environment
    (version 1 included, which fails on a machine without GPUs). Without a GPU, accelerate runs several processes
    only in its CPU mode (gloo), where it ignores FSDP; it is switched on here."""
    if accelerator.distributed_type == DistributedType.MULTI_CPU:
        _enable_fsdp2_on_cpu(accelerator, fsdp)
    if accelerator.distributed_type != DistributedType.FSDP:
        mode = _MODE_NAMES.get(accelerator.distributed_type, accelerator.distributed_type.value)
        _stop(
            f"the accelerate config asks for FSDP, but this run is {mode}: start it with "
            "`accelerate launch --config_file ...`"
        )


def check_deepspeed(gradient_accumulation_steps: int, optimizer: str):
    """What run_pretraining.py cannot do under DeepSpeed (with these flags' values), refused in one line before any
    work."""
    if gradient_accumulation_steps > 1:
        raise InputError(
            "--gradient_accumulation_steps under DeepSpeed: DeepSpeed accumulates by its own count and "
            "scaling, which would undo the step-wide loss weighting of training_step; use an FSDP or "
            "DDP config, or a larger --per_device_train_batch_size"
        )
    if optimizer == "lamb":
        raise InputError(
            "--optimizer lamb under DeepSpeed: ZeRO and DeepSpeed's mixed-precision optimizers hand the "
            "optimizer one flat partition per parameter group, so LAMB's per-parameter trust ratio "
            "would become one ratio per partition, which is not LAMB; use --optimizer adamw, or an "
            "FSDP or DDP config for LAMB"
        )


def cpu_processes_without_gpus():
    """Several processes on a machine without GPUs run in accelerate's CPU mode (gloo). Set before transformers'
    TrainingArguments are built: without it Trainer gives every process its own independent training (its
    "parallel_mode != ParallelMode.DISTRIBUTED" warning), whatever the launcher's config."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        os.environ["ACCELERATE_USE_CPU"] = "true"


def make_accelerator(**kwargs) -> tuple[Accelerator, FsdpRequest | None]:
    """`Accelerator(**kwargs)` in the mode the launcher asked for, or InputError with the reason it cannot be had;
    under FSDP also what the config asked for that albert_hf carries out (None otherwise)."""
    fsdp, request = requested_mode()
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), fsdp_plugin=fsdp, **kwargs)
    if fsdp is not None:
        use_fsdp(accelerator, fsdp)
    return accelerator, request


def _stop(reason: str):
    raise InputError(reason)  # printed by the first process only (`cli.run_entry_point`)


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
    the same parameter as `predictions.decoder.bias`, in the root unit; torch refuses a parameter in two units. The
    units here are those of the module's docstring. Every process calls it, with the process group set up.

    Args:
        model (`torch.nn.Module`): an albert_hf model, not yet prepared.
        plugin (`FullyShardedDataParallelPlugin`): the run's FSDP2 plugin (`reshard_after_forward`,
            `mixed_precision_policy`, `cpu_offload`).

    Returns:
        `torch.nn.Module`: `model` itself, now an FSDP module.
    """
    options = {
        "mp_policy": plugin.mixed_precision_policy or MixedPrecisionPolicy(),
        "offload_policy": plugin.cpu_offload,
    }
    layers = {id(module): module for module in model.modules() if isinstance(module, AlbertHFLayer)}
    config = getattr(model, "config", None)
    if getattr(config, "sharing", "all") in ("attention", "ffn"):
        # Every block applies block 0's attention (or FFN), so it is a unit of its own, gathered by each block that
        # uses it; inside block 0's unit it would be resharded when block 0 ends, before the next block reads it.
        first = next(iter(layers.values()))
        shared = (
            [first.attention]
            if config.sharing == "attention"
            else [first.ffn, first.ffn_output, first.full_layer_layer_norm]
        )
        fully_shard(shared, reshard_after_forward=plugin.reshard_after_forward, **options)
    for layer in layers.values():
        fully_shard(layer, reshard_after_forward=plugin.reshard_after_forward, **options)
    head = getattr(model, "predictions", None)
    if head is not None:
        # used at the start (embedding lookup) and the end (MLM logits) of every forward: kept gathered between
        fully_shard([model.get_input_embeddings(), head], reshard_after_forward=False, **options)
    fully_shard(model, **options)
    return model


def shard_model(accelerator: Accelerator, model: torch.nn.Module, send_first_process_weights: bool = False):
    """`shard_for_fsdp2` with the run's plugin, before the optimizer is built. With `send_first_process_weights`
    (fsdp_cpu_ram_efficient_loading and a checkpoint to start from) the first process's weights are then sent
    to the others, whose model may be on the meta device (`load_on_first_process`)."""
    full_weights = (
        dict(model.named_parameters()) if send_first_process_weights and accelerator.is_main_process else None
    )
    shard_for_fsdp2(model, accelerator.state.fsdp_plugin)
    if send_first_process_weights:
        send_weights_from_first_process(accelerator, model, full_weights)
    return model


def load_on_first_process(accelerator: Accelerator, load, build_from_config) -> torch.nn.Module:
    """fsdp_cpu_ram_efficient_loading: `load()` (reading a checkpoint) runs on the first process only; the others
    get its config and `build_from_config(config)` builds their model on the meta device, without memory. Once
    the model is sharded, `shard_model(..., send_first_process_weights=True)` gives every process its shards."""
    model = load() if accelerator.is_main_process else None
    config = broadcast_object_list([model.config if model is not None else None])[0]
    if model is None:
        with torch.device("meta"):
            model = build_from_config(config)
    return model


def send_weights_from_first_process(accelerator: Accelerator, model: torch.nn.Module, full_weights: dict | None):
    """After sharding: the first process (which holds `full_weights`, its parameters from before sharding)
    scatters each parameter in turn, so another process never holds more than one full tensor, and sends its
    buffers (FSDP2 does not shard them; e.g. the position ids). The others first allocate their (meta) shards and
    buffers; tied parameters stay one parameter."""
    if full_weights is None:
        model.to_empty(device=accelerator.device)
    with torch.no_grad():
        for name, param in model.named_parameters():  # the same order on every process
            full = (
                full_weights[name].to(param.device, param.dtype)
                if full_weights is not None
                else torch.empty(param.shape, dtype=param.dtype, device=param.device)
            )
            shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=0)
            param.to_local().copy_(shard.to_local())
        for _, buffer in model.named_buffers():
            dist.broadcast(buffer, src=0)


def local_share(model: torch.nn.Module) -> float:
    """The fraction of the model's parameter values this process holds (1.0 unless sharded)."""
    total = local = 0
    for param in model.parameters():
        total += param.numel()
        local += param.to_local().numel() if hasattr(param, "to_local") else param.numel()
    return local / total


def describe(accelerator: Accelerator, model: torch.nn.Module, hardware=None) -> str:
    """The start line's account of where the run is, e.g. 'FSDP2 over 2 processes on 1 machine (gloo, cpu: AMD
    EPYC 7B13, AVX2, 1 thread): this process holds 50.1% of the parameters (reshard_after_forward false)'.

    Args:
        accelerator (`Accelerator`): the run's accelerator: the mode, the processes, the backend.
        model (`torch.nn.Module`): the model as prepared; under FSDP, the share of its parameters this process holds is
            given.
        hardware (`hardware.Hardware`, *optional*): names the device; without it, only its type (e.g. "cpu").

    Returns:
        `str`: the mode and, with several processes, their count, machines and backend (e.g. "one process (cpu)").
    """
    n = accelerator.num_processes
    mode = _MODE_NAMES.get(accelerator.distributed_type, accelerator.distributed_type.value)
    device = hardware.describe() if hardware is not None else accelerator.device.type
    if n == 1:
        return f"{mode} ({device})"
    machines = n // int(os.environ.get("LOCAL_WORLD_SIZE", n))
    text = (
        f"{mode} over {n} processes on {machines} machine{'s' * (machines > 1)} ({accelerator.state.backend}, {device})"
    )
    if accelerator.distributed_type == DistributedType.FSDP:
        reshard = str(accelerator.state.fsdp_plugin.reshard_after_forward).lower()
        text += (
            f": this process holds {100 * local_share(model):.1f}% of the parameters (reshard_after_forward {reshard})"
        )
    return text


def gather_full_model(accelerator: Accelerator, model: torch.nn.Module):
    """The trained model with full weights as a plain module on the main process, None on the others.

    Every process must call it: under FSDP the full weights are gathered from all of them.

    Args:
        accelerator (`Accelerator`): the run's accelerator.
        model (`torch.nn.Module`): the model as prepared (wrapped, or sharded under FSDP).

    Returns:
        `torch.nn.Module` or `None`: on the main process, the unwrapped model itself without FSDP, and under FSDP a new
        instance of the model's class holding the gathered weights, in eval mode; None on the other processes.
    """
    unwrapped = accelerator.unwrap_model(model)
    if accelerator.distributed_type != DistributedType.FSDP:
        return unwrapped if accelerator.is_main_process else None
    state_dict = accelerator.get_state_dict(model)  # collective; the full tensors land on the main process
    if not accelerator.is_main_process:
        return None
    original_class = next(c for c in type(unwrapped).__mro__ if not issubclass(c, FSDPModule))
    with torch.random.fork_rng(devices=[]):  # its random init must not move the run's random stream (dropout)
        plain = original_class(unwrapped.config)
    plain.load_state_dict(state_dict)
    return plain.eval()


def end_distributed(accelerator: Accelerator | None = None, timeout: float = 5.0) -> int:
    """The last call of a distributed run, in every process, after a barrier and after the caller has dropped its
    own references to the model and optimizer: destroys the process groups and frees them (polling up to `timeout`
    seconds) while the interpreter is still whole, as a gloo group freed at exit can abort the process (BENCHMARKS.md,
    "Ending a distributed run").

    Without a process group it only ends the accelerator's trackers, if given. A warning is logged when a group is
    still alive.

    Args:
        accelerator (`Accelerator`, *optional*): the run's accelerator: its memory freed and its training ended
            (trackers, then the process group); None: the default process group is destroyed directly.
        timeout (`float`, defaults to 5.0): the seconds to wait for the groups to be freed.

    Returns:
        `int`: how many groups are still alive (0 when all went, or when there was no process group).
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
        for obj in gc.get_objects():  # DTensor's cached meshes hold the groups they resolved
            # `type(...) is`: isinstance on every object would call torch's __instancecheck__ hooks (warnings)
            registry = getattr(obj, "_pg_registry", None) if type(obj) is DeviceMesh else None
            if registry:
                watched += [weakref.ref(group) for group in registry.values()]
                registry.clear()
        gc.collect()
        alive = sum(ref() is not None for ref in watched)
        if not alive or time.monotonic() > deadline:
            if alive:
                logger.warning("a process group is still alive at exit: the process may abort in teardown")
            return alive
        time.sleep(0.01)
