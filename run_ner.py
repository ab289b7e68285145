#!/usr/bin/env python
"""Fine-tune ALBERT for token classification (named entities, part-of-speech tags), with the arguments of
transformers' run_ner.py.

    python run_ner.py --model_name_or_path albert/albert-base-v2 --train_file train.conll \
        --validation_file dev.conll --do_train --do_eval --output_dir out/ner

Data: CoNLL files (a token and its tag per line, blank lines between sentences), json/jsonl rows with `tokens` and
`ner_tags` (or --text_column_name / --label_column_name), or --dataset_name. Writes, as transformers' run_ner.py,
eval_results.json (`eval_precision`, `eval_recall`, `eval_f1` over entities, `eval_accuracy` over words),
predict_results.json when the test file has tags, predictions.txt (one sentence per line) with --do_predict,
train_results.json and all_results.json. The task: albert_hf/tasks/ner/ (data.py,
features.py, definition.py, evaluation.py).
"""

import signal

# Run as a script, stop signals wait while the libraries load (seconds); the entry point then handles them (one
# line, status 75). Imported, it leaves the importer's signals alone.
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1))

from transformers import DataCollatorForTokenClassification

from albert_hf import AlbertHFForTokenClassification
from albert_hf.errors import InputError
from albert_hf.tasks.arguments import SeedRun
from albert_hf.tasks.finetuning import parse_arguments, run_script, setup
from albert_hf.tasks.inputs import (
    best_by_task_metric,
    fit_max_seq_length,
    load_checkpoint_config,
    load_tokenizer_and_model,
    padding_collator,
    wanted_samples,
)
from albert_hf.tasks.ner import data, definition, evaluation, features
from albert_hf.tasks.outputs import evaluate_splits, finish, stage_results, train
from albert_hf.tasks.seeds import run_seeds
from albert_hf.tasks.trainer import AlbertTrainer


def main(argv=None, seed_run: SeedRun | None = None) -> dict:
    model_args, data_args, training_args = parse_arguments(data.NerDataArguments, argv, seed_run)
    if training_args.seed_list is not None:  # --seeds / --num_seeds: this main once per seed, then the summary
        return run_seeds(main, argv, training_args)
    if training_args.paper_hparams:
        raise InputError(
            "--paper_hparams: ALBERT's paper has no token-classification recipe; give the hyper-parameters explicitly"
        )
    wanted = wanted_samples(training_args, data_args)
    last_checkpoint = setup(training_args)
    raw_splits, sources = data.load_raw_splits(data_args, wanted, model_args.cache_dir, model_args.token)
    names = data.tags_of(
        raw_splits,
        sources,
        load_checkpoint_config(model_args),
        model_args.source("config")[1],
        model_args.ignore_mismatched_sizes,
    )
    splits = data.encoded_splits(raw_splits, sources, names, wanted)
    tokenizer, model = load_tokenizer_and_model(
        model_args,
        AlbertHFForTokenClassification,
        num_labels=len(names),
        id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)},
        finetuning_task="ner",
    )
    data_args = fit_max_seq_length(data_args, model.config)
    words, inputs = features.tokenize_splits(splits, tokenizer, data_args, names, training_args.main_process_first)
    per_type = data_args.return_entity_level_metrics
    trainer = AlbertTrainer(
        model=model,
        args=best_by_task_metric(training_args, definition.MAIN_METRIC),
        train_dataset=inputs.get("train"),
        eval_dataset=inputs.get("validation"),
        processing_class=tokenizer,
        data_collator=padding_collator(
            DataCollatorForTokenClassification,
            tokenizer,
            data_args.pad_to_max_length,
            training_args.fp16 or training_args.bf16,
        ),
        compute_metrics=definition.compute_metrics_function(words["validation"], names, per_type)
        if "validation" in words
        else None,
    )
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(inputs.get("train", ())), seed_run)
    validation = test = None
    if training_args.do_eval:
        validation = evaluate_splits(trainer, {"validation": inputs["validation"]})
    if training_args.do_predict:
        test = evaluation.predict_and_write(
            trainer, words["test"], inputs["test"], names, per_type, training_args.output_dir
        )
    finish(trainer, model_args, training_args, data_args)
    return stage_results(validation, test, definition.BASELINE if validation else None)


if __name__ == "__main__":
    run_script(main)
