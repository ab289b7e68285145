"""run_checkpoint_evals.py's arguments (`parse_args`): ours, checked, and the fine-tuning flags each task's script
takes (`flags_by_script`)."""

import argparse
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..tasks.arguments import AlbertTrainingArguments, ModelArguments
from ..tasks.glue.data import GlueDataArguments
from ..tasks.glue.definition import TASKS
from ..tasks.race import definition as race_definition
from ..tasks.race.data import RaceDataArguments
from ..tasks.squad import definition as squad_definition
from ..tasks.squad.data import SquadDataArguments

DESCRIPTION = "What each checkpoint of a pretraining run is worth downstream."

OWN_DATA = "own_data"  # the task name of --train_file / --validation_file
# the tasks beside GLUE's: the script that fine-tunes each, and its dev metric (the table's and the plot's)
TASK_SCRIPTS = {"squad": "run_squad.py", "squad_v2": "run_squad.py", "race": "run_race.py"}
OTHER_MAIN_METRICS = {
    "squad": squad_definition.MAIN_METRIC,
    "squad_v2": squad_definition.MAIN_METRIC,
    "race": race_definition.MAIN_METRIC,
}
# --squad_dir: the official file names of each version's train and dev sets; without it, the Hub's datasets
SQUAD_FILES = {"squad": ("train-v1.1.json", "dev-v1.1.json"), "squad_v2": ("train-v2.0.json", "dev-v2.0.json")}
HUB_DATASETS = {"squad": "rajpurkar/squad", "squad_v2": "rajpurkar/squad_v2", "race": "ehovy/race"}
# what eval_results.json holds besides the metrics: losses, speeds, counts and SQuAD v2's tuned thresholds
NOT_METRICS = {
    "loss",
    "runtime",
    "samples_per_second",
    "steps_per_second",
    "samples",
    "model_tflops_per_second",
    "mfu",
    "features",
    "total",
    "HasAns_total",
    "NoAns_total",
    "num_high",
    "num_middle",
    "null_threshold",
    "best_exact_thresh",
    "best_f1_thresh",
}
# the flags this job sets for each fine-tuning (its data, folder, model and seed) beside its own (--data_dir,
# --train_file, --validation_file), which its parser takes
TAKEN = {
    "--output_dir",
    "--model_name_or_path",
    "--seed",
    "--task_name",
    "--do_train",
    "--do_eval",
    "--dataset_name",
    "--dataset_config_name",
    "--version_2_with_negative",
}


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


def build_parser() -> argparse.ArgumentParser:
    """Our arguments; the rest go to the fine-tuning scripts."""
    parser = argparse.ArgumentParser(
        prog="run_checkpoint_evals.py", description=DESCRIPTION, allow_abbrev=False
    )  # --seed is run_glue.py's, not short for --seeds
    parser.add_argument("run", help="a run_pretraining.py --output_dir, or hub:OWNER/NAME (its step-N branches)")
    parser.add_argument(
        "--tasks", nargs="*", default=[], help="GLUE task names (mrpc, cola, ...), squad, squad_v2, race"
    )
    parser.add_argument("--data_dir", help="the original GLUE folders (else the Hub's nyu-mll/glue)")
    parser.add_argument(
        "--squad_dir",
        help="a folder with the official train-v1.1.json and dev-v1.1.json (squad), "
        "train-v2.0.json and dev-v2.0.json (squad_v2); else the Hub's rajpurkar/squad(_v2)",
    )
    parser.add_argument(
        "--race_dir", help="RACE in its official layout ({train,dev}/{high,middle}/*.txt); else the Hub's ehovy/race"
    )
    parser.add_argument("--train_file", help=f"your own labelled data (with --validation_file): task {OWN_DATA}")
    parser.add_argument("--validation_file")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42], help="fine-tuning seeds (default: 42)")
    parser.add_argument(
        "--baseline",
        choices=("none", "random_init"),
        default="none",
        help="random_init: add step 0, the run's config with random weights",
    )
    parser.add_argument(
        "--source_model",
        help="a continued run's --model_name_or_path (a folder or a Hub repo): "
        "add it as step 0, the starting point the checkpoints are compared with",
    )
    parser.add_argument(
        "--watch", action="store_true", help="wait for the run's checkpoints; end after its final folder"
    )
    parser.add_argument("--watch_interval", type=float, default=60.0, help="seconds between looks (--watch)")
    parser.add_argument("--output_dir", type=Path, help="default: RUN/downstream (./NAME-downstream for hub:)")
    parser.add_argument("--device", help="cpu, or cuda:N to keep the fine-tuning off the training GPU")
    parser.add_argument(
        "--with_tracking",
        action="store_true",
        help="TensorBoard scalars downstream/TASK at the pretraining step, in RUN/runs",
    )
    parser.add_argument("--hub_token", help="default: the saved Hub login")
    return parser


def parse_args(argv=None) -> EvalArguments:
    """Our arguments, checked, and the rest for the fine-tuning scripts (every checkpoint alike)."""
    known, rest = build_parser().parse_known_args(argv)
    tasks = [task.lower() for task in known.tasks]
    unknown = [task for task in tasks if task not in TASKS and task not in TASK_SCRIPTS]
    if unknown:
        raise InputError(
            f"--tasks {' '.join(unknown)}: not a task here (GLUE's {', '.join(TASKS)}; "
            f"{', '.join(TASK_SCRIPTS)}); your own data goes in --train_file and --validation_file"
        )
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
    output_dir = known.output_dir or (
        Path(known.run) / "downstream"
        if not known.run.startswith("hub:")
        else Path(known.run[4:].replace("/", "-") + "-downstream")
    )
    return EvalArguments(
        known.run,
        tasks,
        known.data_dir,
        known.squad_dir,
        known.race_dir,
        known.train_file,
        known.validation_file,
        known.seeds,
        known.baseline,
        known.watch,
        known.watch_interval,
        output_dir,
        known.device,
        known.with_tracking,
        known.hub_token,
        flags_by_script(rest, tasks),
        known.source_model,
    )


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

    data_classes = {
        "run_glue.py": GlueDataArguments,
        "run_squad.py": SquadDataArguments,
        "run_race.py": RaceDataArguments,
    }
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
        parser = HfArgumentParser((ModelArguments, data_classes[script], AlbertTrainingArguments), exit_on_error=False)
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
