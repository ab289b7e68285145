"""The model and optimizer of the pretraining job: built from a preset, a config or earlier weights, checked
against the tokenizer, loaded once under FSDP's RAM-efficient loading, compiled and sharded when asked."""

import torch

from ..configuration_albert_hf import AlbertHFConfig
from ..errors import InputError
from ..hub.loading import loading
from ..modeling_albert_hf import AlbertHFForPreTraining
from ..optimization import AdamWeightDecay, Lamb, parameter_groups
from ..runtime.cli import RunArguments
from ..runtime.distributed import load_on_first_process, shard_model
from .step_graph import MODE as STEP_GRAPH

OPTIMIZERS = {"lamb": Lamb, "adamw": AdamWeightDecay}


def check_positions(args: RunArguments) -> None:
    """--max_seq_length against the positions of the model the run will build or load, before any data is read:
    the one check of that limit for a run (the model, the pair builder and the collator each keep their own for
    callers that use them directly)."""
    if args.model_name_or_path or args.config_name:
        flag, name = (("--model_name_or_path", args.model_name_or_path) if args.model_name_or_path
                      else ("--config_name", args.config_name))
        with loading(flag, name):
            positions = AlbertHFConfig.from_pretrained(name).max_position_embeddings
    else:
        positions = AlbertHFConfig.from_preset(args.model_config).max_position_embeddings
    if args.max_seq_length > positions:
        raise InputError(f"--max_seq_length {args.max_seq_length} exceeds the model's max_position_embeddings="
                         f"{positions}")


def new_model_config(args: RunArguments) -> AlbertHFConfig:
    """The config of a model built from scratch: --config_name or the --model_config preset, with --sharing (the
    caller sets the vocabulary)."""
    if args.config_name:
        with loading("--config_name", args.config_name):
            config = AlbertHFConfig.from_pretrained(args.config_name)
    else:
        config = AlbertHFConfig.from_preset(args.model_config)
    if args.sharing:
        config = AlbertHFConfig(**{**config.to_diff_dict(), "sharing": args.sharing})
    return config


def build_model(args: RunArguments, tokenizer, gradient_checkpointing: bool = False):
    if args.model_name_or_path:
        with loading("--model_name_or_path", args.model_name_or_path):
            model = AlbertHFForPreTraining.from_pretrained(args.model_name_or_path)
    else:
        config = new_model_config(args)
        config.vocab_size = len(tokenizer)
        model = AlbertHFForPreTraining(config)
    return finish_model(model, tokenizer, args.task, gradient_checkpointing)


def planned_weight_bytes(args: RunArguments) -> int | None:
    """The fp32 weights' size of the model the run will build, before the tokenizer or the corpus is read (with
    --vocab_size for a vocabulary still to be trained), counted on the meta device; None when the config cannot
    be read yet (build_model then says why)."""
    try:
        if args.model_name_or_path:
            config = AlbertHFConfig.from_pretrained(args.model_name_or_path)
        else:
            config = new_model_config(args)
            config.vocab_size = args.vocab_size
    except (OSError, ValueError):
        return None
    with torch.device("meta"):
        return 4 * sum(p.numel() for p in AlbertHFForPreTraining(config).parameters())


def finish_model(model, tokenizer, task: str, gradient_checkpointing: bool):
    """The checks and settings every built or loaded model gets: vocabulary, special tokens, checkpointing, and
    with `task` "none" the pooler and the sentence-order head frozen."""
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"The tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")
    for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
        setattr(model.config, name.replace("cls", "bos").replace("sep", "eos"), getattr(tokenizer, name))
    if gradient_checkpointing:
        model.activation_checkpointing_enable()
    if task == "none":  # no loss reaches the pooler and SOP head: frozen, so DDP expects no gradient for them
        model.albert.pooler.requires_grad_(False)
        model.sop_classifier.requires_grad_(False)
    return model


def make_optimizer(model, args: RunArguments):
    groups = parameter_groups(model, weight_decay=args.weight_decay)
    return OPTIMIZERS[args.optimizer](groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                           eps=args.adam_epsilon)


def compile_note(device: torch.device, mode: str | None) -> str:
    """What the start line says of --torch_compile; measured on an H200 (BENCHMARKS.md, "second lease")."""
    shapes = "static shapes" if device.type == "cuda" else "dynamic shapes"
    if mode == STEP_GRAPH:
        return (f"torch.compile (mode default, {shapes}) of each distinct block and the MLM head with its loss, and "
                "the whole training step (forward, backward, clipping, the update) captured as one CUDA graph at the "
                "first step and replayed")
    note = f"torch.compile (mode {mode or 'default'}, {shapes}) of each distinct block and the MLM head with its loss"
    if device.type == "cuda" and mode in (None, "default"):
        note += ("; on an H200 this ran no faster than eager where the host limits the step (BENCHMARKS.md); "
                 "--torch_compile_mode whole-step-graph removes the host's share")
    return note


def build_run_model(args: RunArguments, tokenizer, accelerator, fsdp_request, notes: list[str]) -> torch.nn.Module:
    """The model of the run: built or loaded (under FSDP's RAM-efficient loading, read by the first process only),
    compiled with --torch_compile, sharded under FSDP2; what the start line says of it is added to `notes`.
    Activations are recomputed in backward with --gradient_checkpointing or the FSDP config's
    activation checkpointing."""
    checkpointing = args.gradient_checkpointing or (fsdp_request is not None and fsdp_request.activation_checkpointing)
    first_process_loads = (fsdp_request is not None and fsdp_request.ram_efficient_loading
                           and bool(args.model_name_or_path))
    if first_process_loads:
        model = load_on_first_process(
            accelerator, lambda: build_model(args, tokenizer, checkpointing),
            lambda config: finish_model(AlbertHFForPreTraining(config), tokenizer, args.task, checkpointing))
        notes.append("fsdp_cpu_ram_efficient_loading: the first process read --model_name_or_path, the others "
                     "received their shards")
    else:
        if fsdp_request is not None and fsdp_request.ram_efficient_loading:
            notes.append("fsdp_cpu_ram_efficient_loading: nothing to load (no --model_name_or_path); every "
                         "process builds the same weights from --seed")
        model = build_model(args, tokenizer, checkpointing)
    if args.torch_compile:  # whole-step-graph: the blocks in the default mode, inside the step's graph
        mode = {"mode": args.torch_compile_mode} if args.torch_compile_mode not in (None, STEP_GRAPH) else {}
        # one batch shape on CUDA devices (the collator's static_shapes), a new row count every batch elsewhere
        model.compile_blocks(dynamic=accelerator.device.type != "cuda", **mode)
        notes.append(compile_note(accelerator.device, args.torch_compile_mode))
    if accelerator.is_fsdp2:  # before the optimizer is built: it must hold the sharded parameters
        shard_model(accelerator, model, send_first_process_weights=first_process_loads)
    return model
