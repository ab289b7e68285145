"""The model card of a model fine-tuned by run_glue.py / run_squad.py / run_race.py / run_ner.py: the task's data
(its arguments' `card_dataset`), the training as Trainer ran it, the results and the training log, as the
`CardContent` that hub/model_card.py renders."""

from pathlib import Path
from typing import TYPE_CHECKING

from ..hub.model_card import (
    CURVES_SECTION,
    TASK_NAMES,
    CardContent,
    CardDataset,
    describe_checkpoint,
    eval_results,
    folder_name,
    format_value,
    framework_versions,
    hub_model_name,
    is_metric,
    markdown_table,
    metric_name,
    read_results,
    write_model_card,
)

if TYPE_CHECKING:  # for annotations only
    from transformers import TrainingArguments


def _training_log(log_history) -> str | None:
    """Training loss and evaluations during training, by step (as in transformers' Trainer cards). The log ends
    at Trainer's summary entry (train_runtime): the final evaluations that follow are in the Results section."""
    rows = {}
    for entry in log_history:
        if "train_runtime" in entry:
            break
        values = {"training loss": entry["loss"]} if "loss" in entry else {}
        values.update(
            {
                f"validation {metric_name(key[5:])}": value
                for key, value in entry.items()
                if key.startswith("eval_") and is_metric(key[5:], with_loss=True) and isinstance(value, (int, float))
            }
        )
        if values and "step" in entry:
            rows.setdefault(entry["step"], {"epoch": entry.get("epoch")}).update(values)
    if not rows:
        return None
    columns = ["epoch"] + list(dict.fromkeys(key for row in rows.values() for key in row if key != "epoch"))
    lines = ["| step | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for step, row in rows.items():
        cells = ["" if row.get(column) is None else format_value(row[column]) for column in columns]
        lines.append(f"| {step} | " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def _finetuning_training(trainer, model_args, args: "TrainingArguments") -> dict:
    official = getattr(args, "official_optimizer", False)
    optimizer = (
        "AdamWeightDecay (official: no bias correction, decoupled weight decay)"
        if official
        else f"{getattr(args.optim, 'value', args.optim)} (betas {args.adam_beta1}, {args.adam_beta2})"
    )
    schedule = (
        "linear warm-up, then linear decay to 0 (official)"
        if official
        else str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    )
    config = trainer.model.config
    return {
        "starting checkpoint": model_args.model_name_or_path
        if hub_model_name(model_args.model_name_or_path)
        else f"local folder `{folder_name(model_args.model_name_or_path)}`",
        "optimizer": optimizer,
        "peak learning rate": args.learning_rate,
        "schedule": schedule,
        "warmup steps": args.warmup_steps,
        "weight decay": args.weight_decay,
        "epsilon": args.adam_epsilon,
        "max grad norm": args.max_grad_norm,
        "batch size": args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1),
        "steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch or 0.0, 2),
        "processes": args.world_size,
        "mixed precision": "bf16" if args.bf16 else "fp16" if args.fp16 else "no",
        "hidden dropout": getattr(config, "hidden_dropout_prob", None),
        "classifier dropout": getattr(config, "classifier_dropout_prob", None),
        "seed": args.seed,
    }


def _paper_recipe_section(recipe) -> str:
    rows = {
        name: f"{format_value(value)} (explicit)" if name in recipe.explicit else value
        for name, value in recipe.values.items()
    }
    return (
        f"Trained with `--paper_hparams`: ALBERT's fine-tuning recipe for {recipe.name}, as used (also in "
        '`paper_hparams.json`); "explicit" marks values given on the command line instead of the '
        "recipe's.\n\n" + markdown_table(rows)
    )


def write_finetuned_card(
    trainer,
    model_args,
    training_args,
    data_args,
    splits: list[str],
    paper_recipe=None,
    dataset: CardDataset | None = None,
) -> Path:
    """The card of a model fine-tuned by run_glue.py / run_squad.py / run_race.py / run_ner.py, with the metrics of
    output_dir/all_results.json, the license of --license and the resolved --paper_hparams recipe
    (`tasks.paper_hparams.PaperRecipe`) when given.

    Args:
        splits: the splits the run used ("train", "validation", "test"), which the card's dataset names.
        dataset: the card's Data section; default `data_args.card_dataset(splits)`.

    Returns:
        The path of the card written, output_dir/README.md.
    """
    pipeline_tag, script = data_args.PIPELINE_TAG, data_args.SCRIPT
    output_dir = Path(training_args.output_dir)
    dataset = dataset or data_args.card_dataset(splits)
    results = read_results(output_dir)
    found = eval_results(results, dataset, pipeline_tag)
    base = model_args.model_name_or_path
    summary = (
        f"ALBERT fine-tuned for {TASK_NAMES[pipeline_tag].lower()} on {dataset.name} with albert_hf's "
        f"`{script}`, starting from {describe_checkpoint(base)}."
    )
    if found:
        summary += (
            " Final results: "
            + ", ".join(
                f"{result.metric_name} {format_value(result.metric_value)} ({result.dataset_split})" for result in found
            )
            + "."
        )
    sections = []
    if paper_recipe is not None:
        sections.append(("Recipe", _paper_recipe_section(paper_recipe)))
    if (output_dir / "training_curves.png").is_file():
        sections.append(CURVES_SECTION)
    log = _training_log(trainer.state.log_history)
    if log:
        sections.append(("Training log", log))
    sections.append(("Framework versions", framework_versions()))
    model_name = (training_args.hub_model_id or output_dir.absolute().name).split("/")[-1]
    return write_model_card(
        output_dir,
        trainer.model,
        CardContent(
            title=model_name,
            summary=summary,
            pipeline_tag=pipeline_tag,
            tags=(pipeline_tag, *data_args.card_tags()),
            usage_class=data_args.AUTO_CLASS,
            repo=training_args.hub_model_id,
            data=dataset.description,
            training=_finetuning_training(trainer, model_args, training_args),
            metrics=results,
            license=model_args.license,
            base_model=hub_model_name(base),
            datasets=[dataset.hub_id] if dataset.hub_id else None,
            language="en",
            eval_results=found,
            model_name=model_name,
            sections=tuple(sections),
        ),
    )
