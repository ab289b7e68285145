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

The task lives in albert_hf/tasks/squad/: data.py (the arguments, reading), features.py (the windows), definition.py
(the paper's rows, F1), evaluation.py (SquadTrainer, the files) and postprocess.py (answers, metrics); the official v2
answerability head is
AlbertHFForQuestionAnsweringWithAnswerability; the shared flow is albert_hf/tasks/finetuning.py.
"""

import signal

# Run as a script, stop signals wait while the libraries load (seconds); the entry point then handles them (one
# line, status 75). Imported, it leaves the importer's signals alone.
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1))

import logging

from transformers import default_data_collator

from albert_hf.tasks.arguments import SeedRun
from albert_hf.tasks.finetuning import parse_arguments, run_script, setup
from albert_hf.tasks.inputs import best_by_task_metric, wanted_samples
from albert_hf.tasks.outputs import finish, stage_results, train
from albert_hf.tasks.paper_hparams import apply_paper_hparams
from albert_hf.tasks.seeds import run_seeds
from albert_hf.tasks.squad import data, definition, evaluation, features

logger = logging.getLogger(__name__)


def main(argv=None, seed_run: SeedRun | None = None) -> dict:
    model_args, data_args, training_args = parse_arguments(data.SquadDataArguments, argv, seed_run)
    if training_args.seed_list is not None:  # --seeds / --num_seeds: this main once per seed, then the summary
        return run_seeds(main, argv, training_args)
    wanted = wanted_samples(training_args, data_args)
    data.check_sources(data_args, wanted)
    last_checkpoint = setup(training_args)
    applied = None  # the recipe row --paper_hparams applied
    if training_args.paper_hparams:
        model_args, data_args, training_args, applied = apply_paper_hparams(
            *definition.paper_recipe(data_args), model_args, data_args, training_args, argv, seed_run
        )
    tokenizer, model = evaluation.load_tokenizer_and_model(model_args, data_args)
    data_args = features.fit_lengths(data_args, model.config)
    splits = data.load_squad_splits(data_args, wanted, model_args.cache_dir, model_args.token)

    train_examples, train_dataset = features.training_features(splits, tokenizer, data_args, training_args)
    eval_examples = eval_features = None
    if "validation" in splits:  # also asked for by --eval_strategy steps/epoch: evaluations during training use it
        with training_args.main_process_first(desc="evaluation features"):
            eval_examples, eval_features = features.prepare_questions(
                splits["validation"], tokenizer, data_args, data_args.validation_file or "validation"
            )
    trainer = evaluation.SquadTrainer(
        model=model,
        args=best_by_task_metric(training_args, definition.MAIN_METRIC),
        train_dataset=train_dataset,
        processing_class=tokenizer,
        data_collator=default_data_collator,
        data_args=data_args,
        eval_examples=eval_examples,
        eval_features=eval_features,
    )

    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(train_examples), seed_run)
    validation = test = baseline = None
    if training_args.do_eval:
        validation = evaluation.evaluate_and_write(trainer, eval_examples, eval_features, training_args.output_dir)
        baseline = definition.baseline(eval_examples, data_args.version_2_with_negative)
    if training_args.do_predict:
        with training_args.main_process_first(desc="test features"):
            test_examples, test_features = features.prepare_questions(
                splits["test"], tokenizer, data_args, data_args.test_file or "test"
            )
        tuned = (validation or {}).get("eval_null_threshold")  # SQuAD 2.0: the dev set's no-answer threshold
        test = evaluation.predict_and_write(
            trainer, data_args, test_examples, test_features, tuned, training_args.output_dir
        )
    finish(trainer, model_args, training_args, data_args, applied)
    return stage_results(validation, test, baseline)


if __name__ == "__main__":
    run_script(main)
