"""The pretraining job behind `run_pretraining.py`: accelerate, LAMB, exact resume, evaluation, Hub push.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 ...
    python run_pretraining.py            # a tiny ALBERT on the embedded corpus, a few minutes on a laptop CPU
    python run_pretraining.py recipes/demo.yaml  # the arguments from a file (.json or .yaml; recipes/ has some)

`main` = `parse_args` (the flags resolved and checked: flags.py) -> `prepare` (`setup`: accelerator and output folder;
the inputs: pretraining/inputs.py; the model and optimizer: pretraining/model.py) -> `fit` (the loop over a
`TrainingState`, its step and evaluation in step.py; its log: log.py) -> `finish` (the final folder: final_folder.py;
the summary, the push). Only this module sees the whole job (`Pretraining`): the loop's parts and the final folder are
at its end; the modules below take explicit arguments. The other modes (--preprocess_only, --dry_run) and
--auto_find_batch_size's search are in modes.py.

Loop: MLM + SOP loss (their plain sum), LAMB with the official poly-decay schedule, global clipping at 1.0, gradient
accumulation, bf16/fp16 through accelerate. Every `--checkpointing_steps` the full state (model, optimizer,
scheduler, RNGs, data position) goes atomically into `OUTPUT_DIR/step_N` (pretraining/checkpoints.py);
`--resume_from_checkpoint latest` continues exactly where the last complete checkpoint left off.
"""

import json
import logging
import sys
import time
from dataclasses import dataclass
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
from transformers import AutoModel

from ..errors import InputError, NothingProduced
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
)
from ..runtime.preemption import PREEMPTED, StopOnSignal, at_stage, deferred
from ..runtime.storage import StorageError, agreed, check_free_space, fault_line, refused
from . import step_graph as pretraining_graph
from .arguments import (
    PretrainingArguments,
)
from .card import PretrainingRun
from .checkpoints import FILL_MASK_FILE, StepCheckpoints, clear_earlier_run, truncate_metrics_log
from .collator import DataCollatorForAlbertPretraining
from .divergence import Diverged, check_losses, check_weights, newest_finite, stop_line
from .final_folder import corpus_card_dataset, held_out_fill_mask, save_final_model, where_trained
from .flags import choose_step, hardware_and_precision, parse_args
from .hub_push import HubPush, download_last_checkpoint, hub_source
from .inputs import build_inputs
from .log import MetricsLog, format_metrics, format_value, start_logging, start_tracking
from .model import build_run_model, make_optimizer, planned_weight_bytes
from .modes import auto_micro_batch, dry_run, preprocess
from .plan import batch_split
from .step import COUNTS, FitResult, TrainingState, accumulation_groups, evaluate, training_step, update_gate

logger = logging.getLogger("albert_hf.pretraining.job")


# ----------------------------------------------------------------------------------------------------------------
# The job: setup -> prepare -> fit -> finish


@dataclass
class Pretraining:
    """Everything `prepare` builds, which `fit` trains and `finish` saves."""

    args: PretrainingArguments
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
    hub: HubPush | None = None  # --push_to_hub

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output.output_dir)

    @property
    def stream(self) -> datasets.IterableDataset | None:
        """The process's own endless stream of training pairs under --streaming (its position is checkpointed)."""
        dataset = self.train_dataloader.dataset
        return dataset if isinstance(dataset, datasets.IterableDataset) else None


@dataclass
class Setup:
    """What `setup` decides before the inputs are built."""

    args: PretrainingArguments  # with the step and the micro-batch chosen for this machine
    hardware: Hardware
    precision: Precision
    accelerator: Accelerator
    fsdp_request: FsdpRequest | None  # what an FSDP launch asked for, applied when the model is built
    checkpoints: StepCheckpoints
    notes: list[str]  # for the start line


def setup(args: PretrainingArguments) -> Setup:
    """The hardware, the precision, the accelerator (in the mode the launcher asked for) and its FSDP request, the
    output folder (an earlier run cleared with --overwrite_output_dir, partial checkpoints removed), and with
    --auto_find_batch_size the micro-batch found."""
    optimization, output = args.optimization, args.output
    hardware, precision = hardware_and_precision(optimization)
    args, notes = choose_step(args, hardware, precision)  # before the accelerator: a captured step changes autocast
    graphed = args.model.torch_compile_mode == pretraining_graph.MODE
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
        reason = pretraining_graph.refusal(accelerator, args.model.gradient_checkpointing or (
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
    checkpoints = StepCheckpoints(output_dir, accelerator, output.checkpoints_total_limit)
    checkpoints.remove_partial()
    # Before the corpus is read: room for one checkpoint (the weights and the optimizer's two moments), or without
    # checkpoints for the final model, estimated from the config the run will build.
    weights = planned_weight_bytes(args.config, None if args.model.model_name_or_path else args.data.vocab_size)
    needed, what = (3 * weights, "one checkpoint") if output.checkpointing_steps else (weights, "the final model")
    check_free_space(output_dir, needed, what, "--output_dir")
    return Setup(args, hardware, precision, accelerator, fsdp_request, checkpoints, notes)


def prepare(args: PretrainingArguments) -> Pretraining:
    """`setup`, the inputs (pretraining/inputs.py), the model (sharded under FSDP), the optimizer and the schedule,
    all prepared by accelerate; logs the start line."""
    ready = setup(args)
    args, accelerator, fsdp_request = ready.args, ready.accelerator, ready.fsdp_request
    inputs = build_inputs(args.data, args.objective, accelerator, seed=args.optimization.seed,
                          model_name_or_path=args.model.model_name_or_path, adopted=args.adopted,
                          batch_sizes=(args.optimization.per_device_train_batch_size,
                                       args.output.per_device_eval_batch_size))
    at_stage("building the model")
    model, model_notes = build_run_model(args.model, args.config, args.objective.task, inputs.tokenizer, accelerator,
                                         fsdp_request)
    notes = [*ready.notes, *(fsdp_request.notes if fsdp_request is not None else ()), *inputs.notes]
    if args.objective.task == "none":
        notes.append("--task none: the pooler and the sentence-order head are frozen (no loss trains them)")
    notes += model_notes
    dtype = ready.precision.autocast_dtype or torch.float32
    notes.append(attention_kernel(accelerator.unwrap_model(model).config, accelerator.device, dtype,
                                  args.data.max_seq_length))
    optimizer = make_optimizer(model, args.optimization)
    # A checkpoint holds the weights and the optimizer's two moments (for the line a failed write gives).
    ready.checkpoints.expected_bytes = 3 * sum(p.numel() * p.element_size()
                                         for p in accelerator.unwrap_model(model).parameters())
    # The schedule counts optimizer steps; it is stepped by hand (not prepared), once per update, so that it
    # follows the official formula whatever the number of processes.
    scheduler = get_official_schedule(optimizer, args.optimization.num_warmup_steps, args.optimization.max_train_steps)
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
    graph = (pretraining_graph.StepGraph(model, optimizer, accelerator, optimization.max_grad_norm,
                                         optimization.loss_normalization)
             if args.model.torch_compile_mode == pretraining_graph.MODE else None)
    hub = (HubPush(args.output, Path(args.output.output_dir), accelerator.is_main_process)
           if args.output.push_to_hub else None)
    return Pretraining(args, accelerator, inputs.tokenizer, model, optimizer, scheduler, inputs.collate,
                       train_dataloader, eval_dataloader, inputs.eval_documents, ready.checkpoints, num_parameters,
                       global_batch, ready.hardware, ready.precision, graph, hub)


def optimizer_step(run: Pretraining, micro_batches) -> torch.Tensor:
    """One optimizer step (`training_step`), or with --torch_compile_mode whole-step-graph a replay of the captured
    step and the schedule's step; the six counts of `step_counts`."""
    if run.step_graph is None:
        return training_step(run.model, micro_batches, run.optimizer, run.scheduler, run.accelerator,
                             run.args.optimization.max_grad_norm, run.args.optimization.loss_normalization)
    counts = run.step_graph(micro_batches)
    run.scheduler.step()
    return counts


def started(groups):
    """`groups`, its first taken with stop signals deferred: the DataLoader's workers start then, and a start cut
    short leaves an iterator that torch cannot shut down (a traceback at exit)."""
    with deferred():
        first = next(groups, None)
    if first is not None:
        yield first
        yield from groups


def first_step_stage(run: Pretraining) -> str:
    """What the first optimizer step does besides the step, for the stop line."""
    if run.step_graph is not None:
        return "capturing the whole-step graph (the first step)"
    return "compiling the model (the first step)" if run.args.model.torch_compile else "taking the first step"


def fit(run: Pretraining, stop: StopOnSignal | None = None) -> FitResult:
    """The training loop, from the checkpoint --resume_from_checkpoint names (if any) to --max_train_steps, with
    logging, evaluation and checkpoints. When `stop` reports a signal (in any process) at a step boundary, every
    process saves the checkpoint of that step and the loop ends there."""
    output, accelerator = run.args.output, run.accelerator
    steps, accumulation = run.args.optimization.max_train_steps, run.args.optimization.gradient_accumulation_steps
    state = resume(run)
    log = metrics_log(run)
    progress = tqdm(total=steps, initial=state.step, disable=not accelerator.is_main_process,
                    desc="pretraining", dynamic_ncols=True)
    eval_metrics, stopped, compiled, rollbacks = {}, None, False, 0
    run.model.train()
    at_stage(first_step_stage(run))  # until the first step is done
    try:  # closed on the way out too, so that an error line starts on a line of its own
        while state.step < steps and stopped is None:
            for micro_batches in started(accumulation_groups(epoch_batches(run, state), accumulation)):
                state.batches_in_epoch += len(micro_batches)
                began = time.perf_counter()
                counts = optimizer_step(run, micro_batches)
                if run.args.model.torch_compile and not compiled:  # the first step compiles
                    compiled = True
                    logger.info("torch.compile: the first step took %.1f s, compiling included",
                                time.perf_counter() - began)
                state.add_step(counts, micro_batches, update_gate(run.optimizer, accelerator.device))
                if stop is not None:
                    stop.saving()  # a step to save from here on: a signal waits for the step boundary
                progress.update(1)
                try:
                    eval_metrics = after_step(run, state, log, progress) or eval_metrics
                except Diverged as diverged:  # stops the run, or with --on_divergence rollback goes back
                    rollbacks += 1
                    state = roll_back(run, state, log, progress, diverged, rollbacks)
                    continue
                if state.step >= steps:
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
    if run.eval_dataloader is not None and (not output.eval_steps or steps % output.eval_steps):
        eval_metrics = evaluate_and_log(run, state.step, log)
    return FitResult(eval_metrics, state.step)


def finish(run: Pretraining, eval_metrics: dict, completed_steps: int):
    """The final folder (weights gathered from every process, tokenizer, remote code, card), reloaded with
    AutoModel as a check, the summary with fill-mask examples, and the Hub push."""
    accelerator, output_dir = run.accelerator, run.output_dir
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


# ----------------------------------------------------------------------------------------------------------------
# The parts of `fit`'s loop and `finish`


def resume(run: Pretraining) -> TrainingState:
    """A fresh state, or the one of the checkpoint --resume_from_checkpoint names (and the stream's position)."""
    args, accelerator = run.args, run.accelerator
    state = TrainingState.start(accelerator.device)
    value = args.output.resume_from_checkpoint
    if hub_source(value, args.output) is not None:  # the state --hub_strategy checkpoint pushed
        value = str(download_last_checkpoint(value, args.output, accelerator))
    path = run.checkpoints.resolve(value) if value else None
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
    metrics = state.window_metrics(run.accelerator, run.args.objective.task, current_lr(run))
    progress.set_postfix({k.replace("_accuracy", "_acc"): f"{v:.3g}" for k, v in metrics.items() if k != "lr"})
    log.write(state.step, {f"train_{k}" if k not in ("lr", "tokens_per_second", "skipped_steps") else k: v
                           for k, v in metrics.items()})
    check_losses(metrics, state.step, metrics["lr"], lambda: newest_checkpoint(run), "training")
    for row in run.hub.sent_rows() if run.hub is not None else ():  # main process: the uploads done meanwhile
        log.write(state.step, row)


def after_step(run: Pretraining, state: TrainingState, log, progress) -> dict | None:
    """What follows a step: the skip limit, the logged window, the evaluation (its metrics returned) and the
    checkpoint, each when due; a run that diverged raises `Diverged`."""
    output, steps = run.args.output, run.args.optimization.max_train_steps
    check_skips(run, state, log, progress)
    if state.step % output.logging_steps == 0 or state.step == steps:
        log_window(run, state, log, progress)
    eval_metrics = None
    if run.eval_dataloader is not None and output.eval_steps and state.step % output.eval_steps == 0:
        eval_metrics = evaluate_and_log(run, state.step, log)
        logger.info("step %d: %s", state.step, format_metrics(eval_metrics))
    if output.checkpointing_steps and state.step % output.checkpointing_steps == 0:
        save_checkpoint(run, state)
    return eval_metrics


def roll_back(run: Pretraining, state: TrainingState, log, progress, diverged: Diverged,
              rollbacks: int) -> TrainingState:
    """--on_divergence rollback: the newest finite checkpoint from before the divergence is loaded (weights,
    optimizer, schedule, step count), and training goes on with the data where it is, so that the batches since
    that checkpoint are not seen again. One line and one metrics row say so. Without a checkpoint to go back to,
    or past --max_rollbacks, `diverged` stops the run."""
    optimization = run.args.optimization
    if optimization.on_divergence != "rollback":
        raise diverged
    path = newest_checkpoint(run, before=diverged.before)
    if path is None or rollbacks > optimization.max_rollbacks:
        why = "no checkpoint to roll back to" if path is None else f"{optimization.max_rollbacks} rollbacks done"
        raise Diverged(f"{diverged} ({why})") from None
    back = TrainingState.start(run.accelerator.device)
    back.restore(run.checkpoints.load(path, COUNTS), run.accelerator.is_main_process)
    back.epoch, back.batches_in_epoch = state.epoch, state.batches_in_epoch  # the data goes on from here
    if run.accelerator.is_main_process:
        truncate_metrics_log(run.output_dir / "metrics.jsonl", back.step)
    log.write(back.step, {"rollback": rollbacks, "rolled_back_from_step": state.step})
    logger.warning("%s; rolled back to %s (rollback %d of at most %d): training goes on from step %d with the "
                   "batches after step %d", diverged, path, rollbacks, optimization.max_rollbacks, back.step,
                   state.step)
    progress.n = back.step
    progress.refresh()
    return back


def check_skips(run: Pretraining, state: TrainingState, log, progress):
    """--max_consecutive_skips: that many steps skipped in a row (their loss or gradients not finite) stop the run,
    after their window is logged, in every process at the same step (pretraining/divergence.py)."""
    limit = run.args.optimization.max_consecutive_skips
    if not limit:
        return  # nothing read: on a GPU the read waits on the step before
    in_a_row = state.consecutive_skips()
    if in_a_row >= limit:
        log_window(run, state, log, progress)
        skipped = int(state.skips[2].cpu())
        # a checkpoint written during the skipped steps holds the weights that lead to them: one from before
        first = state.step - state.consecutive.lag - in_a_row + 1
        raise Diverged(stop_line(state.step, f"{in_a_row} steps in a row (from step {first}) were skipped, their "
                                             f"loss or gradients not finite ({skipped} skipped in all)",
                                 current_lr(run), newest_checkpoint(run, before=first)), before=first)


def evaluate_and_log(run: Pretraining, step: int, log) -> dict:
    """Held-out metrics, logged; a non-finite loss stops the run (pretraining/divergence.py)."""
    metrics = evaluate(run.model, run.eval_dataloader, run.accelerator, run.args.objective.task)
    log.write(step, metrics)
    if run.hub is not None:
        run.hub.latest_eval = metrics  # the next pushed checkpoint's card shows them
    check_losses(metrics, step, current_lr(run), lambda: newest_checkpoint(run), "held-out")
    return metrics


def save_checkpoint(run: Pretraining, state: TrainingState) -> Path:
    """A collective: every process calls it at the same step. Non-finite weights are not written: the run stops."""
    check_weights(run.model, run.accelerator, state.step, current_lr(run), lambda: newest_checkpoint(run),
                  f"the step-{state.step} checkpoint")
    path = run.checkpoints.save(state.step, state.checkpoint_state(run.accelerator),
                                stream_state=None if run.stream is None else run.stream.state_dict())
    if run.hub is not None and run.hub.pushes(state.step):  # --hub_strategy: this step's model (and state) goes up
        model = gather_full_model(run.accelerator, run.model)  # a collective under FSDP
        if model is not None:
            run.hub.push_checkpoint(state.step, path, lambda folder: save_final_model(
                model, run.tokenizer, folder, card_run(run.args), run.hub.latest_eval, run.global_batch,
                run.accelerator.num_processes, where=where_trained(run.hardware, run.precision,
                                                                   run.accelerator.num_processes)))
    return path


def metrics_log(run: Pretraining) -> MetricsLog:
    return MetricsLog(run.output_dir / "metrics.jsonl", run.accelerator, run.args.output.with_tracking)


def current_lr(run: Pretraining) -> float:
    return float(run.scheduler.get_last_lr()[0])


def newest_checkpoint(run: Pretraining, before: int | None = None) -> Path | None:
    """The checkpoint a diverged run can go back to: the newest complete one with finite weights (of a step before
    `before`, where given)."""
    return newest_finite([path for step, path in run.checkpoints.complete() if before is None or step < before])


def write_final_folder(run: Pretraining, final, eval_metrics: dict, completed_steps: int):
    """On the main process, at the end (`finish`): the held-out baselines, the curves, the final folder
    (`save_final_model`), reloaded with AutoModel as a check, and the summary with fill-mask examples."""
    accelerator, args, output_dir = run.accelerator, run.args, run.output_dir
    pair_task = args.objective.task if args.objective.task != "none" else None
    if run.eval_dataloader is not None and eval_metrics:
        # on the evaluation's own pairs and static masks (the unprepared dataset and collator)
        eval_metrics = {**eval_metrics, **heldout_baselines(
            run.eval_dataloader.dataset, run.eval_dataloader.collate_fn, len(run.tokenizer),
            run.tokenizer.all_special_ids, pair_task)}
    curves = None
    if not args.output.no_plots:
        rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()
                ] if (output_dir / "metrics.jsonl").is_file() else []
        curves = pretraining_curves(rows, eval_metrics, output_dir / CURVES_FILE, pair_task)
    save_final_model(final, run.tokenizer, output_dir, card_run(args), eval_metrics, run.global_batch,
                     accelerator.num_processes, curves=curves is not None,
                     where=where_trained(run.hardware, run.precision, accelerator.num_processes))
    reloaded = AutoModel.from_pretrained(output_dir, trust_remote_code=True)
    summary = {"output_dir": str(output_dir), "parameters": run.num_parameters, "steps": completed_steps,
               "global_batch": run.global_batch, "reloaded_with": f"AutoModel -> {type(reloaded).__name__}",
               **({"training_curves": str(curves)} if curves else {})}
    # after the save: the examples are a look at the saved model, not part of it (nor of all_results.json)
    examples = held_out_fill_mask(final, run.tokenizer, run.eval_documents, seed=args.optimization.seed,
                                  max_length=args.data.max_seq_length,
                                  sentence_per_line=args.data.layout == "sentence_per_line")
    if examples:
        (output_dir / FILL_MASK_FILE).write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n")
    print("\n".join(["", "Pretraining done."] + [f"  {k}: {format_value(v)}" for k, v in summary.items()]
                    + [f"  {k}: {text}" for k, text in with_baselines(eval_metrics)]
                    + format_fill_mask(examples)))


def card_run(args: PretrainingArguments) -> PretrainingRun:
    """What the model card says of this run."""
    optimization = args.optimization
    return PretrainingRun(
        dataset=corpus_card_dataset(args.data), task=args.objective.task, max_ngram=args.objective.max_ngram,
        max_train_steps=optimization.max_train_steps, max_seq_length=args.data.max_seq_length,
        micro_batch=f"{optimization.per_device_train_batch_size} a process x "
                    f"{optimization.gradient_accumulation_steps} accumulation"
                    + (" (found by --auto_find_batch_size)" if optimization.auto_find_batch_size else ""),
        optimizer=optimization.optimizer, learning_rate=optimization.learning_rate,
        num_warmup_steps=optimization.num_warmup_steps, mixed_precision=optimization.mixed_precision,
        seed=optimization.seed, architecture=args.model.model_config if not args.model.config_name else "custom",
        base_model=args.model.model_name_or_path, hub_model_id=args.output.hub_model_id, license=args.output.license,
        output_dir=args.output.output_dir)


def main(argv=None):
    """Exits with status PREEMPTED (75) when a stop signal ended the run early, after its checkpoint; stops with one
    line when another run holds --output_dir."""
    args = parse_args(argv)
    if args.output.dry_run:  # nothing written, so no lock
        return dry_run(args)
    # one run per folder, from before anything is written or read (runtime/output_lock.py)
    with output_lock.held(args.output.output_dir, "--output_dir", args.output.take_over_lock, is_first_process()):
        return pretrain(args)


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
            finish(run, result.eval_metrics, result.steps)
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
