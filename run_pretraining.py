#!/usr/bin/env python
"""Pretrain ALBERT with accelerate: `python run_pretraining.py --help`, or with no arguments a tiny demo run.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 \
        --per_device_train_batch_size 32 --gradient_accumulation_steps 16 ...  # precision: auto (the start line)
"""

from albert_hf.pretraining.job import main
from albert_hf.runtime.cli import run_entry_point

if __name__ == "__main__":
    run_entry_point(main)
