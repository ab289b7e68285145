"""Training and what it leaves: the Trainer's train, evaluation and prediction with the results files transformers'
examples write (`train`, `evaluate_splits`, `save_results`, prediction files, `stage_results`), then the card and the
push (`finish`)."""

import logging
import sys
from pathlib import Path

import numpy as np
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..hub.model_card import CardDataset
from ..reports.curves import CURVES_FILE, trainer_curves
from ..runtime.preemption import PREEMPTED, StopOnSignal
from .arguments import ModelArguments, SeedRun
from .finetuned_card import write_finetuned_card
from .inputs import wanted_splits
from .paper_hparams import PaperRecipe
from .trainer import StopOnSignalCallback

logger = logging.getLogger(__name__)


def train(
    trainer, training_args, last_checkpoint: str | None, num_examples: int | None, seed_run: SeedRun | None = None
) -> dict:
    """Train (resuming if asked), save the final model with its tokenizer, write train_results.json.

    A fresh all_results.json is started: results of an earlier run in output_dir describe another model. A stop
    signal during training saves a checkpoint and exits with status PREEMPTED (75): see StopOnSignalCallback.

    Args:
        trainer: the script's Trainer, its training dataset set.
        training_args: the run's arguments (`output_dir`).
        last_checkpoint: the checkpoint to resume from (`setup`), or None.
        num_examples: the training examples before windowing, reported as `train_samples`.
        seed_run: the seed of a --seeds run this run is, or None; the stop line says how to continue either.

    Returns:
        The training metrics as written to train_results.json.
    """
    if trainer.is_world_process_zero():
        Path(training_args.output_dir, "all_results.json").unlink(missing_ok=True)
    # From here on a signal waits for the end of a step (Trainer builds its loaders and workers in train: a signal
    # there must not cut their start short), and the first step's checkpoint is written; after training, the
    # script's StopOnSignal records one too (`saving`), and the run completes.
    with StopOnSignal() as stop:
        stop.saving()
        logger.info("Fine-tuning: %s", trainer.describe_mode())
        callback = StopOnSignalCallback(stop)
        trainer.add_callback(callback)
        result = trainer.train(resume_from_checkpoint=last_checkpoint)
        trainer.remove_callback(callback)
        # A signal after the last step (or only after training) stops nothing: the run finishes as usual.
        if callback.stopped_at is not None and callback.stopped_at < trainer.state.max_steps:
            checkpoint = Path(training_args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")
            if trainer.is_world_process_zero():
                # A --seeds run resumes each seed's folder by itself and refuses --resume_from_checkpoint.
                alone = "" if seed_run is not None else ", or pass --resume_from_checkpoint with that folder"
                print(
                    f"Stopped by {stop.name} after step {trainer.state.global_step} of {trainer.state.max_steps}: "
                    f"the training state is in {checkpoint}. To continue, run the same command (it resumes from "
                    f"the last checkpoint in --output_dir){alone}",
                    file=sys.stderr,
                    flush=True,
                )
            raise SystemExit(PREEMPTED)
    # An internal save: with --push_to_hub, Trainer would otherwise upload here with its own model card; `finish`
    # pushes once, with ours.
    trainer.save_model(_internal_call=True)
    metrics = {**result.metrics, "train_samples": num_examples}
    save_results(trainer, "train", metrics)
    trainer.save_state()
    return metrics


def stage_results(validation: dict | None, test: dict | None = None, baseline=None) -> dict:
    """What a fine-tuning script's `main` returns: {"validation": metrics, "test": metrics, "baseline": Baseline}, for
    the stages that ran and gave metrics (`test` is None for a test set without labels).

    Args:
        validation: the dev set's metrics (--do_eval), or None.
        test: a labelled test set's metrics (--do_predict), or None.
        baseline: the dev score of a model that learned nothing (`seeds.Baseline`), which a --seeds run compares
            each seed's with; None without --do_eval.
    """
    results = {"validation": validation, "baseline": baseline, "test": test}
    return {stage: value for stage, value in results.items() if value is not None}


def write_index_predictions(path, indices, logits, labels, is_regression: bool) -> Path:
    """`index<TAB>prediction` per row, as transformers' run_glue.py writes them and GLUE's server reads them: the
    label of the highest logit, or the score with 3 decimals."""
    if is_regression:
        predictions = [f"{score:.3f}" for score in np.squeeze(logits, axis=-1).tolist()]
    else:
        predictions = [labels[i] for i in np.argmax(logits, axis=-1).tolist()]
    path = Path(path)
    with path.open("w", encoding="utf-8") as file:
        file.write("index\tprediction\n")
        file.writelines(f"{index}\t{prediction}\n" for index, prediction in zip(indices, predictions))
    return path


def save_results(trainer, kind: str, metrics: dict) -> dict:
    """Log `metrics` and write them as transformers' example scripts do: `<kind>_results.json` and merged into
    `all_results.json`, which thus holds every result of the run.

    Args:
        trainer: the run's Trainer (its `output_dir`; only the main process writes).
        kind: "train", "eval" or "predict".
        metrics: one flat dict, its keys prefixed `<kind>_` by whoever computed them.

    Returns:
        `metrics`, unchanged.
    """
    trainer.log_metrics(kind, metrics)
    if trainer.is_world_process_zero():
        Path(trainer.args.output_dir).mkdir(parents=True, exist_ok=True)
    trainer.save_metrics(kind, metrics, combined=True)
    return metrics


def suffixed(metrics: dict, suffix: str) -> dict:
    """`{key + suffix: value}`: the keys of a second evaluation set (transformers' run_glue: `eval_accuracy_mm`)."""
    return {f"{key}{suffix}": value for key, value in metrics.items()}


def evaluate_splits(trainer, splits: dict, evaluate=None, prefix: str = "eval", suffixes: dict | None = None) -> dict:
    """Evaluate each named split and write `<prefix>_results.json` (and all_results.json) via `save_results`.

    The results are ONE flat dict, as transformers' examples write them: keys `<prefix>_<metric>` plus
    `<prefix>_samples`, so several splits merge into one file.

    Args:
        trainer: the run's Trainer.
        splits: split name -> its tokenized dataset.
        evaluate: `evaluate(trainer, name, dataset, prefix) -> metrics` (keys already prefixed), for tasks that need
            more than `trainer.evaluate` (RACE's chosen letters); default `trainer.evaluate`.
        prefix: "eval" (the dev set) or "predict" (a labelled test set).
        suffixes: split name -> a suffix for its keys (GLUE MNLI's mismatched dev set: "_mm").

    Returns:
        The merged metrics, as written.

    Raises:
        ValueError: two splits would write the same key (a split left without a suffix).
    """
    results = {}
    for name, dataset in splits.items():
        if evaluate is None:
            metrics = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
        else:
            metrics = evaluate(trainer, name, dataset, prefix)
        metrics[f"{prefix}_samples"] = len(dataset)
        metrics = suffixed(metrics, (suffixes or {}).get(name, ""))
        clash = sorted(set(metrics) & set(results))
        if clash:
            raise ValueError(f"split {name!r} would overwrite {clash[:3]} of another split: give it a suffix")
        results.update(metrics)
    return save_results(trainer, prefix, results)


def finish(
    trainer,
    model_args: ModelArguments,
    training_args,
    data_args,
    paper_recipe: PaperRecipe | None = None,
    card_dataset: CardDataset | None = None,
) -> None:
    """Write the model card (README.md: `finetuned_card.write_finetuned_card`, metrics from all_results.json) and push
    the output folder when --push_to_hub is set. Nothing contacts the Hub unless pushing.

    Args:
        paper_recipe: what --paper_hparams resolved to, for the card's Recipe section; None without it.
        card_dataset: the card's Data section when the data arguments alone cannot say it (run_glue.py on your own
            data, whose task is read from the data); default `data_args.card_dataset(splits)`.
    """

    def write_card():
        write_finetuned_card(
            trainer,
            model_args,
            training_args,
            data_args,
            wanted_splits(training_args),
            paper_recipe=paper_recipe,
            dataset=card_dataset,
        )

    if training_args.do_train and not training_args.no_plots and trainer.is_world_process_zero():
        trainer_curves(trainer.state.log_history, Path(training_args.output_dir) / CURVES_FILE)
    if training_args.push_to_hub:
        # Trainer.push_to_hub writes README.md just before uploading: ours (`AlbertTrainer.create_model_card`).
        trainer.push_to_hub(card=write_card)
    elif trainer.is_world_process_zero():
        write_card()
