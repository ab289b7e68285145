"""--paper_hparams: ALBERT's fine-tuning recipes applied to a script's arguments (the tasks hold their rows), and the
official optimizer settings and evaluation schedule the rows share."""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from transformers import HfArgumentParser

from ..errors import InputError
from ..runtime.cli import explicit_arguments, parse_into_dataclasses

logger = logging.getLogger(__name__)

# Every official fine-tuning script (run_classifier.py, run_squad_v1/v2.py, run_race.py) builds the optimizer of
# optimization.py: AdamWeightDecay without bias correction, eps 1e-6, decoupled weight decay 0.01, linear warm-up
# then linear decay counted from step 0, global-norm clipping at 1.0.
OFFICIAL_FINETUNING = dict(official_optimizer=True, adam_epsilon=1e-6, weight_decay=0.01, max_grad_norm=1.0)
PAPER_HPARAMS_FILE = "paper_hparams.json"


# The flags of an evaluation schedule: one given explicitly replaces the recipe's schedule as a whole (a recipe's
# --save_steps beside the user's --save_strategy no would contradict --load_best_model_at_end).
EVALUATION_SCHEDULE = {"eval_strategy", "eval_steps", "save_strategy", "save_steps", "load_best_model_at_end"}


def best_on_dev(steps: int) -> dict:
    """A recipe's evaluation schedule: every `steps` steps a checkpoint is scored on dev, and the best is kept
    (`recipe_arguments` applies it to runs with --do_train and --do_eval; the others have no dev set)."""
    return dict(best_checkpoint_every=steps)


@dataclass
class PaperRecipe:
    """What --paper_hparams resolved to, for paper_hparams.json and the model card."""

    name: str  # the recipe's row, e.g. "mrpc", "SQuAD v2.0", "RACE, v2 models"
    values: dict  # argument name -> the value the run uses (the recipe's, or the user's explicit one)
    explicit: list  # the names whose value the user gave explicitly


def recipe_arguments(
    recipe: dict, explicit: set[str], batch_divisor: int, hidden_dropout_prob: float, with_dev_set: bool = False
) -> dict:
    """A task's recipe as the arguments it sets, in the recipe's order.

    `recipe` holds argument values by name, and two values of the recipe tables:
    - `batch_size`, the total batch: per_device_train_batch_size = batch / (gradient_accumulation_steps x
      processes);
    - `albert_dropout`, the paper's "ALBERT DR": the released configurations give the hidden and the attention
      dropout one value, so it sets both hidden_dropout_prob and attention_probs_dropout_prob. An explicit
      --hidden_dropout_prob replaces it for both, unless --attention_probs_dropout_prob is given too.
    An explicit --num_train_epochs keeps the epoch count instead of the recipe's max_steps. A run that trains and
    evaluates (`with_dev_set`) gets the recipe's evaluation schedule, `best_checkpoint_every` (`best_on_dev`):
    a checkpoint scored on dev every that many steps, the best one loaded at the end (by the task's main metric,
    `best_by_task_metric`) and two kept on disk; unless one of `EVALUATION_SCHEDULE` is explicit, which makes the
    schedule the user's, as given.

    Args:
        recipe: the row, e.g. `glue.recipe.paper_recipe(task)[1]`.
        explicit: the arguments the user gave (`runtime.cli.explicit_arguments`).
        batch_divisor: gradient_accumulation_steps x processes, which the total batch is divided by.
        hidden_dropout_prob: the run's --hidden_dropout_prob, which an explicit one gives the attention too.
        with_dev_set: whether the run trains and evaluates (--do_train and --do_eval).

    Returns:
        argument name -> the recipe's value, explicit arguments included (the caller keeps the user's).
    """
    recipe = dict(recipe)
    batch_size = recipe.pop("batch_size", None)
    if batch_size is not None:
        if "per_device_train_batch_size" not in explicit and batch_size % batch_divisor:
            raise InputError(
                f"--paper_hparams: the total batch {batch_size} is not divisible by "
                f"gradient_accumulation_steps x processes = {batch_divisor}; give "
                "--per_device_train_batch_size"
            )
        recipe["per_device_train_batch_size"] = batch_size // batch_divisor
    if "albert_dropout" in recipe:
        dropout = recipe.pop("albert_dropout")
        recipe["hidden_dropout_prob"] = dropout
        recipe["attention_probs_dropout_prob"] = hidden_dropout_prob if "hidden_dropout_prob" in explicit else dropout
    if "num_train_epochs" in explicit:
        recipe.pop("max_steps", None)
    every = recipe.pop("best_checkpoint_every", None)
    if every is not None and with_dev_set and not explicit & EVALUATION_SCHEDULE:
        recipe.update(
            eval_strategy="steps",
            eval_steps=every,
            save_strategy="steps",
            save_steps=every,
            load_best_model_at_end=True,
            save_total_limit=2,
        )
    return recipe


def apply_paper_hparams(
    name: str, recipe: dict, model_args, data_args, training_args, argv=None, seed_run=None
) -> tuple:
    """--paper_hparams in a script: the arguments parsed again from `argv` with the recipe's values as their
    defaults, so that explicit flags win and every argument check runs once on the values the run uses; those
    values are logged and written to OUTPUT_DIR/paper_hparams.json (TrainingArguments' names).

    Args:
        name: the recipe's row, e.g. "mrpc", "SQuAD v2.0", "RACE, v2 models".
        recipe: its values (`recipe_arguments`).
        model_args, data_args, training_args: the arguments `parse_arguments` gave; left as they are.
        argv: the script's arguments (default: the command line), or one .json/.yaml file.
        seed_run (`arguments.SeedRun`, *optional*): one seed of a --seeds run, whose seed and folder replace the
            parsed ones again (`AlbertTrainingArguments.for_seed`), as `finetuning.parse_arguments` did.

    Returns:
        (model_args, data_args, training_args, PaperRecipe): the arguments the run uses, and what the recipe
        resolved to, for the model card.
    """
    types = (type(model_args), type(data_args), type(training_args))
    explicit = explicit_arguments(argv, types)
    arguments = recipe_arguments(
        recipe,
        explicit,
        training_args.gradient_accumulation_steps * training_args.world_size,
        model_args.hidden_dropout_prob,
        training_args.do_train and training_args.do_eval,
    )
    applied = {argument: value for argument, value in arguments.items() if argument not in explicit}
    parsed = parse_into_dataclasses(HfArgumentParser(types), argv, defaults=applied)
    names = list(arguments)
    if "per_device_train_batch_size" in arguments:  # the per-device batch is the total batch only with these
        names.append("gradient_accumulation_steps")
    if "num_train_epochs" in explicit:
        names.append("num_train_epochs")
    values = {
        argument: next(getattr(args, argument) for args in parsed if hasattr(args, argument)) for argument in names
    }
    resolved = PaperRecipe(name, values, sorted(explicit & set(values)))
    logger.info(
        "--paper_hparams (%s) set: %s; kept your explicit %s",
        name,
        ", ".join(f"{k}={v}" for k, v in applied.items()),
        resolved.explicit or "nothing",
    )
    model_args, data_args, training_args = parsed
    if seed_run is not None:
        training_args = training_args.for_seed(seed_run)
    if training_args.should_save:
        path = Path(training_args.output_dir) / PAPER_HPARAMS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(resolved.values, indent=2) + "\n", encoding="utf-8")
        logger.info("The recipe used is in %s", path)
    return model_args, data_args, training_args, resolved
