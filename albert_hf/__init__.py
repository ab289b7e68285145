"""albert_hf: ALBERT (Lan et al., ICLR 2020) for the Hugging Face stack.

Importing the package registers every model with the Auto classes (model_type "albert_hf").
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForMultipleChoice,
    AutoModelForPreTraining,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)

from .configuration_albert_hf import PRESETS, AlbertHFConfig
from .data_collator import DataCollatorForAlbertPretraining
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

AUTO_CLASSES = {
    AutoModel: AlbertHFModel,
    AutoModelForPreTraining: AlbertHFForPreTraining,
    AutoModelForMaskedLM: AlbertHFForMaskedLM,
    AutoModelForSequenceClassification: AlbertHFForSequenceClassification,
    AutoModelForMultipleChoice: AlbertHFForMultipleChoice,
    AutoModelForQuestionAnswering: AlbertHFForQuestionAnswering,
    AutoModelForTokenClassification: AlbertHFForTokenClassification,
}

AutoConfig.register(AlbertHFConfig.model_type, AlbertHFConfig, exist_ok=True)
AlbertHFConfig.register_for_auto_class()
for _auto_class, _model_class in AUTO_CLASSES.items():
    _auto_class.register(AlbertHFConfig, _model_class, exist_ok=True)
    # Makes save_pretrained copy the two remote-code files next to the weights.
    _model_class.register_for_auto_class(_auto_class.__name__)
# The answerability QA head loads through AutoModelForQuestionAnswering too (see its _auto_map_entry); it is not
# the Auto mapping's default, but its checkpoints must carry the code as well.
AlbertHFForQuestionAnsweringWithAnswerability.register_for_auto_class("AutoModelForQuestionAnswering")

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
]
