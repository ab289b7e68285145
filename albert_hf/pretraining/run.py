"""The pretraining job's object, `Run`, and how it is built: `setup` (the machine's plan, the accelerator, the output
folder) then `prepare` (the inputs: data/inputs.py; the model and optimizer: training/model.py; the checkpoints; all
prepared by accelerate; the start line). job.py runs it (`fit`: training/loop.py) and saves it (`finish`)."""

import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import AutocastKwargs, DataLoaderConfiguration, DistributedType, ProjectConfiguration, set_seed
from torch.utils.data import DataLoader

from ..errors import InputError
from ..flops import training_flops_per_token
from ..runtime.distributed import FsdpRequest, check_deepspeed, describe, make_accelerator
from ..runtime.hardware import Hardware, Precision, attention_kernel, enable_cpu_fp16, mfu_peak
from ..runtime.preemption import at_stage
from ..runtime.storage import check_free_space
from ..runtime.throughput import Throughput
from .arguments import OutputArgs, PretrainingArguments
from .data.collator import DataCollatorForAlbertPretraining, masking_budget
from .data.inputs import build_inputs
from .data.mixed_pairs import MixedPairs, MixedStream, start_lines
from .data.mixture import Mix, held_out_lines
from .data.vocabulary import VocabularyExtension
from .machine import MachinePlan
from .output.checkpoints import StepCheckpoints, remove_partial
from .output.final_folder import save_final_model, where_trained
from .output.folder import clear_earlier_run
from .output.hub_push import HubPush
from .output.loadable import ModelFiles
from .output.log import start_logging, start_tracking
from .output.pretraining_card import CardFacts, card_run
from .plan import auto_micro_batch, batch_split
from .resolution import choose_step, hardware_and_precision
from .schedule import SchedulePlan
from .training import step_graph
from .training.model import build_run_model, make_optimizer, planned_weight_bytes
from .training.state import TrainingState
from .training.step_graph import StepGraph

logger = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything `prepare` builds, which `fit` trains and `finish` saves."""

    args: PretrainingArguments  # as parsed
    plan: MachinePlan  # what the machine decided: the step, the micro-batch, the precision
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
    throughput: Throughput  # the model FLOPs per token and the peak of the logged rates and MFU
    step_graph: StepGraph | None = None  # --torch_compile_mode whole-step-graph
    hub: HubPush | None = None  # --push_to_hub
    mix: Mix | None = None  # a mixed run's sources (--sources)
    vocabulary: VocabularyExtension | None = None  # --extend_vocabulary's new pieces

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output.output_dir)

    def write_model_folder(self, model, folder: Path, metrics: dict, cost: dict, curves: bool = False) -> None:
        """A loadable model folder of this run, with its card and results (output/final_folder.py): the final
        folder, and each checkpoint --hub_strategy pushes, alike."""
        processes = self.accelerator.num_processes
        where = where_trained(self.plan.hardware, self.plan.precision, processes)
        save_final_model(
            model,
            self.tokenizer,
            folder,
            self.card(),
            metrics,
            self.global_batch,
            processes,
            curves=curves,
            where=where,
            cost=cost,
        )

    def push_checkpoint(self, path: Path, state: TrainingState, saved: dict, model) -> None:
        """--hub_strategy's upload of checkpoint `path` (its record written first), with the model folder of `model`
        (gathered, or None: the state alone) whose all_results.json names the step, the tokens and, for a mix, the
        sources' counts (the closed windows' and the open one's): run_checkpoint_evals.py reads them."""
        self.checkpoints.wait_for_record()  # uploaded with the state
        if model is None:
            return
        tokens = saved["run_tokens"] + saved["window_tokens"]
        cost = self.throughput.summary(state.step, tokens, saved["run_seconds"] + saved["window_seconds"])
        if self.mix is not None:
            counts = {name: [a + b for a, b in zip(c["run"], c["window"])] for name, c in saved["sources"].items()}
            cost |= self.mix_summary(counts, state)
        self.hub.push_checkpoint(
            state.step, path, lambda folder: self.write_model_folder(model, folder, self.hub.latest_eval, cost)
        )

    def mix_summary(self, counts: dict, state: TrainingState) -> dict:
        """A mixed run's per-source fields of all_results.json and the card (source_<name>_*): its weight now, pairs
        and tokens trained on (`counts`: name -> [tokens, pairs]), its share of the pairs and its epochs."""
        total = sum(pairs for _, pairs in counts.values())
        weights = self.mixed.plan.segments[-1].weights
        epochs = self.mixed.plan.epochs(self.pairs_drawn(state))
        summary = {}
        for name, (tokens, pairs) in counts.items():
            summary |= {
                f"source_{name}_weight": weights.get(name, 0.0),
                f"source_{name}_pairs": int(pairs),
                f"source_{name}_tokens": int(tokens),
                f"source_{name}_share": pairs / total if total else 0.0,
            }
            if epochs.get(name) is not None:
                summary[f"source_{name}_epochs"] = epochs[name]
        return summary

    def card(self) -> CardFacts:
        """What the model card of a checkpoint or of the final folder says of the run."""
        parsed = self.args
        return card_run(
            parsed.model,
            parsed.data,
            parsed.objective,
            parsed.optimization,
            parsed.output,
            parsed.sources,
            self.plan,
            parsed.schedule.card_line(),
        )

    @property
    def stream(self) -> datasets.IterableDataset | MixedStream | None:
        """The process's own endless stream of training pairs under --streaming (its position is checkpointed)."""
        dataset = self.train_dataloader.dataset
        return dataset if isinstance(dataset, (datasets.IterableDataset, MixedStream)) else None

    @property
    def mixed(self) -> MixedPairs | MixedStream | None:
        """A mixed run's training pairs, whose plan (data/mixture.py) a checkpoint saves."""
        dataset = self.train_dataloader.dataset
        return dataset if isinstance(dataset, (MixedPairs, MixedStream)) else None

    def pairs_drawn(self, state: TrainingState) -> int:
        """A mixed run's position: the run's pairs drawn (a stream's: this process's)."""
        if isinstance(self.mixed, MixedStream):
            return self.mixed.draws
        micro = self.plan.micro_batch
        return self.mixed.first + state.batches_in_epoch * micro * self.accelerator.num_processes


@dataclass
class Setup:
    """What `setup` decides before the inputs are built."""

    plan: MachinePlan  # the step, the micro-batch and the precision this machine gets
    accelerator: Accelerator
    fsdp_request: FsdpRequest | None  # what an FSDP launch asked for, applied when the model is built
    notes: list[str]  # for the start line


def setup(args: PretrainingArguments) -> Setup:
    """The hardware, the precision, the step and the accelerator (in the mode the launcher asked for) with its FSDP
    request, the output folder (an earlier run cleared with --overwrite_output_dir, partial checkpoints removed),
    and with --auto_find_batch_size the micro-batch found: a `MachinePlan`, the arguments left as parsed."""
    optimization, output = args.optimization, args.output
    hardware, precision = hardware_and_precision(optimization)
    compiled, mode, notes = choose_step(args, hardware, precision)  # before the accelerator: a graph changes autocast
    graphed = mode == step_graph.MODE
    accelerator, fsdp_request = make_accelerator(
        mixed_precision=precision.mixed_precision,  # accumulation is ours (fit, training_step), not accelerate's
        log_with=output.report_to if output.with_tracking else None,
        project_config=ProjectConfiguration(project_dir=output.output_dir, logging_dir=f"{output.output_dir}/runs"),
        # batches are copied to a GPU from pinned memory without waiting (DataLoader's pin_memory)
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=torch.cuda.is_available()),
        # a captured step must not reuse weights cast during the capture (torch.cuda.graphs' rule for autocast)
        kwargs_handlers=[AutocastKwargs(cache_enabled=False)] if graphed else None,
    )
    start_logging(accelerator.is_main_process)
    if graphed:
        reason = step_graph.refusal(
            accelerator,
            args.model.gradient_checkpointing or (fsdp_request is not None and fsdp_request.activation_checkpointing),
        )
        if reason:
            raise InputError(reason)
    if precision.warning and accelerator.is_main_process:  # first, before the data is built: stop a slow run early
        logger.warning(precision.warning)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        check_deepspeed(optimization.gradient_accumulation_steps, optimization.optimizer)
    if accelerator.mixed_precision == "fp16" and accelerator.scaler is None:
        enable_cpu_fp16(accelerator)
    micro, accumulation = optimization.per_device_train_batch_size, optimization.gradient_accumulation_steps
    if optimization.auto_find_batch_size:  # before the seed: its trial steps draw random numbers
        micro, accumulation, batch_notes = auto_micro_batch(args, accelerator, precision)
        notes += batch_notes
    set_seed(optimization.seed)
    prepare_output_dir(args, accelerator)
    return Setup(
        MachinePlan(hardware, precision, compiled, mode, micro, accumulation), accelerator, fsdp_request, notes
    )


def prepare_output_dir(args: PretrainingArguments, accelerator: Accelerator) -> None:
    """--output_dir made (an earlier run cleared with --overwrite_output_dir, partial checkpoints removed), with room
    for one checkpoint (the weights and the optimizer's two moments), or without checkpoints for the final model,
    estimated from the config the run will build before the corpus is read."""
    output = args.output
    output_dir = Path(output.output_dir)
    if output.overwrite_output_dir and accelerator.is_main_process:
        clear_earlier_run(output_dir)
    accelerator.wait_for_everyone()
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_partial(output_dir, accelerator)
    weights = planned_weight_bytes(args.config, None if args.model.model_name_or_path else args.data.vocab_size)
    needed, what = (3 * weights, "one checkpoint") if output.checkpointing_steps else (weights, "the final model")
    check_free_space(output_dir, needed, what, "--output_dir")


def prepare(args: PretrainingArguments) -> Run:
    """`setup`, the inputs (pretraining/data/inputs.py), the model (sharded under FSDP), the optimizer and the schedule,
    all prepared by accelerate; logs the start line."""
    ready = setup(args)
    plan, accelerator = ready.plan, ready.accelerator
    inputs = build_inputs(
        args.data,
        args.objective,
        accelerator,
        seed=args.optimization.seed,
        model_name_or_path=args.model.model_name_or_path,
        adopted=args.adopted,
        batch_sizes=(plan.micro_batch, args.output.per_device_eval_batch_size),
        sources=args.sources,
        accumulation=plan.accumulation,
        max_train_steps=args.optimization.max_train_steps,
    )
    model, notes, throughput = built_model(args, ready, inputs)
    optimizer = make_optimizer(model, args.optimization)
    # The schedule counts optimizer steps; it is stepped by hand (not prepared), once per update, so that it
    # follows its formula whatever the number of processes.
    scheduler = args.schedule.make(optimizer)
    checkpoints = step_checkpoints(
        args.output, accelerator, accelerator.unwrap_model(model), inputs.tokenizer, scheduler, args.schedule
    )
    model, optimizer, train_dataloader, eval_dataloader = prepared(accelerator, model, optimizer, inputs)
    num_parameters = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
    global_batch = log_start(args, plan, accelerator, model, num_parameters, notes)
    graph = (
        step_graph.StepGraph(
            model, optimizer, accelerator, args.optimization.max_grad_norm, args.optimization.loss_normalization
        )
        if plan.compile_mode == step_graph.MODE
        else None
    )
    hub = (
        HubPush(args.output, Path(args.output.output_dir), accelerator.is_main_process)
        if args.output.push_to_hub
        else None
    )
    log_mix(inputs.mix, train_dataloader.dataset, args.optimization.max_train_steps, global_batch)
    return Run(
        args=args,
        plan=plan,
        accelerator=accelerator,
        tokenizer=inputs.tokenizer,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        collate=inputs.collate,
        train_dataloader=train_dataloader,
        eval_dataloader=eval_dataloader,
        eval_documents=inputs.eval_documents,
        checkpoints=checkpoints,
        num_parameters=num_parameters,
        global_batch=global_batch,
        throughput=throughput,
        step_graph=graph,
        hub=hub,
        mix=inputs.mix,
        vocabulary=inputs.vocabulary,
    )


def built_model(args: PretrainingArguments, ready: Setup, inputs) -> tuple:
    """The run's model (training/model.py, on `ready`'s plan), the start line's notes so far, and its `Throughput`
    (the model FLOPs a token and the peak MFU is measured against)."""
    plan, accelerator, fsdp_request = ready.plan, ready.accelerator, ready.fsdp_request
    at_stage("building the model")
    model, model_notes = build_run_model(
        args.model,
        args.config,
        args.objective.task,
        inputs.tokenizer,
        accelerator,
        fsdp_request,
        args.optimization.num_warmup_steps,
        inputs.vocabulary,
        compile=plan.compile,
        compile_mode=plan.compile_mode,
    )
    notes = [*ready.notes, *(fsdp_request.notes if fsdp_request is not None else ()), *inputs.notes]
    if args.schedule.kind != "official":  # the default schedule goes unsaid (--dry_run draws it)
        notes.append(args.schedule.describe())
    if args.objective.task == "none":
        notes.append("--task none: the pooler and the sentence-order head are frozen (no loss trains them)")
    notes += model_notes
    config, dtype = accelerator.unwrap_model(model).config, plan.precision.autocast_dtype or torch.float32
    throughput, peak_note = run_throughput(args, config, accelerator, plan.hardware, plan.precision)
    notes += [attention_kernel(config, accelerator.device, dtype, args.data.max_seq_length), peak_note]
    return model, notes, throughput


def prepared(accelerator: Accelerator, model, optimizer, inputs) -> tuple:
    """The model, the optimizer and the loaders prepared by accelerate: (model, optimizer, training loader, held-out
    loader or None)."""
    train_dataloader, eval_dataloader = inputs.train_dataloader, inputs.eval_dataloader
    if isinstance(train_dataloader.dataset, (datasets.IterableDataset, torch.utils.data.IterableDataset)):
        # Each process already streams its own pairs (build_data): accelerate would split them again, or have the
        # first process read for all. Not prepared, the loader is iterated in this process, no batch ahead, so
        # its dataset's state_dict() is the position after the last batch taken (saved with each checkpoint).
        model, optimizer = accelerator.prepare(model, optimizer)
    else:
        model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    if eval_dataloader is not None:
        eval_dataloader = accelerator.prepare(eval_dataloader)
    return model, optimizer, train_dataloader, eval_dataloader


def log_start(
    args: PretrainingArguments,
    plan: MachinePlan,
    accelerator: Accelerator,
    model,
    num_parameters: int,
    notes: list[str],
) -> int:
    """The start line (the trackers started with the arguments first); returns the global batch."""
    optimization = args.optimization
    global_batch = plan.global_batch(accelerator.num_processes)
    if optimization.global_batch_size not in (None, global_batch):  # split for the launch's WORLD_SIZE
        raise InputError(
            f"--global_batch_size {optimization.global_batch_size} was split for {args.processes} "
            f"processes, but the run has {accelerator.num_processes}"
        )
    if args.output.with_tracking:
        start_tracking(accelerator, args.output.report_to, args.flat())
    logger.info(
        "%s parameters; %s, %d tokens each; %d steps; %s; %s%s",
        f"{num_parameters:,}",
        batch_split(global_batch, accelerator.num_processes, plan.micro_batch, plan.accumulation),
        args.data.max_seq_length,
        optimization.max_train_steps,
        describe(accelerator, model, plan.hardware),
        plan.precision.describe(),
        "".join(f"; {note}" for note in notes),
    )
    return global_batch


def log_mix(mix, dataset, max_train_steps: int, global_batch: int) -> None:
    """The start line of a mixed run's sources (`mix`; None: one corpus, no line): each one's weight, size, pairs
    drawn over the run and epochs."""
    if mix is None:
        return
    apart = f" (and {len(mix.held_out_only)} held out only)" if mix.held_out_only else ""
    logger.info(
        "Mixing %d source%s%s, weights %s: %s",
        len(mix.names),
        "s" * (len(mix.names) > 1),
        apart,
        mix.weighting,
        "; ".join(start_lines(dataset, max_train_steps, global_batch) + held_out_lines(mix)),
    )


def step_checkpoints(
    output: OutputArgs, accelerator: Accelerator, model, tokenizer, scheduler, schedule: SchedulePlan
) -> StepCheckpoints:
    """The run's step_N checkpoints: with the schedule they save (its position and its plan), their size (the
    weights and the optimizer's two moments, for the line a failed write gives) and, on the main process, the files
    that make each one loadable as a model (pretraining/output/loadable.py)."""
    model_files = (
        ModelFiles(Path(output.output_dir), model, tokenizer)
        if output.checkpointing_steps and accelerator.is_main_process
        else None
    )
    return StepCheckpoints(
        output.output_dir,
        accelerator,
        output.checkpoints_total_limit,
        schedule=scheduler,
        schedule_plan=schedule.record(),
        model_files=model_files,
        expected_bytes=3 * sum(p.numel() * p.element_size() for p in model.parameters()),
    )


def run_throughput(
    args: PretrainingArguments, config, accelerator: Accelerator, hardware: Hardware, precision: Precision
) -> tuple[Throughput, str]:
    """The model FLOPs per token of this run's step (a full-length sequence with its masking budget of predicted
    positions) and the peak its MFU is measured against, with the start line's note naming both (and, under
    DeepSpeed, that the rows have no gradient norm)."""
    length, objective = args.data.max_seq_length, args.objective
    predicted = int(masking_budget(length, objective.mlm_probability, objective.max_predictions_per_seq))
    flops = training_flops_per_token(config, length, predicted)
    peak, note = mfu_peak(hardware, precision, args.output.peak_tflops)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        note += "; no grad_norm in the logged rows: DeepSpeed clips inside its engine and does not return the norm"
    return Throughput(flops, accelerator.num_processes, peak), (
        f"{flops / 1e6:.4g} model MFLOPs a token ({predicted} of {length} predicted); {note}"
    )
