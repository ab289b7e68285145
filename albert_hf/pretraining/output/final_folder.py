"""The final folder of a pretraining run: the weights, tokenizer, remote code, results and card
(`save_final_model`, written into a temporary folder, then moved into place), where the run was trained, and the
fill-mask examples of the run's summary."""

import logging
import os
import shutil
from itertools import islice
from pathlib import Path

from ...reports.fill_mask import fill_mask_examples, pick_fill_mask_sentences
from ...runtime.hardware import Hardware, Precision
from ...runtime.storage import write_json
from .pretraining_card import CardFacts, write_pretraining_card

logger = logging.getLogger(__name__)


def save_final_model(
    model,
    tokenizer,
    output_dir: Path,
    facts: CardFacts,
    eval_metrics,
    global_batch,
    num_processes,
    curves: bool = False,
    where: dict | None = None,
    cost: dict | None = None,
):
    """Weights, tokenizer, remote code, model card: written into a temporary folder, then moved into place.
    `where` (hardware and precision, `where_trained`) and `cost` (the run's model FLOPs and mean MFU, with its peak:
    runtime/throughput.py) go into all_results.json and the card."""
    tmp = output_dir / ".tmp-final"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(tmp / "all_results.json", {**eval_metrics, **(cost or {}), **(where or {})})
        write_pretraining_card(
            tmp,
            model,
            facts,
            global_batch,
            num_processes,
            curves,  # metrics: all_results.json
            where=where,
        )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a failed write (a full disk) frees its space at once
        raise
    for path in tmp.iterdir():
        os.replace(path, output_dir / path.name)
    tmp.rmdir()


def where_trained(hardware: Hardware, precision: Precision, num_processes: int) -> dict:
    """The hardware and precision of the run, for all_results.json and the model card."""
    return {
        "hardware": hardware.describe() + (f", {num_processes} processes" if num_processes > 1 else ""),
        "fast_precisions": ", ".join(hardware.fast_precisions),
        "mixed_precision": precision.mixed_precision,
        "precision": precision.describe(),
    }


def held_out_fill_mask(
    model, tokenizer, eval_documents, *, seed: int, max_length: int, sentence_per_line: bool, count=4, documents_read=50
) -> list[dict]:
    """`fill_mask_examples` on sentences of the first held-out documents (a seeded sample already, or the
    first documents of a stream); [] when there is nothing to show."""
    if eval_documents is None:  # --validation_split_percentage 0: no held-out sentence to show
        return []
    if tokenizer.mask_token is None:
        logger.info("No fill-mask examples: the tokenizer has no mask token")
        return []
    texts = [row["text"] for row in islice(eval_documents, documents_read)]  # reads a stream's head only
    sentences = pick_fill_mask_sentences(
        texts, tokenizer, count=count, seed=seed, max_length=max_length, sentence_per_line=sentence_per_line
    )
    if not sentences:
        logger.info(
            "No fill-mask examples: the first %d held-out documents have no sentence of 8 to 30 words with "
            "a one-piece content word",
            documents_read,
        )
    return fill_mask_examples(model, tokenizer, sentences)
