"""Fine-tune ALBERT on SQuAD v1.1 or v2.0 (transformers' run_qa.py arguments; the official ALBERT recipe).

    python run_squad.py --model_name_or_path albert/albert-base-v2 --train_file train-v1.1.json \
        --validation_file dev-v1.1.json --do_train --do_eval --paper_hparams --output_dir out/squad11
    python run_squad.py ... --version_2_with_negative --paper_hparams   # + the answerability head, tuned threshold
    python run_squad.py ... --eval_strategy steps --eval_steps 1000 --save_steps 1000 \
        --load_best_model_at_end --metric_for_best_model f1       # keeps the checkpoint with the best dev F1
    python run_squad.py --model_name_or_path out/squad11 --test_file test.json --do_predict --output_dir out/test

--paper_hparams applies the paper's row for the version (explicit flags win) and writes the values used to
paper_hparams.json.

Writes predictions.json, nbest_predictions.json (v2.0: null_odds.json) and eval_results.json for the dev set;
with --do_predict, predict_predictions.json, predict_nbest_predictions.json (v2.0: predict_null_odds.json) and,
when the test file has answers, predict_results.json; all_results.json holds every result of the run.

The task logic lives in albert_hf/squad.py (arguments, SquadTrainer), albert_hf/squad_features.py (reading,
windows) and albert_hf/squad_postprocess.py (answers, metrics, files); the official v2 answerability head is
AlbertHFForQuestionAnsweringWithAnswerability; the shared flow is albert_hf/finetuning.py.
"""

import logging

from transformers import default_data_collator

from albert_hf import AlbertHFForQuestionAnswering, AlbertHFForQuestionAnsweringWithAnswerability
from albert_hf import squad
from albert_hf.errors import InputError
from albert_hf.finetuning import (
    apply_paper_hparams,
    finish,
    limit,
    load_tokenizer_and_model,
    parse_arguments,
    run_script,
    save_results,
    setup,
    train,
)
from albert_hf.squad import SquadDataArguments, SquadTrainer, paper_recipe
from albert_hf.squad_features import (
    features_dataset,
    has_gold_answers,
    load_squad_splits,
    prepare_questions,
    select_trainable,
)
from albert_hf.squad_postprocess import write_outputs

logger = logging.getLogger("run_squad")

# split -> (what asks for it, the file argument giving it)
NEEDS = {"train": ("--do_train", "train_file"),
         "validation": ("--do_eval (or --eval_strategy steps/epoch)", "validation_file"),
         "test": ("--do_predict", "test_file")}


def main(argv=None):
    model_args, data_args, training_args = parse_arguments(SquadDataArguments, argv)
    wanted = {"train": training_args.do_train, "validation": training_args.do_eval, "test": training_args.do_predict}
    for split, asked in wanted.items():
        flag, file_argument = NEEDS[split]
        if asked and data_args.dataset_name is None and getattr(data_args, file_argument) is None:
            raise InputError(f"{flag} needs a {split} set: give --{file_argument} (or a --dataset_name that "
                             f"has a {split} split)")
    last_checkpoint = setup(training_args)
    recipe = None
    if training_args.paper_hparams:
        recipe = apply_paper_hparams(*paper_recipe(data_args), model_args, data_args, training_args, argv)
    if data_args.answerability_head:
        tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForQuestionAnsweringWithAnswerability,
                                                    start_n_top=data_args.start_n_top, end_n_top=data_args.end_n_top)
    else:
        tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForQuestionAnswering)
    squad.fit_lengths(data_args, model.config)

    splits = load_squad_splits(data_args, cache_dir=model_args.cache_dir, token=model_args.token)
    for split, asked in wanted.items():
        if asked and split not in splits:
            flag, file_argument = NEEDS[split]
            raise InputError(f"{flag} needs a {split} set: --dataset_name {data_args.dataset_name} has no "
                             f"{split} split; give --{file_argument}")

    train_dataset = None
    if training_args.do_train:
        train_examples = select_trainable(limit(splits["train"], data_args.max_train_samples),
                                          data_args.version_2_with_negative, data_args.train_file or "train")
        with training_args.main_process_first(desc="training features"):
            train_dataset = features_dataset(train_examples, tokenizer, data_args, training=True)
        logger.info("%d training questions -> %d windows", len(train_examples), len(train_dataset))
    eval_examples = eval_features = None
    if training_args.do_eval:  # also set by --eval_strategy steps/epoch: the evaluations during training use it
        with training_args.main_process_first(desc="evaluation features"):
            eval_examples, eval_features = prepare_questions(limit(splits["validation"], data_args.max_eval_samples),
                                                             tokenizer, data_args,
                                                             data_args.validation_file or "validation")

    trainer = SquadTrainer(model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer,
                           data_collator=default_data_collator, data_args=data_args, eval_examples=eval_examples,
                           eval_features=eval_features)
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(train_examples))
    metrics = {}
    version_2 = data_args.version_2_with_negative
    if training_args.do_eval:
        result = trainer.evaluate_questions(eval_examples, eval_features)
        if trainer.is_world_process_zero():
            write_outputs(training_args.output_dir, "", result.predictions, result.nbest, result.null_odds)
        metrics.update(save_results(trainer, "eval", {**result.metrics, "eval_samples": len(eval_examples)}))
    if training_args.do_predict:
        with training_args.main_process_first(desc="test features"):
            test_examples, test_features = prepare_questions(limit(splits["test"], data_args.max_predict_samples),
                                                             tokenizer, data_args, data_args.test_file or "test")
        null_threshold = None
        if version_2 and data_args.tune_null_threshold and "eval_null_threshold" in metrics:
            null_threshold = metrics["eval_null_threshold"]
            logger.info("Test predictions use the null threshold tuned on the dev set: %.4f", null_threshold)
        elif version_2 and data_args.tune_null_threshold and not has_gold_answers(test_examples):
            logger.warning("--tune_null_threshold: no dev evaluation in this run and no answers in the test set to "
                           "tune on; the test predictions use --null_score_diff_threshold %s",
                           data_args.null_score_diff_threshold)
        result = trainer.predict_questions(test_examples, test_features, null_threshold=null_threshold)
        if trainer.is_world_process_zero():
            write_outputs(training_args.output_dir, "predict", result.predictions, result.nbest, result.null_odds)
        if has_gold_answers(test_examples):
            metrics.update(save_results(trainer, "predict",
                                        {**result.metrics, "predict_samples": len(test_examples)}))
        else:
            logger.info("%s has no answers: predictions written, no metrics (predict_results.json)",
                        data_args.test_file or "the test split")
    finish(trainer, model_args, training_args, data_args, recipe)
    return metrics


if __name__ == "__main__":
    run_script(main)
