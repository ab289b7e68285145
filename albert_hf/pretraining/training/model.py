"""The model and optimizer of the pretraining job: built from a preset, a config or earlier weights, checked
against the tokenizer, loaded once under FSDP's RAM-efficient loading, compiled and sharded when asked."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import PretrainedConfig

from ...configuration_albert_hf import AlbertHFConfig
from ...errors import InputError
from ...hub.loading import loading
from ...modeling_albert_hf import AlbertHFForPreTraining
from ...optimization import OPTIMIZERS, parameter_groups
from ...runtime.distributed import load_on_first_process, shard_model
from .step_graph import MODE as STEP_GRAPH

if TYPE_CHECKING:  # annotations only: arguments.py imports this module
    from ..arguments import ModelArgs, OptimizationArgs
    from ..data.vocabulary import VocabularyExtension


def resolve_config(model: "ModelArgs") -> AlbertHFConfig:
    """The model's config, worked out once for the run (`resolution.parse_args`): --model_name_or_path's, or for a
    model built from scratch --config_name or the --model_config preset with --sharing. A model built from scratch
    takes its vocabulary from the tokenizer (`build_model`)."""
    if model.model_name_or_path:
        with loading("--model_name_or_path", model.model_name_or_path):
            return AlbertHFConfig.from_pretrained(model.model_name_or_path)
    if model.config_name:
        with loading("--config_name", model.config_name):
            config = AlbertHFConfig.from_pretrained(model.config_name)
    else:
        config = AlbertHFConfig.from_preset(model.model_config)
    if model.sharing:
        config = AlbertHFConfig(**{**config.to_diff_dict(), "sharing": model.sharing})
    return config


def check_positions(config: AlbertHFConfig, max_seq_length: int) -> None:
    """--max_seq_length against the positions of the model the run will build or load, before any data is read:
    the one check of that limit for a run (the model, the pair builder and the collator each keep their own for
    callers that use them directly)."""
    if max_seq_length > config.max_position_embeddings:
        raise InputError(
            f"--max_seq_length {max_seq_length} exceeds the model's max_position_embeddings="
            f"{config.max_position_embeddings}"
        )


def build_model(
    config: AlbertHFConfig,
    model_name_or_path: str | None,
    tokenizer,
    task: str,
    gradient_checkpointing: bool = False,
    vocabulary: "VocabularyExtension | None" = None,
):
    """The weights of --model_name_or_path (with `vocabulary`'s new rows: `extend_embeddings`), or a new model of
    `config` with the tokenizer's vocabulary. A loaded model carries what it took from the folder (`loaded_from`:
    `Continued`)."""
    continued = None
    if model_name_or_path:
        with loading("--model_name_or_path", model_name_or_path):
            # mismatched shapes are refused below, naming the part (transformers' own error names none)
            model, info = AlbertHFForPreTraining.from_pretrained(
                model_name_or_path, output_loading_info=True, ignore_mismatched_sizes=True
            )
            saved, _ = PretrainedConfig.get_config_dict(model_name_or_path)  # as written: transformers' or ours
        continued = Continued.of(
            model_name_or_path, saved, model.config, info.get("missing_keys", ()), info.get("mismatched_keys", ())
        )
        if vocabulary is not None:
            extend_embeddings(model, vocabulary, model_name_or_path)
    else:
        model = AlbertHFForPreTraining(AlbertHFConfig(**{**config.to_diff_dict(), "vocab_size": len(tokenizer)}))
    model = finish_model(model, tokenizer, task, gradient_checkpointing)
    model.loaded_from = continued
    return model


@torch.no_grad()
def extend_embeddings(model, vocabulary: "VocabularyExtension", source: str) -> None:
    """The word embeddings grown by `vocabulary`'s pieces, in place: the loaded rows as they were, each new row the
    mean of the rows of the pieces the loaded vocabulary split it into, the MLM decoder still tied to them, and each
    new output bias the mean of those pieces' biases. Text without new pieces then gives the loaded model's outputs
    (and its logits over the loaded pieces) bit for bit."""
    embeddings, decoder = model.get_input_embeddings(), model.get_output_embeddings()
    if decoder.weight is not embeddings.weight:
        raise InputError(
            f"--extend_vocabulary: {source} has an MLM decoder not tied to its word embeddings, whose "
            "new rows would have no meaning; continue it without --extend_vocabulary"
        )
    if embeddings.num_embeddings != vocabulary.base_size:
        raise InputError(
            f"--extend_vocabulary: {source} has {embeddings.num_embeddings:,} embedding rows and its "
            f"tokenizer {vocabulary.base_size:,} pieces; new pieces need the rows to follow the pieces"
        )
    rows, biases = embeddings.weight, model.predictions.bias
    new_rows = torch.stack([rows[list(split)].float().mean(0) for split in vocabulary.splits]).to(rows.dtype)
    new_biases = torch.stack([biases[list(split)].float().mean() for split in vocabulary.splits]).to(biases.dtype)
    grown = torch.nn.Embedding(
        vocabulary.base_size + len(vocabulary.pieces),
        rows.shape[1],
        padding_idx=embeddings.padding_idx,
        device=rows.device,
        dtype=rows.dtype,
    )
    grown.weight.copy_(torch.cat([rows, new_rows]))
    head = torch.nn.Linear(rows.shape[1], grown.num_embeddings, device=rows.device, dtype=rows.dtype)
    head.weight = grown.weight
    head.bias = torch.nn.Parameter(torch.cat([biases, new_biases]))
    model.set_input_embeddings(grown)
    model.set_output_embeddings(head)
    model.config.vocab_size = grown.num_embeddings


# The parts of a pretraining model, by the first names of their weights
PARTS = (
    ("encoder", ("albert.embeddings.", "albert.encoder.")),
    ("pooler", ("albert.pooler.",)),
    ("MLM head", ("predictions.",)),
    ("pair head", ("sop_classifier.",)),
)
MASKED_LM_ONLY = ("AlbertForMaskedLM", "AlbertHFForMaskedLM")  # the Hub's transformers ALBERT folders


@dataclass(frozen=True)
class Continued:
    """What a continued run took from --model_name_or_path: the parts loaded and those initialised fresh (with the
    reason), and the task its 2-way head was trained for, where the folder says (`pretraining_task`)."""

    source: str
    saved_as: str
    loaded: tuple[str, ...]
    fresh: tuple[str, ...]
    reason: str
    head_task: str | None

    @classmethod
    def of(cls, source: str, saved: dict, config, missing_keys, mismatched=()) -> "Continued":
        """From the folder's config as written (`saved`), the loaded one, the weights the folder lacked, and those
        of another shape than its config gives ((name, in the folder, here): refused, naming the part)."""
        saved_as = (saved.get("architectures") or ["a model of unknown class"])[0]
        if mismatched:
            key, found, expected = min(mismatched)
            if key.startswith(dict(PARTS)["pair head"]):
                raise InputError(
                    f"--model_name_or_path {source}: its pair head has another shape ({key}: "
                    f"{tuple(found)} in the folder) than the SOP or NSP head pretraining trains "
                    f"({tuple(expected)}); continue from an ALBERT pretraining or masked-LM folder"
                )
            raise InputError(
                f"--model_name_or_path {source}: {key} is {tuple(found)} in the folder and "
                f"{tuple(expected)} by its config.json: its weights and config disagree"
            )
        fresh = tuple(name for name, prefixes in PARTS if any(key.startswith(prefixes) for key in missing_keys))
        if "encoder" in fresh:
            raise InputError(
                f"--model_name_or_path {source}: it holds no ALBERT encoder weights (saved as "
                f"{saved_as}); continue from a folder of an ALBERT model"
            )
        reason = ""
        if fresh and saved_as in MASKED_LM_ONLY:
            reason = (
                "not in this folder: transformers' AlbertForMaskedLM folders carry none; the original TF "
                "checkpoints do (python -m albert_hf.convert --from_tf)"
            )
        elif fresh:
            reason = f"not in this folder (saved as {saved_as})"
        head_task = getattr(config, "pretraining_task", None)
        if head_task is None and "pair head" not in fresh:
            head_task = "sop"  # transformers' ALBERT and the official checkpoints train the 2-way head for SOP
        return cls(source, saved_as, tuple(n for n, _ in PARTS if n not in fresh), fresh, reason, head_task)

    def note(self, task: str, num_warmup_steps: int) -> str:
        """The start line's account: what was loaded, what starts fresh and why, the 2-way head's task against
        --task, and the optimizer and schedule starting over."""
        pair = {"sop": "SOP head", "nsp": "NSP head"}.get(task, "pair head")
        name = lambda part: pair if part == "pair head" else part  # noqa: E731
        line = f"continued from {self.source} (saved as {self.saved_as}): {', '.join(map(name, self.loaded))} loaded"
        if self.fresh:
            line += f"; {' and '.join(map(name, self.fresh))} initialised fresh: {self.reason}"
        if task == "none":
            line += "; the pair head is not trained (--task none)"
        elif self.head_task and self.head_task != task and "pair head" not in self.fresh:
            line += (
                f"; its 2-way head was trained for {self.head_task.upper()} and is trained for {task.upper()} "
                "from here (--task)"
            )
        return (
            line + f"; the optimizer starts fresh and the learning rate warms up again over {num_warmup_steps} "
            "steps (--num_warmup_steps)"
        )


def planned_weight_bytes(config: AlbertHFConfig, vocab_size: int | None) -> int:
    """The fp32 weights' size of the model the run will build, before the tokenizer or the corpus is read (with
    `vocab_size`, --vocab_size, for a vocabulary still to be trained; None keeps the config's), counted on the meta
    device."""
    if vocab_size is not None:
        config = AlbertHFConfig(**{**config.to_diff_dict(), "vocab_size": vocab_size})
    return 4 * count_parameters(config)


def count_parameters(config: AlbertHFConfig) -> int:
    """The parameters of the model `config` builds, counted on the meta device (nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in AlbertHFForPreTraining(config).parameters())


def finish_model(model, tokenizer, task: str, gradient_checkpointing: bool):
    """The checks and settings every built or loaded model gets: vocabulary, special tokens, checkpointing, and
    with `task` "none" the pooler and the sentence-order head frozen."""
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"The tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")
    model.config.pretraining_task = task  # what the 2-way head learns here: a run that continues it says so
    for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
        setattr(model.config, name.replace("cls", "bos").replace("sep", "eos"), getattr(tokenizer, name))
    if gradient_checkpointing:
        model.activation_checkpointing_enable()
    if task == "none":  # no loss reaches the pooler and SOP head: frozen, so DDP expects no gradient for them
        model.albert.pooler.requires_grad_(False)
        model.sop_classifier.requires_grad_(False)
    return model


def make_optimizer(model, optimization: "OptimizationArgs"):
    groups = parameter_groups(model, weight_decay=optimization.weight_decay)
    return OPTIMIZERS[optimization.optimizer](
        groups,
        lr=optimization.learning_rate,
        eps=optimization.adam_epsilon,
        betas=(optimization.adam_beta1, optimization.adam_beta2),
    )


def compile_note(device: torch.device, mode: str | None) -> str:
    """What the start line says of --torch_compile; measured on an H200 (BENCHMARKS.md, "CUDA graphs")."""
    shapes = "static shapes" if device.type == "cuda" else "dynamic shapes"
    if mode == STEP_GRAPH:
        return (
            f"torch.compile (mode default, {shapes}) of each distinct block and the MLM head with its loss, and "
            "the whole training step (forward, backward, clipping, the update) captured as one CUDA graph at the "
            "first step and replayed"
        )
    note = f"torch.compile (mode {mode or 'default'}, {shapes}) of each distinct block and the MLM head with its loss"
    if device.type == "cuda" and mode in (None, "default"):
        note += (
            '; on an H200 this ran no faster than eager where the host limits the step (BENCHMARKS.md, "CUDA '
            "graphs\"); --torch_compile_mode whole-step-graph removes the host's share"
        )
    return note


def build_run_model(
    model_args: "ModelArgs",
    config: AlbertHFConfig,
    task: str,
    tokenizer,
    accelerator,
    fsdp_request,
    warmup_steps: int = 0,
    vocabulary: "VocabularyExtension | None" = None,
    compile: bool = False,
    compile_mode: str | None = None,
) -> tuple[torch.nn.Module, list[str]]:
    """The model of the run and what the start line says of it: built or loaded (under FSDP's RAM-efficient loading,
    read by the first process only), its blocks compiled with `compile` (in `compile_mode`: the step the machine
    takes, `machine.MachinePlan`), sharded under FSDP2. Activations are recomputed
    in backward with --gradient_checkpointing or the FSDP config's activation checkpointing. A continued run's
    notes open with what it took from --model_name_or_path (`Continued.note`, `warmup_steps` its re-warming) and the
    pieces --extend_vocabulary added (`vocabulary`)."""
    checkpointing = model_args.gradient_checkpointing or (
        fsdp_request is not None and fsdp_request.activation_checkpointing
    )
    source = model_args.model_name_or_path
    first_process_loads = fsdp_request is not None and fsdp_request.ram_efficient_loading and bool(source)
    notes = []
    if first_process_loads:
        model = load_on_first_process(
            accelerator,
            lambda: build_model(config, source, tokenizer, task, checkpointing, vocabulary),
            lambda loaded: finish_model(AlbertHFForPreTraining(loaded), tokenizer, task, checkpointing),
        )
        notes.append(
            "fsdp_cpu_ram_efficient_loading: the first process read --model_name_or_path, the others "
            "received their shards"
        )
    else:
        if fsdp_request is not None and fsdp_request.ram_efficient_loading:
            notes.append(
                "fsdp_cpu_ram_efficient_loading: nothing to load (no --model_name_or_path); every "
                "process builds the same weights from --seed"
            )
        model = build_model(config, source, tokenizer, task, checkpointing, vocabulary)
    if getattr(model, "loaded_from", None) is not None:  # the first process's, under RAM-efficient loading
        notes.insert(0, model.loaded_from.note(task, warmup_steps))
    if vocabulary is not None:
        notes.insert(1, vocabulary.note())
    if compile:  # whole-step-graph: the blocks in the default mode, inside the step's graph
        mode = compile_mode
        # one batch shape on CUDA devices (the collator's static_shapes), a new row count every batch elsewhere
        model.compile_blocks(
            dynamic=accelerator.device.type != "cuda", **({"mode": mode} if mode not in (None, STEP_GRAPH) else {})
        )
        notes.append(compile_note(accelerator.device, mode))
    if accelerator.is_fsdp2:  # before the optimizer is built: it must hold the sharded parameters
        shard_model(accelerator, model, send_first_process_weights=first_process_loads)
    return model, notes
