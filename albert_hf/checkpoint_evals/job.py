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

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, NothingProduced
from ..pretraining.output.checkpoints import StepCheckpoints
from ..pretraining.output.loadable import missing
from ..runtime import output_lock
from ..tasks.arguments import AlbertTrainingArguments, ModelArguments
from ..tasks.glue.data import GlueDataArguments
from ..tasks.glue.recipe import TASKS
from ..tasks.race import recipe as race_recipe
from ..tasks.race.data import RaceDataArguments
from ..tasks.squad import recipe as squad_recipe
from ..tasks.squad.data import SquadDataArguments
from . import report
from .sources import Source, download, hub_sources, local_sources, random_init

logger = logging.getLogger(__name__)

OWN_DATA = "own_data"  # the task name of --train_file / --validation_file
# the tasks beside GLUE's: the script that fine-tunes each, and its dev metric (the table's and the plot's)
TASK_SCRIPTS = {"squad": "run_squad.py", "squad_v2": "run_squad.py", "race": "run_race.py"}
OTHER_MAIN_METRICS = {"squad": squad_recipe.MAIN_METRIC, "squad_v2": squad_recipe.MAIN_METRIC,
                      "race": race_recipe.MAIN_METRIC}
# --squad_dir: the official file names of each version's train and dev sets; without it, the Hub's datasets
SQUAD_FILES = {"squad": ("train-v1.1.json", "dev-v1.1.json"), "squad_v2": ("train-v2.0.json", "dev-v2.0.json")}
HUB_DATASETS = {"squad": "rajpurkar/squad", "squad_v2": "rajpurkar/squad_v2", "race": "ehovy/race"}
# what eval_results.json holds besides the metrics: losses, speeds, counts and SQuAD v2's tuned thresholds
NOT_METRICS = {"loss", "runtime", "samples_per_second", "steps_per_second", "samples", "model_tflops_per_second",
               "mfu", "features", "total", "HasAns_total", "NoAns_total", "num_high", "num_middle", "null_threshold",
               "best_exact_thresh", "best_f1_thresh"}
# the flags this job sets for each fine-tuning (its data, folder, model and seed) beside its own (--data_dir,
# --train_file, --validation_file), which its parser takes
TAKEN = {"--output_dir", "--model_name_or_path", "--seed", "--task_name", "--do_train", "--do_eval", "--dataset_name",
         "--dataset_config_name", "--version_2_with_negative"}


@dataclass(frozen=True)
class EvalArguments:
    run: str  # the run's output folder, or hub:OWNER/NAME
    tasks: list[str]
    data_dir: str | None
    squad_dir: str | None
    race_dir: str | None
    train_file: str | None
    validation_file: str | None
    seeds: list[int]
    baseline: str
    watch: bool
    watch_interval: float
    output_dir: Path  # where the rows, the table and the plot go
    device: str | None
    with_tracking: bool
    hub_token: str | None
    flags: dict[str, list[str]]  # the fine-tuning flags each script takes (`flags_by_script`)
    source_model: str | None = None  # a continued run's --model_name_or_path, evaluated as step 0


def parse_args(argv=None) -> EvalArguments:
    """Our arguments, and the rest for the fine-tuning scripts (every checkpoint alike)."""
    parser = argparse.ArgumentParser(prog="run_checkpoint_evals.py", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)  # --seed is run_glue.py's, not short for --seeds
    parser.add_argument("run", help="a run_pretraining.py --output_dir, or hub:OWNER/NAME (its step-N branches)")
    parser.add_argument("--tasks", nargs="*", default=[], help="GLUE task names (mrpc, cola, ...), squad, squad_v2, "
                        "race")
    parser.add_argument("--data_dir", help="the original GLUE folders (else the Hub's nyu-mll/glue)")
    parser.add_argument("--squad_dir", help="a folder with the official train-v1.1.json and dev-v1.1.json (squad), "
                        "train-v2.0.json and dev-v2.0.json (squad_v2); else the Hub's rajpurkar/squad(_v2)")
    parser.add_argument("--race_dir", help="RACE in its official layout ({train,dev}/{high,middle}/*.txt); else the "
                        "Hub's ehovy/race")
    parser.add_argument("--train_file", help=f"your own labelled data (with --validation_file): task {OWN_DATA}")
    parser.add_argument("--validation_file")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42], help="fine-tuning seeds (default: 42)")
    parser.add_argument("--baseline", choices=("none", "random_init"), default="none",
                        help="random_init: add step 0, the run's config with random weights")
    parser.add_argument("--source_model", help="a continued run's --model_name_or_path (a folder or a Hub repo): "
                        "add it as step 0, the starting point the checkpoints are compared with")
    parser.add_argument("--watch", action="store_true", help="wait for the run's checkpoints; end after its final "
                        "folder")
    parser.add_argument("--watch_interval", type=float, default=60.0, help="seconds between looks (--watch)")
    parser.add_argument("--output_dir", type=Path, help="default: RUN/downstream (./NAME-downstream for hub:)")
    parser.add_argument("--device", help="cpu, or cuda:N to keep the fine-tuning off the training GPU")
    parser.add_argument("--with_tracking", action="store_true", help="TensorBoard scalars downstream/TASK at the "
                        "pretraining step, in RUN/runs")
    parser.add_argument("--hub_token", help="default: the saved Hub login")
    known, rest = parser.parse_known_args(argv)
    tasks = [task.lower() for task in known.tasks]
    unknown = [task for task in tasks if task not in TASKS and task not in TASK_SCRIPTS]
    if unknown:
        raise InputError(f"--tasks {' '.join(unknown)}: not a task here (GLUE's {', '.join(TASKS)}; "
                         f"{', '.join(TASK_SCRIPTS)}); your own data goes in --train_file and --validation_file")
    check_task_data(known, tasks)
    if known.train_file:
        tasks.append(OWN_DATA)
    if not tasks:
        raise InputError("nothing to evaluate: pass --tasks (GLUE names) and/or --train_file/--validation_file")
    if known.source_model and known.baseline != "none":
        raise InputError(f"--source_model and --baseline {known.baseline} are both step 0: pass one of them")
    if len(set(known.seeds)) != len(known.seeds):
        raise InputError("--seeds: a seed is given twice")
    if known.watch and known.run.startswith("hub:"):
        raise InputError("--watch waits for a local run's checkpoints: pass the run's --output_dir")
    if known.watch_interval <= 0:
        raise InputError("--watch_interval must be above 0")
    clash = sorted(flag for flag in rest if flag.split("=")[0] in TAKEN)
    if clash:
        raise InputError(f"{', '.join(clash)}: run_checkpoint_evals.py sets it for each fine-tuning")
    output_dir = known.output_dir or (Path(known.run) / "downstream" if not known.run.startswith("hub:")
                                      else Path(known.run[4:].replace("/", "-") + "-downstream"))
    return EvalArguments(known.run, tasks, known.data_dir, known.squad_dir, known.race_dir, known.train_file,
                         known.validation_file, known.seeds,
                         known.baseline, known.watch, known.watch_interval, output_dir, known.device,
                         known.with_tracking, known.hub_token, flags_by_script(rest, tasks), known.source_model)


def check_task_data(known: argparse.Namespace, tasks: list[str]) -> None:
    """The tasks' data flags: the SQuAD files and the RACE folder named exist; one's own files come in pairs."""
    for task in tasks:
        if task in SQUAD_FILES and known.squad_dir:
            absent = [name for name in SQUAD_FILES[task] if not (Path(known.squad_dir) / name).is_file()]
            if absent:
                raise InputError(f"--squad_dir {known.squad_dir}: no {' nor '.join(absent)} (task {task})")
    if known.race_dir and "race" in tasks and not Path(known.race_dir).is_dir():
        raise InputError(f"--race_dir {known.race_dir}: no such folder")
    if bool(known.train_file) != bool(known.validation_file):
        raise InputError("--train_file and --validation_file go together (the dev scores are the rows)")


def script_of(task: str) -> str:
    return TASK_SCRIPTS.get(task, "run_glue.py")


def flags_by_script(rest: list[str], tasks: list[str]) -> dict[str, list[str]]:
    """The fine-tuning flags each script of `tasks` takes: a flag goes to the scripts whose arguments have it (e.g.
    --doc_stride to run_squad.py only); one that none takes is refused, a bad value too, in one line."""
    from transformers import HfArgumentParser

    data_classes = {"run_glue.py": GlueDataArguments, "run_squad.py": SquadDataArguments,
                    "run_race.py": RaceDataArguments}
    groups, group = [], []  # each flag with the values that follow it
    for token in rest:
        if token.startswith("--") and group:
            groups.append(group)
            group = []
        group.append(token)
    if group:
        groups.append(group)
    if groups and not groups[0][0].startswith("--"):
        raise InputError(f"{groups[0][0]}: not a flag (run_checkpoint_evals.py takes one RUN)")
    given = {}
    for script in sorted({script_of(task) for task in tasks}):
        parser = HfArgumentParser((ModelArguments, data_classes[script], AlbertTrainingArguments),
                                  exit_on_error=False)
        given[script] = []
        for group in groups:
            try:
                _, unknown = parser.parse_known_args([*group, "--model_name_or_path", "-"])  # we set that one
            except argparse.ArgumentError as error:
                raise InputError(f"{group[0]}: {error.message} ({script})") from None
            if not unknown:
                given[script] += group
    nowhere = [group[0] for group in groups if not any(group[0] in flags for flags in given.values())]
    if nowhere:
        raise InputError(f"{', '.join(nowhere)}: not a flag of {' nor '.join(sorted(given))}")
    return given


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
        data = (["--train_file", str(Path(args.squad_dir) / SQUAD_FILES[task][0]), "--validation_file",
                 str(Path(args.squad_dir) / SQUAD_FILES[task][1])] if args.squad_dir
                else ["--dataset_name", HUB_DATASETS[task]])
        return data + ["--version_2_with_negative"] * (task == "squad_v2")
    if task == "race":
        return ["--data_dir", args.race_dir] if args.race_dir else ["--dataset_name", HUB_DATASETS[task]]
    return ["--task_name", task] + (["--data_dir", args.data_dir] if args.data_dir else [])


def finetune_command(args: EvalArguments, scripts: Path, model: Path, task: str, seed: int,
                     folder: Path) -> tuple[list[str], dict]:
    """The command of one fine-tuning, with the fine-tuning flags its script takes, and its environment
    (--device)."""
    data = task_data(args, task)
    command = [sys.executable, str(scripts / script_of(task)), "--model_name_or_path", str(model), "--output_dir",
               str(folder), "--overwrite_output_dir", "--do_train", "--do_eval", "--seed", str(seed),
               "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true", *data,
               *args.flags[script_of(task)]]
    env = dict(os.environ)
    if args.device == "cpu":
        command.append("--use_cpu")
    elif args.device:
        env["CUDA_VISIBLE_DEVICES"] = args.device.removeprefix("cuda:")
    return command, env


def metric_rows(source: Source, task: str, seed: int, results: dict) -> list[dict]:
    return [{"step": source.step, "tokens": source.tokens, "task": task, "seed": seed, "metric": key[5:],
             "value": value} for key, value in sorted(results.items())
            if key.startswith("eval_") and key[5:] not in NOT_METRICS and isinstance(value, (int, float))]


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
        found = (hub_sources(self.hub, self.out / "hub", self.args.hub_token) if self.hub else
                 local_sources(Path(self.args.run)))
        if self.args.baseline == "random_init" and (self.hub is None or found):
            model_files = Path(self.args.run) if self.hub is None else download(found[-1], self.out / "hub",
                                                                                 self.args.hub_token)
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
            return (f"{path}: no model files ({', '.join(absent)}): make it loadable with python -m "
                    f"albert_hf.pretraining.output.loadable {path}")
        return None

    def evaluate(self, source: Source) -> int:
        """Every (task, seed) of `source` not yet in the rows; returns how many were fine-tuned."""
        todo = [(task, seed) for task in self.args.tasks for seed in self.args.seeds
                if (source.step, task, seed) not in self.done]
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
            logger.warning("%s, %s, seed %d: fine-tuning failed (status %d): %s", source.name, task, seed,
                           done.returncode, last)
            self.failed += 1
            return
        rows = metric_rows(source, task, seed, json.loads(results_file.read_text()))
        with open(self.out / report.RESULTS_FILE, "a") as file:  # one write: a kill leaves a whole row set or none
            file.write("".join(json.dumps(row) + "\n" for row in rows))
        self.done.add((source.step, task, seed))
        for path in folder.iterdir():  # the fine-tuned weights are not kept: the rows are the result
            if path.suffix in (".safetensors", ".bin", ".pt") or path.is_dir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        logger.info("%s, %s, seed %d: %s (%.0f s)", source.name, task, seed,
                    ", ".join(f"{row['metric']}={row['value']:.4f}" for row in rows), time.perf_counter() - began)

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
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        level=logging.INFO)
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
        raise NothingProduced(f"{jobs.failed} fine-tunings failed (their lines above); run the same command again "
                              "to retry them")
