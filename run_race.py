#!/usr/bin/env python
"""Fine-tune ALBERT on RACE (multiple-choice reading comprehension), as the official run_race.py does.

    python run_race.py --model_name_or_path albert/albert-base-v2 --data_dir RACE --do_train --do_eval \
        --do_predict --paper_hparams --output_dir out/race     # v1 models: add --race_recipe v1

--paper_hparams applies the recipe's RACE row (explicit flags win) and writes the values used to
paper_hparams.json.

Data (official layout, folders or files of JSON articles, Hub-style rows, `--dataset_name ehovy/race`),
formatting and metrics live in albert_hf/tasks/race/; the shared flow in albert_hf/tasks/finetuning.py.

Results as transformers' example scripts write them: eval_results.json (dev set, --do_eval: `eval_accuracy`, per
level `eval_accuracy_high`/`eval_accuracy_middle` with `eval_num_high`/`eval_num_middle`), predict_results.json
(test set, --do_predict: the same keys with `predict_`), train_results.json, and all_results.json holding them all;
the chosen letters in predictions_validation.json and predictions_test.json.
"""

import signal

# Run as a script, stop signals wait while the libraries load (seconds); the entry point then handles them (one
# line, status 75). Imported, it leaves the importer's signals alone.
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1))

from albert_hf import AlbertHFForMultipleChoice
from albert_hf.errors import InputError
from albert_hf.tasks.arguments import SeedRun
from albert_hf.tasks.finetuning import parse_arguments, run_script, setup
from albert_hf.tasks.inputs import best_by_task_metric, limit, load_tokenizer_and_model, wanted_samples
from albert_hf.tasks.outputs import evaluate_splits, finish, stage_results, train
from albert_hf.tasks.paper_hparams import apply_paper_hparams
from albert_hf.tasks.race import data, definition, evaluation, features
from albert_hf.tasks.seeds import run_seeds
from albert_hf.tasks.trainer import AlbertTrainer


def main(argv=None, seed_run: SeedRun | None = None) -> dict:
    model_args, data_args, training_args = parse_arguments(data.RaceDataArguments, argv, seed_run)
    if training_args.seed_list is not None:  # --seeds / --num_seeds: this main once per seed, then the summary
        return run_seeds(main, argv, training_args)
    if data_args.race_recipe != "v2" and not training_args.paper_hparams:
        raise InputError(
            f"--race_recipe {data_args.race_recipe} chooses the row --paper_hparams applies: pass --paper_hparams too"
        )
    last_checkpoint = setup(training_args)
    applied = None  # the recipe row --paper_hparams applied
    if training_args.paper_hparams:
        model_args, data_args, training_args, applied = apply_paper_hparams(
            *definition.paper_recipe(data_args), model_args, data_args, training_args, argv, seed_run
        )

    questions = {
        split: limit(data.load_race_split(data_args, split, model_args.cache_dir, model_args.token), cap)
        for split, cap in wanted_samples(training_args, data_args).items()
    }

    tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForMultipleChoice)
    data_args = features.fit_lengths(data_args, model.config)
    with training_args.main_process_first(desc="RACE tokenization"):
        inputs = {
            split: features.encode_questions(rows, tokenizer, data_args, f"RACE {split}")
            for split, rows in questions.items()
        }

    trainer = AlbertTrainer(
        model=model,
        args=best_by_task_metric(training_args, definition.MAIN_METRIC),
        train_dataset=inputs.get("train"),
        eval_dataset=inputs.get("validation"),
        processing_class=tokenizer,
        data_collator=features.data_collator(tokenizer, data_args, training_args.fp16 or training_args.bf16),
        compute_metrics=definition.compute_accuracy,
    )

    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(inputs.get("train", ())), seed_run)
    # Both evaluations also write the chosen letters, predictions_<split>.json.
    evaluate = evaluation.evaluate_and_write_predictions
    validation = test = None
    if training_args.do_eval:
        validation = evaluate_splits(trainer, {"validation": inputs["validation"]}, evaluate=evaluate, prefix="eval")
    if training_args.do_predict:
        test = evaluate_splits(trainer, {"test": inputs["test"]}, evaluate=evaluate, prefix="predict")
    finish(trainer, model_args, training_args, data_args, applied)
    return stage_results(validation, test, definition.BASELINE if validation else None)


if __name__ == "__main__":
    run_script(main)
