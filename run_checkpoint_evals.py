#!/usr/bin/env python
"""What each checkpoint of a pretraining run is worth downstream: fine-tune every step_N (and the final folder) on
GLUE tasks, SQuAD, RACE or your own data, over several seeds, with the fine-tuning scripts' flags, into
RUN/downstream (results.jsonl, the table by_step.md, the plot by_step.png, and the table in the run's model card).

    python run_checkpoint_evals.py outputs/albert-pretraining --tasks mrpc --data_dir glue/ --seeds 1 2 3
    python run_checkpoint_evals.py outputs/run --tasks rte --baseline random_init --watch --max_steps 300
    python run_checkpoint_evals.py hub:OWNER/NAME --tasks mrpc   # the step-N branches --hub_strategy pushed

A row already computed is not computed again; --watch waits for the run's checkpoints and ends after its final
folder. The job: albert_hf/checkpoint_evals/ (sources.py, job.py, report.py).
"""

import signal

# Run as a script, stop signals wait while the libraries load (seconds); the entry point then handles them (one
# line, status 75). Imported, it leaves the importer's signals alone.
if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1))

from pathlib import Path

from albert_hf.checkpoint_evals import job
from albert_hf.runtime.cli import run_entry_point


def main(argv=None):
    return job.main(argv, scripts=Path(__file__).resolve().parent)


if __name__ == "__main__":
    run_entry_point(main, stage="starting")
