"""Checkpoint conversion: transformers' ALBERT <-> albert_hf (`transformers_format.convert`), official TensorFlow
checkpoints -> albert_hf (`tf_import.from_tf_checkpoint`), and the command line (`cli.main`):

    python -m albert_hf.convert SRC_DIR_OR_HUB_NAME OUT_DIR [--to albert_hf|transformers]
    python -m albert_hf.convert --from_tf PREFIX_OR_DIR OUT_DIR
"""

from .cli import main
from .tf_import import from_tf_checkpoint
from .transformers_format import convert, copy_tokenizer_files, to_albert_hf, to_transformers

__all__ = ["convert", "copy_tokenizer_files", "from_tf_checkpoint", "main", "to_albert_hf", "to_transformers"]
