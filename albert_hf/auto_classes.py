"""albert_hf's classes registered with transformers' Auto classes (model_type "albert_hf"), once, when the package
is imported: AutoConfig, each AutoModel* its head, and each class's remote code for save_pretrained."""

import transformers
from transformers import AutoConfig, AutoModelForQuestionAnswering

from . import modeling_albert_hf
from .configuration_albert_hf import AlbertHFConfig
from .modeling_albert_hf import AUTO_MAP, AlbertHFForQuestionAnsweringWithAnswerability

# One table, AUTO_MAP (written into every saved config.json): the same entries register the classes here.
AutoConfig.register(AlbertHFConfig.model_type, AlbertHFConfig, exist_ok=True)
AlbertHFConfig.register_for_auto_class()
for _auto_name, _target in AUTO_MAP.items():
    if _auto_name == "AutoConfig":
        continue
    _auto_class, _model_class = getattr(transformers, _auto_name), getattr(modeling_albert_hf, _target.split(".")[1])
    _auto_class.register(AlbertHFConfig, _model_class, exist_ok=True)
    # Makes save_pretrained copy the two remote-code files next to the weights.
    _model_class.register_for_auto_class(_auto_name)
# The answerability QA head loads through AutoModelForQuestionAnswering too (see its _auto_map_entry); it is not
# the Auto mapping's default, but its checkpoints must carry the code as well.
AlbertHFForQuestionAnsweringWithAnswerability.register_for_auto_class(AutoModelForQuestionAnswering.__name__)
