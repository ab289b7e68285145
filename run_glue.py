#!/usr/bin/env python
"""Fine-tune ALBERT on a GLUE task or on your own labelled data, with the arguments of transformers' run_glue.py.

    python run_glue.py --model_name_or_path albert/albert-base-v2 --task_name mrpc --data_dir glue_data/MRPC \
        --do_train --do_eval --do_predict --paper_hparams --output_dir out/mrpc
    python run_glue.py --model_name_or_path MODEL --train_file train.csv --validation_file dev.csv \
        --do_train --do_eval --output_dir out/mine

Without --task_name the data is yours (albert_hf/text_classification.py): csv/tsv/json/jsonl/parquet files or a
--dataset_name, its label names in the saved config, accuracy and macro-F1 (or Pearson, Spearman and MSE for float
labels), and test predictions with the label names in predict_results.txt.

--paper_hparams applies the task's row of ALBERT's recipe (explicit flags win) and writes the values used to
paper_hparams.json.

Data: the Hub's nyu-mll/glue by task name, or local files (--data_dir with the original GLUE TSVs,
--train_file/--validation_file/--test_file as .tsv/.csv/.json/.jsonl). Writes, as transformers' run_glue.py,
train_results.json, eval_results.json (MNLI's mismatched dev set as `eval_accuracy_mm`, ...), predict_results.json
when a test file has labels (the GLUE test files have none), and all_results.json with them all; with --do_predict
the GLUE submission files (MRPC.tsv, MNLI-m.tsv, ...). Task logic: albert_hf/glue.py.
"""

import logging
from pathlib import Path

from transformers import DataCollatorWithPadding, default_data_collator

from albert_hf import AlbertHFForSequenceClassification
from albert_hf import glue, text_classification
from albert_hf.errors import InputError
from albert_hf.finetuning import (
    SPLIT_FLAGS,
    AlbertTrainer,
    apply_paper_hparams,
    evaluate_splits,
    finish,
    fit_max_seq_length,
    limit,
    load_checkpoint_config,
    load_tokenizer_and_model,
    needed_splits,
    parse_arguments,
    run_script,
    save_results,
    setup,
    suffixed,
    train,
)

logger = logging.getLogger("run_glue")

# A second dev or test set's metric keys get this suffix, as in transformers' run_glue.py (mnli-mm).
SUFFIXES = {"validation_mismatched": "_mm", "test_mismatched": "_mm"}


def labels_of_test_set(raw, task, where: str):
    """The encoded labels of a test set when it has them all, else None: the GLUE test files have no label
    column, the Hub's test splits have -1; a file with only some labelled rows gets a warning."""
    if "label" not in raw.column_names:
        return None
    missing = [value is None or str(value).strip() in ("", "-1") for value in raw["label"]]
    if all(missing):
        return None
    if any(missing):
        logger.warning("%s: %d of %d rows have no label: no metrics (predict_results.json) for it", where,
                       sum(missing), len(missing))
        return None
    return task.encode_labels(raw, where)["label"]


def main(argv=None):
    model_args, data_args, training_args = parse_arguments(glue.GlueDataArguments, argv)
    task = data_args.task  # None: the user's own data, whose task is read from it below
    needed = needed_splits(training_args)
    if task is not None and task.predict_only and needed != {"test"}:
        raise InputError(f"{task.name} is the GLUE diagnostic set (unlabelled): --do_predict only, with a "
                         "model fine-tuned on MNLI")
    last_checkpoint = setup(training_args)  # logging first, so that what --paper_hparams sets is logged
    recipe = None
    if training_args.paper_hparams:
        if task is None:
            raise InputError("--paper_hparams is the paper's recipe for a GLUE --task_name; for your own data give "
                             "the hyper-parameters explicitly")
        recipe = apply_paper_hparams(*glue.paper_recipe(task), model_args, data_args, training_args, argv)

    if task is None:
        raw_splits, sources = text_classification.load_raw_splits(data_args, needed, cache_dir=model_args.cache_dir)
    else:
        raw_splits, sources = glue.load_raw_splits(data_args, needed, cache_dir=model_args.cache_dir)
        for kind in needed:
            if not any(task.split_kind(split) == kind for split in raw_splits):
                raise InputError(f"{SPLIT_FLAGS[kind]} needs {kind} data for {task.name}: pass --{kind}_file, or a "
                                 "--data_dir holding "
                                 f"{[n for split, n in task.tsv_files.items() if task.split_kind(split) == kind]}")
        splits = glue.prepare_splits(raw_splits, sources, task)  # the data's checks before the model is read
    checkpoint_config = load_checkpoint_config(model_args)
    config_name = model_args.source("config")[1]
    if task is None:
        task = data_args.task = text_classification.infer_task(
            raw_splits, sources, data_args, checkpoint_config, config_name, model_args.ignore_mismatched_sizes)
        logger.info("Your data: %s", task.describe())
        splits = glue.prepare_splits(raw_splits, sources, task)
    else:
        glue.check_checkpoint_labels(checkpoint_config, task)
    max_samples = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                   "test": data_args.max_predict_samples}
    splits = {split: limit(dataset, max_samples[task.split_kind(split)]) for split, dataset in splits.items()}

    tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForSequenceClassification, **task.label_config())
    fit_max_seq_length(data_args, model.config)
    tokenize = glue.tokenize_function(tokenizer, task, data_args.max_seq_length, data_args.pad_to_max_length)
    features = {}
    with training_args.main_process_first(desc="tokenizing"):
        for split, dataset in splits.items():
            features[split] = dataset.map(
                tokenize, batched=True, num_proc=data_args.preprocessing_num_workers,
                remove_columns=[c for c in dataset.column_names if c != "label"],
                load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenizing {split}")

    if data_args.pad_to_max_length:
        collator = default_data_collator
    else:
        collator = DataCollatorWithPadding(
            tokenizer, pad_to_multiple_of=8 if training_args.fp16 or training_args.bf16 else None)
    validation_splits = [split for split in features if task.split_kind(split) == "validation"]
    trainer = AlbertTrainer(
        model=model,
        args=training_args,
        train_dataset=features.get("train"),
        # The first dev set (MNLI: matched) is the one --eval_strategy / --load_best_model_at_end use.
        eval_dataset=features[validation_splits[0]] if validation_splits else None,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=task.compute_metrics_function(),
    )

    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(features["train"]))
    if training_args.do_eval:
        evaluate_splits(trainer, {split: features[split] for split in validation_splits}, suffixes=SUFFIXES)
    if training_args.do_predict:
        predict_metrics = {}
        for split in [split for split in features if task.split_kind(split) == "test"]:
            dataset = features[split]
            labels = labels_of_test_set(raw_splits[split].select(range(len(dataset))), task,
                                        f"{sources[split]} ({split})")
            if labels is not None:  # then Trainer.predict computes the task metric too
                dataset = dataset.add_column("label", labels)
            output = trainer.predict(dataset, metric_key_prefix="predict")
            indices = splits[split]["idx"] if "idx" in splits[split].column_names else range(len(splits[split]))
            if trainer.is_world_process_zero():
                path = task.write_predictions(Path(training_args.output_dir) / task.submission_files[split],
                                              indices, output.predictions)
                logger.info("%s predictions: %s", split, path)
            if labels is not None:
                metrics = {**output.metrics, "predict_samples": len(dataset)}
                predict_metrics.update(suffixed(metrics, SUFFIXES.get(split, "")))
        if predict_metrics:
            save_results(trainer, "predict", predict_metrics)
    if training_args.do_train or training_args.push_to_hub:
        finish(trainer, model_args, training_args, data_args, recipe)


if __name__ == "__main__":
    run_script(main)
