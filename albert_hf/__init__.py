"""albert_hf: ALBERT (Lan et al., ICLR 2020) for the Hugging Face stack.

Importing the package registers every model with the Auto classes (model_type "albert_hf").
"""

from . import auto_classes  # noqa: F401 - registers the models with the Auto classes (auto_classes.py)
from .configuration_albert_hf import PRESETS, AlbertHFConfig
from .errors import InputError
from .modeling_albert_hf import (
    AlbertHFForMaskedLM,
    AlbertHFForMultipleChoice,
    AlbertHFForPreTraining,
    AlbertHFForPreTrainingOutput,
    AlbertHFForQuestionAnswering,
    AlbertHFForQuestionAnsweringWithAnswerability,
    AlbertHFForSequenceClassification,
    AlbertHFForTokenClassification,
    AlbertHFModel,
    AlbertHFPreTrainedModel,
)
from .pretraining.data.collator import DataCollatorForAlbertPretraining

__all__ = [
    "AlbertHFConfig",
    "PRESETS",
    "AlbertHFModel",
    "AlbertHFPreTrainedModel",
    "AlbertHFForPreTraining",
    "AlbertHFForPreTrainingOutput",
    "AlbertHFForMaskedLM",
    "AlbertHFForSequenceClassification",
    "AlbertHFForMultipleChoice",
    "AlbertHFForQuestionAnswering",
    "AlbertHFForTokenClassification",
    "AlbertHFForQuestionAnsweringWithAnswerability",
    "DataCollatorForAlbertPretraining",
    "InputError",
]
