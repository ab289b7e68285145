"""The pretraining job behind `run_pretraining.py`: accelerate, LAMB, exact resume, evaluation, Hub push.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 ...
    python run_pretraining.py            # a tiny ALBERT on the embedded corpus, a few minutes on a laptop CPU
    python run_pretraining.py recipes/demo.yaml  # the arguments from a file (.json or .yaml; recipes/ has some)

`main` = `parse_args` -> `prepare` (`setup`: accelerator and output folder; the inputs: pretraining/inputs.py;
the model and optimizer: pretraining/model.py) -> `fit` (the loop over a `TrainingState`, its step and evaluation in
step.py; its log: log.py) -> `finish` (the final folder: final_folder.py; the summary, the push). Only this module sees
the whole job (`Pretraining`): the loop's parts and the final folder are at its end; the modules below take explicit
arguments. Loop: MLM + SOP loss (their plain sum), LAMB with the official poly-decay schedule, global clipping at 1.0,
gradient accumulation, bf16/fp16 through accelerate. Every `--checkpointing_steps` the full state (model, optimizer,
scheduler, RNGs, data position) goes atomically into `OUTPUT_DIR/step_N` (pretraining/checkpoints.py);
`--resume_from_checkpoint latest` continues exactly where the last complete checkpoint left off.
"""

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedType,
    ProjectConfiguration,
    send_to_device,
    set_seed,
)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModel, HfArgumentParser

from ..analysis.baselines import heldout_baselines, with_baselines
from ..analysis.curves import CURVES_FILE, pretraining_curves
from ..analysis.fill_mask import format_fill_mask
from ..configuration_albert_hf import PRESETS, SHARING_MODES
from ..errors import InputError
from ..hub.upload import push_folder
from ..optimization import get_official_schedule
from ..runtime import output_lock
from ..runtime.cli import RunArguments, explicit_arguments, is_first_process, parse_into_dataclasses, run_entry_point
from ..runtime.distributed import check_deepspeed, describe, end_distributed, gather_full_model, make_accelerator
from ..runtime.hardware import (
    MIXED_PRECISION_CHOICES,
    Hardware,
    Precision,
    attention_kernel,
    choose_precision,
    detect,
    enable_cpu_fp16,
    use_tf32,
)
from ..runtime.preemption import PREEMPTED, StopOnSignal
from ..runtime.storage import StorageError, agreed, check_free_space, check_writable, fault_line, refused
from . import prepared_data
from . import step_graph as pretraining_graph
from .checkpoints import FILL_MASK_FILE, StepCheckpoints, check_output_dir, clear_earlier_run, truncate_metrics_log
from .collator import DataCollatorForAlbertPretraining
from .corpus import LAYOUTS
from .divergence import check_losses, check_weights, newest_finite
from .final_folder import held_out_fill_mask, save_final_model, where_trained
from .inputs import build_inputs, check_train_files, preprocess
from .log import MetricsLog, format_metrics, format_value, start_logging, start_tracking
from .model import OPTIMIZERS, build_run_model, check_positions, make_optimizer, planned_weight_bytes
from .pairs import TASKS as PAIR_TASKS
from .step import COUNTS, LOSS_NORMALIZATIONS, FitResult, TrainingState, accumulation_groups, evaluate, training_step

logger = logging.getLogger("albert_hf.pretraining.job")


# ----------------------------------------------------------------------------------------------------------------
# Command line: five groups of arguments (HfArgumentParser: `run_pretraining.py args.yaml` works), one namespace.


# torch.compile modes (--torch_compile_mode), and ours: the blocks compiled, the whole step one CUDA graph
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune", pretraining_graph.MODE)

@dataclass
class ModelArguments:
    _argument_group_name = "model"  # a heading of --help

    model_config: str = field(default="tiny", metadata={
        "help": "preset with the official v2 dimensions (tiny is a demo size)", "choices": sorted(PRESETS)})
    config_name: str | None = field(default=None, metadata={
        "help": "a config.json path or directory (overrides --model_config)"})
    model_name_or_path: str | None = field(default=None, metadata={
        "help": "continue pretraining from these weights (albert_hf or transformers ALBERT)"})
    sharing: str | None = field(default=None, metadata={
        "help": "override the config's cross-layer sharing (the paper's Table 4 ablation)",
        "choices": list(SHARING_MODES)})
    tokenizer_name: str | None = field(default=None, metadata={
        "help": "tokenizer directory or Hub name; default: train a SentencePiece unigram model on the training "
        "corpus (cached)"})
    vocab_size: int = field(default=4000, metadata={
        "help": "vocabulary size when training the tokenizer (the official models use 30000)"})
    tokenizer_sample_sentences: int = field(default=10_000_000, metadata={
        "help": "when training the tokenizer: at most this many sentences, sampled uniformly from the whole corpus "
        "(SentencePiece's input_sentence_size; the official recipe: 10,000,000). The sample is held in memory"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "recompute activations in backward"})
    torch_compile: bool = field(default=False, metadata={
        "help": "torch.compile each distinct transformer block and the MLM head with its loss (`compile_blocks`): "
        "one graph for all shared layer applications, compiled in seconds; padding removal and the last-block "
        "selection stay on. Dynamic shapes on CPUs, static on GPUs (one batch shape there)"})
    torch_compile_mode: str | None = field(default=None, metadata={
        "help": "torch.compile's mode; as in transformers, giving it turns --torch_compile on. reduce-overhead "
        f"replays CUDA graphs of the compiled blocks on a GPU; {pretraining_graph.MODE} compiles them in the default "
        "mode and captures the whole training step (forward, backward, clipping, the update) as one CUDA graph: one "
        "process on a CUDA device, bf16 or fp32, no activation checkpointing", "choices": list(COMPILE_MODES)})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "allow code from --tokenizer_name's repository (a tokenizer class of its own)"})


@dataclass
class DataArguments:
    _argument_group_name = "data"  # a heading of --help

    train_files: list[str] | None = field(default=None, metadata={
        "help": "text files or folders (.txt), or json/jsonl/parquet/csv files with a text column; default: the "
        "embedded corpus (standard-library docstrings)"})
    dataset_name: str | None = field(default=None, metadata={"help": "a datasets Hub name, e.g. wikitext"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "e.g. wikitext-103-raw-v1"})
    text_column: str = field(default="text", metadata={
        "help": "the column holding the text in --dataset_name or json/parquet/csv --train_files"})
    layout: str = field(default="document_per_file", metadata={
        "help": "how plain-text files hold documents (sentence_per_line = the official format: one sentence per "
        "line, a blank line between documents)", "choices": list(LAYOUTS)})
    streaming: bool = field(default=False, metadata={
        "help": "read the corpus as training goes (each process its own files, endlessly) instead of preparing all "
        "pairs first"})
    validation_split_percentage: float = field(default=5.0, metadata={
        "help": "percentage of documents held out for evaluation (0: none)"})
    max_seq_length: int = field(default=128, metadata={"help": "tokens per pair (official: 512)"})
    short_seq_prob: float = field(default=0.1, metadata={
        "help": "probability of a shorter target length for a pair, as the official pair builder (0.1)"})
    dupe_factor: int = field(default=5, metadata={
        "help": "how many times the corpus is cut into pairs, each time differently (official: 40)"})
    preprocessing_num_workers: int | None = field(default=None, metadata={
        "help": "processes for tokenizing and building pairs (datasets' num_proc)"})
    dataloader_num_workers: int | None = field(default=None, metadata={
        "help": "DataLoader worker processes that mask and batch the pairs while the model runs (not with "
        "--streaming); default: 2 with a CUDA device, 0 on CPUs (measured in BENCHMARKS.md)"})
    preprocess_only: bool = field(default=False, metadata={
        "help": "write the tokenizer and the pairs into --output_dir and stop, for runs with --prepared_data (the "
        "official create_pretraining_data.py step)"})
    prepared_data: str | None = field(default=None, metadata={
        "help": "train on a folder written by --preprocess_only: no corpus reading or tokenizing; the arguments "
        "that shaped its pairs come from its manifest"})


@dataclass
class ObjectiveArguments:
    _argument_group_name = "objective"  # a heading of --help

    task: str = field(default="sop", metadata={
        "help": "inter-sentence objective beside MLM: sentence order (ALBERT), next sentence (BERT) or none",
        "choices": [*PAIR_TASKS, "none"]})
    mlm_probability: float = field(default=0.15, metadata={"help": "share of tokens masked (official: 0.15)"})
    max_ngram: int = field(default=3, metadata={"help": "longest masked n-gram (official: 3; 1 = BERT's masking)"})
    max_predictions_per_seq: int = field(default=20, metadata={
        "help": "most masked tokens per pair (official: 20 at length 512)"})


@dataclass
class OptimizationArguments:
    _argument_group_name = "optimization"  # a heading of --help

    per_device_train_batch_size: int = field(default=32, metadata={"help": "pairs per process per micro-batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    loss_normalization: str = field(default="global", metadata={
        "help": "global: a step's MLM loss is the mean over every masked token of the global batch (all "
        "micro-batches, all processes); per_device: each process's mean over its own masked tokens, averaged over "
        "the processes (the official code on TPU cores, for parity runs)", "choices": list(LOSS_NORMALIZATIONS)})
    optimizer: str = field(default="lamb", metadata={
        "help": "lamb: official TF LAMB; adamw: official AdamWeightDecay (no bias correction)",
        "choices": list(OPTIMIZERS)})
    learning_rate: float = field(default=1e-2, metadata={
        "help": "peak LR; the default suits the tiny demo model (the paper: 0.00176 for batch 4096)"})
    weight_decay: float = field(default=0.01, metadata={
        "help": "decoupled weight decay (not on LayerNorm and bias parameters)"})
    adam_beta1: float = field(default=0.9, metadata={"help": "first-moment decay (official: 0.9)"})
    adam_beta2: float = field(default=0.999, metadata={
        "help": "second-moment decay (official: 0.999). Neither optimizer corrects the moments' bias, so for the "
        "first ~1/(1-beta2) steps the LayerNorm and bias parameters (no trust ratio) move several times lr per "
        "step; with a warm-up much shorter than that, deeper models can stall for hundreds of steps. Short runs: "
        "0.98, or a longer --num_warmup_steps"})
    adam_epsilon: float = field(default=1e-6, metadata={"help": "official: 1e-6"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "global gradient clipping (0: none)"})
    max_train_steps: int = field(default=1500, metadata={"help": "optimizer steps"})
    num_warmup_steps: int | None = field(default=None, metadata={
        "help": "default: 2.5%% of --max_train_steps, the official ratio (3125 of 125k)"})
    mixed_precision: str = field(default="auto", metadata={
        "help": "auto: bf16 autocast where the hardware has bf16 units (CPUs with AMX or AVX-512 BF16, CUDA GPUs "
        "from Ampere on), fp16 with loss scaling on older GPUs, fp32 elsewhere; the start line says which and why. "
        "An accelerate config's bf16 or fp16 is taken as asked; no: fp32", "choices": list(MIXED_PRECISION_CHOICES)})
    tf32: bool | None = field(default=None, metadata={
        "help": "fp32 matmuls on TF32 tensor cores (CUDA GPUs from Ampere on); default: on where they exist"})
    seed: int = field(default=12345, metadata={"help": "seeds the split, the pairs, the masks and the weights"})


@dataclass
class OutputArguments:
    _argument_group_name = "evaluation, checkpoints and output"  # a heading of --help

    output_dir: str = field(default="outputs/albert-pretraining", metadata={
        "help": "where the model, tokenizer, card, metrics.jsonl and step_N checkpoints go"})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "start over in an --output_dir that holds an earlier run: its checkpoints, logs, results and model "
        "are deleted first (without this flag, such a folder is refused)"})
    take_over_lock: bool = field(default=False, metadata={
        "help": "take --output_dir's lock even if a run on another host holds it (which cannot be checked from "
        "here); a lock of this host's ended run is taken over without it"})
    eval_steps: int = field(default=500, metadata={"help": "evaluate every N optimizer steps (0: only at the end)"})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "pairs per process per evaluation batch"})
    max_eval_samples: int | None = field(default=2000, metadata={"help": "held-out pairs evaluated (0: all)"})
    logging_steps: int = field(default=20, metadata={"help": "log training means every N optimizer steps"})
    no_plots: bool = field(default=False, metadata={
        "help": "do not draw training_curves.png (the curves of metrics.jsonl, with the held-out baselines)"})
    checkpointing_steps: int | None = field(default=None, metadata={
        "help": "save the full training state into step_N every N steps"})
    checkpoints_total_limit: int | None = field(default=None, metadata={"help": "keep only the newest N step_N"})
    resume_from_checkpoint: str | None = field(default=None, metadata={
        "help": "'latest' (the newest complete step_N in --output_dir, or a fresh start when there is none) or a "
        "step_N folder"})
    with_tracking: bool = field(default=False, metadata={"help": "log to the trackers of --report_to"})
    report_to: str = field(default="tensorboard", metadata={
        "help": "accelerate tracker(s): tensorboard, wandb, all, ..."})
    push_to_hub: bool = field(default=False, metadata={"help": "upload the final folder to the Hub"})
    hub_model_id: str | None = field(default=None, metadata={"help": "repo id (default: the output_dir name)"})
    hub_token: str | None = field(default=None, metadata={"help": "default: the saved Hub login"})
    license: str | None = field(default=None, metadata={
        "help": "the license named in the model card, a Hub license id (e.g. apache-2.0)"})


ARGUMENT_GROUPS = (ModelArguments, DataArguments, ObjectiveArguments, OptimizationArguments, OutputArguments)


def build_parser() -> HfArgumentParser:
    return HfArgumentParser(ARGUMENT_GROUPS, description=(
        "Pretrain ALBERT (MLM + sentence-order prediction) with accelerate. With no arguments: a tiny ALBERT on the "
        "embedded corpus (standard-library docstrings) for a few minutes. A single .json or .yaml file of "
        "arguments may replace the flags."))


def parse_args(argv=None) -> RunArguments:
    """All groups as one read-only namespace, resolved and checked: a bad value stops with one line naming the
    flag. Resolved here and nowhere later: with --prepared_data, the arguments that shaped its pairs come from
    its manifest (`adopted` lists those that changed); a --torch_compile_mode turns --torch_compile on; the
    warm-up defaults to 2.5% of the steps."""
    groups = parse_into_dataclasses(build_parser(), argv)
    values = {k: v for group in groups for k, v in vars(group).items()}
    adopted = []
    if values["prepared_data"]:
        if values["preprocess_only"]:
            raise InputError("pass --preprocess_only (to prepare a folder) or --prepared_data (to train on "
                             "one), not both")
        manifest = prepared_data.read_manifest(values["prepared_data"])
        recorded = prepared_data.adopt_manifest(RunArguments(**values), manifest,
                                                explicit_arguments(argv, ARGUMENT_GROUPS))
        adopted = [f"--{name} {value}" for name, value in recorded.items() if values[name] != value]
        values.update(recorded)
    check_args(RunArguments(**values))
    if values["torch_compile_mode"]:  # as transformers' TrainingArguments: a mode asks for compiling
        values["torch_compile"] = True
    if values["num_warmup_steps"] is None:
        values["num_warmup_steps"] = round(0.025 * values["max_train_steps"])
    return RunArguments(**values, adopted=adopted)


def check_args(args: RunArguments):
    """Stops with one line on a bad value, path or output folder, before any work."""
    check_writable(Path(args.output_dir), "--output_dir")
    if args.train_files and args.dataset_name:
        raise InputError("pass --train_files or --dataset_name, not both")
    for name in ("max_train_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_seq_length"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be at least 1")
    check_train_files(args.train_files)
    if args.num_warmup_steps is not None and args.num_warmup_steps > args.max_train_steps:
        raise InputError("--num_warmup_steps exceeds --max_train_steps")
    if not 0 <= args.validation_split_percentage < 100:
        raise InputError("--validation_split_percentage must be in [0, 100)")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            raise InputError(f"--{name} must be in [0, 1)")
    if args.resume_from_checkpoint and args.overwrite_output_dir:
        raise InputError("pass --resume_from_checkpoint or --overwrite_output_dir, not both")
    if args.preprocess_only and args.streaming:
        raise InputError("--preprocess_only writes every pair to disk, and --streaming builds them as training "
                         "goes: drop one of them")
    if args.dataloader_num_workers is not None and args.dataloader_num_workers < 0:
        raise InputError("--dataloader_num_workers must be 0 or more")
    if args.streaming and args.dataloader_num_workers:
        raise InputError("--dataloader_num_workers with --streaming: the stream is read in the training process, "
                         "whose position each checkpoint records; drop --dataloader_num_workers")
    if args.preprocess_only and args.resume_from_checkpoint:
        raise InputError("--preprocess_only trains nothing: drop --resume_from_checkpoint")
    check_positions(args)
    check_output_dir(args.output_dir, args.resume_from_checkpoint, args.overwrite_output_dir)


# ----------------------------------------------------------------------------------------------------------------
# The job: setup -> prepare -> fit -> finish


@dataclass
class Pretraining:
    """Everything `prepare` builds, which `fit` trains and `finish` saves."""

    args: RunArguments
    accelerator: Accelerator
    tokenizer: transformers.PreTrainedTokenizerBase
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    collate: DataCollatorForAlbertPretraining
    train_dataloader: DataLoader
    eval_dataloader: DataLoader | None
    eval_documents: datasets.Dataset | datasets.IterableDataset | None  # for the fill-mask examples
    checkpoints: StepCheckpoints
    num_parameters: int
    global_batch: int
    hardware: Hardware
    precision: Precision
    step_graph: pretraining_graph.StepGraph | None = None  # --torch_compile_mode whole-step-graph

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output_dir)

    @property
    def stream(self) -> datasets.IterableDataset | None:
        """The process's own endless stream of training pairs under --streaming (its position is checkpointed)."""
        dataset = self.train_dataloader.dataset
        return dataset if isinstance(dataset, datasets.IterableDataset) else None


def setup(args: RunArguments):
    """The hardware, the precision, the accelerator (in the mode the launcher asked for) and its FSDP request, and
    the output folder (an earlier run cleared with --overwrite_output_dir, partial checkpoints removed)."""
    hardware = detect()
    precision = choose_precision(hardware, args.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION"),
                                 args.tf32)
    use_tf32(precision)
    accelerator, fsdp_request = make_accelerator(
        mixed_precision=precision.mixed_precision,  # accumulation is ours (fit, training_step), not accelerate's
        log_with=args.report_to if args.with_tracking else None,
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=f"{args.output_dir}/runs"),
        # batches are copied to a GPU from pinned memory without waiting (DataLoader's pin_memory)
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=torch.cuda.is_available()),
        # a captured step must not reuse weights cast during the capture (torch.cuda.graphs' rule for autocast)
        kwargs_handlers=([AutocastKwargs(cache_enabled=False)] if args.torch_compile_mode == pretraining_graph.MODE
                         else None),
    )
    start_logging(accelerator.is_main_process)
    if args.torch_compile_mode == pretraining_graph.MODE:
        reason = pretraining_graph.refusal(accelerator, args.gradient_checkpointing or (
            fsdp_request is not None and fsdp_request.activation_checkpointing))
        if reason:
            raise InputError(reason)
    if precision.warning and accelerator.is_main_process:  # first, before the data is built: stop a slow run early
        logger.warning(precision.warning)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        check_deepspeed(args)
    if accelerator.mixed_precision == "fp16" and accelerator.scaler is None:
        enable_cpu_fp16(accelerator)
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    if args.overwrite_output_dir and accelerator.is_main_process:
        clear_earlier_run(output_dir)
    accelerator.wait_for_everyone()
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = StepCheckpoints(output_dir, accelerator, args.checkpoints_total_limit)
    checkpoints.remove_partial()
    # Before the corpus is read: room for one checkpoint (the weights and the optimizer's two moments), or without
    # checkpoints for the final model, estimated from the config the run will build.
    weights = planned_weight_bytes(args)
    if weights is not None:
        needed, what = (3 * weights, "one checkpoint") if args.checkpointing_steps else (weights, "the final model")
        check_free_space(output_dir, needed, what, "--output_dir")
    return hardware, precision, accelerator, fsdp_request, checkpoints


def prepare(args: RunArguments) -> Pretraining:
    """`setup`, the inputs (pretraining/inputs.py), the model (sharded under FSDP), the optimizer and the schedule,
    all prepared by accelerate; logs the start line."""
    hardware, precision, accelerator, fsdp_request, checkpoints = setup(args)
    inputs = build_inputs(args, accelerator)
    notes = [*(fsdp_request.notes if fsdp_request is not None else ()), *inputs.notes]
    if args.task == "none":
        notes.append("--task none: the pooler and the sentence-order head are frozen (no loss trains them)")
    model = build_run_model(args, inputs.tokenizer, accelerator, fsdp_request, notes)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, torch.float32)
    notes.append(attention_kernel(accelerator.unwrap_model(model).config, accelerator.device, dtype,
                                  args.max_seq_length))
    optimizer = make_optimizer(model, args)
    # A checkpoint holds the weights and the optimizer's two moments (for the line a failed write gives).
    checkpoints.expected_bytes = 3 * sum(p.numel() * p.element_size()
                                         for p in accelerator.unwrap_model(model).parameters())
    # The schedule counts optimizer steps; it is stepped by hand (not prepared), once per update, so that it
    # follows the official formula whatever the number of processes.
    scheduler = get_official_schedule(optimizer, args.num_warmup_steps, args.max_train_steps)
    train_dataloader, eval_dataloader = inputs.train_dataloader, inputs.eval_dataloader
    if isinstance(train_dataloader.dataset, datasets.IterableDataset):
        # Each process already streams its own pairs (build_data): accelerate would split them again, or have the
        # first process read for all. Not prepared, the loader is iterated in this process, no batch ahead, so
        # its dataset's state_dict() is the position after the last batch taken (saved with each checkpoint).
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    if eval_dataloader is not None:
        eval_dataloader = accelerator.prepare(eval_dataloader)
    accelerator.register_for_checkpointing(scheduler)

    num_parameters = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
    global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * accelerator.num_processes
    if args.with_tracking:
        start_tracking(accelerator, args)
    logger.info("%s parameters; global batch %d x %d tokens; %d steps; %s; %s%s",
                f"{num_parameters:,}", global_batch, args.max_seq_length, args.max_train_steps,
                describe(accelerator, model, hardware), precision.describe(),
                "".join(f"; {note}" for note in notes))
    graph = (pretraining_graph.StepGraph(model, optimizer, accelerator, args.max_grad_norm, args.loss_normalization)
             if args.torch_compile_mode == pretraining_graph.MODE else None)
    return Pretraining(args, accelerator, inputs.tokenizer, model, optimizer, scheduler, inputs.collate,
                       train_dataloader, eval_dataloader, inputs.eval_documents, checkpoints, num_parameters,
                       global_batch, hardware, precision, graph)


def optimizer_step(run: Pretraining, micro_batches) -> torch.Tensor:
    """One optimizer step (`training_step`), or with --torch_compile_mode whole-step-graph a replay of the captured
    step and the schedule's step; the six counts of `step_counts`."""
    if run.step_graph is None:
        return training_step(run.model, micro_batches, run.optimizer, run.scheduler, run.accelerator,
                             run.args.max_grad_norm, run.args.loss_normalization)
    counts = run.step_graph(micro_batches)
    run.scheduler.step()
    return counts


def fit(run: Pretraining, stop: StopOnSignal | None = None) -> FitResult:
    """The training loop, from the checkpoint --resume_from_checkpoint names (if any) to --max_train_steps, with
    logging, evaluation and checkpoints. When `stop` reports a signal (in any process) at a step boundary, every
    process saves the checkpoint of that step and the loop ends there."""
    args, accelerator = run.args, run.accelerator
    state = resume(run)
    log = MetricsLog(run.output_dir / "metrics.jsonl", accelerator, args.with_tracking)
    progress = tqdm(total=args.max_train_steps, initial=state.step, disable=not accelerator.is_main_process,
                    desc="pretraining", dynamic_ncols=True)
    eval_metrics, stopped, compiled = {}, None, False
    run.model.train()
    try:  # closed on the way out too, so that an error line starts on a line of its own
        while state.step < args.max_train_steps and stopped is None:
            for micro_batches in accumulation_groups(epoch_batches(run, state), args.gradient_accumulation_steps):
                state.batches_in_epoch += len(micro_batches)
                began = time.perf_counter()
                counts = optimizer_step(run, micro_batches)
                if args.torch_compile and not compiled:  # the first step compiles
                    compiled = True
                    logger.info("torch.compile: the first step took %.1f s, compiling included",
                                time.perf_counter() - began)
                state.add_step(counts, micro_batches, accelerator.optimizer_step_was_skipped)
                progress.update(1)
                if state.step % args.logging_steps == 0 or state.step == args.max_train_steps:
                    log_window(run, state, log, progress)
                if run.eval_dataloader is not None and args.eval_steps and state.step % args.eval_steps == 0:
                    eval_metrics = evaluate_and_log(run, state.step, log)
                    logger.info("step %d: %s", state.step, format_metrics(eval_metrics))
                if args.checkpointing_steps and state.step % args.checkpointing_steps == 0:
                    save_checkpoint(run, state)
                if state.step >= args.max_train_steps:
                    break
                if stop is not None and stop.agreed(accelerator.device):  # returns at once if just saved
                    stopped = FitResult(eval_metrics, state.step, stop.name, save_checkpoint(run, state))
                    break
            else:
                state.next_epoch()
    finally:
        progress.close()
    if stopped is not None:
        return stopped
    if run.eval_dataloader is not None and (not args.eval_steps or args.max_train_steps % args.eval_steps):
        eval_metrics = evaluate_and_log(run, state.step, log)
    return FitResult(eval_metrics, state.step)


def finish(run: Pretraining, eval_metrics: dict, completed_steps: int):
    """The final folder (weights gathered from every process, tokenizer, remote code, card), reloaded with
    AutoModel as a check, the summary with fill-mask examples, and the Hub push."""
    accelerator, args, output_dir = run.accelerator, run.args, run.output_dir
    accelerator.wait_for_everyone()
    check_weights(run.model, accelerator, completed_steps, current_lr(run), lambda: newest_checkpoint(run),
                  "the final model folder")
    final = gather_full_model(accelerator, run.model)
    fault = None
    if accelerator.is_main_process:
        fault = refused(lambda: write_final_folder(run, final, eval_metrics, completed_steps))
    fault = agreed(accelerator, fault, main_only=True)  # every process stops, none waits
    if fault is not None:
        raise StorageError(fault_line(fault, "the final model folder", output_dir, run.checkpoints.expected_bytes // 3,
                                    run.checkpoints.intact()))
    if accelerator.is_main_process:
        if args.push_to_hub:
            repo_id = args.hub_model_id or output_dir.name
            pushed = push_folder(output_dir, repo_id, token=args.hub_token, commit_message="End of training")
            print(f"  pushed: {pushed}")
    accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------------------------------------------
# The parts of `fit`'s loop and `finish`


def resume(run: Pretraining) -> TrainingState:
    """A fresh state, or the one of the checkpoint --resume_from_checkpoint names (and the stream's position)."""
    args, accelerator = run.args, run.accelerator
    state = TrainingState.start(accelerator.device)
    path = run.checkpoints.resolve(args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    if path is None:
        return state
    state.restore(run.checkpoints.load(path, COUNTS), accelerator.is_main_process)
    if run.stream is not None:
        run.stream.load_state_dict(run.checkpoints.stream_state(path))
    if accelerator.is_main_process:
        truncate_metrics_log(run.output_dir / "metrics.jsonl", state.step)
    logger.info("Resumed from %s: step %d, epoch %d, batch %d of the epoch", path, state.step, state.epoch,
                state.batches_in_epoch)
    return state


def epoch_batches(run: Pretraining, state: TrainingState):
    """The batches of the state's epoch, from the state's position in it."""
    run.collate.set_epoch(state.epoch)
    if hasattr(run.train_dataloader, "set_epoch"):
        run.train_dataloader.set_epoch(state.epoch)
    if run.stream is not None:  # unprepared (see prepare); resumed by its state_dict, not by skipping
        accelerator = run.accelerator
        return (send_to_device(batch, accelerator.device, non_blocking=accelerator.non_blocking)
                for batch in run.train_dataloader)
    if state.batches_in_epoch:
        return run.accelerator.skip_first_batches(run.train_dataloader, state.batches_in_epoch)
    return run.train_dataloader


def log_window(run: Pretraining, state: TrainingState, log, progress):
    """A collective: the training means of the window, into the progress bar and the metrics log; a non-finite
    loss stops the run (pretraining/divergence.py)."""
    metrics = state.window_metrics(run.accelerator, run.args.task, current_lr(run))
    progress.set_postfix({k.replace("_accuracy", "_acc"): f"{v:.3g}" for k, v in metrics.items() if k != "lr"})
    log.write(state.step, {f"train_{k}" if k not in ("lr", "tokens_per_second", "skipped_steps") else k: v
                           for k, v in metrics.items()})
    check_losses(metrics, state.step, metrics["lr"], lambda: newest_checkpoint(run), "training")


def evaluate_and_log(run: Pretraining, step: int, log) -> dict:
    """Held-out metrics, logged; a non-finite loss stops the run (pretraining/divergence.py)."""
    metrics = evaluate(run.model, run.eval_dataloader, run.accelerator, run.args.task)
    log.write(step, metrics)
    check_losses(metrics, step, current_lr(run), lambda: newest_checkpoint(run), "held-out")
    return metrics


def save_checkpoint(run: Pretraining, state: TrainingState) -> Path:
    """A collective: every process calls it at the same step. Non-finite weights are not written: the run stops."""
    check_weights(run.model, run.accelerator, state.step, current_lr(run), lambda: newest_checkpoint(run),
                  f"the step-{state.step} checkpoint")
    return run.checkpoints.save(state.step, state.checkpoint_state(run.accelerator),
                                stream_state=None if run.stream is None else run.stream.state_dict())


def current_lr(run: Pretraining) -> float:
    return float(run.scheduler.get_last_lr()[0])


def newest_checkpoint(run: Pretraining) -> Path | None:
    """The checkpoint a diverged run can go back to: the newest complete one with finite weights."""
    return newest_finite([path for _, path in run.checkpoints.complete()])


def write_final_folder(run: Pretraining, final, eval_metrics: dict, completed_steps: int):
    """On the main process, at the end (`finish`): the held-out baselines, the curves, the final folder
    (`save_final_model`), reloaded with AutoModel as a check, and the summary with fill-mask examples."""
    accelerator, args, output_dir = run.accelerator, run.args, run.output_dir
    pair_task = args.task if args.task != "none" else None
    if run.eval_dataloader is not None and eval_metrics:
        # on the evaluation's own pairs and static masks (the unprepared dataset and collator)
        eval_metrics = {**eval_metrics, **heldout_baselines(
            run.eval_dataloader.dataset, run.eval_dataloader.collate_fn, len(run.tokenizer),
            run.tokenizer.all_special_ids, pair_task)}
    curves = None
    if not args.no_plots:
        rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()
                ] if (output_dir / "metrics.jsonl").is_file() else []
        curves = pretraining_curves(rows, eval_metrics, output_dir / CURVES_FILE, pair_task)
    save_final_model(final, run.tokenizer, output_dir, args, eval_metrics, run.global_batch,
                     accelerator.num_processes, curves=curves is not None,
                     where=where_trained(run.hardware, run.precision, accelerator.num_processes))
    reloaded = AutoModel.from_pretrained(output_dir, trust_remote_code=True)
    summary = {"output_dir": str(output_dir), "parameters": run.num_parameters, "steps": completed_steps,
               "global_batch": run.global_batch, "reloaded_with": f"AutoModel -> {type(reloaded).__name__}",
               **({"training_curves": str(curves)} if curves else {})}
    # after the save: the examples are a look at the saved model, not part of it (nor of all_results.json)
    examples = held_out_fill_mask(final, run.tokenizer, run.eval_documents, args)
    if examples:
        (output_dir / FILL_MASK_FILE).write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n")
    print("\n".join(["", "Pretraining done."] + [f"  {k}: {format_value(v)}" for k, v in summary.items()]
                    + [f"  {k}: {text}" for k, text in with_baselines(eval_metrics)]
                    + format_fill_mask(examples)))


def main(argv=None):
    """Exits with status PREEMPTED (75) when a stop signal ended the run early, after its checkpoint; stops with one
    line when another run holds --output_dir."""
    args = parse_args(argv)
    # one run per folder, from before anything is written or read (runtime/output_lock.py)
    with output_lock.held(args.output_dir, "--output_dir", args.take_over_lock, is_first_process()):
        return pretrain(args)


def pretrain(args: RunArguments) -> dict:
    """The job, once its folder is locked: prepare, fit, finish (or only the pairs, with --preprocess_only)."""
    if args.preprocess_only:
        return preprocess(args)
    run = prepare(args)
    # From the first step on, SIGTERM / SIGINT / SIGUSR1 end the run at a step boundary with a checkpoint; during
    # the final save they are noted and the save completes.
    with StopOnSignal() as stop:
        result = fit(run, stop)
        if result.stopped_by is None:
            finish(run, result.eval_metrics, result.steps)
        accelerator = run.accelerator
        del run  # its model and optimizer hold the process group: dropped, so that end_distributed can free it
        end_distributed(accelerator)
        if result.stopped_by is not None:
            if accelerator.is_main_process:
                print(f"Stopped by {result.stopped_by} after step {result.steps} of {args.max_train_steps}: the "
                      f"full training state is in {result.checkpoint}. To continue, run the same command with "
                      "--resume_from_checkpoint latest", file=sys.stderr, flush=True)
            raise SystemExit(PREEMPTED)
    return result.eval_metrics


if __name__ == "__main__":
    run_entry_point(main)
