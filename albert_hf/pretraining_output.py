"""What the pretraining job writes and prints: its log setup, the metrics log, the final model's files (weights,
tokenizer, results, card: `save_final_model`), the fill-mask examples of the summary, and the number formats of its
lines."""

import json
import logging
import os
import shutil
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import datasets
import transformers
from accelerate import Accelerator

from .analysis.fill_mask import fill_mask_examples, pick_fill_mask_sentences
from .checkpointing import clear_previous_run
from .errors import InputError
from .hardware import Hardware, Precision
from .hub import write_json
from .model_card import write_pretraining_card
from .storage import fault_of

logger = logging.getLogger("albert_hf.pretraining")


def held_out_fill_mask(model, tokenizer, eval_documents, args, count=4, documents_read=50) -> list[dict]:
    """`fill_mask_examples` on sentences of the first held-out documents (a seeded sample already, or the
    first documents of a stream); [] when there is nothing to show."""
    if eval_documents is None:  # --validation_split_percentage 0: no held-out sentence to show
        return []
    if tokenizer.mask_token is None:
        logger.info("No fill-mask examples: the tokenizer has no mask token")
        return []
    texts = [row["text"] for row in islice(eval_documents, documents_read)]  # reads a stream's head only
    sentences = pick_fill_mask_sentences(texts, tokenizer, count=count, seed=args.seed,
                                         max_length=args.max_seq_length,
                                         sentence_per_line=args.layout == "sentence_per_line")
    if not sentences:
        logger.info("No fill-mask examples: the first %d held-out documents have no sentence of 8 to 30 words with "
                    "a one-piece content word", documents_read)
    return fill_mask_examples(model, tokenizer, sentences)


def where_trained(hardware: Hardware, precision: Precision, num_processes: int) -> dict:
    """The hardware and precision of the run, for all_results.json and the model card."""
    return {"hardware": hardware.describe() + (f", {num_processes} processes" if num_processes > 1 else ""),
            "fast_precisions": ", ".join(hardware.fast_precisions), "mixed_precision": precision.mixed_precision,
            "precision": precision.describe()}


def save_final_model(model, tokenizer, output_dir: Path, args, eval_metrics, global_batch, num_processes,
                     curves: bool = False, where: dict | None = None):
    """Weights, tokenizer, remote code, model card: written into a temporary folder, then moved into place.
    `where` (hardware and precision, `where_trained`) goes into all_results.json and the card."""
    tmp = output_dir / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "all_results.json", {**eval_metrics, **(where or {})})
        write_pretraining_card(tmp, model, args, global_batch, num_processes, curves,  # metrics: all_results.json
                               where=where)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (a full disk) frees its space at once
        raise
    for path in tmp.iterdir():
        os.replace(path, output_dir / path.name)
    tmp.rmdir()


class _DropTiedWeightsNotice(logging.Filter):
    # accelerate's save_state warns that it dropped the tied decoder weights; they are re-tied on load.
    def filter(self, record):
        return "Removed shared tensor" not in record.getMessage()


def start_logging(main_process: bool):
    """Our log lines with timestamps (INFO on the main process, warnings only on the others), libraries quieter."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO if main_process else logging.WARNING)
    quiet_library_logs()


def start_tracking(accelerator: Accelerator, args):
    """--with_tracking: the trackers of --report_to, given the run's plain arguments."""
    if not accelerator.log_with:
        raise InputError(f"--with_tracking: no usable tracker for --report_to {args.report_to} (for "
                         "tensorboard: pip install tensorboard, or albert_hf[tracking])")
    accelerator.init_trackers("albert_pretraining", {k: v for k, v in vars(args).items()
                                                     if isinstance(v, (int, float, str, bool))})


def clear_earlier_run(output_dir: Path):
    """--overwrite_output_dir: what an earlier run wrote into output_dir is deleted, and logged."""
    cleared = clear_previous_run(output_dir)
    if cleared:
        logger.info("--overwrite_output_dir: deleted the earlier run's %s", ", ".join(cleared))


def quiet_library_logs():
    """Keep the console to our progress and results: accelerate's per-file checkpoint notices go to WARNING."""
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    logging.getLogger("accelerate.utils.other").addFilter(_DropTiedWeightsNotice())
    datasets.utils.logging.set_verbosity_warning()
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()


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
        if self.tracking:
            self.accelerator.log(metrics, step=step)
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
