"""SQuAD's recipe (the paper's row per version for --paper_hparams), its main metric and the baseline a --seeds run
compares with."""

from __future__ import annotations

from datasets import Dataset

from ..paper_hparams import OFFICIAL_FINETUNING, best_on_dev
from ..seeds import Baseline
from .data import SquadDataArguments

# The paper's SQuAD rows (Table 14; the official run_squad_v1.py/run_squad_v2.py): whole epochs, int(87,599 / 48 x 2)
# = 3649 and int(130,319 / 48 x 3) = 8144 steps, warm-up 10%. Both use windows of stride 128, questions of at most 64
# pieces, n-best 20 and answers of at most 30 pieces, and the config's own ALBERT dropout. v2.0 is the official
# run_squad_v2.py: its answerability head (dropout_prob 0.1, beams of 5 x 5) and the threshold tuned on dev.
PAPER_HPARAMS = {
    "v1.1": dict(learning_rate=5e-5, batch_size=48, max_steps=3649, warmup_steps=365, max_seq_length=384),
    "v2.0": dict(
        learning_rate=3e-5,
        batch_size=48,
        max_steps=8144,
        warmup_steps=814,
        max_seq_length=512,
        answerability_head=True,
        tune_null_threshold=True,
        start_n_top=5,
        end_n_top=5,
        classifier_dropout_prob=0.1,
    ),
}


# The official run_squad_v* keeps the best F1 checkpoint on dev; how often it scores one is ours.
PAPER_COMMON = dict(
    doc_stride=128,
    max_query_length=64,
    n_best_size=20,
    max_answer_length=30,
    **OFFICIAL_FINETUNING,
    **best_on_dev(1000),
)


MAIN_METRIC = "f1"


def paper_recipe(data_args: SquadDataArguments) -> tuple[str, dict]:
    """(name, recipe) of the paper's row for the data's version, for `paper_hparams.apply_paper_hparams`."""
    version = "v2.0" if data_args.version_2_with_negative else "v1.1"
    return f"SQuAD {version}", {**PAPER_HPARAMS[version], **PAPER_COMMON}


def baseline(examples: Dataset, version_2: bool) -> Baseline:
    """The dev F1 of a model that learned nothing: the empty answer's (0) for v1.1; for v2.0 always answering "no
    answer", right on exactly the unanswerable questions."""
    if not version_2:
        return Baseline(MAIN_METRIC, 0.0, "the empty answer")
    unanswerable = sum(not answers["text"] for answers in examples["answers"])
    return Baseline(MAIN_METRIC, 100.0 * unanswerable / len(examples), "always no answer")
