"""The job behind `run_checkpoint_evals.py`: what each checkpoint of a pretraining run is worth downstream.

    python run_checkpoint_evals.py RUN --tasks mrpc cola squad race --data_dir glue/ --squad_dir squad/ \
        --race_dir RACE/ --seeds 1 2 3 [--baseline random_init | --source_model MODEL] [--watch] [fine-tuning flags]

For every model folder of the run (sources.py: each complete step_N, the final folder, or the Hub's step-N
branches; as step 0, the run's config with random weights, or for a continued run the model it started from), every
task and every seed, the task's script (`run_glue.py`, `run_squad.py` or `run_race.py`: `TASK_SCRIPTS`) fine-tunes it
in a process of its own, with the same flags for all (a flag goes to the scripts that take it), and each dev metric
becomes one row of RUN/downstream/results.jsonl ({step, tokens, task, seed, metric, value}); then the table, the plot
and the card (report.py). A row already there is not computed again, so a killed job continues where it stopped; a
second job on the same RUN is refused (the lock of RUN/downstream, not of RUN, which the pretraining run holds).
`--watch` waits for checkpoints as the run writes them and ends once the run's final folder is evaluated.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..errors import InputError, NothingProduced
from ..pretraining.output.checkpoints import StepCheckpoints
from ..pretraining.output.loadable import missing
from ..runtime import output_lock
from ..tasks.glue.definition import TASKS
from . import report
from .arguments import (
    HUB_DATASETS,
    NOT_METRICS,
    OTHER_MAIN_METRICS,
    OWN_DATA,
    SQUAD_FILES,
    EvalArguments,
    parse_args,
    script_of,
)
from .sources import Source, download, hub_sources, local_sources, random_init

logger = logging.getLogger(__name__)


def flag_names(flags: dict[str, list[str]]) -> list[str]:
    return [token.split("=")[0] for tokens in flags.values() for token in tokens if token.startswith("--")]


def main_metric(task: str, rows: list[dict]) -> str:
    """A GLUE task's official key metric, SQuAD's F1, RACE's accuracy; for your own data accuracy, or Pearson for
    float labels."""
    if task in TASKS:
        return TASKS[task].main_metric
    if task in OTHER_MAIN_METRICS:
        return OTHER_MAIN_METRICS[task]
    return "accuracy" if any(row["metric"] == "accuracy" for row in rows if row["task"] == task) else "pearson"


def task_data(args: EvalArguments, task: str) -> list[str]:
    """The data flags of one task's script: the local files asked for, else the Hub's dataset."""
    if task == OWN_DATA:
        return ["--train_file", args.train_file, "--validation_file", args.validation_file]
    if task in SQUAD_FILES:
        data = (
            [
                "--train_file",
                str(Path(args.squad_dir) / SQUAD_FILES[task][0]),
                "--validation_file",
                str(Path(args.squad_dir) / SQUAD_FILES[task][1]),
            ]
            if args.squad_dir
            else ["--dataset_name", HUB_DATASETS[task]]
        )
        return data + ["--version_2_with_negative"] * (task == "squad_v2")
    if task == "race":
        return ["--data_dir", args.race_dir] if args.race_dir else ["--dataset_name", HUB_DATASETS[task]]
    return ["--task_name", task] + (["--data_dir", args.data_dir] if args.data_dir else [])


def finetune_command(
    args: EvalArguments, scripts: Path, model: Path, task: str, seed: int, folder: Path
) -> tuple[list[str], dict]:
    """The command of one fine-tuning, with the fine-tuning flags its script takes, and its environment
    (--device)."""
    data = task_data(args, task)
    command = [
        sys.executable,
        str(scripts / script_of(task)),
        "--model_name_or_path",
        str(model),
        "--output_dir",
        str(folder),
        "--overwrite_output_dir",
        "--do_train",
        "--do_eval",
        "--seed",
        str(seed),
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        *data,
        *args.flags[script_of(task)],
    ]
    env = dict(os.environ)
    if args.device == "cpu":
        command.append("--use_cpu")
    elif args.device:
        env["CUDA_VISIBLE_DEVICES"] = args.device.removeprefix("cuda:")
    return command, env


def metric_rows(source: Source, task: str, seed: int, results: dict) -> list[dict]:
    return [
        {"step": source.step, "tokens": source.tokens, "task": task, "seed": seed, "metric": key[5:], "value": value}
        for key, value in sorted(results.items())
        if key.startswith("eval_") and key[5:] not in NOT_METRICS and isinstance(value, (int, float))
    ]


def run_command(command: list[str], env: dict) -> subprocess.CompletedProcess:
    """A fine-tuning's process, to its end (its output captured: the job logs its last line when it fails)."""
    return subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)


class Evaluations:
    """One job's fine-tunings and rows (module docstring); `run_process` runs each fine-tuning's process."""

    def __init__(self, args: EvalArguments, scripts: Path, run_process=run_command):
        self.args, self.scripts, self.run_process = args, scripts, run_process
        self.out = args.output_dir
        self.done = {(row["step"], row["task"], row["seed"]) for row in report.read_rows(self.out)}
        self.reported: set[str] = set()  # sources already said to be unusable
        self.failed = 0
        self.hub = args.run[4:] if args.run.startswith("hub:") else None

    def sources(self) -> list[Source]:
        found = (
            hub_sources(self.hub, self.out / "hub", self.args.hub_token)
            if self.hub
            else local_sources(Path(self.args.run))
        )
        if self.args.baseline == "random_init" and (self.hub is None or found):
            model_files = (
                Path(self.args.run) if self.hub is None else download(found[-1], self.out / "hub", self.args.hub_token)
            )
            found.insert(0, random_init(model_files, self.out / "random_init"))
        if self.args.source_model:  # a folder, or a Hub repo id the fine-tuning scripts load as they load any
            found.insert(0, Source(0, 0.0, self.args.source_model))
        return found

    def unusable(self, source: Source) -> str | None:
        """Why a local checkpoint cannot be evaluated (gone, damaged, or without its model files), or None."""
        path = Path(source.path)
        if source.revision is not None or source.step == 0:
            return None
        if not path.exists():
            return f"{path}: removed before its turn (--checkpoints_total_limit): skipped"
        if path.name.startswith("step_"):
            damage = StepCheckpoints.damage(path)
            if damage:
                return f"{path}: damaged ({damage}): not evaluated"
        absent = missing(path)
        if absent:
            return (
                f"{path}: no model files ({', '.join(absent)}): make it loadable with python -m "
                f"albert_hf.pretraining.output.loadable {path}"
            )
        return None

    def evaluate(self, source: Source) -> int:
        """Every (task, seed) of `source` not yet in the rows; returns how many were fine-tuned."""
        todo = [
            (task, seed)
            for task in self.args.tasks
            for seed in self.args.seeds
            if (source.step, task, seed) not in self.done
        ]
        if not todo:
            return 0
        problem = self.unusable(source)
        if problem:
            if problem not in self.reported:
                logger.warning(problem)
                self.reported.add(problem)
            return 0
        model = download(source, self.out / "hub", self.args.hub_token)
        for task, seed in todo:
            self.finetune(source, model, task, seed)
        return len(todo)

    def finetune(self, source: Source, model: Path, task: str, seed: int) -> None:
        folder = self.out / "runs" / source.name / task / f"seed_{seed}"
        command, env = finetune_command(self.args, self.scripts, model, task, seed, folder)
        logger.info("%s, %s, seed %d: fine-tuning", source.name, task, seed)
        began = time.perf_counter()
        done = self.run_process(command, env)
        results_file = folder / "eval_results.json"
        if done.returncode != 0 or not results_file.is_file():
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            logger.warning(
                "%s, %s, seed %d: fine-tuning failed (status %d): %s", source.name, task, seed, done.returncode, last
            )
            self.failed += 1
            return
        rows = metric_rows(source, task, seed, json.loads(results_file.read_text()))
        with open(self.out / report.RESULTS_FILE, "a") as file:  # one write: a kill leaves a whole row set or none
            file.write("".join(json.dumps(row) + "\n" for row in rows))
        self.done.add((source.step, task, seed))
        for path in folder.iterdir():  # the fine-tuned weights are not kept: the rows are the result
            if path.suffix in (".safetensors", ".bin", ".pt") or path.is_dir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        logger.info(
            "%s, %s, seed %d: %s (%.0f s)",
            source.name,
            task,
            seed,
            ", ".join(f"{row['metric']}={row['value']:.4f}" for row in rows),
            time.perf_counter() - began,
        )

    def finished(self) -> bool:
        """--watch: the run has written its final folder and no longer holds its own folder."""
        run = Path(self.args.run)
        return (run / "all_results.json").is_file() and output_lock.in_use(run, "RUN") is None

    def report(self) -> str:
        rows = report.read_rows(self.out)
        metrics = {task: main_metric(task, rows) for task in self.args.tasks}
        text = report.table(rows, metrics)
        (self.out / report.TABLE_FILE).write_text(text)
        if rows:
            report.plot(rows, metrics, self.out / report.PLOT_FILE)
        if self.hub is None:
            report.into_card(Path(self.args.run) / "README.md", text)
        if self.args.with_tracking:
            track(Path(self.args.run) if self.hub is None else self.out, rows, metrics, self.out)
        return text


def track(run_dir: Path, rows: list[dict], metrics: dict[str, str], out: Path) -> None:
    """TensorBoard scalars downstream/<task> (the median over seeds) at the pretraining step, in the run's
    tracker folder; each (task, step) once, whatever the number of reports."""
    from torch.utils.tensorboard import SummaryWriter

    written_file = out / ".tracked.json"
    written = set(map(tuple, json.loads(written_file.read_text()))) if written_file.is_file() else set()
    writer = SummaryWriter(log_dir=str(run_dir / "runs" / "albert_pretraining"), filename_suffix=".downstream")
    for task, by_step in report.summary(rows, metrics).items():
        for step, cell in by_step.items():
            if (task, step) not in written and cell["seeds"] == len({r["seed"] for r in rows if r["task"] == task}):
                writer.add_scalar(f"downstream/{task}", cell["median"], step)
                written.add((task, step))
    writer.close()
    written_file.write_text(json.dumps(sorted(written)))


def main(argv=None, scripts: Path | None = None, run_process=run_command) -> None:
    """Every evaluation asked for gets its row; NothingProduced (status 1) when some failed (each said in its line).
    `scripts`: the folder of run_glue.py (default: the running script's); `run_process`: how a fine-tuning's
    process runs."""
    logging.basicConfig(
        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S", level=logging.INFO
    )
    args = parse_args(argv)
    for script, flags in args.flags.items():
        left_out = sorted(set(flag_names(args.flags)) - set(flag_names({script: flags})))
        if left_out:
            logger.info("%s: not given %s (it has no such flag)", script, ", ".join(left_out))
    scripts = scripts or Path(sys.argv[0]).resolve().parent
    if not args.run.startswith("hub:") and not args.watch and not Path(args.run).is_dir():
        raise InputError(f"{args.run}: no such run folder (--watch waits for one)")
    with output_lock.held(args.output_dir, "--output_dir of the evaluations"):
        jobs = Evaluations(args, scripts, run_process)
        while True:
            sources = jobs.sources()
            computed = sum(jobs.evaluate(source) for source in sources)
            if computed or not (args.output_dir / report.TABLE_FILE).is_file():
                jobs.report()
            if not args.watch or (jobs.finished() and not computed):
                break
            time.sleep(args.watch_interval)
    print((args.output_dir / report.TABLE_FILE).read_text(), end="")
    print(f"{len(report.read_rows(args.output_dir))} rows in {args.output_dir / report.RESULTS_FILE}")
    if jobs.failed:
        raise NothingProduced(
            f"{jobs.failed} fine-tunings failed (their lines above); run the same command again to retry them"
        )
