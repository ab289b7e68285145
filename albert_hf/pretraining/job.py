"""The pretraining job behind `run_pretraining.py`: accelerate, LAMB, exact resume, evaluation, Hub push.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 ...
    python run_pretraining.py            # a tiny ALBERT on the embedded corpus, a few minutes on a laptop CPU
    python run_pretraining.py recipes/demo.yaml  # the arguments from a file (.json or .yaml; recipes/ has some)

`main` = `parse_args` (the flags resolved and checked: resolution.py) -> `prepare` (`setup`: accelerator and
output folder; the inputs: data/inputs.py; the model and optimizer: training/model.py) -> `fit` (training/loop.py:
the loop over a `TrainingState`, one optimizer step at a time in training/step.py) -> `finish` (the final folder:
output/final_folder.py; the summary, the push). This module builds the whole job (`Run`) and saves it, loop.py
trains it; only these two see it, the modules below take explicit arguments. --preprocess_only is `preprocess`
here; --dry_run and --auto_find_batch_size's search are in plan.py.

Loop (training/loop.py): MLM + SOP loss (their plain sum), LAMB with the official poly-decay schedule, global
clipping at 1.0, gradient accumulation, bf16/fp16 through accelerate. Every `--checkpointing_steps` the full state
(model, optimizer, scheduler, RNGs, data position) goes atomically into `OUTPUT_DIR/step_N`
(output/checkpoints.py); `--resume_from_checkpoint latest` continues exactly where the last complete checkpoint left
off.
"""

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from accelerate import Accelerator
from accelerate.utils import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedType,
    ProjectConfiguration,
    set_seed,
)
from transformers import AutoModel

from ..errors import InputError, NothingProduced
from ..flops import training_flops_per_token
from ..optimization import get_official_schedule
from ..reports.baselines import heldout_baselines, with_baselines
from ..reports.curves import CURVES_FILE, pretraining_curves
from ..reports.fill_mask import format_fill_mask
from ..runtime import output_lock
from ..runtime.cli import is_first_process, run_entry_point
from ..runtime.distributed import (
    FsdpRequest,
    check_deepspeed,
    describe,
    end_distributed,
    gather_full_model,
    make_accelerator,
)
from ..runtime.hardware import (
    Hardware,
    Precision,
    attention_kernel,
    enable_cpu_fp16,
    mfu_peak,
)
from ..runtime.preemption import PREEMPTED, StopOnSignal, at_stage
from ..runtime.storage import StorageError, agreed, check_free_space, fault_line, refused
from ..runtime.throughput import Throughput, cost_rows
from .arguments import OutputArgs, PretrainingArguments
from .data import prepared_data
from .data.collator import masking_budget
from .data.inputs import build_data, build_inputs, build_mixed_data
from .data.mixture import held_out_lines, start_lines
from .output.card import card_run, source_rows
from .output.checkpoints import FILL_MASK_FILE, StepCheckpoints, remove_partial
from .output.final_folder import held_out_fill_mask, save_final_model, where_trained
from .output.folder import clear_earlier_run
from .output.hub_push import HubPush
from .output.loadable import ModelFiles
from .output.log import format_value, start_logging, start_tracking
from .plan import auto_micro_batch, batch_split, dry_run
from .resolution import choose_step, hardware_and_precision, parse_args
from .training import step_graph
from .training.divergence import check_weights
from .training.evaluation import since_start
from .training.loop import Run, current_lr, fit, metrics_log, newest_checkpoint
from .training.model import build_run_model, make_optimizer, planned_weight_bytes

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# The job: setup -> prepare (here) -> fit (loop.py) -> finish (here)


@dataclass
class Setup:
    """What `setup` decides before the inputs are built."""

    args: PretrainingArguments  # with the step and the micro-batch chosen for this machine
    hardware: Hardware
    precision: Precision
    accelerator: Accelerator
    fsdp_request: FsdpRequest | None  # what an FSDP launch asked for, applied when the model is built
    notes: list[str]  # for the start line


def setup(args: PretrainingArguments) -> Setup:
    """The hardware, the precision, the accelerator (in the mode the launcher asked for) and its FSDP request, the
    output folder (an earlier run cleared with --overwrite_output_dir, partial checkpoints removed), and with
    --auto_find_batch_size the micro-batch found."""
    optimization, output = args.optimization, args.output
    hardware, precision = hardware_and_precision(optimization)
    args, notes = choose_step(args, hardware, precision)  # before the accelerator: a captured step changes autocast
    graphed = args.model.torch_compile_mode == step_graph.MODE
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
        reason = step_graph.refusal(accelerator, args.model.gradient_checkpointing or (
            fsdp_request is not None and fsdp_request.activation_checkpointing))
        if reason:
            raise InputError(reason)
    if precision.warning and accelerator.is_main_process:  # first, before the data is built: stop a slow run early
        logger.warning(precision.warning)
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        check_deepspeed(optimization.gradient_accumulation_steps, optimization.optimizer)
    if accelerator.mixed_precision == "fp16" and accelerator.scaler is None:
        enable_cpu_fp16(accelerator)
    if optimization.auto_find_batch_size:  # before the seed: its trial steps draw random numbers
        args, batch_notes = auto_micro_batch(args, accelerator, precision)
        notes += batch_notes
    set_seed(optimization.seed)
    output_dir = Path(output.output_dir)
    if output.overwrite_output_dir and accelerator.is_main_process:
        clear_earlier_run(output_dir)
    accelerator.wait_for_everyone()
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_partial(output_dir, accelerator)
    # Before the corpus is read: room for one checkpoint (the weights and the optimizer's two moments), or without
    # checkpoints for the final model, estimated from the config the run will build.
    weights = planned_weight_bytes(args.config, None if args.model.model_name_or_path else args.data.vocab_size)
    needed, what = (3 * weights, "one checkpoint") if output.checkpointing_steps else (weights, "the final model")
    check_free_space(output_dir, needed, what, "--output_dir")
    return Setup(args, hardware, precision, accelerator, fsdp_request, notes)


def prepare(args: PretrainingArguments) -> Run:
    """`setup`, the inputs (pretraining/data/inputs.py), the model (sharded under FSDP), the optimizer and the schedule,
    all prepared by accelerate; logs the start line."""
    ready = setup(args)
    args, accelerator, fsdp_request = ready.args, ready.accelerator, ready.fsdp_request
    inputs = build_inputs(args.data, args.objective, accelerator, seed=args.optimization.seed,
                          model_name_or_path=args.model.model_name_or_path, adopted=args.adopted,
                          batch_sizes=(args.optimization.per_device_train_batch_size,
                                       args.output.per_device_eval_batch_size), sources=args.sources,
                          accumulation=args.optimization.gradient_accumulation_steps,
                          max_train_steps=args.optimization.max_train_steps)
    at_stage("building the model")
    model, model_notes = build_run_model(args.model, args.config, args.objective.task, inputs.tokenizer, accelerator,
                                         fsdp_request, args.optimization.num_warmup_steps, inputs.vocabulary)
    notes = [*ready.notes, *(fsdp_request.notes if fsdp_request is not None else ()), *inputs.notes]
    if args.objective.task == "none":
        notes.append("--task none: the pooler and the sentence-order head are frozen (no loss trains them)")
    notes += model_notes
    config, dtype = accelerator.unwrap_model(model).config, ready.precision.autocast_dtype or torch.float32
    throughput, peak_note = run_throughput(args, config, accelerator, ready.hardware, ready.precision)
    notes += [attention_kernel(config, accelerator.device, dtype, args.data.max_seq_length), peak_note]
    optimizer = make_optimizer(model, args.optimization)
    # The schedule counts optimizer steps; it is stepped by hand (not prepared), once per update, so that it
    # follows the official formula whatever the number of processes.
    scheduler = get_official_schedule(optimizer, args.optimization.num_warmup_steps, args.optimization.max_train_steps)
    checkpoints = step_checkpoints(args.output, accelerator, accelerator.unwrap_model(model), inputs.tokenizer,
                                   scheduler)
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

    num_parameters = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
    optimization = args.optimization
    global_batch = (optimization.per_device_train_batch_size * optimization.gradient_accumulation_steps
                    * accelerator.num_processes)
    if optimization.global_batch_size not in (None, global_batch):  # split for the launch's WORLD_SIZE
        raise InputError(f"--global_batch_size {optimization.global_batch_size} was split for {args.processes} "
                         f"processes, but the run has {accelerator.num_processes}")
    if args.output.with_tracking:
        start_tracking(accelerator, args.output.report_to, args.flat())
    logger.info("%s parameters; %s, %d tokens each; %d steps; %s; %s%s", f"{num_parameters:,}",
                batch_split(global_batch, accelerator.num_processes, optimization.per_device_train_batch_size,
                            optimization.gradient_accumulation_steps),
                args.data.max_seq_length, optimization.max_train_steps,
                describe(accelerator, model, ready.hardware), ready.precision.describe(),
                "".join(f"; {note}" for note in notes))
    graph = (step_graph.StepGraph(model, optimizer, accelerator, optimization.max_grad_norm,
                                         optimization.loss_normalization)
             if args.model.torch_compile_mode == step_graph.MODE else None)
    hub = (HubPush(args.output, Path(args.output.output_dir), accelerator.is_main_process)
           if args.output.push_to_hub else None)
    log_mix(inputs.mix, train_dataloader.dataset, optimization.max_train_steps, global_batch)
    return Run(args, accelerator, inputs.tokenizer, model, optimizer, scheduler, inputs.collate,
               train_dataloader, eval_dataloader, inputs.eval_documents, checkpoints, num_parameters,
               global_batch, ready.hardware, ready.precision, throughput, graph, hub, inputs.mix, inputs.vocabulary)


def log_mix(mix, dataset, max_train_steps: int, global_batch: int) -> None:
    """The start line of a mixed run's sources (`mix`; None: one corpus, no line): each one's weight, size, pairs
    drawn over the run and epochs."""
    if mix is None:
        return
    apart = f" (and {len(mix.held_out_only)} held out only)" if mix.held_out_only else ""
    logger.info("Mixing %d source%s%s, weights %s: %s", len(mix.names), "s" * (len(mix.names) > 1), apart,
                mix.weighting, "; ".join(start_lines(dataset, max_train_steps, global_batch) + held_out_lines(mix)))


def step_checkpoints(output: OutputArgs, accelerator: Accelerator, model, tokenizer, scheduler) -> StepCheckpoints:
    """The run's step_N checkpoints: with the schedule they save, their size (the weights and the optimizer's two
    moments, for the line a failed write gives) and, on the main process, the files that make each one loadable as
    a model (pretraining/output/loadable.py)."""
    model_files = (ModelFiles(Path(output.output_dir), model, tokenizer)
                   if output.checkpointing_steps and accelerator.is_main_process else None)
    return StepCheckpoints(output.output_dir, accelerator, output.checkpoints_total_limit, schedule=scheduler,
                           model_files=model_files,
                           expected_bytes=3 * sum(p.numel() * p.element_size() for p in model.parameters()))


def run_throughput(args: PretrainingArguments, config, accelerator: Accelerator, hardware: Hardware,
                   precision: Precision) -> tuple[Throughput, str]:
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
        f"{flops / 1e6:.4g} model MFLOPs a token ({predicted} of {length} predicted); {note}")


# ----------------------------------------------------------------------------------------------------------------
# After `fit` (loop.py): the final folder, the summary, the push


def finish(run: Run, eval_metrics: dict, completed_steps: int, cost: dict):
    """The final folder (weights gathered from every process, tokenizer, remote code, card, and the run's `cost`:
    its model FLOPs and mean MFU, runtime/throughput.py), reloaded with AutoModel as a check, the summary with
    fill-mask examples, and the Hub push."""
    accelerator, output_dir = run.accelerator, run.output_dir
    accelerator.wait_for_everyone()
    check_weights(run.model, accelerator, completed_steps, current_lr(run), lambda: newest_checkpoint(run),
                  "the final model folder")
    final = gather_full_model(accelerator, run.model)
    fault = None
    if accelerator.is_main_process:
        fault = refused(lambda: write_final_folder(run, final, eval_metrics, completed_steps, cost))
    fault = agreed(accelerator, fault, main_only=True)  # every process stops, none waits
    if fault is not None:
        raise StorageError(fault_line(fault, "the final model folder", output_dir, run.checkpoints.expected_bytes // 3,
                                    run.checkpoints.intact()))
    unpushed = None
    if accelerator.is_main_process and run.hub is not None:
        run.hub.wait("before the final folder")
        log = metrics_log(run)
        for row in run.hub.sent_rows():  # in the pushed metrics.jsonl too
            log.write(completed_steps, row)
        try:
            pushed, seconds = run.hub.push_final()
            print(f"  pushed: {pushed} ({seconds:.1f} s)")
        except NothingProduced as failure:  # raised once every process is past the barrier, none left waiting
            unpushed = failure
    accelerator.wait_for_everyone()
    if unpushed is not None:
        raise unpushed



def write_final_folder(run: Run, final, eval_metrics: dict, completed_steps: int, cost: dict):
    """On the main process, at the end (`finish`): the held-out baselines, the curves, the final folder
    (`save_final_model`, with the run's `cost`: `Throughput.totals`), reloaded with AutoModel as a check, and the
    summary with fill-mask examples."""
    accelerator, args, output_dir = run.accelerator, run.args, run.output_dir
    pair_task = args.objective.task if args.objective.task != "none" else None
    if run.eval_dataloader is not None and eval_metrics:
        # on the evaluation's own pairs and static masks (the unprepared dataset and collator)
        eval_metrics = {**eval_metrics, **heldout_baselines(
            run.eval_dataloader.dataset, run.eval_dataloader.collate_fn, len(run.tokenizer),
            run.tokenizer.all_special_ids, pair_task)}
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()
            ] if (output_dir / "metrics.jsonl").is_file() else []
    names = run.mix.held_out if run.mix is not None else ()  # those held out only too
    # a continued run's starting point (its step-0 evaluation), beside the end in all_results.json and the card
    start = next((row for row in rows if row["step"] == 0 and "eval_mlm_loss" in row), {})
    started = {f"{key}_step_0": value for key, value in start.items() if key.startswith("eval_")}
    curves = None
    if not args.output.no_plots:
        curves = pretraining_curves(rows, eval_metrics, output_dir / CURVES_FILE, pair_task, names)
    save_final_model(final, run.tokenizer, output_dir,
                     card_run(args.model, args.data, args.objective, args.optimization, args.output, args.sources),
                     {**eval_metrics, **started, **(run.vocabulary.results() if run.vocabulary else {})},
                     run.global_batch, accelerator.num_processes, curves=curves is not None,
                     where=where_trained(run.hardware, run.precision, accelerator.num_processes),
                     cost=cost)
    reloaded = AutoModel.from_pretrained(output_dir, trust_remote_code=True)
    summary = {"output_dir": str(output_dir), "parameters": run.num_parameters, "steps": completed_steps,
               "global_batch": run.global_batch, **cost_rows(cost),
               **source_rows(cost, run.mix.names if run.mix is not None else ()),
               "reloaded_with": f"AutoModel -> {type(reloaded).__name__}",
               **({"training_curves": str(curves)} if curves else {})}
    # after the save: the examples are a look at the saved model, not part of it (nor of all_results.json)
    examples = held_out_fill_mask(final, run.tokenizer, run.eval_documents, seed=args.optimization.seed,
                                  max_length=args.data.max_seq_length,
                                  sentence_per_line=args.data.layout == "sentence_per_line")
    if examples:
        (output_dir / FILL_MASK_FILE).write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n")
    print("\n".join(["", "Pretraining done."] + [f"  {k}: {format_value(v)}" for k, v in summary.items()]
                    + [f"  {k}: {text}" for k, text in with_baselines(eval_metrics)]
                    + (since_step_0(start, eval_metrics, names) if start and eval_metrics else [])
                    + format_fill_mask(examples)))


def since_step_0(start: dict, end: dict, names) -> list[str]:
    """The summary's lines of a continued run's change since step 0, overall and per source, and the sources whose
    held-out MLM accuracy fell (forgetting), named."""
    changes, forgot = since_start(start, end, names)
    lines = ["  since step 0 (the loaded model):"] + [f"    {line}" for line in changes]
    if forgot:
        lines.append(f"  forgetting: the held-out MLM accuracy of {', '.join(forgot)} fell since step 0")
    return lines



def main(argv=None):
    """Exits with status PREEMPTED (75) when a stop signal ended the run early, after its checkpoint; stops with one
    line when another run holds --output_dir."""
    args = parse_args(argv)
    if args.output.dry_run:  # nothing written, so no lock
        return dry_run(args)
    # one run per folder, from before anything is written or read (runtime/output_lock.py)
    with output_lock.held(args.output.output_dir, "--output_dir", args.output.take_over_lock, is_first_process()):
        return pretrain(args)


def preprocess(args: PretrainingArguments):
    """--preprocess_only: the tokenizer and the pairs into --output_dir (prepared_data.py), nothing trained."""
    if args.processes > 1:
        raise InputError("--preprocess_only runs in one process: start it with python, not accelerate launch")
    start_logging(main_process=True)
    set_seed(args.optimization.seed)
    output_dir = Path(args.output.output_dir)
    if args.output.overwrite_output_dir:
        clear_earlier_run(output_dir)
    if args.sources is not None:
        data = build_mixed_data(args.data, args.sources, args.objective.task, args.optimization.seed,
                                args.model.model_name_or_path)
    else:
        data = build_data(args.data, args.objective.task, args.optimization.seed, args.model.model_name_or_path)
    at_stage(f"writing the prepared pairs to {output_dir}")
    manifest = prepared_data.save(data, output_dir, args.flat(), args.sources)
    per_source = "".join(f"\n  {entry['name']}: {entry['train_pairs']:,} training pairs, {entry['train_tokens']:,} "
                         f"tokens, {entry.get('validation_pairs', 0):,} held-out pairs"
                         for entry in manifest.get("sources", ()))
    print(f"\nPrepared {manifest['train_pairs']:,} training and {manifest.get('validation_pairs', 0):,} held-out "
          f"pairs in {output_dir}. Train on them with: run_pretraining.py --prepared_data {output_dir} ...{per_source}")


def pretrain(args: PretrainingArguments) -> dict:
    """The job, once its folder is locked: prepare, fit, finish (or only the pairs, with --preprocess_only).

    SIGTERM / SIGINT / SIGUSR1 (runtime/preemption.py): before the first optimizer step they stop the run at once
    with a line naming the stage; from then on at a step boundary with a checkpoint; during the final save they are
    noted and the save completes."""
    with StopOnSignal("setting up") as stop:  # nested in run_entry_point's, which covers the arguments and the lock
        if args.data.preprocess_only:
            return preprocess(args)
        run = prepare(args)
        result = fit(run, stop)
        if result.stopped_by is None:
            cost = run.throughput.summary(result.steps, result.run_tokens, result.run_seconds) | result.sources
            finish(run, result.eval_metrics, result.steps, cost)
        elif run.hub is not None:  # the stop's checkpoint goes up before the process ends (--hub_strategy)
            run.hub.wait(f"{result.stopped_by} received: the checkpoint of step {result.steps} first")
        accelerator = run.accelerator
        del run  # its model and optimizer hold the process group: dropped, so that end_distributed can free it
        end_distributed(accelerator)
        if result.stopped_by is not None:
            if accelerator.is_main_process:
                # a recipe that clears the folder (the demo's) would refuse the resume: the line says so
                again = "--resume_from_checkpoint latest" + (
                    " --overwrite_output_dir false" if args.output.overwrite_output_dir else "")
                print(f"Stopped by {result.stopped_by} after step {result.steps} of "
                      f"{args.optimization.max_train_steps}: the full training state is in {result.checkpoint}. To "
                      f"continue, run the same command with {again}", file=sys.stderr, flush=True)
            raise SystemExit(PREEMPTED)
        if stop.received is not None and accelerator.is_main_process:
            print(f"{stop.name} received while the final folder was written: the run is complete in "
                  f"{args.output.output_dir}", file=sys.stderr, flush=True)
    return result.eval_metrics


if __name__ == "__main__":
    run_entry_point(main, stage="starting")
