"""The pretraining job behind `run_pretraining.py`: accelerate, LAMB, exact resume, evaluation, Hub push.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 ...
    python run_pretraining.py            # a tiny ALBERT on the embedded corpus, a few minutes on a laptop CPU
    python run_pretraining.py recipes/demo.yaml  # the arguments from a file (.json or .yaml; recipes/ has some)

`main` = `parse_args` (the flags resolved and checked, once: resolution.py) -> `prepare` (run.py: `setup`, the
machine's plan, accelerator and output folder; the inputs: data/inputs.py; the model and optimizer:
training/model.py) -> `fit` (training/loop.py: the loop over a `TrainingState`, one optimizer step at a time in
training/step.py) -> `finish` (here: the final folder, output/final_folder.py; the summary, the push). run.py builds
the whole job (`Run`), loop.py trains it and this module saves it; only these three see it, the modules below take
explicit arguments. --preprocess_only is `preprocess` here; --dry_run and --auto_find_batch_size's search are in
plan.py.

Loop (training/loop.py): MLM + SOP loss (their plain sum), LAMB with the official poly-decay schedule, global
clipping at 1.0, gradient accumulation, bf16/fp16 through accelerate. Every `--checkpointing_steps` the full state
(model, optimizer, scheduler, RNGs, data position) goes atomically into `OUTPUT_DIR/step_N`
(output/checkpoints.py); `--resume_from_checkpoint latest` continues exactly where the last complete checkpoint left
off.
"""

import json
import logging
import shutil
import sys
from pathlib import Path

from accelerate.utils import DistributedType, set_seed
from safetensors.torch import load_file
from transformers import AutoModel

from ..average import average_checkpoints
from ..errors import InputError, NothingProduced
from ..reports.baselines import heldout_baselines, with_baselines
from ..reports.curves import CURVES_FILE, pretraining_curves
from ..reports.fill_mask import format_fill_mask
from ..runtime import output_lock
from ..runtime.cli import is_first_process, run_entry_point
from ..runtime.distributed import end_distributed, gather_full_model
from ..runtime.preemption import PREEMPTED, StopOnSignal, at_stage
from ..runtime.storage import StorageError, fault_line, shared_fault, write_fault, write_json
from ..runtime.throughput import cost_rows
from .arguments import PretrainingArguments
from .data import prepared_data
from .data.inputs import build_data, build_mixed_data
from .output.checkpoints import FILL_MASK_FILE
from .output.final_folder import held_out_fill_mask
from .output.folder import AVERAGE_PREFIX, clear_earlier_run
from .output.log import format_value, start_logging
from .output.pretraining_card import source_rows
from .plan import dry_run
from .resolution import parse_args
from .run import Run, prepare
from .training.divergence import check_weights
from .training.evaluation import since_start
from .training.loop import current_lr, fit, held_out_metrics, metrics_log, newest_checkpoint

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# After `fit` (loop.py): the final folder, the summary, the push


def finish(run: Run, eval_metrics: dict, completed_steps: int, cost: dict):
    """The final folder (weights gathered from every process, tokenizer, remote code, card, and the run's `cost`:
    its model FLOPs and mean MFU, runtime/throughput.py), reloaded with AutoModel as a check, the summary with
    fill-mask examples, and the Hub push."""
    accelerator, output_dir = run.accelerator, run.output_dir
    accelerator.wait_for_everyone()
    check_weights(
        run.model,
        accelerator,
        completed_steps,
        current_lr(run),
        lambda: newest_checkpoint(run),
        "the final model folder",
    )
    final = gather_full_model(accelerator, run.model)
    fault = None
    if accelerator.is_main_process:
        fault = write_fault(lambda: write_final_folder(run, final, eval_metrics, completed_steps, cost))
    fault = shared_fault(accelerator, fault, main_only=True)  # every process stops, none waits
    if fault is not None:
        raise StorageError(
            fault_line(
                fault,
                "the final model folder",
                output_dir,
                run.checkpoints.expected_bytes // 3,
                run.checkpoints.intact(),
            )
        )
    if run.args.output.average_last:
        finish_average(run, run.args.output.average_last)
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
    parsed, output_dir = run.args, run.output_dir
    pair_task = parsed.objective.task if parsed.objective.task != "none" else None
    eval_metrics = {**eval_metrics, **held_out_baselines(run, eval_metrics, pair_task)}
    rows = (
        [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
        if (output_dir / "metrics.jsonl").is_file()
        else []
    )
    names = run.mix.held_out if run.mix is not None else ()  # those held out only too
    # a continued run's starting point (its step-0 evaluation), beside the end in all_results.json and the card
    start = next((row for row in rows if row["step"] == 0 and "eval_mlm_loss" in row), {})
    started = {f"{key}_step_0": value for key, value in start.items() if key.startswith("eval_")}
    curves = None
    if not parsed.output.no_plots:
        curves = pretraining_curves(rows, eval_metrics, output_dir / CURVES_FILE, pair_task, names)
    results = {**eval_metrics, **started, **(run.vocabulary.results() if run.vocabulary else {})}
    results |= parsed.schedule.results()
    run.write_model_folder(final, output_dir, results, cost, curves=curves is not None)
    reloaded = AutoModel.from_pretrained(output_dir, trust_remote_code=True)
    summary = {
        "output_dir": str(output_dir),
        "parameters": run.num_parameters,
        "steps": completed_steps,
        "global_batch": run.global_batch,
        **cost_rows(cost),
        **source_rows(cost, run.mix.names if run.mix is not None else ()),
        "reloaded_with": f"AutoModel -> {type(reloaded).__name__}",
        **({"training_curves": str(curves)} if curves else {}),
    }
    # after the save: the examples are a look at the saved model, not part of it (nor of all_results.json)
    examples = held_out_fill_mask(
        final,
        run.tokenizer,
        run.eval_documents,
        seed=parsed.optimization.seed,
        max_length=parsed.data.max_seq_length,
        sentence_per_line=parsed.data.layout == "sentence_per_line",
    )
    if examples:
        (output_dir / FILL_MASK_FILE).write_text(json.dumps(examples, indent=2, ensure_ascii=False) + "\n")
    lines = [f"  {k}: {format_value(v)}" for k, v in summary.items()] + [
        f"  {k}: {text}" for k, text in with_baselines(eval_metrics)
    ]
    since = since_step_0(start, eval_metrics, names) if start and eval_metrics else []
    print("\n".join(["", "Pretraining done.", *lines, *since, *format_fill_mask(examples)]))


def finish_average(run: Run, count: int) -> None:
    """A collective, --average_last K: the first process writes the mean of the run's last K checkpoints into
    OUTPUT_DIR/average_last_K (`average_last`); every process then evaluates it on the held-out pairs, unless the
    model is sharded, and the figures join its all_results.json."""
    accelerator, folder = run.accelerator, run.output_dir / f"{AVERAGE_PREFIX}{count}"
    fault = write_fault(lambda: average_last(run, count, folder)) if accelerator.is_main_process else None
    fault = shared_fault(accelerator, fault, main_only=True)  # every process stops, none waits
    if fault is not None:
        written = "the final model folder is complete"
        raise StorageError(fault_line(fault, f"the average of the last {count} checkpoints", folder, None, written))
    if run.eval_dataloader is None or not folder.is_dir():
        return
    if accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU):
        logger.info(
            "--average_last %d: not evaluated here (the model is sharded); its weights are in %s", count, folder
        )
        return
    load_weights(accelerator.unwrap_model(run.model), folder / "model.safetensors")
    metrics = held_out_metrics(run)
    if accelerator.is_main_process:
        results = json.loads((folder / "all_results.json").read_text()) | metrics
        write_json(folder / "all_results.json", results)
        print(f"  {folder.name}: " + ", ".join(f"{k} {format_value(v)}" for k, v in metrics.items()))


def average_last(run: Run, count: int, folder: Path) -> None:
    """The mean of the run's last `count` checkpoints (their records written) into `folder`, replacing an earlier
    run's; a line when fewer are there."""
    run.checkpoints.wait_for_record()
    found = [path for _, path in run.checkpoints.complete()][-count:]
    shutil.rmtree(folder, ignore_errors=True)
    if len(found) < count:
        logger.warning(
            "--average_last %d: %s holds %d complete checkpoints; none averaged", count, run.output_dir, len(found)
        )
        return
    average_checkpoints(folder, found)
    print(f"  averaged: {folder} (the mean of {', '.join(path.name for path in found)})")


def load_weights(model, path: Path) -> None:
    """`path`'s tensors into `model`: every one a tensor of the model, and every tensor of the model either read or
    an alias of one read (tied weights)."""
    state = model.state_dict()
    loaded = model.load_state_dict(load_file(path), strict=False)
    read = {state[name].data_ptr() for name in state if name not in loaded.missing_keys}
    unread = [name for name in loaded.missing_keys if state[name].data_ptr() not in read]
    if loaded.unexpected_keys or unread:
        raise InputError(f"{path}: not this run's model ({(loaded.unexpected_keys or unread)[0]})")


def held_out_baselines(run: Run, eval_metrics: dict, pair_task: str | None) -> dict:
    """The held-out baselines beside the final evaluation (reports/baselines.py), on its own pairs and static masks
    (the unprepared dataset and collator); none without an evaluation."""
    if run.eval_dataloader is None or not eval_metrics:
        return {}
    loader, tokenizer = run.eval_dataloader, run.tokenizer
    return heldout_baselines(loader.dataset, loader.collate_fn, len(tokenizer), tokenizer.all_special_ids, pair_task)


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
        data = build_mixed_data(
            args.data, args.sources, args.objective.task, args.optimization.seed, args.model.model_name_or_path
        )
    else:
        data = build_data(args.data, args.objective.task, args.optimization.seed, args.model.model_name_or_path)
    at_stage(f"writing the prepared pairs to {output_dir}")
    manifest = prepared_data.save(data, output_dir, args.flat(), args.sources)
    per_source = "".join(
        f"\n  {entry['name']}: {entry['train_pairs']:,} training pairs, {entry['train_tokens']:,} "
        f"tokens, {entry.get('validation_pairs', 0):,} held-out pairs"
        for entry in manifest.get("sources", ())
    )
    print(
        f"\nPrepared {manifest['train_pairs']:,} training and {manifest.get('validation_pairs', 0):,} held-out "
        f"pairs in {output_dir}. Train on them with: run_pretraining.py --prepared_data {output_dir} ...{per_source}"
    )


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
                    " --overwrite_output_dir false" if args.output.overwrite_output_dir else ""
                )
                print(
                    f"Stopped by {result.stopped_by} after step {result.steps} of "
                    f"{args.optimization.max_train_steps}: the full training state is in {result.checkpoint}. To "
                    f"continue, run the same command with {again}",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(PREEMPTED)
        if stop.received is not None and accelerator.is_main_process:
            print(
                f"{stop.name} received while the final folder was written: the run is complete in "
                f"{args.output.output_dir}",
                file=sys.stderr,
                flush=True,
            )
    return result.eval_metrics


if __name__ == "__main__":
    run_entry_point(main, stage="starting")
