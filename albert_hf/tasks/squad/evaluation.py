"""SQuAD v1.1 / v2.0 for run_squad.py: `SquadTrainer` and the evaluation and prediction files; the data arguments and
the examples are in data.py, their windowed features in features.py, the paper's rows and F1 in definition.py, the
post-processing into answers and metrics in postprocess.py (as transformers' run_qa.py, utils_qa.py and
trainer_qa.py).

The recipe is the official ALBERT one (google-research/albert's `squad_utils.py`), on a fast tokenizer's offsets
instead of the official LCS character alignment:
- `[CLS] question [SEP] context-window [SEP]`, the question cut to `max_query_length` pieces, windows of the
  context advancing by `doc_stride` pieces (the official meaning: the step between window starts);
- a training window that does not contain the answer (and every window of an unanswerable question) points at
  [CLS] (position 0) and is marked `is_impossible`;
- post-processing over all windows of a question: n-best (start, end) pairs, starts only where the window gives
  the token its most context (`token_is_max_context`), at most `max_answer_length` pieces; for v2.0 the null score
  against the best span.

Two heads: the plain span head (`AlbertHFForQuestionAnswering`, the official v1.1 head; for v2.0 the BERT/HF
null-score-difference rule) and the official ALBERT v2 answerability head
(`AlbertHFForQuestionAnsweringWithAnswerability` in modeling_albert_hf.py).

`SquadTrainer` runs the model on the windows and post-processes against the questions in its `evaluate` (as
transformers' QuestionAnsweringTrainer does), so evaluations during training (--eval_strategy), the best-checkpoint
choice (--metric_for_best_model f1) and the final evaluation and prediction all see the same SQuAD metrics."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from datasets import Dataset
from transformers.trainer_utils import speed_metrics

from ... import AlbertHFForQuestionAnswering, AlbertHFForQuestionAnsweringWithAnswerability
from .. import inputs
from ..outputs import save_results
from ..trainer import AlbertTrainer
from .data import SquadDataArguments, has_gold_answers
from .features import model_inputs
from .postprocess import apply_null_threshold, golds_of, postprocess, squad_metrics, write_outputs

logger = logging.getLogger(__name__)


@dataclass
class SquadPredictions:
    """A SquadTrainer run over a set of questions."""

    predictions: dict  # question id -> answer ("" = no answer, v2.0)
    nbest: dict  # question id -> n-best entries
    null_odds: dict | None  # v2.0: question id -> null odds
    metrics: dict  # "<prefix>_" keys: runtime, windows, and the SQuAD metrics when the questions have answers


class SquadTrainer(AlbertTrainer):
    """AlbertTrainer whose `evaluate` gives the SQuAD metrics (transformers' QuestionAnsweringTrainer, on our
    post-processing): the model runs on the evaluation windows, its outputs are post-processed against the
    evaluation questions (n-best spans; v2.0: the null decision, --null_score_diff_threshold or with
    --tune_null_threshold the threshold tuned on the set) and scored with the official EM/F1, keys prefixed
    "eval_" and logged. Evaluations during training (--eval_strategy) and --metric_for_best_model (e.g. f1) see
    these metrics; `evaluate_questions` and `predict_questions` are the same run for the final evaluation and for
    --do_predict, returning the predictions for the output files too.
    """

    def __init__(
        self,
        *args,
        data_args: SquadDataArguments,
        eval_examples: Dataset | None = None,
        eval_features: Dataset | None = None,
        **kwargs,
    ):
        if (eval_examples is None) != (eval_features is None):
            raise ValueError("SquadTrainer: give eval_examples and eval_features together")
        kwargs["eval_dataset"] = None if eval_features is None else model_inputs(eval_features)
        super().__init__(*args, **kwargs)
        self.data_args = data_args
        self.eval_examples, self.eval_features = eval_examples, eval_features

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval", eval_examples=None) -> dict:
        """SQuAD metrics on `eval_dataset` (windows from `features_dataset`, post-processing columns included) and
        its questions `eval_examples`; by default the trainer's own evaluation set."""
        if eval_dataset is None and eval_examples is None:
            eval_dataset, eval_examples = self.eval_features, self.eval_examples
        if eval_dataset is None or eval_examples is None:
            raise ValueError(
                "SquadTrainer.evaluate needs the evaluation windows and their questions (run_squad.py: "
                "--validation_file or a --dataset_name with a validation split)"
            )
        return self.evaluate_questions(eval_examples, eval_dataset, ignore_keys, metric_key_prefix).metrics

    def evaluate_questions(
        self, examples: Dataset, features: Dataset, ignore_keys=None, metric_key_prefix: str = "eval"
    ) -> SquadPredictions:
        """`evaluate`, returning the predictions as well: logged, and the callbacks' on_evaluate called."""
        result = self._run_questions(examples, features, ignore_keys, metric_key_prefix, "Evaluation")
        self.log(result.metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, result.metrics)
        return result

    def predict_questions(
        self,
        examples: Dataset,
        features: Dataset,
        ignore_keys=None,
        metric_key_prefix: str = "predict",
        null_threshold: float | None = None,
    ) -> SquadPredictions:
        """The same run for --do_predict (callbacks' on_predict). `null_threshold` replaces the v2.0 threshold
        (and its tuning), e.g. with the one tuned on the dev set."""
        result = self._run_questions(examples, features, ignore_keys, metric_key_prefix, "Prediction", null_threshold)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, result.metrics)
        return result

    def _run_questions(self, examples, features, ignore_keys, prefix, description, null_threshold=None):
        data_args, version_2 = self.data_args, self.data_args.version_2_with_negative
        start_time = time.time()
        # The trainer's own evaluation set through Trainer's (possibly cached) eval loader; any other set through a
        # loader of its own (get_eval_dataloader(dataset) returns the cached eval loader with persistent workers).
        if features is self.eval_features:
            dataloader = self.get_eval_dataloader()
        else:
            dataloader = self.get_test_dataloader(model_inputs(features))
        output = self.evaluation_loop(
            dataloader,
            description=description,
            prediction_loss_only=False,
            ignore_keys=ignore_keys,
            metric_key_prefix=prefix,
        )
        metrics = dict(output.metrics)
        if f"{prefix}_model_preparation_time" in metrics:
            start_time += metrics[f"{prefix}_model_preparation_time"]
        batch_size = self.args.eval_batch_size * self.args.world_size
        metrics.update(
            speed_metrics(
                prefix, start_time, num_samples=len(features), num_steps=math.ceil(len(features) / batch_size)
            )
        )
        best, nbest, null_odds = postprocess(examples, features, output.predictions, data_args)
        threshold = data_args.null_score_diff_threshold if null_threshold is None else null_threshold
        if has_gold_answers(examples):
            tune = data_args.tune_null_threshold and null_threshold is None
            predictions, scores = squad_metrics(golds_of(examples), best, null_odds, version_2, threshold, tune)
            metrics.update({f"{prefix}_{key}": value for key, value in scores.items()})
        else:
            predictions = apply_null_threshold(best, null_odds, threshold) if version_2 else best
            if version_2:
                metrics[f"{prefix}_null_threshold"] = threshold
        metrics[f"{prefix}_features"] = len(features)
        return SquadPredictions(predictions, nbest, null_odds if version_2 else None, metrics)


# ----------------------------------------------------------------------------------------------------------------
# run_squad.py's evaluation and prediction


def evaluate_and_write(trainer: SquadTrainer, examples: Dataset, features: Dataset, output_dir) -> dict:
    """The dev questions' SQuAD metrics and prediction files (run_squad.py's --do_eval).

    Every process calls it (the evaluation is distributed); only the main process writes the files.

    Args:
        trainer (`SquadTrainer`): the run's trainer.
        examples (`datasets.Dataset`): the dev questions, as `prepare_questions` kept them.
        features (`datasets.Dataset`): their windows, from `prepare_questions`.
        output_dir (`str` or `os.PathLike`): the folder for predictions.json, nbest_predictions.json and (v2.0)
            null_odds.json.

    Returns:
        `dict`: the `eval_` metrics (`SquadTrainer.evaluate_questions`: runtime, `eval_features` windows and, when the
        questions have answers, those of `squad_metrics`) and `eval_samples`, the number of questions, as written to
        eval_results.json and all_results.json in the trainer's output_dir (`outputs.save_results`).
    """
    result = trainer.evaluate_questions(examples, features)
    if trainer.is_world_process_zero():
        write_outputs(output_dir, "", result.predictions, result.nbest, result.null_odds)
    return save_results(trainer, "eval", {**result.metrics, "eval_samples": len(examples)})


def predict_and_write(
    trainer: SquadTrainer,
    data_args: SquadDataArguments,
    examples: Dataset,
    features: Dataset,
    tuned_threshold: float | None,
    output_dir,
) -> dict | None:
    """The test questions' prediction files and, when they have answers, their SQuAD metrics (run_squad.py's
    --do_predict).

    v2.0 with --tune_null_threshold: the null threshold is `tuned_threshold`, the one tuned on the dev set in this run,
    if any; without it, a test set with answers is tuned on itself, and one without uses --null_score_diff_threshold
    (with a warning). Every process calls it; only the main process writes the files.

    Args:
        trainer (`SquadTrainer`): the run's trainer.
        data_args (`SquadDataArguments`): `version_2_with_negative`, `tune_null_threshold` and
            `null_score_diff_threshold`.
        examples (`datasets.Dataset`): the test questions, as `prepare_questions` kept them.
        features (`datasets.Dataset`): their windows, from `prepare_questions`.
        tuned_threshold (`float`, *optional*): the `eval_null_threshold` of this run's dev evaluation; read only for
            v2.0 with --tune_null_threshold.
        output_dir (`str` or `os.PathLike`): the folder for predict_predictions.json, predict_nbest_predictions.json and
            (v2.0) predict_null_odds.json.

    Returns:
        `dict` or `None`: when the questions have answers, the `predict_` metrics and `predict_samples`, as written to
        predict_results.json and all_results.json in the trainer's output_dir; None when they have none.
    """
    null_threshold = None
    if data_args.version_2_with_negative and data_args.tune_null_threshold:
        if tuned_threshold is not None:
            null_threshold = tuned_threshold
            logger.info("Test predictions use the null threshold tuned on the dev set: %.4f", null_threshold)
        elif not has_gold_answers(examples):
            logger.warning(
                "--tune_null_threshold: no dev evaluation in this run and no answers in the test set to "
                "tune on; the test predictions use --null_score_diff_threshold %s",
                data_args.null_score_diff_threshold,
            )
    result = trainer.predict_questions(examples, features, null_threshold=null_threshold)
    if trainer.is_world_process_zero():
        write_outputs(output_dir, "predict", result.predictions, result.nbest, result.null_odds)
    if not has_gold_answers(examples):
        logger.info(
            "%s has no answers: predictions written, no metrics (predict_results.json)",
            data_args.test_file or "the test split",
        )
        return None
    return save_results(trainer, "predict", {**result.metrics, "predict_samples": len(examples)})


def load_tokenizer_and_model(model_args, data_args: SquadDataArguments):
    """The tokenizer and the span QA model: the official SQuAD v2.0 head with --answerability_head (its beam sizes
    from --start_n_top and --end_n_top), else the plain start/end head."""
    if data_args.answerability_head:
        return inputs.load_tokenizer_and_model(
            model_args,
            AlbertHFForQuestionAnsweringWithAnswerability,
            start_n_top=data_args.start_n_top,
            end_n_top=data_args.end_n_top,
        )
    return inputs.load_tokenizer_and_model(model_args, AlbertHFForQuestionAnswering)
