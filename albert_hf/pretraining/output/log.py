"""What the pretraining job logs: the log set-up (our lines with timestamps, libraries quieter), the trackers of
--report_to, the metrics log (metrics.jsonl) and the number formats of its lines."""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import datasets
import transformers
from accelerate import Accelerator

from ...errors import InputError
from ...runtime.storage import fault_of

logger = logging.getLogger(__name__)


def start_logging(main_process: bool):
    """Our log lines with timestamps (INFO on the main process, warnings only on the others), libraries quieter."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        level=logging.INFO if main_process else logging.WARNING,
    )
    quiet_library_logs()


def quiet_library_logs():
    """Keep the console to our progress and results: accelerate's per-file checkpoint notices go to WARNING."""
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").addFilter(_DropTiedWeightsNotice())
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()


class _DropTiedWeightsNotice(logging.Filter):
    # accelerate's save_state warns that it dropped the tied decoder weights; they are re-tied on load.
    def filter(self, record):
        return "Removed shared tensor" not in record.getMessage()


def start_tracking(accelerator: Accelerator, report_to: str, run_config: dict):
    """--with_tracking: the trackers of --report_to, given the run's plain arguments (`run_config`, by flag name)."""
    if not accelerator.log_with:
        raise InputError(
            f"--with_tracking: no usable tracker for --report_to {report_to} (for "
            "tensorboard: pip install tensorboard, or albert_hf[tracking])"
        )
    accelerator.init_trackers(
        "albert_pretraining", {k: v for k, v in run_config.items() if isinstance(v, (int, float, str, bool))}
    )


def truncate_metrics_log(path: Path, step: int) -> None:
    """Keep the rows up to `step`: a resumed run logs the later ones again. A row cut short by a kill is dropped."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", 0) <= step:
            kept.append(line + "\n")
    path.write_text("".join(kept))


def format_value(value):
    return f"{value:.4f}" if isinstance(value, float) else value


def format_metrics(metrics: dict) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in metrics.items())


@dataclass
class MetricsLog:
    """metrics.jsonl (written by the main process), and the trackers of --report_to with --with_tracking."""

    path: Path
    accelerator: Accelerator
    tracking: bool

    def write(self, step: int, metrics: dict):
        """One row; a value None (a gradient norm that was not finite) is null in the file, left out of trackers."""
        if self.tracking:
            self.accelerator.log({k: v for k, v in metrics.items() if v is not None}, step=step)
        if self.accelerator.is_main_process:
            try:
                with open(self.path, "a") as f:
                    f.write(json.dumps({"step": step, **metrics}) + "\n")
            except OSError as error:
                # Only this process writes the log: stopping here would leave the others waiting in the next
                # step's collectives. The run goes on; the next checkpoint stops every process together if the
                # disk is still full.
                fault = fault_of(error)
                if fault is None:
                    raise
                logger.warning("%s: %s; the metrics of step %d are not in it", self.path, fault, step)
