"""The flow run_glue.py, run_squad.py, run_race.py and run_ner.py share: setup and loading, train/evaluate/predict,
the results files, the card and the push. The arguments are in tasks/arguments.py, the Trainer in tasks/trainer.py,
--paper_hparams in tasks/paper_hparams.py.

Each task is a package of the same shape (tasks/<task>/: `data`, `features`, `recipe`, `job`), which its script
imports as `from albert_hf.tasks.<task> import data, features, job, recipe`. run_race.py's `main`, for one:

    model_args, data_args, training_args = parse_arguments(data.RaceDataArguments, argv, seed_run)
    if training_args.seed_list is not None:  # --seeds: this main once per seed, then the summary
        return run_seeds(main, argv, training_args)
    last_checkpoint = setup(training_args)  # logging, the seed, the output folder's lock, the checkpoint to resume
    applied = None
    if training_args.paper_hparams:  # GLUE, SQuAD and RACE: the paper's row for the task
        model_args, data_args, training_args, applied = apply_paper_hparams(
            *recipe.paper_recipe(data_args), model_args, data_args, training_args, argv, seed_run)
    questions = {split: limit(data.load_race_split(data_args, split, ...), cap)
                 for split, cap in wanted_samples(training_args, data_args).items()}  # what --do_* ask for
    tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForMultipleChoice)
    data_args = features.fit_lengths(data_args, model.config)  # GLUE and NER: fit_max_seq_length
    inputs = {split: features.encode_questions(rows, tokenizer, data_args, ...) for split, rows in questions.items()}
    trainer = AlbertTrainer(model=model, args=best_by_task_metric(training_args, recipe.MAIN_METRIC), ...,
                            compute_metrics=recipe.compute_accuracy)  # SQuAD: job.SquadTrainer
    results = train_evaluate_predict(trainer, training_args, last_checkpoint, len(inputs.get("train", ())),
                                     evaluate=..., predict=..., baseline=lambda: recipe.BASELINE,
                                     seed_run=seed_run)  # evaluate/predict: evaluate_splits, or the task's job
    finish(trainer, model_args, training_args, data_args, applied)  # model card from all_results.json; the push
    return results

and runs it with `run_script(main)` (an `InputError` as one line, the stop signals, the process group freed).

Any albert_hf checkpoint works, and any transformers ALBERT checkpoint (model_type "albert", e.g.
`albert/albert-base-v2` or a local copy) is converted on load: the weight names are the same.
"""

import logging
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import transformers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    HfArgumentParser,
    TrainingArguments,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from .. import AlbertHFConfig
from ..errors import InputError
from ..hub.loading import check_tokenizer, loading
from ..hub.model_card import CardDataset
from ..reports.curves import CURVES_FILE, trainer_curves
from ..runtime import output_lock
from ..runtime.cli import is_first_process, parse_into_dataclasses, run_entry_point
from ..runtime.distributed import cpu_processes_without_gpus, end_distributed, requested_mode
from ..runtime.hardware import bf16_trainer_warning, detect
from ..runtime.preemption import PREEMPTED, StopOnSignal
from ..runtime.storage import check_writable
from .arguments import AlbertTrainingArguments, ModelArguments, SeedRun
from .card import write_finetuned_card
from .paper_hparams import PaperRecipe
from .trainer import StopOnSignalCallback, check_checkpoint

logger = logging.getLogger(__name__)


def parse_arguments(data_arguments_class, argv=None, seed_run: SeedRun | None = None) -> tuple:
    """A fine-tuning script's arguments, checked: the launcher's mode first, then each dataclass's `__post_init__`.

    Args:
        data_arguments_class: the script's data arguments (e.g. `glue.data.GlueDataArguments`).
        argv: the arguments (default: the command line), or one .json/.yaml file holding them.
        seed_run: one seed of a --seeds run (`seeds.run_seeds`): its seed and folder replace --seed and
            --output_dir (`AlbertTrainingArguments.for_seed`); None for a run of its own.

    Returns:
        (ModelArguments, data arguments, AlbertTrainingArguments).

    Raises:
        InputError: a value the checks refuse; argparse's own usage error (exit status 2) for an unknown flag.
    """
    requested_mode()  # a launcher mode that cannot be had stops here, before TrainingArguments try it
    cpu_processes_without_gpus()  # before TrainingArguments decide the device
    model_args, data_args, training_args = parse_into_dataclasses(
        HfArgumentParser((ModelArguments, data_arguments_class, AlbertTrainingArguments)), argv)
    return model_args, data_args, (training_args if seed_run is None else training_args.for_seed(seed_run))


# The split each of TrainingArguments' --do_* flags asks for.
SPLIT_FLAGS = {"train": "--do_train", "validation": "--do_eval", "test": "--do_predict"}


def best_by_task_metric(training_args, metric: str):
    """--load_best_model_at_end without --metric_for_best_model keeps the checkpoint best on the task's main metric
    (`metric`, e.g. "accuracy"; higher is better), as the official code does, where Trainer would take the loss.

    Returns:
        `training_args` itself, or a copy checked again with the metric set.
    """
    if not training_args.load_best_model_at_end or training_args.metric_for_best_model_given:
        return training_args
    logger.info("--load_best_model_at_end keeps the checkpoint with the best dev %s (the task's main metric; "
                "--metric_for_best_model chooses another)", metric)
    return replace(training_args, metric_for_best_model=metric, greater_is_better=True
                   if not training_args.greater_is_better_given else training_args.greater_is_better)


def wanted_splits(training_args) -> list[str]:
    """The splits the run's --do_train / --do_eval / --do_predict ask for, in that order."""
    return [split for split, flag in SPLIT_FLAGS.items() if getattr(training_args, flag[2:])]


def wanted_samples(training_args, data_args) -> dict[str, int | None]:
    """The splits the run asks for and how many rows of each it reads: the one place the scripts learn it.

    Args:
        training_args: --do_train, --do_eval, --do_predict.
        data_args: the script's data arguments, with --max_train_samples, --max_eval_samples, --max_predict_samples.

    Returns:
        {split: max_samples (None: every row)} for "train", "validation", "test" as asked for, in that order. None
        asked for stops the run with one line (InputError).
    """
    caps = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
            "test": data_args.max_predict_samples}
    wanted = {split: caps[split] for split in wanted_splits(training_args)}
    if not wanted:
        raise InputError("nothing to do; pass --do_train, --do_eval and/or --do_predict")
    return wanted


def start_logging(training_args: TrainingArguments) -> None:
    """The scripts' log format, INFO from the main process, transformers' own warnings and above."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if training_args.should_log else logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()


def claim_output_dir(training_args: TrainingArguments) -> Path:
    """--output_dir checked writable and locked for this run (one run per folder, `runtime/output_lock.py`; released
    when the script ends). Returns it as a Path."""
    output_dir = Path(training_args.output_dir)
    check_writable(output_dir, "--output_dir")
    if is_first_process():
        output_lock.acquire(output_dir, "--output_dir", getattr(training_args, "take_over_lock", False))
    return output_dir


def refuse_a_trained_model(output_dir: Path) -> None:
    """An output folder holding a model that no checkpoint or record of ours explains is another run's: never
    silently overwritten."""
    if any(p.suffix in (".safetensors", ".bin") for p in output_dir.iterdir()):
        raise InputError(f"{output_dir} already holds a trained model; pass --overwrite_output_dir to replace it, "
                         "or another --output_dir")


def setup(training_args: TrainingArguments) -> str | None:
    """Logging, seed, and the checkpoint to resume from.

    An output_dir that already holds a run is never silently overwritten: its last checkpoint is resumed, or
    the run stops unless --overwrite_output_dir is given.

    Args:
        training_args: the run's arguments (`output_dir`, `seed`, `do_train`, `resume_from_checkpoint`, `bf16`).

    Returns:
        The checkpoint folder to resume from, or None to start fresh.

    Raises:
        InputError: --output_dir cannot be written, or holds a trained model and no checkpoint.
    """
    start_logging(training_args)
    slow = bf16_trainer_warning(detect()) if training_args.bf16 and training_args.should_log else None
    if slow:  # first, before the data is read: the user can stop a slow run at once
        logger.warning(slow)
    set_seed(training_args.seed)
    output_dir = claim_output_dir(training_args)  # before the data is read
    last_checkpoint = None
    if training_args.do_train and output_dir.is_dir() and not getattr(training_args, "overwrite_output_dir", False):
        last_checkpoint = get_last_checkpoint(str(output_dir))
        if training_args.resume_from_checkpoint:
            last_checkpoint = training_args.resume_from_checkpoint
        elif last_checkpoint is None:
            refuse_a_trained_model(output_dir)
        if last_checkpoint is not None:
            check_checkpoint(last_checkpoint)  # input: checked against its record, read as data only
            logger.info("Resuming from %s (pass --overwrite_output_dir to start over)", last_checkpoint)
    return last_checkpoint


def load_checkpoint_config(model_args: ModelArguments):
    """The checkpoint's own config as saved (AutoConfig: its labels, problem type), before anything overrides it:
    what the scripts compare the data's labels with."""
    flag, config_name = model_args.source("config")
    with loading(flag, config_name):
        return AutoConfig.from_pretrained(config_name, trust_remote_code=model_args.trust_remote_code,
                                          cache_dir=model_args.cache_dir, revision=model_args.model_revision,
                                          token=model_args.token)


def load_tokenizer_and_model(model_args: ModelArguments, model_class, **config_overrides):
    """The tokenizer and the model a fine-tuning run starts from.

    Args:
        model_args: the checkpoint (--model_name_or_path, or --config_name / --tokenizer_name), its Hub revision,
            token and cache folder, and the dropout overrides.
        model_class: the head to load, an AlbertHFFor* class; a transformers ALBERT checkpoint is converted on load.
        **config_overrides: config fields set on load (the labels: num_labels, id2label, label2id, ...).

    Returns:
        (tokenizer, model); the tokenizer always returns token_type_ids. A checkpoint that cannot be read, or a
        tokenizer larger than the model's vocabulary, stops with one line naming the argument (InputError).
    """
    hub = dict(cache_dir=model_args.cache_dir, revision=model_args.model_revision, token=model_args.token)
    flag, tokenizer_name = model_args.source("tokenizer")
    with loading(flag, tokenizer_name):
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=model_args.trust_remote_code, **hub)
    check_tokenizer(tokenizer, flag, tokenizer_name)
    if "token_type_ids" not in tokenizer.model_input_names:
        # transformers' AlbertTokenizer leaves them out by default; ALBERT's segment embeddings need them.
        tokenizer.model_input_names = [*tokenizer.model_input_names, "token_type_ids"]
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob"):
        if getattr(model_args, name) is not None:
            config_overrides[name] = getattr(model_args, name)
    flag, config_name = model_args.source("config")
    with loading(flag, config_name):
        config = AlbertHFConfig.from_pretrained(config_name, **config_overrides, **hub)
    with loading("--model_name_or_path", model_args.model_name_or_path):
        model = model_class.from_pretrained(
            model_args.model_name_or_path, config=config,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **hub,
        )
    if len(tokenizer) > model.config.vocab_size:
        raise InputError(f"The tokenizer has {len(tokenizer)} tokens but the model's vocabulary only "
                         f"{model.config.vocab_size}: they do not belong together")
    return tokenizer, model


def check_columns(dataset, required, where: str, expected: str = "") -> None:
    """Stop with the file/split and the missing column named, before any preprocessing runs; `expected` says
    what the rows should look like (e.g. " for mrpc (expected [...])")."""
    missing = [name for name in required if name not in dataset.column_names]
    if missing:
        raise InputError(f"{where}: missing column(s) {missing}{expected}; found {dataset.column_names}")


def fit_max_seq_length(data_args, config):
    """The data arguments with `max_seq_length` capped at the model's positions, with a warning, as transformers'
    examples do: a script's default (GLUE 128, SQuAD 384, RACE 512) then works with a model that has fewer.

    Args:
        data_args: a script's data arguments (a dataclass with `max_seq_length`); left as they are.
        config: the model's config.

    Returns:
        `data_args` itself when the length fits, else a copy with the capped length, checked again by its
        `__post_init__`.
    """
    if data_args.max_seq_length <= config.max_position_embeddings:
        return data_args
    logger.warning("--max_seq_length %d is longer than the model's %d positions; using %d",
                   data_args.max_seq_length, config.max_position_embeddings, config.max_position_embeddings)
    return replace(data_args, max_seq_length=config.max_position_embeddings)


def padding_collator(collator_class, tokenizer, pad_to_max_length: bool, half_precision: bool):
    """`default_data_collator` when --pad_to_max_length padded the inputs already, else `collator_class` padding each
    batch to its longest row (to a multiple of 8 in fp16/bf16)."""
    if pad_to_max_length:
        return default_data_collator
    return collator_class(tokenizer, pad_to_multiple_of=8 if half_precision else None)


def limit(dataset, max_samples: int | None):
    return dataset if max_samples is None else dataset.select(range(min(max_samples, len(dataset))))


def train(trainer, training_args, last_checkpoint: str | None, num_examples: int | None,
          seed_run: SeedRun | None = None) -> dict:
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
                print(f"Stopped by {stop.name} after step {trainer.state.global_step} of {trainer.state.max_steps}: "
                      f"the training state is in {checkpoint}. To continue, run the same command (it resumes from "
                      f"the last checkpoint in --output_dir){alone}", file=sys.stderr, flush=True)
            raise SystemExit(PREEMPTED)
    # An internal save: with --push_to_hub, Trainer would otherwise upload here with its own model card; `finish`
    # pushes once, with ours.
    trainer.save_model(_internal_call=True)
    metrics = {**result.metrics, "train_samples": num_examples}
    save_results(trainer, "train", metrics)
    trainer.save_state()
    return metrics


def train_evaluate_predict(trainer, training_args, last_checkpoint: str | None, num_train_examples: int | None,
                           evaluate: Callable[[], dict], predict: Callable[[dict | None], dict | None],
                           baseline: Callable[[], object] | None = None, seed_run: SeedRun | None = None) -> dict:
    """The stages every fine-tuning script runs after building its Trainer, in order and as its flags ask:
    --do_train, --do_eval (the dev set), --do_predict (the test set).

    Args:
        trainer: the script's Trainer, its training and evaluation datasets set.
        training_args: the run's `TrainingArguments` (`do_train`, `do_eval`, `do_predict`).
        last_checkpoint: the checkpoint training resumes from (`setup`), or None.
        num_train_examples: the training examples before windowing (questions, sentences), for the start line.
        evaluate: evaluates the dev set, writes eval_results.json and returns its metrics.
        predict: given the dev set's metrics (None without --do_eval; SQuAD 2.0 takes its tuned no-answer
            threshold from them), predicts the test set, writes the task's predictions file and, when the test set
            has labels, predict_results.json; returns those metrics, or None.
        baseline: the dev score of a model that learned nothing (`seeds.Baseline`), which a --seeds run compares
            each seed's with.
        seed_run: the seed of a --seeds run this run is (`parse_arguments`), or None.

    Returns:
        {"validation": metrics, "test": metrics, "baseline": Baseline}, for the stages that ran and gave metrics:
        what `main` returns.
    """
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, num_train_examples, seed_run)
    results = {}
    if training_args.do_eval:
        results["validation"] = evaluate()
        if baseline is not None:
            results["baseline"] = baseline()
    if training_args.do_predict:
        metrics = predict(results.get("validation"))
        if metrics is not None:
            results["test"] = metrics
    return results


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


def finish(trainer, model_args: ModelArguments, training_args, data_args, paper_recipe: PaperRecipe | None = None,
           card_dataset: CardDataset | None = None) -> None:
    """Write the model card (README.md: `card.write_finetuned_card`, metrics from all_results.json) and push
    the output folder when --push_to_hub is set. Nothing contacts the Hub unless pushing.

    Args:
        paper_recipe: what --paper_hparams resolved to, for the card's Recipe section; None without it.
        card_dataset: the card's Data section when the data arguments alone cannot say it (run_glue.py on your own
            data, whose task is read from the data); default `data_args.card_dataset(splits)`.
    """
    def write_card():
        write_finetuned_card(trainer, model_args, training_args, data_args, wanted_splits(training_args),
                             paper_recipe=paper_recipe, dataset=card_dataset)

    if training_args.do_train and not training_args.no_plots and trainer.is_world_process_zero():
        trainer_curves(trainer.state.log_history, Path(training_args.output_dir) / CURVES_FILE)
    if training_args.push_to_hub:
        # Trainer.push_to_hub writes README.md just before uploading: ours (`AlbertTrainer.create_model_card`).
        trainer.push_to_hub(card=write_card)
    elif trainer.is_world_process_zero():
        write_card()


def run_script(main) -> None:
    """A script's entry point: `main()`, then, in every process of a launched run, the process group freed while
    the interpreter is still whole (`distributed.end_distributed`): a gloo group left to the interpreter's exit can
    abort the process after its outputs are written. An InputError (its `error:` line, status 2) or a SystemExit
    (PREEMPTED after a stop signal) ends the process only after that, since its traceback holds main's Trainer and
    with it the group.

    Stop signals (runtime/preemption.py): before the first optimizer step they end the run at once with one line;
    during training (`train`) at the end of a step with a checkpoint; after training they are noted and the run
    completes."""
    run_entry_point(main, finish=end_distributed, stage="reading the data and loading the model")
