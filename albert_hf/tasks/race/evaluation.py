"""run_race.py's evaluation and predictions file: the chosen letter of each question, and accuracy overall and per
subset."""

import json
from pathlib import Path

from datasets import Dataset

from .data import ANSWER_LETTERS
from .definition import accuracy_by_subset


def evaluate_and_write_predictions(trainer, split: str, dataset: Dataset, prefix: str = "eval") -> dict:
    """`outputs.evaluate_splits`' callback for RACE: the metrics of one set, and its chosen letters in
    `predictions_<split>.json` in the trainer's output_dir (question id -> "A" to "D").

    Every process calls it (`Trainer.predict` is distributed); only the main process writes the file.

    Args:
        trainer (`trainer.AlbertTrainer`): the run's trainer.
        split (`str`): the set's name, in the file's name: "validation" or "test".
        dataset (`datasets.Dataset`): its encoded questions (`encode_questions`), with `example_id`, `subset` and
            `label`.
        prefix (`str`, defaults to `"eval"`): the metric keys' prefix: "eval" (dev set) or "predict" (test set).

    Returns:
        `dict`: `Trainer.predict`'s metrics (`<prefix>_loss`, `<prefix>_accuracy`, runtime) with the accuracy per
        level present, `<prefix>_accuracy_high` / `<prefix>_accuracy_middle`, and their counts `<prefix>_num_high` /
        `<prefix>_num_middle`. `evaluate_splits` writes them.
    """
    output = trainer.predict(dataset, metric_key_prefix=prefix)
    predicted = output.predictions.argmax(-1)
    metrics = dict(output.metrics)
    metrics.update(
        {
            f"{prefix}_{name}": value
            for name, value in accuracy_by_subset(predicted, dataset["label"], dataset["subset"]).items()
        }
    )
    if trainer.is_world_process_zero():
        letters = {example_id: ANSWER_LETTERS[choice] for example_id, choice in zip(dataset["example_id"], predicted)}
        path = Path(trainer.args.output_dir) / f"predictions_{split}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(letters, indent=2) + "\n")
    return metrics
