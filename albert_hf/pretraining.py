"""The pretraining job behind `run_pretraining.py`: accelerate, LAMB, exact resume, evaluation, Hub push.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 ...
    python run_pretraining.py            # a tiny ALBERT on the embedded corpus, a few minutes on a laptop CPU
    python run_pretraining.py args.json  # the same arguments from a file (.json or .yaml)

`main` = `parse_args` -> `prepare` (accelerator, data, tokenizer, model, optimizer) -> `fit` (the loop) -> `finish`
(save, summary, push). Loop: MLM + SOP loss (their plain sum), LAMB with the official poly-decay schedule, global
clipping at 1.0, gradient accumulation, bf16/fp16 through accelerate. Every `--checkpointing_steps` the full state
(model, optimizer, scheduler, RNGs, data position) goes atomically into `OUTPUT_DIR/step_N` (checkpointing.py);
`--resume_from_checkpoint latest` continues exactly where the last complete checkpoint left off.
"""

import argparse
import contextlib
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import datasets
from datasets.distributed import split_dataset_by_node
import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import (DataLoaderConfiguration, DistributedType, ProjectConfiguration, gather_object,
                               send_to_device, set_seed)
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer, HfArgumentParser

from .analysis.baselines import heldout_baselines, with_baselines
from .analysis.curves import CURVES_FILE, pretraining_curves
from .analysis.fill_mask import fill_mask_examples, format_fill_mask, pick_fill_mask_sentences
from .checkpointing import (FILL_MASK_FILE, StepCheckpoints, clear_previous_run, previous_run_files,
                            truncate_metrics_log)
from . import prepared_data
from .cli import explicit_arguments, parse_into_dataclasses
from .configuration_albert_hf import PRESETS, SHARING_MODES, AlbertHFConfig
from .corpus import (LAYOUTS, files_fingerprint, find_text_files, first_documents, first_few, is_plain_text,
                     load_corpus, split_sentences, text_file_stream)
from .data_collator import DataCollatorForAlbertPretraining
from .errors import InputError, run_entry_point
from .distributed import (describe, end_distributed, gather_full_model, load_on_first_process, make_accelerator,
                          shard_model)
from .hardware import MIXED_PRECISION_CHOICES, Hardware, Precision, choose_precision, detect, use_tf32
from .hub import push_folder, write_json
from .loading import check_tokenizer, loading
from .model_card import write_pretraining_card
from .modeling_albert_hf import AlbertHFForPreTraining
from .optimization import AdamWeightDecay, Lamb, get_official_schedule, parameter_groups
from .preemption import PREEMPTED, StopOnSignal
from .prepared_data import PretrainingData
from .pretraining_data import TASKS as PAIR_TASKS
from .pretraining_data import NoPairsError, build_pretraining_dataset
from .tokenization import train_tokenizer

logger = logging.getLogger("albert_hf.pretraining")

OPTIMIZERS = {"lamb": Lamb, "adamw": AdamWeightDecay}
LOSS_NORMALIZATIONS = ("global", "per_device")


# ----------------------------------------------------------------------------------------------------------------
# Command line: five groups of arguments, parsed by transformers' HfArgumentParser (so `run_pretraining.py args.json`
# or `args.yaml` works as in transformers' examples); the job reads them as one namespace.


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
        "help": "torch.compile each transformer block (`compile_blocks`): one graph for all shared layer "
        "applications, compiled in seconds; padding removal and the last-block selection stay on"})
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


def parse_args(argv=None) -> argparse.Namespace:
    """All groups as one namespace, checked: a bad value stops with one line naming the flag. With
    --prepared_data the arguments that shaped its pairs are taken from its manifest (`args.adopted` lists them)."""
    groups = parse_into_dataclasses(build_parser(), argv)
    args = argparse.Namespace(**{k: v for group in groups for k, v in vars(group).items()}, adopted=[])
    if args.prepared_data:
        if args.preprocess_only:
            raise InputError("pass --preprocess_only (to prepare a folder) or --prepared_data (to train on "
                             "one), not both")
        manifest = prepared_data.read_manifest(args.prepared_data)
        args.adopted = prepared_data.adopt_manifest(args, manifest, explicit_arguments(argv, ARGUMENT_GROUPS))
    check_args(args)
    return args


def check_args(args):
    """Fills in the default warm-up; stops with one line on a bad value, path or output folder, before any work."""
    if args.train_files and args.dataset_name:
        raise InputError("pass --train_files or --dataset_name, not both")
    for name in ("max_train_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "max_seq_length"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be at least 1")
    for path in args.train_files or ():
        if not Path(path).exists():
            raise InputError(f"--train_files: {path} does not exist")
    if args.train_files and is_plain_text(args.train_files):
        try:
            find_text_files(args.train_files)
        except InputError as error:
            raise InputError(f"--train_files: {error}") from None
    if args.num_warmup_steps is None:
        args.num_warmup_steps = round(0.025 * args.max_train_steps)
    if args.num_warmup_steps > args.max_train_steps:
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
    if args.resume_from_checkpoint not in (None, "latest"):
        problem = StepCheckpoints.problem(Path(args.resume_from_checkpoint))
        if problem:
            raise InputError(f"--resume_from_checkpoint {args.resume_from_checkpoint}: {problem}")
    earlier = previous_run_files(args.output_dir)
    if earlier and not args.overwrite_output_dir:
        has_checkpoint = bool(StepCheckpoints.complete_in(args.output_dir))
        if args.resume_from_checkpoint is None:
            resumable = ("pass --resume_from_checkpoint latest to continue it" if has_checkpoint
                         else "it left no complete step_N checkpoint for --resume_from_checkpoint latest")
            raise InputError(f"--output_dir {args.output_dir} holds an earlier run ({', '.join(earlier[:4])}"
                             f"{', ...' if len(earlier) > 4 else ''}): {resumable}; pass --overwrite_output_dir to "
                             "start over, or another --output_dir")
        if args.resume_from_checkpoint == "latest" and not has_checkpoint:
            raise InputError(f"--resume_from_checkpoint latest: --output_dir {args.output_dir} holds an "
                             "earlier run but no complete step_N checkpoint to continue from; pass "
                             "--overwrite_output_dir to start over, or another --output_dir")


def check_deepspeed(args):
    """What run_pretraining.py cannot do under DeepSpeed, refused in one line before any work."""
    if args.gradient_accumulation_steps > 1:
        raise InputError("--gradient_accumulation_steps under DeepSpeed: DeepSpeed accumulates by its own count and "
                         "scaling, which would undo the step-wide loss weighting of training_step; use an FSDP or "
                         "DDP config, or a larger --per_device_train_batch_size")
    if args.optimizer == "lamb":
        raise InputError("--optimizer lamb under DeepSpeed: ZeRO and DeepSpeed's mixed-precision optimizers hand the "
                         "optimizer one flat partition per parameter group, so LAMB's per-parameter trust ratio "
                         "would become one ratio per partition, which is not LAMB; use --optimizer adamw, or an "
                         "FSDP or DDP config for LAMB")


# ----------------------------------------------------------------------------------------------------------------
# Metrics


@torch.no_grad()
def example_counts(outputs, batch) -> torch.Tensor:
    """Per example: [MLM loss sum, MLM correct, MLM count, pair loss, pair correct, pair count], shape (batch, 6);
    "pair" is the 2-way head's task (SOP or NSP; its logits are `sop_logits` either way).

    For evaluation: per-example rows let `gather_for_metrics` drop the samples accelerate repeats to even out the
    last batch, so the losses are computed again per token here (training uses the model's own: `step_counts`).
    """
    sop_logits = outputs.sop_logits
    counts = torch.zeros(sop_logits.shape[0], 6, dtype=torch.float64, device=sop_logits.device)
    labels = batch.get("labels")
    if labels is not None and outputs.mlm_loss is not None:
        targets, weights, owner = mlm_targets(batch)
        logits = outputs.prediction_logits.float()
        token_loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none").double() * weights
        counts[:, 0].index_add_(0, owner, token_loss)
        counts[:, 1].index_add_(0, owner, (logits.argmax(-1) == targets).double() * weights)
        counts[:, 2].index_add_(0, owner, weights)
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[:, 3] = torch.nn.functional.cross_entropy(sop_logits.float(), order, reduction="none").double()
        counts[:, 4] = (sop_logits.argmax(-1) == order).double()
        counts[:, 5] = 1
    return counts


@torch.no_grad()
def step_counts(outputs, batch) -> torch.Tensor:
    """The same six sums for a whole training micro-batch, shape (6,), from the losses the model already computed
    (its means over the masked tokens and over the pairs, times their counts).

    No grad: the training loop adds these into a running window, which would otherwise chain every step's graph
    into one that is never freed (about 30 MB a step at H=256, batch 32).
    """
    counts = torch.zeros(6, dtype=torch.float64, device=outputs.sop_logits.device)
    labels = batch.get("labels")
    if labels is not None and outputs.mlm_loss is not None:
        targets, weights, _ = mlm_targets(batch)  # in the head's row order
        masked = weights.sum()
        counts[0] = outputs.mlm_loss.double() * masked
        counts[1] = ((outputs.prediction_logits.argmax(-1) == targets).double() * weights).sum()
        counts[2] = masked
    order = batch.get("sentence_order_label")
    if order is not None and outputs.sop_loss is not None:
        counts[3] = outputs.sop_loss.double() * order.numel()
        counts[4] = (outputs.sop_logits.argmax(-1) == order).sum()
        counts[5] = order.numel()
    return counts


def mlm_targets(batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The MLM head's rows as the model orders them: (target ids, weights (float64: 1, or 0 for the padding of
    the fixed-size form), the example of each row). From `masked_lm_positions` when the batch has them (no count
    read from the device), else from `labels != -100`."""
    labels = batch["labels"]
    positions = batch.get("masked_lm_positions")
    if positions is not None:
        weights = batch["masked_lm_weights"].flatten().double()
        owner = torch.arange(labels.shape[0], device=labels.device).repeat_interleave(positions.shape[1])
        return labels.gather(1, positions).clamp(min=0).flatten(), weights, owner
    masked = labels != -100
    targets = labels[masked]
    return targets, targets.new_ones(targets.shape, dtype=torch.float64), masked.nonzero()[:, 0]


def masked_count(batch) -> torch.Tensor:
    """The batch's masked tokens, as a device tensor (from the collator's weights when it gave them)."""
    if batch.get("masked_lm_weights") is not None:
        return batch["masked_lm_weights"].sum()
    return (batch["labels"] != -100).sum()


def metrics_from_counts(totals: torch.Tensor, prefix: str = "", pair_task: str = "sop") -> dict:
    """Mean losses and accuracies; the 2-way head's metrics are named after the task it is trained on (sop/nsp)."""
    mlm_loss, mlm_correct, mlm_n, pair_loss, pair_correct, pair_n = totals.tolist()
    metrics = {}
    if mlm_n:
        metrics.update({f"{prefix}mlm_loss": mlm_loss / mlm_n, f"{prefix}mlm_accuracy": mlm_correct / mlm_n})
    if pair_n:
        metrics.update({f"{prefix}{pair_task}_loss": pair_loss / pair_n,
                        f"{prefix}{pair_task}_accuracy": pair_correct / pair_n})
    return metrics


@torch.no_grad()
def evaluate(model, dataloader, accelerator, task: str) -> dict:
    model.eval()
    totals = torch.zeros(6, dtype=torch.float64)
    for batch in dataloader:
        with accelerator.autocast():
            outputs = model(**batch)
        totals += accelerator.gather_for_metrics(example_counts(outputs, batch)).sum(0).cpu()
    model.train()
    return metrics_from_counts(totals, prefix="eval_", pair_task=task)


# ----------------------------------------------------------------------------------------------------------------
# Data, tokenizer, model


def load_documents(args):
    """The corpus as documents ("text" column): files, a Hub dataset, or the embedded default corpus."""
    if args.dataset_name:
        return load_corpus(args.dataset_name, text_column=args.text_column, config_name=args.dataset_config_name,
                           streaming=args.streaming)
    if args.train_files:
        return load_corpus(args.train_files, layout=args.layout, text_column=args.text_column,
                           streaming=args.streaming)
    if args.streaming:
        logger.warning("--streaming: the embedded corpus is not streamed (it is small)")
    return load_corpus(None)


def split_documents(documents, args):
    """Hold out whole documents for evaluation, so no evaluation sentence was seen in training."""
    if args.validation_split_percentage == 0:
        return documents, None
    if isinstance(documents, datasets.IterableDataset):  # no length: the first documents of the stream
        count = streamed_documents_held_out(args)
        texts = [row["text"] for row in documents.take(count + 1)]
        if len(texts) <= count:
            raise InputError(too_few_to_hold_out(count, len(texts)))
        held_out = {text_digest(text) for text in texts[:count]}
        # Dropped wherever they come: whichever process's shard holds them (datasets' skip would instead divide the
        # skipped count among the shards, and the others would train on held-out documents).
        train = documents.filter(lambda row: text_digest(row["text"]) not in held_out)
        return train, datasets.Dataset.from_dict({"text": texts[:count]})
    if len(documents) < 2:
        raise InputError(f"{corpus_argument(args)}: {len(documents)} document(s); evaluation needs at least 2 "
                         "(or pass --validation_split_percentage 0)")
    split = documents.train_test_split(test_size=args.validation_split_percentage / 100, seed=args.seed)
    return split["train"], split["test"]


def text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def too_few_to_hold_out(count: int, found: int) -> str:
    return (f"--streaming holds out the corpus's first {count} documents for evaluation "
            f"(--validation_split_percentage x 20), and the corpus has only {found}: pass a smaller "
            "--validation_split_percentage, or 0")


def streamed_documents_held_out(args) -> int:
    """How many documents a stream holds out for evaluation (its first ones): a stream has no length, so
    --validation_split_percentage x 20."""
    return max(1, int(args.validation_split_percentage * 20))


def load_tokenizer(args, train_documents, fingerprint: str | None = None):
    if args.tokenizer_name:
        with loading("--tokenizer_name", args.tokenizer_name):
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name, trust_remote_code=args.trust_remote_code)
        return check_tokenizer(tokenizer, "--tokenizer_name", args.tokenizer_name)
    if args.model_name_or_path and Path(args.model_name_or_path, "tokenizer.json").is_file():
        with loading("--model_name_or_path", args.model_name_or_path):
            tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        return check_tokenizer(tokenizer, "--model_name_or_path", args.model_name_or_path)
    if isinstance(train_documents, datasets.IterableDataset):
        logger.warning("--streaming without --tokenizer_name: the tokenizer is trained first, on a sample of the "
                       "whole corpus, which is read once before the first step (pass --tokenizer_name, e.g. the "
                       "tokenizer of an earlier run, to stream from the start)")
    return train_tokenizer(train_documents, vocab_size=args.vocab_size, text_column="text",
                           sentence_per_line=args.layout == "sentence_per_line",
                           input_sentence_size=args.tokenizer_sample_sentences, fingerprint=fingerprint)


def build_pairs(documents, tokenizer, args, dupe_factor, seed, one_chunk="random_next"):
    """The pairs of the objective. --task none: SOP's pairs without their label, so batches carry none and the
    model's pair head gets no loss (the 2-way metrics then stay out of the logs as well)."""
    try:
        pairs = build_pretraining_dataset(
            documents, tokenizer, text_column="text", sentence_per_line=args.layout == "sentence_per_line",
            num_proc=args.preprocessing_num_workers, max_seq_length=args.max_seq_length,
            short_seq_prob=args.short_seq_prob, dupe_factor=dupe_factor, task="nsp" if args.task == "nsp" else "sop",
            seed=seed, one_chunk=one_chunk,
        )
    except NoPairsError as error:
        which = "its training documents" if one_chunk == "random_next" else "its held-out documents"
        raise InputError(f"{corpus_argument(args)} ({which}): {error}") from None
    return pairs.remove_columns("sentence_order_label") if args.task == "none" else pairs


def check_stream_makes_pairs(documents, args, where: str) -> None:
    """Stop with one line when a process's stream holds no document of two sentences or more, read once through:
    its endless stream would otherwise read pass after pass and never give a pair, and the run would hang. A normal
    corpus answers at its first documents."""
    sentence_per_line = args.layout == "sentence_per_line"
    for row in documents:
        if len(split_sentences(row["text"] or "", sentence_per_line=sentence_per_line)) >= 2:
            return
    raise InputError(f"{where} holds no document of two sentences or more (the held-out ones left out), so it "
                     "gives no sentence pair to train on")


def corpus_argument(args) -> str:
    """The argument that named the corpus, for error lines."""
    if args.train_files:
        return f"--train_files {' '.join(map(str, args.train_files[:3]))}{' ...' if len(args.train_files) > 3 else ''}"
    return f"--dataset_name {args.dataset_name}" if args.dataset_name else "the embedded corpus"


def build_data(args, process_index: int = 0, num_processes: int = 1) -> PretrainingData:
    """Corpus -> held-out split -> tokenizer -> training and held-out pairs (each step a cached `datasets` map).

    A stream (--streaming) gives each process its own endless stream of pairs, built as it is read; its held-out
    pairs are built up front, from its first documents."""
    if args.streaming and args.train_files and is_plain_text(args.train_files):
        return build_text_stream_data(args, process_index, num_processes)
    documents = load_documents(args)
    train_documents, eval_documents = split_documents(documents, args)
    tokenizer = load_tokenizer(args, train_documents)
    if isinstance(train_documents, datasets.IterableDataset):
        shards = train_documents.n_shards
        train_documents = split_dataset_by_node(train_documents, process_index, num_processes)
        check_stream_makes_pairs(train_documents, args, f"{corpus_argument(args)}: process {process_index}'s share")
        train_documents = train_documents.repeat(None)
        if num_processes == 1:
            shares = f"{shards} shard(s)"
        elif shards % num_processes == 0:
            shares = f"each of the {num_processes} processes reads its own {shards // num_processes} of {shards} shards"
        else:  # datasets' split_dataset_by_node
            shares = (f"each of the {num_processes} processes reads all {shards} shard(s) and keeps every "
                      f"{num_processes}th document (a number of shards, i.e. files, divisible by {num_processes} "
                      "lets each read its own)")
        logger.info("--streaming: %s; %s", shares, STREAM_NOTE)
    train_pairs = build_pairs(train_documents, tokenizer, args, args.dupe_factor, args.seed)
    return PretrainingData(tokenizer, train_pairs, *build_eval_pairs(eval_documents, tokenizer, args))


# A process's training stream never ends: the processes' passes differ in length, and a process whose stream had
# ended would leave the others waiting in their next collective. --max_train_steps ends the run.
STREAM_NOTE = "pass after pass, endlessly, until --max_train_steps"


def build_text_stream_data(args, process_index: int, num_processes: int) -> PretrainingData:
    """--streaming over plain-text files: every process streams files of its own (files[process::processes]),
    endlessly, pass after pass in a reshuffled file order; pairs are built as the files are read. The first
    documents of the corpus (in file order) are held out for evaluation, and skipped by the training streams."""
    files = find_text_files(args.train_files)
    if len(files) < num_processes:
        raise InputError(f"--streaming: --train_files has {len(files)} text file(s) for {num_processes} "
                         "processes, and each process streams files of its own: split the corpus into at least "
                         f"{num_processes} files, or drop --streaming")
    eval_documents, held_out = None, {}
    if args.validation_split_percentage:
        count = streamed_documents_held_out(args)
        texts, held_out, more = first_documents(files, args.layout, count)
        if not more:
            raise InputError(too_few_to_hold_out(count, len(texts)))
        eval_documents = datasets.Dataset.from_dict({"text": texts})
    fingerprint = hashlib.sha256(json.dumps([files_fingerprint(files, args.layout), held_out]).encode()).hexdigest()
    tokenizer = load_tokenizer(args, text_file_stream(files, args.layout, held_out=held_out, endless=False),
                               fingerprint=fingerprint)
    own = files[process_index::num_processes]
    logger.info("--streaming: %s, each pass in a new file order; %s",
                f"{len(files)} files" if num_processes == 1 else
                f"each of the {num_processes} processes reads its own files, this one {len(own)} of {len(files)}",
                STREAM_NOTE)
    check_stream_makes_pairs(text_file_stream(own, args.layout, held_out=held_out, endless=False), args,
                             f"--train_files: the files of process {process_index} ({first_few(list(map(str, own)))})")
    train_documents = text_file_stream(own, args.layout, seed=args.seed, held_out=held_out)
    train_pairs = build_pairs(train_documents, tokenizer, args, args.dupe_factor, args.seed)
    return PretrainingData(tokenizer, train_pairs, *build_eval_pairs(eval_documents, tokenizer, args))


def build_eval_pairs(eval_documents, tokenizer, args) -> tuple:
    """(held-out pairs, held-out documents), or (None, None) without held-out documents."""
    eval_pairs = None
    if eval_documents is not None:
        # Held-out pairs without the one-sentence-chunk quirk (a random-document B labelled 1 even for SOP):
        # the SOP accuracy then measures order prediction only, and chance is 50%.
        eval_pairs = build_pairs(eval_documents, tokenizer, args, 1, args.seed + 1, one_chunk="skip")
        if hasattr(eval_pairs, "__len__") and args.max_eval_samples:
            eval_pairs = eval_pairs.select(range(min(args.max_eval_samples, len(eval_pairs))))
        elif args.max_eval_samples:
            eval_pairs = eval_pairs.take(args.max_eval_samples)
    return eval_pairs, eval_documents


def preprocess(args):
    """--preprocess_only: the tokenizer and the pairs into --output_dir (prepared_data.py), nothing trained."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise InputError("--preprocess_only runs in one process: start it with python, not accelerate launch")
    start_logging(main_process=True)
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    if args.overwrite_output_dir:
        clear_earlier_run(output_dir)
    manifest = prepared_data.save(build_data(args), output_dir, args)
    print(f"\nPrepared {manifest['train_pairs']:,} training and {manifest.get('validation_pairs', 0):,} held-out "
          f"pairs in {output_dir}. Train on them with: run_pretraining.py --prepared_data {output_dir} ...")


def build_model(args, tokenizer):
    if args.model_name_or_path:
        with loading("--model_name_or_path", args.model_name_or_path):
            model = AlbertHFForPreTraining.from_pretrained(args.model_name_or_path)
    else:
        if args.config_name:
            with loading("--config_name", args.config_name):
                config = AlbertHFConfig.from_pretrained(args.config_name)
        else:
            config = AlbertHFConfig.from_preset(args.model_config)
        config.vocab_size = len(tokenizer)
        if args.sharing:
            config = AlbertHFConfig(**{**config.to_diff_dict(), "sharing": args.sharing})
        if args.max_seq_length > config.max_position_embeddings:
            raise InputError(f"--max_seq_length {args.max_seq_length} exceeds the model's "
                             f"max_position_embeddings={config.max_position_embeddings}")
        model = AlbertHFForPreTraining(config)
    return finish_model(model, args, tokenizer)


def finish_model(model, args, tokenizer):
    """The checks and settings every built or loaded model gets: vocabulary, special tokens, checkpointing."""
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"The tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")
    for name in ("pad_token_id", "cls_token_id", "sep_token_id"):
        setattr(model.config, name.replace("cls", "bos").replace("sep", "eos"), getattr(tokenizer, name))
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable()
    if args.task == "none":  # no loss reaches the pooler and SOP head: frozen, so DDP expects no gradient for them
        model.albert.pooler.requires_grad_(False)
        model.sop_classifier.requires_grad_(False)
    return model


def make_optimizer(model, args):
    groups = parameter_groups(model, weight_decay=args.weight_decay)
    return OPTIMIZERS[args.optimizer](groups, lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2),
                           eps=args.adam_epsilon)


# ----------------------------------------------------------------------------------------------------------------
# Fill-mask examples for the end-of-run summary (the helpers: albert_hf/analysis/fill_mask.py)


def held_out_fill_mask(model, tokenizer, eval_documents, args, count=4, documents_read=50) -> list[dict]:
    """`fill_mask_examples` on sentences of the first held-out documents (a seeded sample already, or the
    first documents of a stream); [] when there is nothing to show."""
    if eval_documents is None:  # --validation_split_percentage 0: no held-out sentence to show
        return []
    if tokenizer.mask_token is None:
        logger.info("No fill-mask examples: the tokenizer has no mask token")
        return []
    texts = [row["text"] for row in islice(eval_documents, documents_read)]  # reads a stream's head only
    sentences = pick_fill_mask_sentences(texts, tokenizer, count=count, seed=args.seed,
                                         max_length=args.max_seq_length,
                                         sentence_per_line=args.layout == "sentence_per_line")
    if not sentences:
        logger.info("No fill-mask examples: the first %d held-out documents have no sentence of 8 to 30 words with "
                    "a one-piece content word", documents_read)
    return fill_mask_examples(model, tokenizer, sentences)


# ----------------------------------------------------------------------------------------------------------------
# The job: prepare -> fit -> finish


@dataclass
class Pretraining:
    """Everything `prepare` builds, which `fit` trains and `finish` saves."""

    args: argparse.Namespace
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

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output_dir)

    @property
    def stream(self) -> datasets.IterableDataset | None:
        """The process's own endless stream of training pairs under --streaming (its position is checkpointed)."""
        dataset = self.train_dataloader.dataset
        return dataset if isinstance(dataset, datasets.IterableDataset) else None


def compile_note(device: torch.device) -> str | None:
    """compile_blocks is built for CPUs; on a GPU it measured slower than eager (BENCHMARKS.md, "On a GPU")."""
    if device.type == "cuda":
        return "--torch_compile: compiled blocks ran 37% slower than eager on an H200 (base, 32 x 128); kept as asked"
    return None


def prepare(args) -> Pretraining:
    """The accelerator (in the mode the launcher asked for), the output folder, the pairs, the tokenizer, the model
    (sharded under FSDP), the optimizer and the schedule; logs the start line."""
    hardware = detect()
    precision = choose_precision(hardware, args.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION"),
                                 args.tf32)
    use_tf32(precision)
    accelerator, fsdp_request = make_accelerator(
        mixed_precision=precision.mixed_precision,  # accumulation is ours (fit, training_step), not accelerate's
        log_with=args.report_to if args.with_tracking else None,
        project_config=ProjectConfiguration(project_dir=args.output_dir, logging_dir=f"{args.output_dir}/runs"),
        # batches are copied to a GPU from pinned memory without waiting (DataLoader's pin_memory below)
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=torch.cuda.is_available()),
    )
    start_logging(accelerator.is_main_process)
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

    problem = None
    with accelerator.main_process_first():  # the main process builds the caches, the others read them
        try:
            if args.prepared_data:
                data = prepared_data.load(args.prepared_data)
                logger.info("Training on the pairs prepared in %s (no tokenizing)%s", args.prepared_data,
                            f"; from its manifest: {', '.join(args.adopted)}" if args.adopted else "")
            else:
                data = build_data(args, accelerator.process_index, accelerator.num_processes)
        except InputError as error:
            # Raised below by every process at once: a process stopping alone would leave the others waiting in
            # their next collective, and only the first process prints the line (errors.run_entry_point).
            problem = str(error)
    problems = gather_object([problem]) if accelerator.num_processes > 1 else [problem]
    if any(problems):
        raise InputError(next(found for found in problems if found))
    tokenizer, train_pairs, eval_pairs = data.tokenizer, data.train_pairs, data.eval_pairs

    # the fixed-size masked positions: the model sizes its MLM head without reading counts from the device
    masking = dict(tokenizer=tokenizer, mlm_probability=args.mlm_probability, max_ngram=args.max_ngram,
                   max_predictions_per_seq=args.max_predictions_per_seq, seed=args.seed, masked_positions=True)
    # Dynamic masks keyed on (seed, epoch, example) (`set_epoch` in `fit`): the same example gets the same mask
    # whatever the batching, the number of processes or a resume, so runs are exactly reproducible.
    collate = DataCollatorForAlbertPretraining(**masking)
    # Workers mask and batch while the model runs; the masks stay keyed on (seed, epoch, example) in every worker.
    workers = args.dataloader_num_workers
    if workers is None:
        workers = 2 if accelerator.device.type == "cuda" and not args.streaming else 0
    loading = dict(num_workers=workers, pin_memory=accelerator.device.type == "cuda")
    train_dataloader = DataLoader(train_pairs, batch_size=args.per_device_train_batch_size, collate_fn=collate,
                                  shuffle=hasattr(train_pairs, "__len__"), **loading)
    eval_dataloader = None
    if eval_pairs is not None:
        # Static masking: every evaluation sees the same masks, so the numbers are comparable over time.
        eval_dataloader = DataLoader(eval_pairs, batch_size=args.per_device_eval_batch_size,
                                     collate_fn=DataCollatorForAlbertPretraining(**masking, static_masking=True),
                                     **loading)

    notes = list(fsdp_request.notes) if fsdp_request is not None else []
    if workers:
        notes.append(f"{workers} DataLoader worker{'s' * (workers > 1)}")
    if args.task == "none":
        notes.append("--task none: the pooler and the sentence-order head are frozen (no loss trains them)")
    if fsdp_request is not None and fsdp_request.activation_checkpointing:
        args.gradient_checkpointing = True
    load_once = fsdp_request is not None and fsdp_request.ram_efficient_loading and bool(args.model_name_or_path)
    if load_once:
        model = load_on_first_process(accelerator, lambda: build_model(args, tokenizer),
                                      lambda config: finish_model(AlbertHFForPreTraining(config), args, tokenizer))
        notes.append("fsdp_cpu_ram_efficient_loading: the first process read --model_name_or_path, the others "
                     "received their shards")
    else:
        if fsdp_request is not None and fsdp_request.ram_efficient_loading:
            notes.append("fsdp_cpu_ram_efficient_loading: nothing to load (no --model_name_or_path); every "
                         "process builds the same weights from --seed")
        model = build_model(args, tokenizer)
    if args.torch_compile:
        model.compile_blocks()
        notes += [note for note in [compile_note(accelerator.device)] if note]
    if accelerator.is_fsdp2:  # before the optimizer is built: it must hold the sharded parameters
        shard_model(accelerator, model, send_first_process_weights=load_once)
    optimizer = make_optimizer(model, args)
    # The schedule counts optimizer steps; it is stepped by hand (not prepared), once per update, so that it
    # follows the official formula whatever the number of processes.
    scheduler = get_official_schedule(optimizer, args.num_warmup_steps, args.max_train_steps)
    if isinstance(train_pairs, datasets.IterableDataset):
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
        if not accelerator.log_with:
            raise InputError(f"--with_tracking: no usable tracker for --report_to {args.report_to} (for "
                             "tensorboard: pip install tensorboard, or albert_hf[tracking])")
        accelerator.init_trackers("albert_pretraining", {k: v for k, v in vars(args).items()
                                                         if isinstance(v, (int, float, str, bool))})
    logger.info("%s parameters; global batch %d x %d tokens; %d steps; %s; %s%s",
                f"{num_parameters:,}", global_batch, args.max_seq_length, args.max_train_steps,
                describe(accelerator, model, hardware), precision.describe(),
                "".join(f"; {note}" for note in notes))
    return Pretraining(args, accelerator, tokenizer, model, optimizer, scheduler, collate, train_dataloader,
                       eval_dataloader, data.eval_documents, checkpoints, num_parameters, global_batch, hardware,
                       precision)


@dataclass
class Outcome:
    """How `fit` ended: at --max_train_steps, or early on a stop signal with a checkpoint written."""

    eval_metrics: dict  # the last evaluation's
    steps: int  # optimizer steps completed
    stopped_by: str | None = None  # the signal's name (SIGTERM, SIGINT, SIGUSR1) when one ended the run early
    checkpoint: Path | None = None  # the step_N written when it stopped


def fit(run: Pretraining, stop: StopOnSignal | None = None) -> Outcome:
    """The training loop, from the checkpoint --resume_from_checkpoint names (if any) to --max_train_steps, with
    logging, evaluation and checkpoints. When `stop` reports a signal (in any process) at a step boundary, every
    process saves the checkpoint of that step and the loop ends there."""
    args, accelerator, model = run.args, run.accelerator, run.model
    metrics_log = run.output_dir / "metrics.jsonl"
    # The training metrics logged every --logging_steps are means over a window of steps. The window's sums
    # travel with the checkpoint (summed over processes, held by the main process), so that a resumed run logs
    # exactly what the uninterrupted run would have, wherever the checkpoint fell inside a window.
    window = torch.zeros(6, dtype=torch.float64, device=accelerator.device)
    # this process's real tokens in the window, on the device: read (summed over processes) when it is logged
    window_tokens = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    window_seconds = 0.0
    completed_steps, epoch, batches_in_epoch, skipped_steps = 0, 0, 0, 0
    path = run.checkpoints.resolve(args.resume_from_checkpoint) if args.resume_from_checkpoint else None
    if path is not None:
        state = run.checkpoints.load(path)
        completed_steps, epoch, batches_in_epoch = state["step"], state["epoch"], state["batches_in_epoch"]
        skipped_steps = state.get("skipped_steps", 0)
        if accelerator.is_main_process and "window" in state:
            sums, tokens, seconds = state["window"], state.get("window_tokens"), state.get("window_seconds")
            if not (isinstance(sums, list) and len(sums) == len(window)
                    and all(type(v) in (int, float) for v in [*sums, tokens, seconds])):
                raise InputError(f"--resume_from_checkpoint {path}: the logging window in its training state is "
                                 f"not {len(window)} + 2 numbers")
            window = torch.tensor(state["window"], dtype=torch.float64, device=accelerator.device)
            window_tokens.fill_(state["window_tokens"])
            window_seconds = state["window_seconds"]
        if run.stream is not None:
            run.stream.load_state_dict(run.checkpoints.stream_state(path))
        if accelerator.is_main_process:
            truncate_metrics_log(metrics_log, completed_steps)
        logger.info("Resumed from %s: step %d, epoch %d, batch %d of the epoch", path, completed_steps, epoch,
                    batches_in_epoch)

    def log(metrics: dict):
        if args.with_tracking:
            accelerator.log(metrics, step=completed_steps)
        if accelerator.is_main_process:
            with open(metrics_log, "a") as f:
                f.write(json.dumps({"step": completed_steps, **metrics}) + "\n")

    progress = tqdm(total=args.max_train_steps, initial=completed_steps, disable=not accelerator.is_main_process,
                    desc="pretraining", dynamic_ncols=True)
    def window_sums() -> torch.Tensor:  # a collective: the six counts, then the real tokens, over all processes
        return accelerator.reduce(torch.cat([window, window_tokens.view(1)]), "sum").cpu()

    def save_checkpoint() -> Path:  # a collective: every process calls it at the same step
        *sums, tokens = window_sums().tolist()
        return run.checkpoints.save(completed_steps, {
            "step": completed_steps, "epoch": epoch, "batches_in_epoch": batches_in_epoch,
            "skipped_steps": skipped_steps, "window": sums, "window_tokens": tokens,
            "window_seconds": time.perf_counter() - window_start,
        }, stream_state=None if run.stream is None else run.stream.state_dict())

    window_start = time.perf_counter() - window_seconds
    eval_metrics = {}
    stopped_by = stopped_checkpoint = None
    model.train()
    while completed_steps < args.max_train_steps and stopped_by is None:
        run.collate.set_epoch(epoch)
        if hasattr(run.train_dataloader, "set_epoch"):
            run.train_dataloader.set_epoch(epoch)
        batches = run.train_dataloader
        if run.stream is not None:  # unprepared (see prepare); resumed by its state_dict, not by skipping
            batches = (send_to_device(batch, accelerator.device, non_blocking=accelerator.non_blocking)
                       for batch in batches)
        elif batches_in_epoch:
            batches = accelerator.skip_first_batches(run.train_dataloader, batches_in_epoch)
        for micro_batches in accumulation_groups(batches, args.gradient_accumulation_steps):
            batches_in_epoch += len(micro_batches)
            window += training_step(model, micro_batches, run.optimizer, run.scheduler, accelerator,
                                    args.max_grad_norm, args.loss_normalization)
            for batch in micro_batches:
                window_tokens += batch["attention_mask"].sum()
            completed_steps += 1
            skipped_steps += accelerator.optimizer_step_was_skipped
            progress.update(1)

            if completed_steps % args.logging_steps == 0 or completed_steps == args.max_train_steps:
                elapsed = time.perf_counter() - window_start
                sums = window_sums()
                train_metrics = metrics_from_counts(sums[:-1], pair_task=args.task)
                train_metrics.update(lr=run.scheduler.get_last_lr()[0], tokens_per_second=float(sums[-1]) / elapsed)
                if skipped_steps:
                    train_metrics["skipped_steps"] = skipped_steps  # fp16 overflows (no update, no LR step)
                progress.set_postfix({k.replace("_accuracy", "_acc"): f"{v:.3g}" for k, v in train_metrics.items()
                                      if k != "lr"})
                log({f"train_{k}" if k not in ("lr", "tokens_per_second", "skipped_steps") else k: v
                     for k, v in train_metrics.items()})
                window.zero_()
                window_tokens.zero_()
                window_start = time.perf_counter()

            if run.eval_dataloader is not None and args.eval_steps and completed_steps % args.eval_steps == 0:
                eval_metrics = evaluate(model, run.eval_dataloader, accelerator, args.task)
                log(eval_metrics)
                logger.info("step %d: %s", completed_steps, _format(eval_metrics))

            if args.checkpointing_steps and completed_steps % args.checkpointing_steps == 0:
                save_checkpoint()
            if completed_steps >= args.max_train_steps:
                break
            if stop is not None and stop.agreed(accelerator.device):
                stopped_by, stopped_checkpoint = stop.name, save_checkpoint()  # returns at once if just saved
                break
        else:
            epoch += 1
            batches_in_epoch = 0
    progress.close()
    if stopped_by is not None:
        return Outcome(eval_metrics, completed_steps, stopped_by, stopped_checkpoint)

    if run.eval_dataloader is not None and (not args.eval_steps or args.max_train_steps % args.eval_steps):
        eval_metrics = evaluate(model, run.eval_dataloader, accelerator, args.task)
        log(eval_metrics)
    return Outcome(eval_metrics, completed_steps)


def finish(run: Pretraining, eval_metrics: dict, completed_steps: int):
    """The final folder (weights gathered from every process, tokenizer, remote code, card), reloaded with
    AutoModel as a check, the summary with fill-mask examples, and the Hub push."""
    accelerator, args, output_dir = run.accelerator, run.args, run.output_dir
    accelerator.wait_for_everyone()
    final = gather_full_model(accelerator, run.model)
    if accelerator.is_main_process:
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
        print("\n".join(["", "Pretraining done."] + [f"  {k}: {_format_value(v)}" for k, v in summary.items()]
                        + [f"  {k}: {text}" for k, text in with_baselines(eval_metrics)]
                        + format_fill_mask(examples)))
        if args.push_to_hub:
            repo_id = args.hub_model_id or output_dir.name
            pushed = push_folder(output_dir, repo_id, token=args.hub_token, commit_message="End of training")
            print(f"  pushed: {pushed}")
    accelerator.wait_for_everyone()


# ----------------------------------------------------------------------------------------------------------------
# One optimizer step: the gradient of the batch it stands for


def accumulation_groups(batches, size: int):
    """The micro-batches of each optimizer step, in lists of `size`; a shorter last one when the epoch ends."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def loss_weights(micro_batches, accelerator, normalization: str = "global") -> torch.Tensor:
    """(w_mlm, w_pair) for one optimizer step: each micro-batch's backward gets its summed MLM loss times w_mlm
    plus its summed pair (SOP/NSP) loss times w_pair (`weighted_loss`).

    global: w = P / N and P / S, with N the masked tokens and S the pairs of the whole step (every micro-batch of
        every process, counted before the first backward with one all-reduce) and P the processes, whose gradients
        DDP and FSDP average. The step's gradient is then that of mean MLM loss over all N masked tokens plus mean
        pair loss over all S pairs: the same as one batch of all of them, whatever the split. Accumulating
        micro-batch means instead weighs a masked token of a micro-batch with few by more (short sequences,
        padding, n-gram spans): 4.5% off in gradient norm on a realistic batch of 32 split in 4.
    per_device: w = 1 / N_p and 1 / S_p, this process's own counts: the mean over the process's tokens, averaged
        over processes. That is the official code on TPUs, where each core's loss is the mean over its own shard
        and the cross-shard optimizer averages the cores' gradients.
    """
    device = micro_batches[0]["input_ids"].device
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for batch in micro_batches:
        if batch.get("labels") is not None:
            counts[0] += masked_count(batch)
        if batch.get("sentence_order_label") is not None:
            counts[1] += batch["sentence_order_label"].numel()
    scale = 1.0
    if normalization == "global":
        counts, scale = accelerator.reduce(counts, "sum"), accelerator.num_processes
    return scale / counts.clamp(min=1)


def weighted_loss(outputs, batch, weights: torch.Tensor) -> torch.Tensor:
    """A micro-batch's share of the step's loss (`loss_weights`), from the means the model computed."""
    loss = outputs.sop_logits.new_zeros(())
    if outputs.mlm_loss is not None:
        loss = loss + outputs.mlm_loss * (masked_count(batch) * weights[0]).to(loss.dtype)
    if outputs.sop_loss is not None:
        loss = loss + outputs.sop_loss * (batch["sentence_order_label"].numel() * weights[1]).to(loss.dtype)
    return loss


def training_step(model, micro_batches, optimizer, scheduler, accelerator, max_grad_norm,
                  normalization: str = "global") -> torch.Tensor:
    """One optimizer step over its micro-batches: forward and backward of each (the processes' gradients are
    synchronised on the last one only), then clipping and the update. Returns the six counts of `step_counts`,
    summed over the micro-batches.

    Under fp16 the grad scaler skips an update whose gradients overflowed (the weights are left untouched);
    the schedule then does not advance either, as in transformers' Trainer.
    """
    weights = loss_weights(micro_batches, accelerator, normalization)
    counts = 0
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else accelerator.no_sync(model):
            with accelerator.autocast():
                outputs = model(**batch)
            accelerator.backward(weighted_loss(outputs, batch, weights))
        counts = counts + step_counts(outputs, batch)
        del outputs  # a micro-batch's logits are not kept while the next one runs
    if max_grad_norm:
        accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)  # global norm, after unscaling
    optimizer.step()
    if not accelerator.optimizer_step_was_skipped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return counts


def enable_cpu_fp16(accelerator):
    """accelerate silently trains in fp32 when asked for fp16 on a CPU; torch has CPU fp16 autocast and loss
    scaling, so turn them on (slow: CPUs have no fp16 matmul units; use bf16 for speed, fp16 for parity with GPU
    runs). This sets two attributes of the Accelerator before `prepare`; tests/test_pretraining.py checks it."""
    accelerator.native_amp = True
    accelerator.scaler = torch.amp.GradScaler("cpu")


def main(argv=None):
    """Exits with status PREEMPTED (75) when a stop signal ended the run early, after its checkpoint."""
    args = parse_args(argv)
    if args.preprocess_only:
        return preprocess(args)
    run = prepare(args)
    # From the first step on, SIGTERM / SIGINT / SIGUSR1 end the run at a step boundary with a checkpoint; during
    # the final save they are noted and the save completes.
    with StopOnSignal() as stop:
        outcome = fit(run, stop)
        if outcome.stopped_by is None:
            finish(run, outcome.eval_metrics, outcome.steps)
        accelerator = run.accelerator
        del run  # its model and optimizer hold the process group: dropped, so that end_distributed can free it
        end_distributed(accelerator)
        if outcome.stopped_by is not None:
            if accelerator.is_main_process:
                print(f"Stopped by {outcome.stopped_by} after step {outcome.steps} of {args.max_train_steps}: the "
                      f"full training state is in {outcome.checkpoint}. To continue, run the same command with "
                      "--resume_from_checkpoint latest", file=sys.stderr, flush=True)
            raise SystemExit(PREEMPTED)
    return outcome.eval_metrics


def where_trained(hardware: Hardware, precision: Precision, num_processes: int) -> dict:
    """The hardware and precision of the run, for all_results.json and the model card."""
    return {"hardware": hardware.describe() + (f", {num_processes} processes" if num_processes > 1 else ""),
            "fast_precisions": ", ".join(hardware.fast_precisions), "mixed_precision": precision.mixed_precision,
            "precision": precision.describe()}


def save_final_model(model, tokenizer, output_dir: Path, args, eval_metrics, global_batch, num_processes,
                     curves: bool = False, where: dict | None = None):
    """Weights, tokenizer, remote code, model card: written into a temporary folder, then moved into place.
    `where` (hardware and precision, `where_trained`) goes into all_results.json and the card."""
    tmp = output_dir / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    write_json(tmp / "all_results.json", {**eval_metrics, **(where or {})})
    write_pretraining_card(tmp, model, args, global_batch, num_processes, curves,  # metrics: all_results.json
                           where=where)
    for path in tmp.iterdir():
        os.replace(path, output_dir / path.name)
    tmp.rmdir()


class _DropTiedWeightsNotice(logging.Filter):
    # accelerate's save_state warns that it dropped the tied decoder weights; they are re-tied on load.
    def filter(self, record):
        return "Removed shared tensor" not in record.getMessage()


def start_logging(main_process: bool):
    """Our log lines with timestamps (INFO on the main process, warnings only on the others), libraries quieter."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if main_process else logging.WARNING)
    quiet_library_logs()


def clear_earlier_run(output_dir: Path):
    """--overwrite_output_dir: what an earlier run wrote into output_dir is deleted, and logged."""
    cleared = clear_previous_run(output_dir)
    if cleared:
        logger.info("--overwrite_output_dir: deleted the earlier run's %s", ", ".join(cleared))


def quiet_library_logs():
    """Keep the console to our progress and results: accelerate's per-file checkpoint notices go to WARNING."""
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").addFilter(_DropTiedWeightsNotice())
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()


def _format_value(value):
    return f"{value:.4f}" if isinstance(value, float) else value


def _format(metrics: dict) -> str:
    return ", ".join(f"{k}={_format_value(v)}" for k, v in metrics.items())


if __name__ == "__main__":
    run_entry_point(main)
