"""The paper's downstream claims at small scale: does pretraining help GLUE, and do SOP and sharing matter?

    python examples/reproduce_downstream.py --glue_dir glue_data --train_files books/ --torch_compile   # ~1-2 hours
    python examples/reproduce_downstream.py --smoke   # end to end in about a minute (numbers meaningless)

`--glue_dir` is the folder of the original GLUE download (SST-2, CoLA, MRPC, STS-B and RTE with their TSVs). A
smoke run without it writes tiny GLUE files in that layout (albert_hf.testing.glue_folders).

Models, pretrained as in reproduce_sop_vs_nsp.py (same corpus, tokenizer, architecture, steps and seed, the code
path of run_pretraining.py): albert_sop (SOP, all layers shared) and no_pretraining (albert_sop's config and
tokenizer with random weights) by default; with --models also bert_sop (SOP, nothing shared: Table 4), albert_nsp
(NSP: Table 5) and albert_mlm_only (MLM alone), about 35 minutes more each on 2 cores with AMX, an hour without.
Each is fine-tuned on the GLUE dev sets through run_glue.py (in this process), the same way for every model: every
learning rate of --finetune_learning_rates with the first seed of --finetune_seeds; per (model, task) the rate with the
best dev score is kept and run with the other seeds, and the mean and standard deviation over the seeds reported.
SST-2 is trained on its first --sst2_max_train_samples rows (5,000 of 67k: the full set is too slow on 2 cores).

Also measured: a dose-response curve (albert_sop pretrained for each of --budgets steps, fine-tuned on
--curve_tasks) and a low-data regime (SST-2 on its first N rows, --sst2_train_sizes, rows sst2_1k, ...).

Writes OUTPUT_DIR/downstream_results.json, {model: {task: {metric: mean, metric_std: sd, learning_rate, seeds},
glue_avg, glue_avg_se, pretraining: {steps, tokens, minutes, parameters}}}, OUTPUT_DIR/downstream_curve.json and
OUTPUT_DIR/fill_mask_probes.json (each run's top guesses for a masked word of a few probe sentences), and prints
them as tables. GLUE avg = the mean over sst2 cola mrpc stsb rte of the main metric x 100 (accuracy,
except Matthews correlation for CoLA and Pearson for STS-B); glue_avg_se its standard error from the seeds.

Goal: albert_sop beats no_pretraining on the GLUE average by more than twice the standard error of the difference.
Every finished run (pretraining or fine-tuning) is reused, so an interrupted reproduction restarts where it stopped.

GPU mode (`--gpu`), about 6 minutes on an H200 with tokenizer training and corpus preprocessing:

    python examples/reproduce_downstream.py --gpu --train_files books/ --glue_dir glue_data \
        --output_dir outputs/downstream_gpu

albert_sop is a BERT-medium-sized ALBERT (E=128, H=512, 8 layers sharing one block, 8 heads, FFN 2048), pretrained
with SOP for --max_train_steps (2000) steps of --batch_size (256) x 128 tokens, LAMB 2e-3 with a 10% warm-up, in the
precision auto picks (bf16 on a recent GPU); the steps are a count, not a time limit (run_pretraining.py has none):
on an H200 2000 steps took 80 s (900k tokens/s), and the run prints its measured tokens/s. Held-out MLM and SOP
accuracy are evaluated --eval_points (4) times, evenly spaced. no_pretraining is its random-init twin. Both are
fine-tuned on --glue_tasks (all five) with one learning rate (--finetune_learning_rates, 1e-4; no sweep),
--num_train_epochs 3, batch 32, bf16, at most --finetune_max_train_samples (2000) training rows per task (SST-2: its
first --sst2_max_train_samples, 2000), seeds --finetune_seeds (1 2 3), no checkpoints, one evaluation on the whole
dev set at the end. Runs go seed by seed (every task and both models for seed 1, then seed 2, ...); one that would
end past --deadline_minutes (6.5) from the start is skipped and named. OUTPUT_DIR/gpu_results.json is rewritten
after every run: settings; pretraining {steps, tokens, parameters, tokens_per_second, curve: [{step, tokens,
mlm_accuracy, sop_accuracy}]}; runs {model: {task: [{seed, metrics, seconds}]}}; tasks {task: {albert_sop,
no_pretraining: mean, sd and se of each metric; gap, gap_se (x 100)}}; average {model: {glue_avg, glue_avg_se}, gap,
gap_se, exceeds_2se, tasks}; skipped; timings (tokenizer and pairs, pretraining loop, random init, fine-tuning,
total, in seconds). The table printed last gives mean ± standard error per task and model, the gap and the GLUE
average; the goal line is last. --models, --budgets, --curve_tasks and --sst2_train_sizes are not used in this mode;
with --smoke it runs the same pipeline at smoke size (the tests do, on the CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import shutil
import sys
import time
from argparse import Namespace
from pathlib import Path
from statistics import mean, median, stdev

from reproduce_sop_vs_nsp import common_arguments, fresh_accelerate_state, prepare, pretrain, wall_time

REPO = Path(__file__).resolve().parents[1]

# model -> (inter-sentence task, sharing) of its pretraining; None: not pretrained
MODELS = {
    "albert_sop": ("sop", "all"),
    "bert_sop": ("sop", "none"),
    "albert_nsp": ("nsp", "all"),
    "no_pretraining": None,
    "albert_mlm_only": ("none", "all"),
}
# The default run (about 1 hour on 2 cores with AMX, 2 without): pretrained vs not. Each of bert_sop / albert_nsp /
# albert_mlm_only adds a pretraining run and its fine-tuning (about 35 minutes each with AMX: 21 + 14 measured).
DEFAULT_MODELS = ["albert_sop", "no_pretraining"]
# GLUE task -> its metrics in eval_results.json (without the "eval_" prefix); the first one is the task's score.
GLUE_TASKS = {
    "sst2": ("accuracy",),
    "cola": ("matthews_correlation",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"),
    "rte": ("accuracy",),
}
HEADERS = {"sst2": "SST-2 acc", "cola": "CoLA MCC", "mrpc": "MRPC acc", "stsb": "STS-B r", "rte": "RTE acc"}
# --smoke defaults (flags given explicitly still win): 2 models, 1 seed, 1 learning rate, 1 epoch, 64 rows per set.
SMOKE = dict(
    models=["albert_sop", "no_pretraining"],
    budgets=[0, 10, 20],
    finetune_learning_rates=[1e-3],
    finetune_seeds=[1],
    num_train_epochs=1,
    finetune_max_train_samples=64,
    finetune_max_eval_samples=64,
    sst2_max_train_samples=64,
    sst2_train_sizes=[32, 64],
    curve_tasks=["sst2", "mrpc", "stsb"],
)
# --gpu defaults (flags given explicitly still win; --smoke shrinks the model and the budgets on top). LAMB at 2e-3
# with a 10% warm-up: an 8-layer shared H=512 model collapsed at 5e-3 and trained at 2e-3 to 3e-3 with a longer
# warm-up on the CPU (docs/analysis.md). 2000 steps x 256 x 128 (65.5M token slots) took 80 s on an H200 (900k
# tokens/s, docs/downstream.md); the run prints its tokens/s, from which --max_train_steps for another budget follows.
GPU = {
    "max_train_steps": 2000,
    "batch_size": 256,
    "learning_rate": 2e-3,
    "max_eval_samples": 2000,
    "finetune_learning_rates": [1e-4],
    "finetune_seeds": [1, 2, 3],
    "num_train_epochs": 3,
    "finetune_max_train_samples": 2000,
    "sst2_max_train_samples": 2000,
    "deadline_minutes": 6.5,
}
# BERT-medium's shape (Turc et al. 2019) as an ALBERT: E=128, every layer shares one block.
MEDIUM_MODEL = {
    "embedding_size": 128,
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "intermediate_size": 2048,
    "max_position_embeddings": 512,
}


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_arguments(parser, steps=5000, output_dir="outputs/downstream")
    parser.add_argument("--glue_dir", default=None, help="the original GLUE download (holding SST-2, CoLA, ...)")
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(MODELS))
    parser.add_argument(
        "--budgets",
        nargs="*",
        type=int,
        default=[0, 1000, 5000],
        help="pretraining steps of the dose-response curve (0: no_pretraining; --max_train_steps: albert_sop itself)",
    )
    parser.add_argument("--curve_tasks", nargs="+", default=list(GLUE_TASKS), choices=list(GLUE_TASKS))
    parser.add_argument(
        "--sst2_train_sizes",
        nargs="*",
        type=int,
        default=[1000, 5000],
        help="the low-data rows: SST-2 fine-tuned on its first N training rows",
    )
    parser.add_argument(
        "--sst2_max_train_samples", type=int, default=5000, help="SST-2 rows of the GLUE-average run (0: all 67k)"
    )
    parser.add_argument("--finetune_learning_rates", nargs="+", type=float, default=[1e-4, 3e-4])
    parser.add_argument("--finetune_seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--num_train_epochs", type=float, default=2)
    parser.add_argument("--finetune_batch_size", type=int, default=32)
    parser.add_argument("--finetune_max_seq_length", type=int, default=128)
    parser.add_argument(
        "--finetune_max_train_samples",
        type=int,
        default=None,
        help="training rows of the tasks other than SST-2 (default: all)",
    )
    parser.add_argument("--finetune_max_eval_samples", type=int, default=None, help="dev rows (default: all)")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="the GPU mode (see above): a BERT-medium-sized ALBERT, one learning rate, ~7 minutes",
    )
    parser.add_argument(
        "--glue_tasks",
        nargs="+",
        default=list(GLUE_TASKS),
        choices=list(GLUE_TASKS),
        help="--gpu: the tasks fine-tuned (default: all five)",
    )
    parser.add_argument(
        "--eval_points",
        type=int,
        default=4,
        help="--gpu: held-out MLM / SOP evaluations during pretraining, evenly spaced (sets --eval_steps)",
    )
    parser.add_argument(
        "--deadline_minutes",
        type=float,
        default=None,
        help="--gpu: fine-tuning runs that would end after this many minutes from the start are "
        "skipped (and named); the table is printed anyway (--gpu default: 6.5)",
    )
    args = parser.parse_args(argv)
    if args.gpu:
        parser.set_defaults(**GPU)
    if args.smoke:
        parser.set_defaults(**SMOKE)
    if args.gpu or args.smoke:
        args = parser.parse_args(argv)
    if any(steps < 0 for steps in args.budgets) or any(n < 1 for n in args.sst2_train_sizes):
        raise SystemExit("error: --budgets must be >= 0 and --sst2_train_sizes >= 1")
    if args.gpu and (len(args.finetune_learning_rates) != 1 or args.eval_points < 1):
        raise SystemExit(
            "error: --gpu fine-tunes with one learning rate (no sweep): give one "
            "--finetune_learning_rates; --eval_points must be >= 1"
        )
    return args


def glue_folder(args) -> Path:
    """--glue_dir, checked now rather than after hours of pretraining; a smoke run without it writes the tests'
    tiny GLUE folders (every original layout, 8 rows per split)."""
    from albert_hf.tasks.glue.definition import TASKS

    if args.glue_dir:
        missing = [TASKS[t].folder for t in GLUE_TASKS if not (Path(args.glue_dir) / TASKS[t].folder).is_dir()]
        if missing:
            raise SystemExit(f"error: --glue_dir {args.glue_dir}: no {', '.join(missing)} folder in it")
        return Path(args.glue_dir)
    if args.smoke:
        from albert_hf.testing.glue_folders import write_glue_folders

        return write_glue_folders(Path(args.output_dir) / "glue_fixture")
    raise SystemExit(
        "error: --glue_dir is required: the folder of the original GLUE download (SST-2, CoLA, MRPC, STS-B, RTE)"
    )


# ----------------------------------------------------------------------------------------------------------------
# Pretraining


def budget_run(args, steps: int) -> str:
    """The run of the curve pretrained for `steps`: the models' own runs are reused for 0 and --max_train_steps."""
    if steps == 0:
        return "no_pretraining"
    return "albert_sop" if steps == args.max_train_steps else f"albert_sop_steps{steps}"


def millions(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 1e5 else f"{count:,}"


def tokens(args, steps: int) -> int:
    """Token slots seen in pretraining (padded sequences counted whole)."""
    return steps * args.batch_size * (args.gradient_accumulation_steps or 1) * args.max_seq_length


def pretrain_models(args, out: Path) -> dict[str, int]:
    """Pretrain (or reuse) every run the models and the curve need; returns {run: its pretraining steps}."""
    runs = {name: 0 if name == "no_pretraining" else args.max_train_steps for name in args.models}
    runs.update({budget_run(args, steps): steps for steps in args.budgets})
    if "no_pretraining" in runs:
        runs.setdefault("albert_sop", args.max_train_steps)  # it gives no_pretraining its config and tokenizer
    for name, steps in runs.items():
        if name != "no_pretraining":
            task, sharing = MODELS.get(name, MODELS["albert_sop"])  # albert_sop_stepsN: albert_sop, fewer steps
            print(f"\n=== pretraining {name}: {task}, sharing {sharing}, {steps} steps ===")
            pretrain(Namespace(**{**vars(args), "max_train_steps": steps}), out / name, task=task, sharing=sharing)
    if "no_pretraining" in runs:
        random_init(args, out / "albert_sop", out / "no_pretraining")
    return runs


def random_init(args, source: Path, run_dir: Path):
    """`source`'s config and tokenizer with fresh weights drawn with --seed: the no-pretraining baseline."""
    import torch
    from transformers import AutoTokenizer

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining

    if (run_dir / "config.json").is_file():
        print(f"[reuse] {run_dir} is already initialised")
        return
    torch.manual_seed(args.seed)
    model = AlbertHFForPreTraining(AlbertHFConfig.from_pretrained(source))
    tmp = run_dir.with_name(f".tmp-{run_dir.name}")  # moved into place once complete
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
    tmp.rename(run_dir)


# Fill-mask probes (sentence, index of the masked word): has a model learned more than word frequencies?
PROBES = [
    ("She opened the door and walked into the room.", 3),
    ("He drank a glass of wine before going to bed.", 5),
    ("The president will speak to the nation tonight about the war.", 6),
    ("The ship sailed across the sea to a distant island.", 5),
]


def fill_mask_probes(out: Path, runs) -> dict:
    """Each run's top 5 guesses for the masked word of each probe sentence, printed and returned."""
    from albert_hf.analysis.intrinsic import load_pretraining_model
    from albert_hf.reports.fill_mask import fill_mask_examples, format_fill_mask

    probes = {}
    for run in runs:
        probes[run] = fill_mask_examples(*load_pretraining_model(out / run), PROBES)
        print("\n".join([f"\n{run}"] + format_fill_mask(probes[run])))
    return probes


def pretraining_budget(args, run_dir: Path, steps: int) -> dict:
    from albert_hf import AlbertHFConfig
    from albert_hf.analysis.params import count_parameters

    seconds = run_dir / "wall_seconds.txt"
    minutes = float(seconds.read_text()) / 60 if seconds.is_file() else 0.0 if steps == 0 else None
    return {
        "steps": steps,
        "tokens": tokens(args, steps),
        "minutes": None if minutes is None else round(minutes, 1),
        "parameters": count_parameters(AlbertHFConfig.from_pretrained(run_dir)),
    }  # embeddings + encoder, no heads


# ----------------------------------------------------------------------------------------------------------------
# Fine-tuning


def sst2_label(rows: int) -> str:
    return f"sst2_{rows // 1000}k" if rows % 1000 == 0 else f"sst2_{rows}"


def task_specs(args) -> dict[str, tuple[str, int | None]]:
    """Row name -> (GLUE task, training rows or None for all): the five GLUE tasks, then the low-data SST-2 rows."""
    specs = {task: (task, args.finetune_max_train_samples) for task in GLUE_TASKS}
    specs["sst2"] = ("sst2", args.sst2_max_train_samples or None)
    specs.update({sst2_label(rows): ("sst2", rows) for rows in args.sst2_train_sizes})
    return specs


def finetune_argv(args, model_dir: Path, task: str, train_rows, learning_rate: float, seed: int, output_dir: Path):
    from albert_hf.tasks.glue.definition import TASKS

    data_dir = Path(args.glue_dir) / TASKS[task].folder
    argv = [
        "--model_name_or_path",
        model_dir,
        "--task_name",
        task,
        "--data_dir",
        data_dir,
        "--do_train",
        "--do_eval",
        "--max_seq_length",
        args.finetune_max_seq_length,
        "--per_device_train_batch_size",
        args.finetune_batch_size,
        "--per_device_eval_batch_size",
        64,
        "--num_train_epochs",
        f"{args.num_train_epochs:g}",
        "--learning_rate",
        learning_rate,
        "--seed",
        seed,
        "--warmup_steps",
        0.1,  # a float: the fraction of the steps, as BERT/ALBERT fine-tuning warms up
        # Padded per batch rather than to 128 (padding is masked either way): ~20% faster on short sentences.
        "--pad_to_max_length",
        "false",
        "--output_dir",
        output_dir,
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--overwrite_output_dir",
        "--disable_tqdm",
        "true",
        "--dataloader_pin_memory",
        "false",
        "--logging_steps",
        100,
    ]
    if getattr(args, "gpu", False):
        # bf16 where pretraining used it; no training_curves.png per run (matplotlib costs seconds a run)
        argv += ["--no_plots", *(["--bf16"] if args.mixed_precision == "bf16" else [])]
    if train_rows:
        argv += ["--max_train_samples", train_rows]
    if args.finetune_max_eval_samples:
        argv += ["--max_eval_samples", args.finetune_max_eval_samples]
    return [str(a) for a in argv]


def run_glue_main(argv: list[str]) -> None:
    """run_glue.py's main, in this process: the script lies at the top of the repository, outside any package, and
    is imported from its file once (as `run_glue`, the module a caller may already hold)."""
    module = sys.modules.get("run_glue")
    if module is None:
        spec = importlib.util.spec_from_file_location("run_glue", REPO / "run_glue.py")
        module = sys.modules["run_glue"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    module.main(argv)


def finetune(argv: list[str], output_dir: Path) -> dict:
    """One run_glue.py run in this process; returns its eval_results.json. A finished run with the same arguments
    is reused."""
    results, recorded = output_dir / "eval_results.json", output_dir / "run_glue_argv.json"
    if results.is_file() and recorded.is_file() and json.loads(recorded.read_text()) == argv:
        return json.loads(results.read_text())
    recorded.unlink(missing_ok=True)
    fresh_accelerate_state()
    run_glue_main(argv)
    for weights in output_dir.glob("*.safetensors"):
        weights.unlink()  # hundreds of fine-tuned models: the reproduction needs their scores only
    recorded.write_text(json.dumps(argv))
    return json.loads(results.read_text())


def read_scores(results: dict, task: str) -> dict:
    """{metric: value} of one run's eval_results.json. A constant prediction has no Pearson correlation (NaN): it
    counts as 0, as its Matthews correlation does."""
    scores = {metric: results[f"eval_{metric}"] for metric in GLUE_TASKS[task]}
    return {metric: value if math.isfinite(value) else 0.0 for metric, value in scores.items()}


def select_learning_rate(runs: dict[float, list[dict]], metric: str) -> float:
    """The learning rate whose runs (one per seed) have the best mean `metric`; the first listed on a tie."""
    return max(runs, key=lambda rate: mean(scores[metric] for scores in runs[rate]))


def summarise(runs: list[dict], metrics, learning_rate: float) -> dict:
    """Mean and standard deviation over the seeds (0 for a single seed) of each metric."""
    row = {}
    for metric in metrics:
        values = [scores[metric] for scores in runs]
        row[metric] = mean(values)
        row[f"{metric}_std"] = stdev(values) if len(values) > 1 else 0.0
    return {**row, "learning_rate": learning_rate, "seeds": len(runs)}


def average(rows: dict[str, dict]) -> tuple[float, float]:
    """Mean over the GLUE tasks of `rows` of the main metric x 100, and its standard error: the seeds' standard
    deviations as independent errors of each task's mean, sqrt(sum sd_t^2 / n_t) / number of tasks."""
    scores = [100 * row[GLUE_TASKS[task][0]] for task, row in rows.items()]
    variances = [(100 * row[f"{GLUE_TASKS[task][0]}_std"]) ** 2 / row["seeds"] for task, row in rows.items()]
    return mean(scores), math.sqrt(sum(variances)) / len(rows)


def finetune_task(args, out: Path, run: str, label: str, spec) -> dict:
    """One (pretrained run, task row): every learning rate with the first seed, then the other seeds at the rate
    with the best first-seed score (the first listed on a tie); the summary over the seeds at that rate."""
    task, train_rows = spec
    folder = sst2_label(train_rows) if task == "sst2" and train_rows else task  # sst2 and sst2_20k share runs
    metric = GLUE_TASKS[task][0]

    def run_once(rate, seed):
        output_dir = out / "finetune" / run / folder / f"lr{rate:g}_seed{seed}"
        argv = finetune_argv(args, out / run, task, train_rows, rate, seed, output_dir)
        return read_scores(finetune(argv, output_dir), task)

    first, *others = args.finetune_seeds
    sweep = {rate: [run_once(rate, first)] for rate in args.finetune_learning_rates}
    rate = select_learning_rate(sweep, metric)
    row = summarise(sweep[rate] + [run_once(rate, seed) for seed in others], GLUE_TASKS[task], rate)
    print(
        f"[fine-tuned] {run} {label}: {metric} {cell(row, metric)} at learning rate {rate:g} ({row['seeds']} seed(s))"
    )
    return row


def evaluate_model(args, out: Path, model: str, steps: int) -> dict:
    rows = {label: finetune_task(args, out, model, label, spec) for label, spec in task_specs(args).items()}
    glue_avg, glue_avg_se = average({task: rows[task] for task in GLUE_TASKS})
    return {
        **rows,
        "glue_avg": glue_avg,
        "glue_avg_se": glue_avg_se,
        "pretraining": pretraining_budget(args, out / model, steps),
    }


def curve(args, out: Path) -> list[dict]:
    """The dose-response points: albert_sop after each pretraining budget, scored on --curve_tasks."""
    specs = task_specs(args)
    points = []
    for steps in sorted(set(args.budgets)):
        run = budget_run(args, steps)
        rows = {task: finetune_task(args, out, run, task, specs[task]) for task in args.curve_tasks}
        score, score_se = average(rows)
        points.append(
            {
                "steps": steps,
                "tokens": tokens(args, steps),
                "run": run,
                "score": score,
                "score_se": score_se,
                "tasks": rows,
            }
        )
    return points


# ----------------------------------------------------------------------------------------------------------------
# Report


def cell(row: dict, metric: str) -> str:
    return f"{100 * row[metric]:.1f} ± {100 * row[f'{metric}_std']:.1f}"


def budget_cell(budget: dict, wall: str) -> str:
    return (
        f"{budget['steps']} steps, {millions(budget['tokens'])} tokens, {wall}, {millions(budget['parameters'])} params"
    )


def print_table(args, results: dict, out: Path):
    rates = ", ".join(f"{rate:g}" for rate in args.finetune_learning_rates)
    sst2_rows = f"its first {args.sst2_max_train_samples:,}" if args.sst2_max_train_samples else "all its"
    print(
        f"\nGLUE dev scores x 100: mean ± sd over {len(args.finetune_seeds)} seed(s) at the best of learning rates "
        f"{rates} per (model, task), {args.num_train_epochs:g} epochs; SST-2 trained on {sst2_rows} rows (full "
        "SST-2, 67k, is too slow on 2 cores); GLUE avg ± its standard error"
    )
    print("| model | " + " | ".join(HEADERS[task] for task in GLUE_TASKS) + " | GLUE avg | pretraining |")
    print("|---" * (len(GLUE_TASKS) + 3) + "|")
    for model, row in results.items():
        wall = wall_time(out / model) if model != "no_pretraining" else "0 min"
        print(
            f"| {model} | "
            + " | ".join(cell(row[task], GLUE_TASKS[task][0]) for task in GLUE_TASKS)
            + f" | {row['glue_avg']:.1f} ± {row['glue_avg_se']:.1f} | {budget_cell(row['pretraining'], wall)} |"
        )
    print(
        "chosen learning rates: "
        + "; ".join(
            f"{model} " + " ".join(f"{task} {row[task]['learning_rate']:g}" for task in GLUE_TASKS)
            for model, row in results.items()
        )
    )


def print_curve(args, points: list[dict]):
    if not points:  # --budgets with no steps: no curve asked for
        return
    print(
        f"\nDose-response: albert_sop pretrained for each budget, fine-tuned on {' '.join(args.curve_tasks)} "
        "(score: their mean main metric x 100)"
    )
    print("| steps | tokens | " + " | ".join(HEADERS[task] for task in args.curve_tasks) + " | score |")
    print("|---" * (len(args.curve_tasks) + 3) + "|")
    for p in points:
        print(
            f"| {p['steps']} | {millions(p['tokens'])} | "
            + " | ".join(cell(p["tasks"][task], GLUE_TASKS[task][0]) for task in args.curve_tasks)
            + f" | {p['score']:.1f} ± {p['score_se']:.1f} |"
        )


def print_low_data(args, results: dict):
    labels = [sst2_label(rows) for rows in args.sst2_train_sizes]
    if not labels:
        return
    print("\nLow-data SST-2: dev accuracy x 100 after fine-tuning on the first N training rows")
    print(
        "| model | " + " | ".join(f"{label} (N={rows:,})" for label, rows in zip(labels, args.sst2_train_sizes)) + " |"
    )
    print("|---" * (len(labels) + 1) + "|")
    for model, row in results.items():
        print(f"| {model} | " + " | ".join(cell(row[label], "accuracy") for label in labels) + " |")


def difference(results: dict, a: str, b: str) -> tuple[float, float]:
    """GLUE avg of a minus b, and the standard error of that difference."""
    return (
        results[a]["glue_avg"] - results[b]["glue_avg"],
        math.hypot(results[a]["glue_avg_se"], results[b]["glue_avg_se"]),
    )


def print_claims(args, results: dict):
    print()
    for a, b, claim in [
        ("albert_sop", "no_pretraining", "pretrained vs random weights"),
        ("albert_sop", "albert_nsp", "SOP vs NSP: SOP ahead in the paper's Table 5"),
        ("albert_sop", "bert_sop", "all-shared vs not-shared: 80.1 vs 81.6 in Table 4, E=128"),
        ("albert_sop", "albert_mlm_only", "SOP vs MLM alone: SOP ahead in Table 5"),
    ]:
        if a in results and b in results:
            diff, se = difference(results, a, b)
            print(f"{a} - {b}: {diff:+.1f} ± {se:.1f} GLUE avg  ({claim})")
    if "albert_sop" in results and "no_pretraining" in results:
        diff, se = difference(results, "albert_sop", "no_pretraining")
        note = " (1 seed: no standard error)" if len(args.finetune_seeds) == 1 else ""
        print(
            f"goal (albert_sop beats no_pretraining on the GLUE average by more than 2 standard errors of the "
            f"difference): {'MET' if diff > 2 * se else 'not met'} (difference {diff:+.1f}, 2 se = {2 * se:.1f})" + note
        )


# ----------------------------------------------------------------------------------------------------------------
# GPU mode (--gpu): one pretraining run, one learning rate, every result written as soon as it exists


PAIR = ("albert_sop", "no_pretraining")  # pretrained, then the same architecture and tokenizer at random init


class TrainingStart(logging.Handler):
    """Notes when run_pretraining logs its start line, i.e. once the tokenizer, the pairs and the model are built:
    it splits the pretraining phase's wall time into data preparation and the training loop."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.at: float | None = None

    def emit(self, record: logging.LogRecord):
        if self.at is None and "global batch" in record.getMessage():
            self.at = time.perf_counter()


def gpu_pretrain(args, out: Path) -> dict:
    """Pretrains albert_sop (reused when finished) and makes its random-init twin; returns their timings."""
    watcher, logger = TrainingStart(), logging.getLogger("albert_hf.pretraining.run")
    level = logger.level
    logger.setLevel(logging.INFO)  # the start line is an INFO record, whatever the caller's logging setup
    logger.addHandler(watcher)
    start = time.perf_counter()
    try:
        print(f"\n=== pretraining albert_sop: SOP, all layers shared, {args.max_train_steps} steps ===")
        seconds = pretrain(args, out / "albert_sop", task="sop", sharing="all")
    finally:
        logger.removeHandler(watcher)
        logger.setLevel(level)
    end = time.perf_counter()
    reused = math.isnan(seconds)
    timings = {
        "pretraining_reused": reused,
        "tokenizer_and_pairs_seconds": None if reused or watcher.at is None else watcher.at - start,
        "pretraining_loop_seconds": None if reused or watcher.at is None else end - watcher.at,
        "pretraining_phase_seconds": None if reused else end - start,
    }
    start = time.perf_counter()
    random_init(args, out / "albert_sop", out / "no_pretraining")
    timings["random_init_seconds"] = time.perf_counter() - start
    return timings


def pretraining_log(args, run_dir: Path) -> dict:
    """From metrics.jsonl: the held-out MLM / SOP accuracy at each evaluation (against tokens seen) and the loop's
    rate, the median of the logged windows' real (non-padding) tokens/s, the first window (warm-up) left out."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    curve = [
        {
            "step": r["step"],
            "tokens": tokens(args, r["step"]),
            "mlm_accuracy": r.get("eval_mlm_accuracy"),
            "sop_accuracy": r.get("eval_sop_accuracy"),
        }
        for r in rows
        if "eval_mlm_accuracy" in r
    ]
    rates = [r["tokens_per_second"] for r in rows if "tokens_per_second" in r]
    return {"curve": curve, "tokens_per_second": median(rates[1:] or rates) if rates else None}


def summarise_runs(runs: list[dict], task: str, learning_rate: float) -> dict | None:
    """`summarise` of one (model, task)'s finished seeds plus the standard error of each metric's mean."""
    if not runs:
        return None
    row = summarise(runs, GLUE_TASKS[task], learning_rate)
    for metric in GLUE_TASKS[task]:
        row[f"{metric}_se"] = row[f"{metric}_std"] / math.sqrt(len(runs))
    return row


def gpu_summary(args, runs: dict[str, dict[str, list[dict]]]) -> dict:
    """Per task and model: mean, sd and standard error over the finished seeds; per task the gap (albert_sop minus
    no_pretraining, x 100) and its standard error; the GLUE-style average over the tasks both models finished."""
    rate = args.finetune_learning_rates[0]
    tasks = {task: {model: summarise_runs(runs[model][task], task, rate) for model in PAIR} for task in args.glue_tasks}
    for task, row in tasks.items():
        metric = GLUE_TASKS[task][0]
        if all(row[model] for model in PAIR):
            a, b = row[PAIR[0]], row[PAIR[1]]
            row["gap"] = 100 * (a[metric] - b[metric])
            row["gap_se"] = 100 * math.hypot(a[f"{metric}_se"], b[f"{metric}_se"])
    done = [task for task, row in tasks.items() if "gap" in row]
    averages = {}
    if done:
        for model in PAIR:
            averages[model] = dict(zip(("glue_avg", "glue_avg_se"), average({t: tasks[t][model] for t in done})))
        diff, se = difference(averages, *PAIR)
        averages.update(gap=diff, gap_se=se, exceeds_2se=diff > 2 * se, tasks=done)
    return {"tasks": tasks, "average": averages}


def gpu_finetune(args, out: Path, results: dict, deadline: float | None):
    """Every (seed, task, model) run, seed by seed so that a deadline cuts whole seeds, not whole tasks; the
    results file is rewritten after each run. A run is skipped when, at the longest time a run of its task took so
    far, it would end after the deadline."""
    from albert_hf.runtime.storage import write_json  # written whole, then renamed into place

    runs, skipped = results["runs"], results["skipped"]
    rate, started = args.finetune_learning_rates[0], time.perf_counter()
    longest: dict[str, float] = {}
    for seed in args.finetune_seeds:
        for task in args.glue_tasks:
            rows = args.sst2_max_train_samples if task == "sst2" else args.finetune_max_train_samples
            for model in PAIR:
                expected = longest.get(task, max(longest.values(), default=0.0))
                if deadline is not None and time.perf_counter() + expected > deadline:
                    skipped.append(f"{model} {task} seed {seed}")
                    print(f"[skipped] {model} {task} seed {seed}: the deadline ({args.deadline_minutes:g} min)")
                    continue
                output_dir = out / "finetune" / model / task / f"lr{rate:g}_seed{seed}"
                start = time.perf_counter()
                scores = read_scores(
                    finetune(finetune_argv(args, out / model, task, rows or None, rate, seed, output_dir), output_dir),
                    task,
                )
                seconds = time.perf_counter() - start
                longest[task] = max(longest.get(task, 0.0), seconds)
                runs[model][task].append({"seed": seed, **scores, "seconds": round(seconds, 1)})
                print(
                    f"[fine-tuned] {model} {task} seed {seed}: {GLUE_TASKS[task][0]} "
                    f"{100 * scores[GLUE_TASKS[task][0]]:.1f} in {seconds:.1f} s"
                )
                results["timings"]["finetuning_seconds"] = time.perf_counter() - started
                results.update(gpu_summary(args, runs))
                write_json(out / "gpu_results.json", results)


def se_cell(row: dict | None, metric: str) -> str:
    if row is None:
        return "–"
    return f"{100 * row[metric]:.1f} ± {100 * row[f'{metric}_se']:.1f} ({row['seeds']})"


def seconds_text(value) -> str:
    return "reused" if value is None else f"{value:.0f} s"


def print_gpu_table(args, results: dict):
    m, pre, timings = args.model_fields, results["pretraining"], results["timings"]
    print("\n=== GPU mode: albert_sop (pretrained) vs no_pretraining (random init), GLUE dev ===")
    print(
        f"model: ALBERT E={m['embedding_size']} H={m['hidden_size']} L={m['num_hidden_layers']} (all layers "
        f"shared), {m['num_attention_heads']} heads, FFN {m['intermediate_size']}, vocabulary {args.vocab_size}: "
        f"{millions(pre['parameters'])} parameters (embeddings + encoder)"
    )
    rate = "?" if pre["tokens_per_second"] is None else f"{pre['tokens_per_second']:,.0f}"
    print(
        f"pretraining: {pre['steps']} steps x {args.batch_size} x {args.max_seq_length} = "
        f"{millions(pre['tokens'])} token slots, SOP, LAMB {args.learning_rate:g}, {args.mixed_precision}; "
        f"{rate} real tokens/s (median of the logged windows)"
    )
    print("| step | tokens | held-out MLM acc | held-out SOP acc |\n|---|---|---|---|")
    for p in pre["curve"]:
        print(
            f"| {p['step']} | {millions(p['tokens'])} | {100 * p['mlm_accuracy']:.1f} | "
            + (f"{100 * p['sop_accuracy']:.1f} |" if p["sop_accuracy"] is not None else "– |")
        )
    sst2 = args.sst2_max_train_samples
    print(
        f"\nfine-tuning: learning rate {args.finetune_learning_rates[0]:g} for both, {args.num_train_epochs:g} "
        f"epochs, batch {args.finetune_batch_size}, at most {args.finetune_max_train_samples or 'all'} training "
        f"rows per task (SST-2: its first {sst2 or 'all'}), seeds {' '.join(map(str, args.finetune_seeds))}; dev "
        "score x 100, mean ± standard error (seeds)"
    )
    print(f"| task | {PAIR[0]} | {PAIR[1]} | gap |\n|---|---|---|---|")
    for task, row in results["tasks"].items():
        metric = GLUE_TASKS[task][0]
        gap = f"{row['gap']:+.1f} ± {row['gap_se']:.1f}" if "gap" in row else "–"
        print(f"| {HEADERS[task]} | {se_cell(row[PAIR[0]], metric)} | {se_cell(row[PAIR[1]], metric)} | {gap} |")
    avg = results["average"]
    if avg:
        print(
            f"| GLUE avg ({' '.join(avg['tasks'])}) | {avg[PAIR[0]]['glue_avg']:.1f} ± "
            f"{avg[PAIR[0]]['glue_avg_se']:.1f} | {avg[PAIR[1]]['glue_avg']:.1f} ± {avg[PAIR[1]]['glue_avg_se']:.1f}"
            f" | {avg['gap']:+.1f} ± {avg['gap_se']:.1f} |"
        )
    finished = sum(len(r) for model in PAIR for r in results["runs"][model].values())
    print(
        f"wall times: tokenizer + pairs {seconds_text(timings['tokenizer_and_pairs_seconds'])}, pretraining loop "
        f"(with its evaluations and save) {seconds_text(timings['pretraining_loop_seconds'])}, random init "
        f"{timings['random_init_seconds']:.0f} s, fine-tuning {timings['finetuning_seconds']:.0f} s "
        f"({finished} runs), total {timings['total_seconds']:.0f} s"
    )
    print(
        f"skipped runs (deadline {args.deadline_minutes:g} min): "
        + (", ".join(results["skipped"]) if results["skipped"] else "none")
    )
    if not avg:
        print(
            "goal (albert_sop beats no_pretraining on the GLUE average by more than 2 standard errors of the "
            "difference): not evaluated (no task finished for both models)"
        )
        return
    note = (
        " (1 seed: no standard error)"
        if max(row[PAIR[0]]["seeds"] for row in results["tasks"].values() if row[PAIR[0]]) == 1
        else ""
    )
    print(
        f"goal (albert_sop beats no_pretraining on the GLUE average by more than 2 standard errors of the "
        f"difference): {'MET' if avg['exceeds_2se'] else 'not met'} (difference {avg['gap']:+.1f}, "
        f"2 se = {2 * avg['gap_se']:.1f})" + note
    )


def gpu_main(args) -> dict:
    """--gpu: pretrain albert_sop, fine-tune it and its random-init twin (GLUE, one learning rate, every seed),
    write OUTPUT_DIR/gpu_results.json after every run, print the table."""
    from albert_hf.runtime.storage import write_json  # written whole, then renamed into place

    start = time.perf_counter()
    deadline = None if args.deadline_minutes is None else start + 60 * args.deadline_minutes
    prepare(args, MEDIUM_MODEL)
    if args.num_warmup_steps is None:
        args.num_warmup_steps = round(0.1 * args.max_train_steps)
    args.eval_steps = math.ceil(args.max_train_steps / args.eval_points)
    if args.preprocessing_num_workers is None and not args.smoke:
        args.preprocessing_num_workers = min(8, os.cpu_count() or 1)  # 151 books: tokenized and paired in parallel
    if args.dataloader_num_workers is None and not args.smoke:
        import torch

        if torch.cuda.is_available():
            args.dataloader_num_workers = 4  # 256 pairs a step to mask: more than the 2 CUDA-default workers
    args.glue_dir = str(glue_folder(args))
    out = Path(args.output_dir)

    timings = gpu_pretrain(args, out)
    budget = pretraining_budget(args, out / "albert_sop", args.max_train_steps)
    results = {
        "settings": {
            "model": args.model_fields,
            "max_train_steps": args.max_train_steps,
            "batch_size": args.batch_size,
            "max_seq_length": args.max_seq_length,
            "learning_rate": args.learning_rate,
            "num_warmup_steps": args.num_warmup_steps,
            "mixed_precision": args.mixed_precision,
            "vocab_size": args.vocab_size,
            "finetune_learning_rate": args.finetune_learning_rates[0],
            "num_train_epochs": args.num_train_epochs,
            "finetune_batch_size": args.finetune_batch_size,
            "finetune_max_train_samples": args.finetune_max_train_samples,
            "sst2_max_train_samples": args.sst2_max_train_samples,
            "finetune_seeds": args.finetune_seeds,
            "deadline_minutes": args.deadline_minutes,
        },
        "pretraining": {**budget, **pretraining_log(args, out / "albert_sop")},
        "runs": {model: {task: [] for task in args.glue_tasks} for model in PAIR},
        "skipped": [],
        "timings": {**timings, "finetuning_seconds": 0.0},
    }
    results.update(gpu_summary(args, results["runs"]))
    write_json(out / "gpu_results.json", results)
    gpu_finetune(args, out, results, deadline)
    results["timings"]["total_seconds"] = time.perf_counter() - start
    write_json(out / "gpu_results.json", results)
    print_gpu_table(args, results)
    return results


def main(argv=None):
    args = parse_arguments(argv)
    if args.gpu:
        return gpu_main(args)
    prepare(args)
    args.glue_dir = str(glue_folder(args))
    out = Path(args.output_dir)

    runs = pretrain_models(args, out)
    probes = fill_mask_probes(out, sorted(runs, key=runs.get))
    (out / "fill_mask_probes.json").write_text(json.dumps(probes, indent=2, ensure_ascii=False))
    results = {model: evaluate_model(args, out, model, runs[model]) for model in args.models}
    (out / "downstream_results.json").write_text(json.dumps(results, indent=2))
    points = curve(args, out)
    (out / "downstream_curve.json").write_text(json.dumps(points, indent=2))

    print_table(args, results, out)
    print_curve(args, points)
    print_low_data(args, results)
    print_claims(args, results)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
