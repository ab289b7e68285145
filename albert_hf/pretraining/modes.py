"""The modes of run_pretraining.py besides training, and the search one run makes before it trains:
`--preprocess_only` (`preprocess`: the pairs into a folder), `--dry_run` (`dry_run`: the plan, nothing written) and
`--auto_find_batch_size` (`auto_micro_batch`: the micro-batch every process can run)."""

import dataclasses
import os
from pathlib import Path

import torch
import transformers
from accelerate.utils import DistributedType, set_seed

from ..configuration_albert_hf import AlbertHFConfig
from ..errors import InputError, first_line
from ..hub.loading import loading
from ..runtime.cli import is_first_process
from ..runtime.preemption import at_stage
from . import prepared_data
from .arguments import PretrainingArguments
from .checkpoints import clear_earlier_run
from .flags import hardware_and_precision
from .inputs import build_data
from .log import start_logging
from .plan import find_micro_batch, plan_lines


def preprocess(args: PretrainingArguments):
    """--preprocess_only: the tokenizer and the pairs into --output_dir (prepared_data.py), nothing trained."""
    if args.processes > 1:
        raise InputError("--preprocess_only runs in one process: start it with python, not accelerate launch")
    start_logging(main_process=True)
    set_seed(args.optimization.seed)
    output_dir = Path(args.output.output_dir)
    if args.output.overwrite_output_dir:
        clear_earlier_run(output_dir)
    data = build_data(args.data, args.objective.task, args.optimization.seed, args.model.model_name_or_path)
    at_stage(f"writing the prepared pairs to {output_dir}")
    manifest = prepared_data.save(data, output_dir, args.flat())
    print(f"\nPrepared {manifest['train_pairs']:,} training and {manifest.get('validation_pairs', 0):,} held-out "
          f"pairs in {output_dir}. Train on them with: run_pretraining.py --prepared_data {output_dir} ...")


def planned_config(args: PretrainingArguments) -> AlbertHFConfig:
    """The config of the model the run will train, before its tokenizer is built: the vocabulary of
    --model_name_or_path, --tokenizer_name or --prepared_data, or --vocab_size for one still to be trained."""
    vocab = args.config.vocab_size
    if not args.model.model_name_or_path:
        if args.data.tokenizer_name:
            with loading("--tokenizer_name", args.data.tokenizer_name):
                vocab = len(transformers.AutoTokenizer.from_pretrained(args.data.tokenizer_name))
        elif args.data.prepared_data:
            vocab = prepared_data.read_manifest(args.data.prepared_data)["tokenizer_size"]
        else:
            vocab = args.data.vocab_size
    return AlbertHFConfig(**{**args.config.to_diff_dict(), "vocab_size": vocab})


def auto_micro_batch(args: PretrainingArguments, accelerator, precision) -> tuple[PretrainingArguments, list[str]]:
    """--auto_find_batch_size: the micro-batch every process can run (`plan.find_micro_batch`, the smallest
    process's answer), with the accumulation that keeps the global batch; the start line's note."""
    optimization = args.optimization
    if accelerator.is_fsdp2 or accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise InputError("--auto_find_batch_size measures the unsharded model's step, not an FSDP or DeepSpeed "
                         "shard's: pass --auto_find_batch_size false (after a recipe file) and a "
                         "--per_device_train_batch_size")
    processes = accelerator.num_processes
    total = optimization.global_batch_size or (
        optimization.per_device_train_batch_size * optimization.gradient_accumulation_steps * processes)
    size, refused = find_micro_batch(
        planned_config(args), optimization.per_device_train_batch_size, total // processes,
        args.data.max_seq_length, args.objective.max_predictions_per_seq, optimization, accelerator.device,
        precision.autocast_dtype, args.model.gradient_checkpointing)
    size = int(accelerator.gather(torch.tensor([size], device=accelerator.device)).min())
    found = dataclasses.replace(optimization, per_device_train_batch_size=size,
                                gradient_accumulation_steps=total // (processes * size))
    note = (f"--auto_find_batch_size: micro-batch {size} x {found.gradient_accumulation_steps} accumulation"
            + (f" ({', '.join(refused)} did not fit)" if refused else ""))
    return dataclasses.replace(args, optimization=found), [note]


def dry_run(args: PretrainingArguments) -> dict:
    """--dry_run: the plan (plan.py) of this run's model, micro-batch, precision and processes on this process's
    device; printed by the first process. Returns its numbers."""
    optimization = args.optimization
    hardware, precision = hardware_and_precision(optimization)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if hardware.device == "cuda" else "cpu"
    try:
        config, unknown = planned_config(args), None
    except InputError as error:  # a tokenizer out of reach here (offline): the plan goes on with the config's
        config, unknown = args.config, first_line(error)
    lines, numbers = plan_lines(
        config, micro_batch=optimization.per_device_train_batch_size,
        accumulation=optimization.gradient_accumulation_steps, processes=args.processes,
        seq=args.data.max_seq_length, masked=args.objective.max_predictions_per_seq,
        max_train_steps=optimization.max_train_steps, optimization=optimization, device=device,
        autocast_dtype=precision.autocast_dtype, checkpointing=args.model.gradient_checkpointing,
        where=f"{hardware.describe()}; {precision.describe()}")
    if unknown:
        lines.insert(2, f"  vocabulary: the config's ({config.vocab_size:,}); the tokenizer's is unknown here: "
                        f"{unknown}")
    if is_first_process():
        print("\n".join(lines), flush=True)
    return numbers
