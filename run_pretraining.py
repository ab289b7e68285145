#!/usr/bin/env python
"""Pretrain ALBERT with accelerate: `python run_pretraining.py --help`, or with no arguments a tiny demo run.

    accelerate launch run_pretraining.py --model_config base --train_files corpus/ --max_seq_length 512 \
        --per_device_train_batch_size 32 --gradient_accumulation_steps 16 ...  # precision: auto (the start line)
"""

import signal

# Run as a script, stop signals wait while the libraries load (seconds); the entry point then handles them (one
# line, status 75). Imported, it leaves the importer's signals alone.
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1))

from albert_hf.pretraining.job import main
from albert_hf.runtime.cli import run_entry_point

if __name__ == "__main__":
    run_entry_point(main, stage="starting")
