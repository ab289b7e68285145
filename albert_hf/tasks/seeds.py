"""Several seeds in one fine-tuning command (--seeds 1 2 3 / --num_seeds 3), in run_glue, run_squad, run_race
and run_ner.

ALBERT's fine-tuning has bad seeds: runs that stay at a flat loss and score the majority class or F1 0, v2 large
and xlarge above all, and papers report the median or the best of several seeds. `run_seeds` runs the script once
per seed, one after another, each in OUTPUT_DIR/seed_N with the files a run of one seed writes there, then:

- a seed whose dev score on the task's main metric is at or below its trivial baseline (`Baseline`: the majority
  class, MCC 0, correlation 0.1, the empty answer or always-no-answer, chance) is marked `did not learn`, and
  --retry_failed_seeds K replaces up to K of them with new seeds (the next integers after every seed used);
- every dev and test metric is summarised over the seeds that learned: median, mean with its standard error
  (sample standard deviation / sqrt(n)), minimum and maximum, with the seed of each, in all_seeds_results.json, a
  table in the log and the card;
- the best seed (by --metric_for_best_model when given, else the task's main metric) is copied to OUTPUT_DIR, model
  and results files alike, and its card says it was chosen among N seeds.

all_seeds_results.json is rewritten after every seed. The same command after an interruption takes the seeds it
records as they are, resumes a seed folder holding a checkpoint, and runs the seeds still missing.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import InputError, NothingProduced
from ..hub.upload import push_folder
from ..runtime import output_lock
from ..runtime.storage import write_json
from .arguments import SeedRun
from .finetuning import claim_output_dir, refuse_a_trained_model, start_logging

logger = logging.getLogger(__name__)

SUMMARY_FILE = "all_seeds_results.json"
SEED_FOLDER = "seed_{}"
# Per-run bookkeeping that says nothing about how well a seed did.
NOT_SUMMARISED = (
    "_runtime",
    "_per_second",
    "_samples",
    "_features",
    "_num_high",
    "_num_middle",
    "_total",
    "_threshold",
)


@dataclass(frozen=True)
class Baseline:
    """The dev score of a predictor that learned nothing, on the task's main metric."""

    metric: str  # the key without its "eval_" prefix, e.g. "accuracy", "f1", "matthews_correlation"
    value: float
    name: str  # what scores it, e.g. "the majority class (equivalent)"

    def learned(self, metrics: dict) -> bool:
        key = f"eval_{self.metric}"
        if key not in metrics:
            raise ValueError(f"the dev results have no {key}: {sorted(metrics)[:8]}")
        return metrics[key] > self.value + 1e-9


def majority_class(labels, names) -> Baseline:
    """Accuracy of always predicting the most frequent dev label; `names`, the class names by id."""
    labels = list(labels)
    counts = {label: labels.count(label) for label in set(labels)}
    top = max(sorted(counts), key=counts.get)
    return Baseline("accuracy", counts[top] / len(labels), f"the majority class ({names[top]})")


def run_seeds(main, argv, training_args) -> dict:
    """Run `main(argv, seed_run)` once per seed of --seeds / --num_seeds and summarise them (the module's docstring).

    Args:
        main: the script's main, `main(argv, seed_run)`: given a `SeedRun`, it runs that seed in its folder
            (`finetuning.parse_arguments`) and returns its results with a "baseline" (`Baseline`).
        argv: the script's arguments, as main takes them.
        training_args: the parsed arguments of the whole run.

    Returns:
        The summary, as written to OUTPUT_DIR/all_seeds_results.json.
    """
    if training_args.world_size > 1:
        raise InputError(
            "--seeds / --num_seeds run the seeds one after another in one process: start the script "
            "without accelerate launch, or launch one run per seed with its own --seed"
        )
    start_logging(training_args)
    output_dir = claim_output_dir(training_args)  # each seed claims its own folder too
    recorded = previous_runs(output_dir, training_args.overwrite_output_dir)
    queue, retries_left = list(training_args.seed_list), training_args.retry_failed_seeds
    runs = []
    logger.info(
        "Fine-tuning %d seeds (%s), each in %s",
        len(queue),
        ", ".join(map(str, queue)),
        output_dir / SEED_FOLDER.format("N"),
    )
    while queue:
        seed = queue.pop(0)
        if seed in recorded:
            run = recorded[seed]
            logger.info("Seed %d: done in an earlier run (%s), kept", seed, SUMMARY_FILE)
        else:
            run = run_one_seed(main, argv, seed, output_dir / SEED_FOLDER.format(seed))
        runs.append(run)
        if not run["learned"]:
            baseline = run["baseline"]
            score = run["eval"]["eval_" + baseline["metric"]]
            line = (
                f"Seed {seed} did not learn: dev {baseline['metric']} {score:.4g} is at or below "
                f"{baseline['value']:.4g}, that of {baseline['name']}"
            )
            if retries_left:
                used = [r["seed"] for r in runs] + queue + list(training_args.seed_list)
                queue.append(max(used) + 1)
                retries_left -= 1
                line += (
                    f"; replaced by seed {queue[-1]} (retry {training_args.retry_failed_seeds - retries_left} of "
                    f"{training_args.retry_failed_seeds})"
                )
            logger.warning(line)
        summary = summarise(runs, training_args)
        write_json(output_dir / SUMMARY_FILE, summary)
    log_table(summary)
    if summary["best_seed"] is None:
        raise NothingProduced(
            f"No seed learned: {output_dir / SUMMARY_FILE} holds the runs, and no model was put in {output_dir}"
        )
    put_best_on_top(output_dir, summary)
    if training_args.push_to_hub:
        push_folder(
            output_dir,
            training_args.hub_model_id or output_dir.absolute().name,
            token=training_args.hub_token,
            private=training_args.hub_private_repo,
            commit_message=f"Best of {len(runs)} seeds: seed {summary['best_seed']}",
            ignore=[SEED_FOLDER.format("*"), SEED_FOLDER.format("*") + "/**"],
        )
    return summary


def previous_runs(output_dir: Path, overwrite: bool) -> dict[int, dict]:
    """seed -> its run as an earlier, interrupted, run of this command recorded it; {} when starting over.

    A folder that holds a model but no record of seeds is another run's: refused, as a run of one seed refuses it.
    """
    path = output_dir / SUMMARY_FILE
    if overwrite or not output_dir.is_dir():
        return {}
    if not path.is_file():
        refuse_a_trained_model(output_dir)
        return {}
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))["runs"]
        return {int(run["seed"]): run for run in runs}
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{path}: not a summary of seeds ({error}); pass --overwrite_output_dir to start over")


def run_one_seed(main, argv, seed: int, folder: Path) -> dict:
    """One seed's fine-tuning in `folder`, as the run's record: its dev and test metrics, baseline and verdict."""
    logger.info("Seed %d: fine-tuning in %s", seed, folder)
    results = main(argv, SeedRun(seed, str(folder)))
    baseline = results["baseline"]
    return {
        "seed": seed,
        "output_dir": folder.name,
        "learned": baseline.learned(results["validation"]),
        "eval": results["validation"],
        "predict": results.get("test", {}),
        "baseline": asdict(baseline),
    }


def best_metric(runs: list[dict], metric_for_best_model: str | None) -> str:
    """The key the best seed is chosen by: --metric_for_best_model (as Trainer reads it), else the main metric."""
    metric = metric_for_best_model or runs[0]["baseline"]["metric"]
    return metric if metric.startswith("eval_") else f"eval_{metric}"


def summarise(runs: list[dict], training_args) -> dict:
    """The summary of the runs so far (see the module's docstring); `best_seed` is None when none learned."""
    learned = [run for run in runs if run["learned"]]
    by = best_metric(runs, training_args.metric_for_best_model if training_args.metric_for_best_model_given else None)
    metrics = {}
    for kind in ("eval", "predict"):
        keys = [
            key
            for key in (learned[0][kind] if learned else {})
            if not key.endswith(NOT_SUMMARISED)
            and key != "epoch"
            and all(isinstance(run[kind].get(key), (int, float)) for run in learned)
        ]
        for key in sorted(keys, key=lambda key: (key != by, key)):  # the one the best seed is chosen by first
            metrics[key] = statistics_of({run["seed"]: float(run[kind][key]) for run in learned})
    greater = training_args.greater_is_better if training_args.greater_is_better_given else not by.endswith("loss")
    best = None
    if learned:
        if by not in learned[0]["eval"]:
            raise InputError(
                f"--metric_for_best_model {by}: the dev results have no such key; they have "
                f"{sorted(k for k in learned[0]['eval'] if not k.endswith(NOT_SUMMARISED))}"
            )
        best = (max if greater else min)(learned, key=lambda run: run["eval"][by])["seed"]
    return {
        "seeds": [run["seed"] for run in runs],
        "learned": len(learned),
        "did_not_learn": [run["seed"] for run in runs if not run["learned"]],
        "baseline": runs[0]["baseline"],
        "best_seed": best,
        "best_by": by,
        "greater_is_better": greater,
        "metrics": metrics,
        "runs": runs,
    }


def statistics_of(values: dict[int, float]) -> dict:
    """Median, mean, its standard error (None for one value), minimum and maximum of seed -> value, with the seeds
    that gave the median (two for an even count), the minimum and the maximum (among equal values, the first seed
    run, as the best seed is chosen)."""
    seeds = sorted(values, key=lambda seed: values[seed])  # stable: equal values keep the order the seeds ran in
    n = len(seeds)
    middle = seeds[(n - 1) // 2 : n // 2 + 1]
    low, high = min(values.values()), max(values.values())
    return {
        "n": n,
        "median": statistics.median(values.values()),
        "median_seeds": middle,
        "mean": statistics.fmean(values.values()),
        "standard_error": statistics.stdev(values.values()) / math.sqrt(n) if n > 1 else None,
        "min": low,
        "min_seed": next(seed for seed in values if values[seed] == low),
        "max": high,
        "max_seed": next(seed for seed in values if values[seed] == high),
    }


def table(summary: dict) -> list[str]:
    """The summary as markdown table rows, for the log and the card."""
    rows = ["| metric | median | mean ± SE | min (seed) | max (seed) |", "|---|---|---|---|---|"]
    for key, s in summary["metrics"].items():
        se = "" if s["standard_error"] is None else f" ± {s['standard_error']:.4g}"
        rows.append(
            f"| {key} | {s['median']:.4g} | {s['mean']:.4g}{se} | {s['min']:.4g} ({s['min_seed']}) | "
            f"{s['max']:.4g} ({s['max_seed']}) |"
        )
    return rows


def verdict(summary: dict) -> str:
    n, failed = len(summary["seeds"]), summary["did_not_learn"]
    line = f"{summary['learned']} of {n} seeds learned"
    if failed:
        line += (
            f"; did not learn: seed {', '.join(map(str, failed))} (dev {summary['baseline']['metric']} at or "
            f"below {summary['baseline']['value']:.4g}, that of {summary['baseline']['name']}), left out of "
            "the statistics"
        )
    return line


def log_table(summary: dict) -> None:
    logger.info("Seeds %s: %s", ", ".join(map(str, summary["seeds"])), verdict(summary))
    for row in table(summary):
        logger.info(row)


def put_best_on_top(output_dir: Path, summary: dict) -> None:
    """Copy the best seed's files (model, tokenizer, results, predictions, card) to `output_dir`, replacing those
    of an earlier best, each file written beside and renamed into place; the card gains a Seeds section."""
    source = output_dir / SEED_FOLDER.format(summary["best_seed"])
    for path in output_dir.iterdir():  # the earlier best's files: every plain file but the summary and the lock
        if path.is_file() and path.name not in (SUMMARY_FILE, output_lock.LOCK_FILE):
            path.unlink()
    for path in source.iterdir():
        if path.is_file() and path.name != output_lock.LOCK_FILE:
            partial = output_dir / f".tmp-{path.name}"
            shutil.copy2(path, partial)
            os.replace(partial, output_dir / path.name)
    card = output_dir / "README.md"
    if card.is_file():
        chosen = (
            f"This is seed {summary['best_seed']}, the best by dev `{summary['best_by']}` among "
            f"{summary['learned']} seeds that learned ({', '.join(map(str, summary['seeds']))} were run; "
            f"each is in `{SEED_FOLDER.format('N')}/`). {verdict(summary)}. Statistics over the seeds that "
            f"learned (also in `{SUMMARY_FILE}`):"
        )
        card.write_text(
            card.read_text(encoding="utf-8").rstrip()
            + "\n\n## Seeds\n\n"
            + chosen
            + "\n\n"
            + "\n".join(table(summary))
            + "\n",
            encoding="utf-8",
        )
    logger.info(
        "The best seed, %d (dev %s %.4g), is in %s",
        summary["best_seed"],
        summary["best_by"],
        next(run for run in summary["runs"] if run["seed"] == summary["best_seed"])["eval"][summary["best_by"]],
        output_dir,
    )
