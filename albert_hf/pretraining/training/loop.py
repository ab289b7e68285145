"""The pretraining loop: `fit` trains a `Run` (the whole job's object, which run.py defines and builds) one
optimizer step at a time (step.py), with the log window (output/log.py), the held-out evaluation (evaluation.py),
the checkpoints (output/checkpoints.py), --on_divergence rollback and the --max_consecutive_skips limit
(divergence.py), and a stop signal honoured at a step boundary with a checkpoint. Where the loop stands is its
`TrainingState` (state.py: what a checkpoint saves of it); job.py saves the run after (`finish`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate import DistributedType
from accelerate.utils import send_to_device
from tqdm.auto import tqdm

from ...errors import InputError
from ...runtime.distributed import gather_full_model
from ...runtime.preemption import StopOnSignal, at_stage, deferred
from ..data.mixed_pairs import MixedPairs, MixedStream
from ..data.mixture import MixPlan
from ..output.checkpoints import set_aside
from ..output.hub_push import download_last_checkpoint, hub_source
from ..output.log import MetricsLog, format_metrics, truncate_metrics_log
from ..schedule import check_resumed, superseded
from .divergence import Diverged, check_losses, check_weights, newest_finite, stop_line
from .evaluation import evaluate
from .state import IN_ALL, SOURCE_PAIRS, SOURCE_TOKENS, TrainingState
from .step import COUNTS, accumulation_groups, training_step, update_gate

if TYPE_CHECKING:  # defined and built in run.py
    from ..run import Run

logger = logging.getLogger(__name__)


def optimizer_step(run: Run, micro_batches) -> torch.Tensor:
    """One optimizer step (`training_step`), or with --torch_compile_mode whole-step-graph a replay of the captured
    step and the schedule's step; the six counts of `step_counts` and the gradient norm."""
    if run.step_graph is None:
        return training_step(
            run.model,
            micro_batches,
            run.optimizer,
            run.scheduler,
            run.accelerator,
            run.args.optimization.max_grad_norm,
            run.args.optimization.loss_normalization,
        )
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


def timed(groups):
    """Each of `groups` with the seconds spent waiting for it (the data wait of the logged rows)."""
    while True:
        began = time.perf_counter()
        group = next(groups, None)
        if group is None:
            return
        yield group, time.perf_counter() - began


def first_step_stage(run: Run) -> str:
    """What the first optimizer step does besides the step, for the stop line."""
    if run.step_graph is not None:
        return "capturing the whole-step graph (the first step)"
    return "compiling the model (the first step)" if run.plan.compile else "taking the first step"


def fit(run: Run, stop: StopOnSignal | None = None) -> FitResult:
    """The training loop, from the checkpoint --resume_from_checkpoint names (if any) to --max_train_steps, with
    logging, evaluation and checkpoints. When `stop` reports a signal (in any process) at a step boundary, every
    process saves the checkpoint of that step and the loop ends there."""
    output, accelerator = run.args.output, run.accelerator
    steps, accumulation = run.args.optimization.max_train_steps, run.plan.accumulation
    state = resume(run)
    log = metrics_log(run)
    if state.step == 0 and run.args.model.model_name_or_path and run.eval_dataloader is not None:
        at_stage("evaluating the loaded model (step 0)")  # the starting point: loading against forgetting
        logger.info("step 0 (the loaded model): %s", format_metrics(evaluate_and_log(run, state, log)))
    progress = tqdm(
        total=steps, initial=state.step, disable=not accelerator.is_main_process, desc="pretraining", dynamic_ncols=True
    )
    eval_metrics, stopped, compiled, rollbacks = {}, None, False, 0
    run.model.train()
    at_stage(first_step_stage(run))  # until the first step is done
    try:  # closed on the way out too, so that an error line starts on a line of its own
        while state.step < steps and stopped is None:
            for micro_batches, waited in timed(started(accumulation_groups(epoch_batches(run, state), accumulation))):
                state.batches_in_epoch += len(micro_batches)
                state.window_data_wait += waited
                # a mixed run's batches say each pair's source: counted, not given to the model
                sources = [batch.pop("source") for batch in micro_batches] if run.mix is not None else None
                began = time.perf_counter()
                counts = optimizer_step(run, micro_batches)
                if run.plan.compile and not compiled:  # the first step compiles
                    compiled = True
                    logger.info(
                        "torch.compile: the first step took %.1f s, compiling included", time.perf_counter() - began
                    )
                state.add_step(counts, micro_batches, update_gate(run.optimizer, accelerator.device), sources)
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
                if stop is not None and stop.shared_signal(accelerator.device):  # returns at once if just saved
                    stopped = FitResult(eval_metrics, state.step, stop.name, save_checkpoint(run, state))
                    break
            else:
                state.next_epoch()
    finally:
        progress.close()
    if stopped is not None:
        return stopped
    if run.eval_dataloader is not None and (not output.eval_steps or steps % output.eval_steps):
        eval_metrics = evaluate_and_log(run, state, log)
    sources = run.mix_summary(dict(zip(state.source_names, state.source_run.tolist())), state) if run.mix else {}
    return FitResult(
        eval_metrics, state.step, run_tokens=state.run_tokens, run_seconds=state.run_seconds, sources=sources
    )


# ----------------------------------------------------------------------------------------------------------------
# The parts of `fit`'s loop


def resume(run: Run) -> TrainingState:
    """A fresh state, or the one of the checkpoint --resume_from_checkpoint names (and the stream's position); a
    decay branch's first start takes its --decay_from checkpoint's."""
    output, accelerator = run.args.output, run.accelerator
    state = TrainingState.start(accelerator.device, run.mixed.plan.names if run.mixed is not None else ())
    value = output.resume_from_checkpoint or run.args.schedule.parent
    if hub_source(value, output) is not None:  # the state --hub_strategy checkpoint pushed
        value = str(download_last_checkpoint(value, output, accelerator))
    path = run.checkpoints.resolve(value) if value else None
    if path is None:
        return state
    check_vocabulary_size(run, path)
    saved = run.checkpoints.load(path, COUNTS)
    check_resumed(run.args.schedule, path)  # the checkpoint's files checked first: its plan is read as they were
    if "mix" in saved and run.mixed is None:
        names = saved["mix"].get("names", ()) if isinstance(saved["mix"], dict) else ()
        raise InputError(
            f"--resume_from_checkpoint {path}: it was written by a run mixing --sources "
            f"{', '.join(map(str, names))}: resume it with its --sources"
        )
    stream_state = run.checkpoints.stream_state(path) if run.stream is not None else None
    if run.mixed is not None:
        stream_state = continue_mix(run, saved, stream_state, path)
        state.resize_sources(run.mixed.plan.names)
    state.restore(saved, accelerator.is_main_process)
    set_aside_superseded(run, path, state.step)
    if run.stream is not None:
        run.stream.load_state_dict(stream_state)
    if isinstance(run.mixed, MixedPairs):
        state.epoch, state.batches_in_epoch = 0, 0  # the mixed pairs begin where the checkpoint ended
    if accelerator.is_main_process:
        truncate_metrics_log(run.output_dir / "metrics.jsonl", state.step)
    logger.info(
        "Resumed from %s: step %d, epoch %d, batch %d of the epoch",
        path,
        state.step,
        state.epoch,
        state.batches_in_epoch,
    )
    return state


def set_aside_superseded(run: Run, path: Path, step: int) -> None:
    """A run resumed in its own folder under another plan (an extension): the later checkpoints the earlier plan
    wrote there are renamed step_N.superseded, with a line, so that this run writes its own."""
    accelerator = run.accelerator
    if accelerator.is_main_process and path.parent.resolve() == run.output_dir.resolve():
        passed = superseded(run.output_dir, run.args.schedule, step)
        for folder in passed:
            set_aside(folder, "superseded")
        if passed:
            logger.warning(
                "%s: written under the run's earlier plan, renamed *.superseded: this run writes its own",
                ", ".join(folder.name for folder in passed),
            )
    accelerator.wait_for_everyone()


def check_vocabulary_size(run: Run, path: Path) -> None:
    """A checkpoint whose embeddings have another number of rows than this run's model (--extend_vocabulary given
    or not, or another N) stops in one line, before its weights are read."""
    try:
        saved = json.loads((path / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):  # no readable config: the record check of `load` names the fault
        return
    ours = run.accelerator.unwrap_model(run.model).config.vocab_size
    if isinstance(saved, int) and saved != ours:
        raise InputError(
            f"--resume_from_checkpoint {path}: its model has {saved:,} pieces and this run's {ours:,}: "
            "resume with the vocabulary it was written with (the same --model_name_or_path and "
            "--extend_vocabulary)"
        )


def continue_mix(run: Run, saved: dict, stream_state: dict | None, path: Path) -> dict | None:
    """A mixed run resumed: the checkpoint's plan (a stream's: in this process's stream position) continued with
    this run's sources and weights (`MixPlan.resumed`: a change is said in one line; a source missing without
    --drop_sources stops the run). Returns the stream position to load, for a stream."""
    where = f"--resume_from_checkpoint {path}"
    if "mix" not in saved:
        raise InputError(
            f"{where}: it was written by a run of one corpus, and this run mixes --sources: resume it "
            "as it was, or start the mix in another --output_dir"
        )
    mixed = run.mixed
    if isinstance(mixed, MixedStream):
        if not isinstance(stream_state, dict) or "plan" not in stream_state or "streams" not in stream_state:
            raise InputError(f"{where}: its stream positions are not a mixed run's; resume it as it was")
        plan, pairs = MixPlan.from_state(stream_state["plan"], where)
    else:
        plan, pairs = MixPlan.from_state(saved["mix"], where)
    first = mixed.plan.segments[0]
    mixed.plan, changed = plan.resumed(
        pairs,
        saved["step"],
        mixed.plan.names,
        mixed.plan.sizes,
        first.weights,
        first.batch,
        run.args.data.drop_sources or (),
        where,
    )
    if changed and run.accelerator.is_main_process:
        logger.warning(changed)
    mixed.align(first.weights)
    if isinstance(mixed, MixedStream):
        return {**stream_state, "draws": pairs}
    mixed.first = pairs
    return None


def epoch_batches(run: Run, state: TrainingState):
    """The batches of the state's epoch, from the state's position in it."""
    run.collate.set_epoch(state.epoch)
    if hasattr(run.train_dataloader, "set_epoch"):
        run.train_dataloader.set_epoch(state.epoch)
    if run.stream is not None:  # unprepared (see prepare); resumed by its state_dict, not by skipping
        accelerator = run.accelerator
        return (
            send_to_device(batch, accelerator.device, non_blocking=accelerator.non_blocking)
            for batch in run.train_dataloader
        )
    if state.batches_in_epoch:
        return run.accelerator.skip_first_batches(run.train_dataloader, state.batches_in_epoch)
    return run.train_dataloader


# the logged rows' names of the window's fields that are not training means (those get "train_")
RUN_FIELDS = (
    "lr",
    "tokens_per_second",
    "model_tflops_per_second",
    "mfu",
    "grad_norm",
    "data_wait",
    "peak_memory_gib",
    "skipped_steps",
)
SHORT_NAMES = {"model_tflops_per_second": "tflops/s", "peak_memory_gib": "mem_gib"}  # the progress bar's


def log_window(run: Run, state: TrainingState, log, progress):
    """A collective: the training means of the window and the run's rates (runtime/throughput.py), into the
    progress bar and the metrics log; a non-finite loss stops the run (pretraining/training/divergence.py)."""
    metrics = state.window_metrics(run.accelerator, run.args.objective.task, current_lr(run), run.throughput)
    sources = source_fields(run, state) if run.mixed is not None else {}
    progress.set_postfix(
        {
            SHORT_NAMES.get(k, k.replace("_accuracy", "_acc")): "non-finite" if v is None else f"{v:.3g}"
            for k, v in metrics.items()
            if k != "lr"
        }
        | {
            key.replace("run_tokens_", "run_tok_").replace("tokens_", "tok_"): f"{value:.3g}"
            for key, value in sources.items()
            if "tokens_" in key
        }
    )
    log.write(state.step, {k if k in RUN_FIELDS else f"train_{k}": v for k, v in metrics.items()} | sources)
    check_losses(metrics, state.step, metrics["lr"], lambda: newest_checkpoint(run), "training")
    for row in run.hub.sent_rows() if run.hub is not None else ():  # main process: the uploads done meanwhile
        log.write(state.step, row)


def source_fields(run: Run, state: TrainingState) -> dict:
    """A mixed run's per-source fields of a logged row (`state.source_totals`, just read with the window): the
    window's tokens and pairs, the run's tokens and pairs, each source's share of the run's pairs and its epochs."""
    window, run_totals = state.source_totals
    pairs = run_totals[:, SOURCE_PAIRS].sum()
    epochs = run.mixed.plan.epochs(run.pairs_drawn(state))
    row = {}
    for i, name in enumerate(state.source_names):
        row[f"tokens_{name}"] = float(window[i, SOURCE_TOKENS])
        row[f"pairs_{name}"] = int(window[i, SOURCE_PAIRS])
        row[f"run_tokens_{name}"] = float(run_totals[i, SOURCE_TOKENS])
        row[f"run_pairs_{name}"] = int(run_totals[i, SOURCE_PAIRS])
        row[f"share_{name}"] = float(run_totals[i, SOURCE_PAIRS] / pairs) if pairs else 0.0
        if epochs.get(name) is not None:
            row[f"epochs_{name}"] = epochs[name]
    return row


def after_step(run: Run, state: TrainingState, log, progress) -> dict | None:
    """What follows a step: the skip limit, the logged window, the evaluation (its metrics returned) and the
    checkpoint, each when due; a run that diverged raises `Diverged`."""
    output, steps = run.args.output, run.args.optimization.max_train_steps
    check_skips(run, state, log, progress)
    if state.step % output.logging_steps == 0 or state.step == steps:
        log_window(run, state, log, progress)
    eval_metrics = None
    if run.eval_dataloader is not None and output.eval_steps and state.step % output.eval_steps == 0:
        eval_metrics = evaluate_and_log(run, state, log)
        logger.info("step %d: %s", state.step, format_metrics(eval_metrics))
    if output.checkpointing_steps and state.step % output.checkpointing_steps == 0:
        save_checkpoint(run, state)
    return eval_metrics


def roll_back(run: Run, state: TrainingState, log, progress, diverged: Diverged, rollbacks: int) -> TrainingState:
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
    back = TrainingState.start(run.accelerator.device, state.source_names)
    back.restore(run.checkpoints.load(path, COUNTS), run.accelerator.is_main_process)
    back.epoch, back.batches_in_epoch = state.epoch, state.batches_in_epoch  # the data goes on from here
    if run.accelerator.is_main_process:
        truncate_metrics_log(run.output_dir / "metrics.jsonl", back.step)
    log.write(back.step, {"rollback": rollbacks, "rolled_back_from_step": state.step})
    logger.warning(
        "%s; rolled back to %s (rollback %d of at most %d): training goes on from step %d with the "
        "batches after step %d",
        diverged,
        path,
        rollbacks,
        optimization.max_rollbacks,
        back.step,
        state.step,
    )
    progress.n = back.step
    progress.refresh()
    return back


def check_skips(run: Run, state: TrainingState, log, progress):
    """--max_consecutive_skips: that many steps skipped in a row (their loss or gradients not finite) stop the run,
    after their window is logged, in every process at the same step (pretraining/training/divergence.py)."""
    limit = run.args.optimization.max_consecutive_skips
    if not limit:
        return  # nothing read: on a GPU the read waits on the step before
    in_a_row = state.consecutive_skips()
    if in_a_row >= limit:
        log_window(run, state, log, progress)
        skipped = int(state.skips[IN_ALL].cpu())
        # a checkpoint written during the skipped steps holds the weights that lead to them: one from before
        first = state.step - state.consecutive.lag - in_a_row + 1
        raise Diverged(
            stop_line(
                state.step,
                f"{in_a_row} steps in a row (from step {first}) were skipped, their "
                f"loss or gradients not finite ({skipped} skipped in all)",
                current_lr(run),
                newest_checkpoint(run, before=first),
            ),
            before=first,
        )


def evaluate_and_log(run: Run, state: TrainingState, log) -> dict:
    """A collective: held-out metrics, logged with the run's model FLOPs and mean MFU up to here (training time, not
    this evaluation's); a non-finite loss stops the run (pretraining/training/divergence.py)."""
    totals = run.throughput.totals(*state.run_totals(run.accelerator))
    metrics = held_out_metrics(run)
    log.write(state.step, {**metrics, **totals})
    if run.hub is not None:
        run.hub.latest_eval = metrics  # the next pushed checkpoint's card shows them
    check_losses(metrics, state.step, current_lr(run), lambda: newest_checkpoint(run), "held-out")
    return metrics


def held_out_metrics(run: Run) -> dict:
    """A collective: the run's model on its held-out pairs (`evaluation.evaluate`); a mixed run's per source too,
    its overall figures weighted as its mix now weighs the sources (weight 0: apart from the overall)."""
    mix = None if run.mix is None else (run.mix.held_out, run.mixed.plan.segments[-1].weights)
    return evaluate(run.model, run.eval_dataloader, run.accelerator, run.args.objective.task, mix)


def save_checkpoint(run: Run, state: TrainingState) -> Path:
    """A collective: every process calls it at the same step. Non-finite weights are not written: the run stops."""
    check_weights(
        run.model,
        run.accelerator,
        state.step,
        current_lr(run),
        lambda: newest_checkpoint(run),
        f"the step-{state.step} checkpoint",
    )
    pushed = run.hub is not None and run.hub.pushes(state.step)  # --hub_strategy: this step's model (and state)
    sharded = run.accelerator.distributed_type == DistributedType.FSDP  # a checkpoint's weights are shards then
    model = gather_full_model(run.accelerator, run.model) if pushed or sharded else None  # a collective under FSDP
    saved = state.checkpoint_state(run.accelerator)
    if run.mixed is not None:  # the plan and each source's position, as data (a stream's: in its own state)
        saved["mix"] = run.mixed.plan.state(run.pairs_drawn(state))
    path = run.checkpoints.save(
        state.step,
        saved,
        stream_state=None if run.stream is None else run.stream.state_dict(),
        full_model=model if sharded else None,
    )
    if pushed:
        run.push_checkpoint(path, state, saved, model)
    return path


def metrics_log(run: Run) -> MetricsLog:
    return MetricsLog(run.output_dir / "metrics.jsonl", run.accelerator, run.args.output.with_tracking)


def current_lr(run: Run) -> float:
    return float(run.scheduler.get_last_lr()[0])


def newest_checkpoint(run: Run, before: int | None = None) -> Path | None:
    """The checkpoint a diverged run can go back to: the newest complete one with finite weights (of a step before
    `before`, where given)."""
    return newest_finite([path for step, path in run.checkpoints.complete() if before is None or step < before])


@dataclass
class FitResult:
    """How `fit` ended: at --max_train_steps, or early on a stop signal with a checkpoint written."""

    eval_metrics: dict  # the last evaluation's
    steps: int  # optimizer steps completed
    stopped_by: str | None = None  # the signal's name (SIGTERM, SIGINT, SIGUSR1) when one ended the run early
    checkpoint: Path | None = None  # the step_N written when it stopped
    run_tokens: float = 0.0  # the run's real tokens (all processes) and training seconds, for its summary
    run_seconds: float = 0.0
    sources: dict = field(default_factory=dict)  # a mixed run's per-source totals (`Run.mix_summary`)
