"""What `run_checkpoint_evals.py` makes of its rows (RUN/downstream/results.jsonl): the table (step x task, the
median over seeds of each task's main metric with its minimum and maximum), the plot by_step.png (the main metric
against tokens seen, one line per task, the seeds' range shaded) and the table in the run's model card."""

import json
import statistics
from pathlib import Path

RESULTS_FILE = "results.jsonl"
TABLE_FILE = "by_step.md"
PLOT_FILE = "by_step.png"
CARD_SECTION = "## Downstream by step"


def read_rows(folder: Path) -> list[dict]:
    """The rows written so far; a line cut short by a kill is left out (its fine-tuning runs again)."""
    rows = []
    path = folder / RESULTS_FILE
    for line in path.read_text().splitlines() if path.is_file() else ():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and {"step", "task", "seed", "metric", "value"} <= set(row):
            rows.append(row)
    return rows


def summary(rows: list[dict], main_metrics: dict[str, str]) -> dict[str, dict[int, dict]]:
    """{task: {step: {"tokens", "median", "min", "max", "seeds"}}} of each task's main metric."""
    found: dict[str, dict[int, dict]] = {}
    for task, metric in main_metrics.items():
        by_step: dict[int, list[dict]] = {}
        for row in rows:
            if row["task"] == task and row["metric"] == metric:
                by_step.setdefault(row["step"], []).append(row)
        found[task] = {
            step: {
                "tokens": group[0].get("tokens"),
                "median": statistics.median(r["value"] for r in group),
                "min": min(r["value"] for r in group),
                "max": max(r["value"] for r in group),
                "seeds": len(group),
            }
            for step, group in sorted(by_step.items())
        }
    return found


def table(rows: list[dict], main_metrics: dict[str, str]) -> str:
    """Markdown: one row per step, one column per task: median (min-max) over the seeds, with the tokens seen."""
    found = summary(rows, main_metrics)
    steps = sorted({step for by_step in found.values() for step in by_step})
    tokens = {step: cell["tokens"] for by_step in found.values() for step, cell in by_step.items()}
    head = "| step | tokens | " + " | ".join(f"{task} ({metric})" for task, metric in main_metrics.items()) + " |"
    lines = [head, "|" + "---|" * (2 + len(main_metrics))]
    for step in steps:
        cells = []
        for task in main_metrics:
            cell = found[task].get(step)
            cells.append(
                "-"
                if cell is None
                else f"{cell['median']:.4f} ({cell['min']:.4f}-{cell['max']:.4f}, "
                f"{cell['seeds']} seed{'s' * (cell['seeds'] != 1)})"
            )
        seen = tokens.get(step)
        lines.append(f"| {step} | {'-' if seen is None else f'{seen:,.0f}'} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], main_metrics: dict[str, str], path: Path) -> dict[str, dict[str, list]]:
    """by_step.png: each task's main metric (median over seeds, min to max shaded) against the tokens seen (the
    steps where a row does not know its tokens). Returns the series drawn, per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = summary(rows, main_metrics)
    by_tokens = all(cell["tokens"] is not None for by_step in found.values() for cell in by_step.values())
    drawn = {}
    figure, axis = plt.subplots(figsize=(6, 4))
    for task, by_step in found.items():
        if not by_step:
            continue
        x = [cell["tokens"] if by_tokens else step for step, cell in by_step.items()]
        series = {
            "x": x,
            "median": [cell["median"] for cell in by_step.values()],
            "min": [cell["min"] for cell in by_step.values()],
            "max": [cell["max"] for cell in by_step.values()],
        }
        axis.plot(x, series["median"], marker="o", label=f"{task} ({main_metrics[task]})")
        axis.fill_between(x, series["min"], series["max"], alpha=0.2)
        drawn[task] = series
    axis.set_xlabel("tokens seen in pretraining" if by_tokens else "pretraining step")
    axis.set_ylabel("dev score (median over seeds)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return drawn


def into_card(card: Path, text: str) -> None:
    """The table as the run's model card's `CARD_SECTION` (replacing an earlier one), when the card exists."""
    if not card.is_file():
        return
    lines = card.read_text().split("\n")
    if CARD_SECTION in lines:  # the section runs to the next heading of its level
        start = lines.index(CARD_SECTION)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = []
    section = [
        CARD_SECTION,
        "",
        "Fine-tuned from each checkpoint of this run (`run_checkpoint_evals.py`): the dev "
        "score's median over seeds, with its range.",
        "",
        text.rstrip("\n"),
        "",
    ]
    card.write_text("\n".join(lines).rstrip("\n") + "\n\n" + "\n".join(section))
