"""Fine-tune ALBERT on SQuAD v1.1 or v2.0 (transformers' run_qa.py arguments; the official ALBERT recipe).

    python run_squad.py --model_name_or_path albert/albert-base-v2 --train_file train-v1.1.json \
        --validation_file dev-v1.1.json --do_train --do_eval --output_dir out/squad11
    python run_squad.py ... --version_2_with_negative [--answerability_head]

The task logic lives in albert_hf/squad.py (data, features, post-processing, metrics); the official v2
answerability head is AlbertHFForQuestionAnsweringWithAnswerability; the shared flow is albert_hf/finetuning.py.
"""

import logging

from transformers import default_data_collator

from albert_hf import AlbertHFForQuestionAnswering, AlbertHFForQuestionAnsweringWithAnswerability
from albert_hf.finetuning import (
    AlbertTrainer,
    evaluate_splits,
    finish,
    limit,
    load_tokenizer_and_model,
    parse_arguments,
    setup,
    train,
)
from albert_hf.squad import SquadDataArguments, features_dataset, load_squad_splits, make_evaluate, select_trainable

logger = logging.getLogger("run_squad")


def main(argv=None):
    model_args, data_args, training_args = parse_arguments(SquadDataArguments, argv)
    last_checkpoint = setup(training_args)
    if data_args.answerability_head:
        tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForQuestionAnsweringWithAnswerability,
                                                    start_n_top=data_args.start_n_top, end_n_top=data_args.end_n_top)
    else:
        tokenizer, model = load_tokenizer_and_model(model_args, AlbertHFForQuestionAnswering)

    splits = load_squad_splits(data_args, cache_dir=model_args.cache_dir, token=model_args.token)
    for needed, split in ((training_args.do_train, "train"), (training_args.do_eval, "validation")):
        if needed and split not in splits:
            raise ValueError(f"--do_{'train' if split == 'train' else 'eval'} needs a {split} split: give "
                             f"--{split}_file or a --dataset_name that has one")

    train_dataset = None
    if training_args.do_train:
        train_examples = select_trainable(limit(splits["train"], data_args.max_train_samples),
                                          data_args.version_2_with_negative, data_args.train_file or "train")
        with training_args.main_process_first(desc="training features"):
            train_dataset = features_dataset(train_examples, tokenizer, data_args, training=True)
        logger.info("%d training questions -> %d windows", len(train_examples), len(train_dataset))

    trainer = AlbertTrainer(model=model, args=training_args, train_dataset=train_dataset, processing_class=tokenizer,
                            data_collator=default_data_collator)
    if training_args.do_train:
        train(trainer, training_args, last_checkpoint, len(train_examples))
    metrics = None
    if training_args.do_eval:
        eval_examples = limit(splits["validation"], data_args.max_eval_samples)
        metrics = evaluate_splits(trainer, {"validation": eval_examples}, evaluate=make_evaluate(tokenizer, data_args))
    finish(trainer, model_args, training_args, tasks="question-answering", dataset=data_args.dataset_name)
    return metrics


if __name__ == "__main__":
    main()
