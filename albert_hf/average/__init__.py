"""Checkpoints averaged into one model folder (`python -m albert_hf.average OUT CHECKPOINT ...`, or
`run_pretraining.py --average_last K` at the end of a run): the weights' element-wise mean, LAWA (Kaddour 2022;
Sanyal et al. 2023), a better model from a run's last checkpoints at no training cost.

    python -m albert_hf.average outputs/averaged outputs/run/step_600 outputs/run/step_650 outputs/run/step_700

Each source is a model folder (a step_N checkpoint, a final folder, or any albert_hf model folder with
model.safetensors). They must share one config and one tokenizer, and hold the same tensors; a checkpoint with a
record of its files is checked against it first. The weights are streamed one tensor at a time: each source's tensor
read from its memory-mapped file into a float32 sum, the mean written out at once, so the memory used stays under one
model whatever the number of sources (BENCHMARKS.md). The output folder is written whole or not at all (a temporary
folder renamed), with the config, the tokenizer, the remote code and a card listing its sources; it loads with
`AutoModel`.
"""

from .averaging import average_checkpoints

__all__ = ["average_checkpoints"]
