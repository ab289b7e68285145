#!/usr/bin/env python
"""Fine-tune ALBERT on a GLUE task or on your own labelled data, with the arguments of transformers' run_glue.py.

    python run_glue.py --model_name_or_path albert/albert-base-v2 --task_name mrpc --data_dir glue_data/MRPC \
        --do_train --do_eval --do_predict --paper_hparams --output_dir out/mrpc
    python run_glue.py --model_name_or_path MODEL --train_file train.csv --validation_file dev.csv \
        --do_train --do_eval --output_dir out/mine

Without --task_name the data is yours (`albert_hf.tasks.own_data.data.OwnData`): csv/tsv/json/jsonl/parquet files or a
--dataset_name, its label names in the saved config, accuracy and macro-F1 (or Pearson, Spearman and MSE for float
labels), and test predictions with the label names in predict_results.txt.

--paper_hparams applies the task's row of ALBERT's recipe (explicit flags win) and writes the values used to
paper_hparams.json. --seeds 1 2 3 runs once per seed, each in OUTPUT_DIR/seed_N, and puts the summary
(all_seeds_results.json) and the best seed's model in OUTPUT_DIR (albert_hf/tasks/seeds.py); so do the other
scripts.

Data: the Hub's nyu-mll/glue by task name, or local files (--data_dir with the original GLUE TSVs,
--train_file/--validation_file/--test_file as .tsv/.csv/.json/.jsonl). Writes, as transformers' run_glue.py,
train_results.json, eval_results.json (MNLI's mismatched dev set as `eval_accuracy_mm`, ...), predict_results.json
when a test file has labels (the GLUE test files have none), and all_results.json with them all; with --do_predict
the GLUE submission files (MRPC.tsv, MNLI-m.tsv, ...). Task logic: albert_hf/tasks/glue/ (data.py, files.py,
features.py, definition.py, evaluation.py); your own data: albert_hf/tasks/own_data/.
"""

import signal

# Run as a script, stop signals wait while the libraries load (seconds); the entry point then handles them (one
# line, status 75). Imported, it leaves the importer's signals alone.
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1))

from transformers import DataCollatorWithPadding

from albert_hf import AlbertHFForSequenceClassification
from albert_hf.tasks.arguments import SeedRun
from albert_hf.tasks.finetuning import parse_arguments, run_script, setup
from albert_hf.tasks.glue import data, definition, evaluation, features
from albert_hf.tasks.inputs import (
    best_by_task_metric,
    fit_max_seq_length,
    load_tokenizer_and_model,
    padding_collator,
    wanted_samples,
)
from albert_hf.tasks.outputs import evaluate_splits, finish, stage_results, train
from albert_hf.tasks.paper_hparams import apply_paper_hparams
from albert_hf.tasks.seeds import run_seeds
from albert_hf.tasks.trainer import AlbertTrainer


def main(argv=None, seed_run: SeedRun | None = None) -> dict:
    model_args, data_args, training_args = parse_arguments(data.GlueDataArguments, argv, seed_run)
    if training_args.seed_list is not None:  # --seeds / --num_seeds: this main once per seed, then the summary
        return run_seeds(main, argv, training_args)
    wanted = wanted_samples(training_args, data_args)
    # The task's data: a GLUE --task_name (`data.GlueTaskData`) or your own (`OwnData` in albert_hf/tasks/own_data/)
    data_args.task_data.check_wanted(wanted)
    last_checkpoint = setup(training_args)  # logging first, so that what --paper_hparams sets is logged
    applied = None  # the recipe row --paper_hparams applied
    if training_args.paper_hparams:
        model_args, data_args, training_args, applied = apply_paper_hparams(
            *data_args.task_data.paper_recipe(), model_args, data_args, training_args, argv, seed_run
        )
    task, raw_splits, sources, splits = data.task_and_splits(data_args, model_args, wanted)

    tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForSequenceClassification, **task.label_config())
    data_args = fit_max_seq_length(data_args, model.config)
    inputs = features.tokenize_splits(splits, tokenizer, task, data_args, training_args.main_process_first)

    validation_splits = [split for split in inputs if task.split_kind(split) == "validation"]
    trainer = AlbertTrainer(
        model=model,
        args=best_by_task_metric(training_args, task.main_metric),
        train_dataset=inputs.get("train"),
        # The first dev set (MNLI: matched) is the one --eval_strategy / --load_best_model_at_end use.
        eval_dataset=inputs[validation_splits[0]] if validation_splits else None,
        processing_class=tokenizer,
        data_collator=padding_collator(
            DataCollatorWithPadding, tokenizer, data_args.pad_to_max_length, training_args.fp16 or training_args.bf16
        ),
        compute_metrics=task.compute_metrics_function(),
    )
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(inputs.get("train", ())), seed_run)
    validation = test = baseline = None
    if training_args.do_eval:
        dev_sets = {split: inputs[split] for split in validation_splits}
        validation = evaluate_splits(trainer, dev_sets, suffixes=evaluation.SUFFIXES)
        baseline = definition.baseline(task, inputs[validation_splits[0]])
    if training_args.do_predict:
        test = evaluation.predict_and_write(
            trainer, task, inputs, raw_splits, splits, sources, training_args.output_dir
        )
    if training_args.do_train or training_args.push_to_hub:
        finish(trainer, model_args, training_args, data_args, applied, data_args.card_dataset(wanted, task))
    return stage_results(validation, test, baseline)


if __name__ == "__main__":
    run_script(main)
