"""The flow run_glue.py, run_squad.py, run_race.py and run_ner.py share, by stage: the arguments and the start
(here: `parse_arguments`, `setup`, `run_script`), the inputs (tasks/inputs.py: the splits asked for, the tokenizer
and model, lengths fitted to the model), training and its outputs (tasks/outputs.py: `train`, `evaluate_splits`, the
results files, `finish` with the card and the push). The arguments are in tasks/arguments.py, the Trainer in
tasks/trainer.py, --paper_hparams in tasks/paper_hparams.py, --seeds in tasks/seeds.py.

Each task is a package of the same shape (tasks/<task>/: `data`, `features`, `definition`, and `evaluation` where
the task writes predictions of its own), and each script's `main` is the same skeleton:

    arguments = parse_arguments(...)           # --seeds: `run_seeds` runs main once per seed, then the summary
    last_checkpoint = setup(training_args)     # logging, the seed, the output folder's lock, the checkpoint
    (--paper_hparams: the paper's row for the task replaces the defaults)
    rows = the task's data (data.py), as many as the --do_* flags want (`wanted_samples`)
    tokenizer, model = load_tokenizer_and_model(...); lengths fitted to the model
    inputs = the task's features (features.py)
    trainer = AlbertTrainer(... best_by_task_metric(training_args, definition.MAIN_METRIC) ...)
    if training_args.do_train: train(trainer, ...)
    if training_args.do_eval: validation = evaluate_splits(trainer, ...); baseline = definition.baseline(...)
    if training_args.do_predict: test = evaluation.predict_and_write(trainer, ...)
    finish(...)                                # the card from all_results.json; the push
    return stage_results(validation, test, baseline)

and runs it with `run_script(main)` (an `InputError` as one line, the stop signals, the process group freed).

Any albert_hf checkpoint works, and any transformers ALBERT checkpoint (model_type "albert", e.g.
`albert/albert-base-v2` or a local copy) is converted on load: the weight names are the same.
"""

import logging
from pathlib import Path

import transformers
from transformers import HfArgumentParser, TrainingArguments, set_seed
from transformers.trainer_utils import get_last_checkpoint

from ..errors import InputError
from ..runtime import output_lock
from ..runtime.cli import is_first_process, parse_into_dataclasses, run_entry_point
from ..runtime.distributed import cpu_processes_without_gpus, end_distributed, requested_mode
from ..runtime.hardware import bf16_trainer_warning, detect
from ..runtime.storage import check_writable
from .arguments import AlbertTrainingArguments, ModelArguments, SeedRun
from .trainer import check_checkpoint

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
        HfArgumentParser((ModelArguments, data_arguments_class, AlbertTrainingArguments)), argv
    )
    return model_args, data_args, (training_args if seed_run is None else training_args.for_seed(seed_run))


def start_logging(training_args: TrainingArguments) -> None:
    """The scripts' log format, INFO from the main process, transformers' own warnings and above."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        level=logging.INFO if training_args.should_log else logging.WARNING,
    )
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
        raise InputError(
            f"{output_dir} already holds a trained model; pass --overwrite_output_dir to replace it, "
            "or another --output_dir"
        )


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
