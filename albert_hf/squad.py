"""SQuAD v1.1 / v2.0 for run_squad.py: its arguments, the paper's recipe and `SquadTrainer`; the examples and their
windowed features are in squad_features.py, the post-processing into answers, metrics and files in
squad_postprocess.py (as transformers' run_qa.py, utils_qa.py and trainer_qa.py).

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
choice (--metric_for_best_model f1) and the final evaluation and prediction all see the same SQuAD metrics.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset
from transformers.trainer_utils import speed_metrics

from .errors import InputError
from .finetuning import OFFICIAL_FINETUNING, AlbertTrainer, fit_max_seq_length
from .model_card import CardDataset, from_sources, hub_dataset_id, limits
from .squad_features import has_gold_answers, model_inputs
from .squad_postprocess import apply_null_threshold, golds_of, postprocess, squad_metrics

logger = logging.getLogger("albert_hf.squad")

# The paper's SQuAD rows (Table 14; the official run_squad_v1.py/run_squad_v2.py): whole epochs, int(87,599 / 48 x 2)
# = 3649 and int(130,319 / 48 x 3) = 8144 steps, warm-up 10%. Both use windows of stride 128, questions of at most 64
# pieces, n-best 20 and answers of at most 30 pieces, and the config's own ALBERT dropout. v2.0 is the official
# run_squad_v2.py: its answerability head (dropout_prob 0.1, beams of 5 x 5) and the threshold tuned on dev.
PAPER_HPARAMS = {
    "v1.1": dict(learning_rate=5e-5, batch_size=48, max_steps=3649, warmup_steps=365, max_seq_length=384),
    "v2.0": dict(learning_rate=3e-5, batch_size=48, max_steps=8144, warmup_steps=814, max_seq_length=512,
                 answerability_head=True, tune_null_threshold=True, start_n_top=5, end_n_top=5,
                 classifier_dropout_prob=0.1),
}
PAPER_COMMON = dict(doc_stride=128, max_query_length=64, n_best_size=20, max_answer_length=30, **OFFICIAL_FINETUNING)


# Questions in the official SQuAD files: a file in the official JSON format is that dataset only when it holds them
# all (SQuAD's JSON is the exchange format of many QA sets, and of partial copies such as half of the v2.0 dev set).
SQUAD_QUESTIONS = {("1.1", "train"): 87599, ("1.1", "validation"): 10570,
                   ("v2.0", "train"): 130319, ("v2.0", "validation"): 11873}


def is_official_squad(path: Path, version: str, split: str) -> bool:
    expected = SQUAD_QUESTIONS.get((version, split))
    if expected is None or path.suffix.lower() != ".json" or not path.is_file():
        return False
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
        return (str(content.get("version")) == version and expected == sum(
            len(paragraph["qas"]) for article in content["data"] for paragraph in article["paragraphs"]))
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False


@dataclass
class SquadDataArguments:
    """Data and SQuAD options (names as transformers' run_qa.py; the defaults are the official ALBERT ones)."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset, e.g. squad or squad_v2"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "config of the Hub dataset"})
    train_file: str | None = field(
        default=None, metadata={"help": "official SQuAD JSON (train-v1.1.json, train-v2.0.json), or the flattened "
                                        "Hub format as .json/.jsonl/.parquet (id, title, context, question, answers)"})
    validation_file: str | None = field(default=None, metadata={"help": "as train_file, e.g. dev-v2.0.json"})
    test_file: str | None = field(
        default=None, metadata={"help": "as validation_file, for --do_predict (predict_predictions.json); answers "
                                        "are optional: with them, predict_results.json has the metrics"})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "processes for feature building"})
    max_seq_length: int = field(default=384, metadata={"help": "pieces per window, question and specials included"})
    max_query_length: int = field(default=64, metadata={"help": "the question is cut to this many pieces"})
    doc_stride: int = field(
        default=128, metadata={"help": "step between the starts of consecutive context windows, in pieces (the "
                                       "official meaning; run_qa.py passes it to the tokenizer as the overlap)"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N eval questions"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "use only the first N test questions"})
    version_2_with_negative: bool = field(default=False, metadata={"help": "SQuAD v2.0: some questions have no answer"})
    null_score_diff_threshold: float = field(
        default=0.0, metadata={"help": "v2.0: predict no answer when the null odds reach this (>=, as the official "
                                       "code; span head: null score minus best span score; answerability head: the "
                                       "classifier logit)"})
    tune_null_threshold: bool = field(
        default=False, metadata={"help": "v2.0: use instead the threshold that maximises F1 on the evaluation set "
                                         "itself (official ALBERT/XLNet practice: the numbers are tuned on dev)"})
    n_best_size: int = field(default=20, metadata={"help": "candidates kept per question (nbest_predictions.json)"})
    max_answer_length: int = field(default=30, metadata={"help": "longest answer, in pieces"})
    answerability_head: bool = field(
        default=False, metadata={"help": "v2.0: the official ALBERT v2 head (start, end conditioned on the start, "
                                         "answerability classifier) instead of the plain span head"})
    start_n_top: int = field(default=5, metadata={"help": "answerability head: beam of start positions"})
    end_n_top: int = field(default=5, metadata={"help": "answerability head: end positions per start"})

    PIPELINE_TAG, AUTO_CLASS, SCRIPT = "question-answering", "AutoModelForQuestionAnswering", "run_squad.py"

    def card_tags(self) -> list[str]:
        return ["squad"] + ["squad_v2"] * self.version_2_with_negative

    def card_dataset(self, wanted) -> CardDataset:
        v2 = self.version_2_with_negative
        name, official, version = (("SQuAD v2.0", "rajpurkar/squad_v2", "v2.0") if v2
                                   else ("SQuAD v1.1", "rajpurkar/squad", "1.1"))
        sources = {}
        for split in wanted:
            path = getattr(self, f"{split}_file", None)
            if path:
                found = is_official_squad(Path(path), version, split)
                sources[split] = (official if found else None,
                                  f"`{Path(path).name}`" + (f" (the official {name} {split} file)" if found else ""))
            elif self.dataset_name:
                hub_id = hub_dataset_id(self.dataset_name)
                sources[split] = (hub_id, f"the Hub's {hub_id}")
        extra = (f" Windows of {self.max_seq_length} tokens (question: at most {self.max_query_length}), "
                 f"stride {self.doc_stride}.{limits(self, wanted)}")
        config = self.dataset_config_name if self.dataset_name else None
        return from_sources(name, sources, config, extra)

    def __post_init__(self):
        if self.dataset_name is None and not (self.train_file or self.validation_file or self.test_file):
            raise InputError("Give --dataset_name (e.g. squad_v2) or --train_file/--validation_file/--test_file")
        if self.max_seq_length < 5:
            raise InputError(f"--max_seq_length {self.max_seq_length}: [CLS] question [SEP] context [SEP] needs at "
                             "least 5 pieces")
        if self.max_query_length < 1:
            raise InputError(f"--max_query_length {self.max_query_length}: the question needs at least 1 piece")
        if self.doc_stride <= 0:
            raise InputError("doc_stride must be positive")
        if self.answerability_head and not self.version_2_with_negative:
            raise InputError("--answerability_head is the SQuAD v2.0 head: pass --version_2_with_negative too")


def fit_lengths(data_args: SquadDataArguments, config) -> None:
    """Makes the window lengths compose: --max_seq_length is capped at the model's positions, then a
    --max_query_length that would leave the context no room in a window (the default 64 with --max_seq_length 64)
    is cut to half the window's room, logged once. Windows advance by min(doc_stride, window), as the official
    loop, so --doc_stride composes with any window."""
    fit_max_seq_length(data_args, config)
    room = data_args.max_seq_length - 3  # [CLS] question [SEP] context [SEP]
    if data_args.max_query_length >= room:
        capped = room // 2
        logger.warning("--max_query_length %d would leave no context in a --max_seq_length %d window: questions keep "
                       "their first %d pieces", data_args.max_query_length, data_args.max_seq_length, capped)
        data_args.max_query_length = capped


def paper_recipe(data_args: SquadDataArguments) -> tuple[str, dict]:
    """(name, recipe) of the paper's row for the data's version, for `finetuning.apply_paper_hparams`."""
    version = "v2.0" if data_args.version_2_with_negative else "v1.1"
    return f"SQuAD {version}", {**PAPER_HPARAMS[version], **PAPER_COMMON}



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

    def __init__(self, *args, data_args: SquadDataArguments, eval_examples: Dataset | None = None,
                 eval_features: Dataset | None = None, **kwargs):
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
            raise ValueError("SquadTrainer.evaluate needs the evaluation windows and their questions (run_squad.py: "
                             "--validation_file or a --dataset_name with a validation split)")
        return self.evaluate_questions(eval_examples, eval_dataset, ignore_keys, metric_key_prefix).metrics

    def evaluate_questions(self, examples: Dataset, features: Dataset, ignore_keys=None,
                           metric_key_prefix: str = "eval") -> SquadPredictions:
        """`evaluate`, returning the predictions as well: logged, and the callbacks' on_evaluate called."""
        result = self._run_questions(examples, features, ignore_keys, metric_key_prefix, "Evaluation")
        self.log(result.metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, result.metrics)
        return result

    def predict_questions(self, examples: Dataset, features: Dataset, ignore_keys=None,
                          metric_key_prefix: str = "predict", null_threshold: float | None = None) -> SquadPredictions:
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
        output = self.evaluation_loop(dataloader, description=description, prediction_loss_only=False,
                                      ignore_keys=ignore_keys, metric_key_prefix=prefix)
        metrics = dict(output.metrics)
        if f"{prefix}_model_preparation_time" in metrics:
            start_time += metrics[f"{prefix}_model_preparation_time"]
        batch_size = self.args.eval_batch_size * self.args.world_size
        metrics.update(speed_metrics(prefix, start_time, num_samples=len(features),
                                     num_steps=math.ceil(len(features) / batch_size)))
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
