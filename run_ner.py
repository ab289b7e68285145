#!/usr/bin/env python
"""Fine-tune ALBERT for token classification (named entities, part-of-speech tags), with the arguments of
transformers' run_ner.py.

    python run_ner.py --model_name_or_path albert/albert-base-v2 --train_file train.conll \
        --validation_file dev.conll --do_train --do_eval --output_dir out/ner

Data: CoNLL files (a token and its tag per line, blank lines between sentences), json/jsonl rows with `tokens` and
`ner_tags` (or --text_column_name / --label_column_name), or --dataset_name. Writes, as transformers' run_ner.py,
eval_results.json (`eval_precision`, `eval_recall`, `eval_f1` over entities, `eval_accuracy` over words),
predict_results.json when the test file has tags, predictions.txt (one sentence per line) with --do_predict,
train_results.json and all_results.json. Reading, alignment and metrics: albert_hf/token_classification.py.
"""

import logging
from pathlib import Path

from transformers import DataCollatorForTokenClassification, default_data_collator

from albert_hf import AlbertHFForTokenClassification
from albert_hf import token_classification as ner
from albert_hf.errors import InputError
from albert_hf.finetuning import (
    AlbertTrainer,
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
    train,
)
from albert_hf.text_classification import labels_without_training, reconcile_labels

logger = logging.getLogger("run_ner")


def main(argv=None) -> dict:
    model_args, data_args, training_args = parse_arguments(ner.NerDataArguments, argv)
    if training_args.paper_hparams:
        raise InputError("--paper_hparams: ALBERT's paper has no token-classification recipe; give the "
                         "hyper-parameters explicitly")
    needed = needed_splits(training_args)
    last_checkpoint = setup(training_args)
    raw_splits, sources = ner.load_raw_splits(data_args, needed, cache_dir=model_args.cache_dir)

    checkpoint_config = load_checkpoint_config(model_args)
    config_name = model_args.source("config")[1]
    if "train" in raw_splits:
        names = reconcile_labels(ner.tag_names(raw_splits["train"], sources["train"]), checkpoint_config,
                                 config_name, sources["train"], model_args.ignore_mismatched_sizes, what="tags")
    else:
        names = labels_without_training(checkpoint_config, config_name, what="tags")
    logger.info("Tags: %s", list(names))
    caps = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
            "test": data_args.max_predict_samples}
    splits = {split: limit(ner.encode_tags(dataset, names, sources[split])
                           if "ner_tags" in dataset.column_names else dataset, caps[split])
              for split, dataset in raw_splits.items()}

    tokenizer, model = load_tokenizer_and_model(
        model_args, AlbertHFForTokenClassification, num_labels=len(names), id2label=dict(enumerate(names)),
        label2id={name: i for i, name in enumerate(names)}, finetuning_task="ner")
    fit_max_seq_length(data_args, model.config)
    tokenize = ner.tokenize_function(tokenizer, data_args.max_seq_length, data_args.pad_to_max_length,
                                     data_args.label_all_tokens, names)
    with training_args.main_process_first(desc="tokenizing"):
        features = {split: dataset.map(tokenize, batched=True, num_proc=data_args.preprocessing_num_workers,
                                       load_from_cache_file=not data_args.overwrite_cache, desc=f"Tokenizing {split}")
                    for split, dataset in splits.items()}
    model_inputs = {"input_ids", "attention_mask", "token_type_ids", "labels"}
    inputs = {split: dataset.remove_columns([c for c in dataset.column_names if c not in model_inputs])
              for split, dataset in features.items()}

    per_type = data_args.return_entity_level_metrics
    trainer = AlbertTrainer(
        model=model,
        args=training_args,
        train_dataset=inputs.get("train"),
        eval_dataset=inputs.get("validation"),
        processing_class=tokenizer,
        data_collator=default_data_collator if data_args.pad_to_max_length else DataCollatorForTokenClassification(
            tokenizer, pad_to_multiple_of=8 if training_args.fp16 or training_args.bf16 else None),
        compute_metrics=ner.compute_metrics_function(features["validation"], names, per_type)
        if "validation" in features else None,
    )
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(inputs["train"]))
    results = {}
    if training_args.do_eval:
        results["validation"] = evaluate_splits(trainer, {"validation": inputs["validation"]})
    if training_args.do_predict:
        test = features["test"]
        labelled = "labels" in test.column_names
        trainer.compute_metrics = ner.compute_metrics_function(test, names, per_type) if labelled else None
        output = trainer.predict(inputs["test"], metric_key_prefix="predict")
        if trainer.is_world_process_zero():
            path = ner.write_predictions(Path(training_args.output_dir) / ner.PREDICTIONS_FILE, output.predictions,
                                         test["first_pieces"], names)
            logger.info("test predictions: %s", path)
        if labelled:
            results["test"] = save_results(trainer, "predict", {**output.metrics, "predict_samples": len(test)})
    finish(trainer, model_args, training_args, data_args)
    return results


if __name__ == "__main__":
    run_script(main)
