"""run_pretraining.py's command line, resolved and checked once: `parse_args` turns the flags into the frozen
`PretrainingArguments` (arguments.py's groups) that every part of the run reads, or stops with one line naming the
flag; `hardware_and_precision` and `choose_step` resolve what depends on the machine the run starts on.

The groups themselves stay in arguments.py, which the run's parts import for their types; the checks here call those
parts (the corpus, the model's config, the output folder, the Hub), so they sit above them.
"""

import dataclasses
import os
from pathlib import Path

from ..errors import InputError
from ..runtime.cli import explicit_arguments, parse_into_dataclasses
from ..runtime.distributed import requested_sharding
from ..runtime.hardware import Hardware, Precision, check_peak_tflops, choose_precision, detect, use_tf32
from ..runtime.storage import check_writable
from .arguments import (
    ARGUMENT_GROUPS,
    AUTO,
    EAGER,
    MAPPING_LISTS,
    DataArgs,
    ModelArgs,
    OptimizationArgs,
    OutputArgs,
    PretrainingArguments,
    build_parser,
    flat_values,
    with_values,
)
from .data import prepared_data
from .data.inputs import check_train_files
from .data.sources import Sources, parse_sources
from .output.folder import check_output_dir
from .output.hub_push import hub_source
from .schedule import SchedulePlan, resolve_schedule
from .training import step_graph
from .training.model import check_positions, resolve_config


def parse_args(argv=None) -> PretrainingArguments:
    """The groups, resolved and checked: a bad value stops with one line naming the flag. Resolved here and nowhere
    later: with --prepared_data, the arguments that shaped its pairs come from its manifest (`adopted` lists those
    that changed); the model's config; a --torch_compile_mode turns --torch_compile on; the warm-up defaults to
    2.5% of the steps."""
    groups = parse_into_dataclasses(build_parser(), argv, mapping_lists=MAPPING_LISTS)
    values = flat_values(groups)
    explicit = explicit_arguments(argv, ARGUMENT_GROUPS)
    adopted = ()
    if values["prepared_data"]:
        if values["preprocess_only"]:
            raise InputError(
                "pass --preprocess_only (to prepare a folder) or --prepared_data (to train on one), not both"
            )
        manifest = prepared_data.read_manifest(values["prepared_data"])
        recorded = prepared_data.adopt_manifest(values, manifest, explicit)
        adopted = tuple(f"--{name} {value}" for name, value in recorded.items() if values[name] != value)
        groups = with_values(groups, recorded)
    model, data, objective, optimization, output = groups
    sources = resolve_sources(data, explicit, output)
    if sources is not None:
        adopted_too, shaping = prepared_sources(sources, values, explicit)
        adopted += adopted_too
        model, data, objective, optimization, output = with_values(
            (model, data, objective, optimization, output), shaping
        )
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # the launch's processes, read here only
    optimization = split_global_batch(optimization, explicit, processes)
    check_args(model, data, optimization, output)
    check_vocabulary(model, data, sources)
    config = resolve_config(model)
    check_positions(config, data.max_seq_length)
    check_output_dir(output.output_dir, output.resume_from_checkpoint, output.overwrite_output_dir)
    if model.torch_compile_mode == EAGER or (model.torch_compile_mode == AUTO and "torch_compile" in explicit):
        model = dataclasses.replace(model, torch_compile_mode=None)  # the user's choice: eager, or --torch_compile's
    elif model.torch_compile_mode not in (None, AUTO):  # as transformers' TrainingArguments: a mode asks to compile
        model = dataclasses.replace(model, torch_compile=True)
    schedule = resolve_schedule(optimization, output, explicit)  # the checkpoint's, for a resume or a decay branch
    check_average_last(output, schedule)
    optimization = dataclasses.replace(
        optimization,
        lr_scheduler_type=schedule.kind,
        num_warmup_steps=schedule.num_warmup_steps,
        max_train_steps=schedule.max_train_steps,
        decay_steps=schedule.decay_steps,
    )
    return PretrainingArguments(
        model, data, objective, optimization, output, config, adopted, processes, sources, schedule
    )


def resolve_sources(data: DataArgs, explicit: set[str], output: OutputArgs) -> Sources | None:
    """--sources checked (data/sources.py), or a --prepared_data folder's own sources (the weights of --sources, when
    given, replace the folder's); None for a run of one corpus."""
    if data.drop_sources and not output.resume_from_checkpoint:
        raise InputError(
            "--drop_sources says which sources of a checkpoint a resumed run goes on without: pass "
            "--resume_from_checkpoint too, or drop it"
        )
    recorded = prepared_data.manifest_sources(data.prepared_data) if data.prepared_data else None
    if not data.sources:
        return recorded
    for name in ("train_files", "dataset_name"):
        if name in explicit:
            raise InputError(f"--{name} names one corpus and --sources several: put it in --sources as a source")
    sources = parse_sources(data.sources, data.layout, data.text_column)
    held_out_only = [name for name in sources.names if name not in sources.trained]
    if held_out_only and (data.preprocess_only or not data.validation_split_percentage):
        raise InputError(
            f"source {held_out_only[0]} has weight 0 (held out only): "
            + (
                "--preprocess_only prepares every source's training pairs; give it its weight when "
                "training on the folder"
                if data.preprocess_only
                else "with --validation_split_percentage 0 nothing of it would be evaluated"
            )
        )
    if data.prepared_data and recorded is None:
        raise InputError(
            f"--prepared_data {data.prepared_data} holds one corpus, and --sources mixes several: name "
            f"the folder as a source (name=...,weight=...,prepared_data={data.prepared_data}) instead"
        )
    if recorded is not None:
        if [(s.name, s.where()) for s in sources.sources] != [(s.name, s.where()) for s in recorded.sources]:
            raise InputError(
                f"--prepared_data {data.prepared_data} was written for the sources "
                f"{', '.join(recorded.names)} ({'; '.join(s.where() for s in recorded.sources)}), and "
                "--sources names another mix: name the same sources (their weights may change), or "
                "prepare the folder again"
            )
    return sources


def prepared_sources(sources: Sources, values: dict, explicit: set[str]) -> tuple[tuple[str, ...], dict]:
    """Sources that are folders of --preprocess_only (`prepared_data:`) prepared alike: (the shaping arguments taken
    from them that differ from the command's, for the start line; {name: value} to take). Folders prepared with
    another tokenizer or other shaping arguments are refused in one line naming both."""
    folders = [(source.name, source.prepared_data) for source in sources.sources if source.prepared_data]
    if not folders:
        return (), {}
    if values["tokenizer_name"] and "tokenizer_name" in explicit:
        raise InputError(
            f"--tokenizer_name with source {folders[0][0]} (prepared_data {folders[0][1]}): a prepared "
            "folder's pairs are its own tokenizer's; drop --tokenizer_name"
        )
    first_name, first_folder = folders[0]
    first = prepared_data.read_manifest(first_folder, f"source {first_name}: prepared_data")
    for name, folder in folders[1:]:
        other = prepared_data.read_manifest(folder, f"source {name}: prepared_data")
        different = prepared_data.difference(first, first_folder, other, folder)
        if different:
            raise InputError(
                f"source {first_name} (prepared_data {first_folder}) and source {name} (prepared_data "
                f"{folder}) were prepared with {different}: prepare them alike"
            )
    recorded = prepared_data.adopt_manifest(
        {**values, "prepared_data": first_folder}, first, explicit, sources_only=True
    )
    adopted = tuple(f"--{name} {value}" for name, value in recorded.items() if values[name] != value)
    return adopted, recorded


def split_global_batch(optimization: OptimizationArgs, explicit: set[str], processes: int) -> OptimizationArgs:
    """--global_batch_size: the accumulation that makes it with `processes` processes (the launch's WORLD_SIZE) and
    micro-batches of --per_device_train_batch_size. Given with --gradient_accumulation_steps too, the two must
    agree; a global batch the processes and micro-batches cannot divide is refused, naming the micro-batches that
    would."""
    total, micro = optimization.global_batch_size, optimization.per_device_train_batch_size
    if total is None:
        return optimization
    if total < 1 or micro < 1:
        raise InputError("--global_batch_size and --per_device_train_batch_size must be at least 1")
    split = f"{processes} process{'es' * (processes > 1)} x --per_device_train_batch_size {micro}"
    if "gradient_accumulation_steps" in explicit:
        accumulation = optimization.gradient_accumulation_steps
        if processes * micro * accumulation != total:
            raise InputError(
                f"--global_batch_size {total} disagrees with {split} x --gradient_accumulation_steps "
                f"{accumulation} = {processes * micro * accumulation}: give one of the two"
            )
        return optimization
    if total % (processes * micro):
        fitting = [size for size in range(micro, 0, -1) if total % (processes * size) == 0][:3]
        hint = (
            f"; --per_device_train_batch_size {' or '.join(map(str, fitting))} would"
            if fitting
            else f"; {total} is not a multiple of the {processes} processes"
        )
        raise InputError(f"--global_batch_size {total} is not a multiple of {split} = {processes * micro}{hint}")
    return dataclasses.replace(optimization, gradient_accumulation_steps=total // (processes * micro))


def check_args(model: ModelArgs, data: DataArgs, optimization: OptimizationArgs, output: OutputArgs):
    """Stops with one line on a bad value, path or combination, before any work."""
    check_writable(Path(output.output_dir), "--output_dir")
    if data.train_files and data.dataset_name:
        raise InputError("pass --train_files or --dataset_name, not both")
    for group, name in (
        (optimization, "max_train_steps"),
        (optimization, "per_device_train_batch_size"),
        (optimization, "gradient_accumulation_steps"),
        (data, "max_seq_length"),
    ):
        if getattr(group, name) < 1:
            raise InputError(f"--{name} must be at least 1")
    check_train_files(data.train_files)
    if not 0 <= data.validation_split_percentage < 100:
        raise InputError("--validation_split_percentage must be in [0, 100)")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(optimization, name) < 1:
            raise InputError(f"--{name} must be in [0, 1)")
    if output.resume_from_checkpoint and output.overwrite_output_dir:
        raise InputError("pass --resume_from_checkpoint or --overwrite_output_dir, not both")
    if data.preprocess_only and data.streaming:
        raise InputError(
            "--preprocess_only writes every pair to disk, and --streaming builds them as training "
            "goes: drop one of them"
        )
    check_peak_tflops(output.peak_tflops)
    if data.dataloader_num_workers is not None and data.dataloader_num_workers < 0:
        raise InputError("--dataloader_num_workers must be 0 or more")
    if optimization.max_consecutive_skips < 0:
        raise InputError("--max_consecutive_skips must be 0 (never stop for skipped steps) or more")
    check_rollback(model, optimization, output)
    if data.streaming and data.dataloader_num_workers:
        raise InputError(
            "--dataloader_num_workers with --streaming: the stream is read in the training process, "
            "whose position each checkpoint records; drop --dataloader_num_workers"
        )
    training_only = {
        "resume_from_checkpoint": output.resume_from_checkpoint,
        "decay_from": optimization.decay_from,
        "average_last": output.average_last,
    }
    given = [flag for flag, value in training_only.items() if value]
    if data.preprocess_only and given:
        raise InputError(f"--preprocess_only trains nothing: drop --{given[0]}")
    hub_source(output.resume_from_checkpoint, output)  # a malformed hub:REPO[@REVISION] stops here
    check_hub_strategy(output)


def check_rollback(model: ModelArgs, optimization: OptimizationArgs, output: OutputArgs) -> None:
    """--on_divergence rollback's needs: checkpoints to roll back to, a step that reads no optimizer state captured
    before, and at least one rollback."""
    if optimization.on_divergence != "rollback":
        return
    if not output.checkpointing_steps:
        raise InputError("--on_divergence rollback needs --checkpointing_steps: the checkpoints it rolls back to")
    if model.torch_compile_mode == step_graph.MODE:
        raise InputError(
            f"--on_divergence rollback with --torch_compile_mode {step_graph.MODE}: loading a "
            "checkpoint replaces the optimizer state the captured step reads; drop one of them"
        )
    if optimization.max_rollbacks < 1:
        raise InputError("--max_rollbacks must be at least 1 with --on_divergence rollback")


def check_hub_strategy(output: OutputArgs) -> None:
    """--hub_strategy other than end: it says what --push_to_hub uploads at each checkpoint, so both are needed."""
    if output.hub_strategy == "end":
        return
    if not output.push_to_hub:
        raise InputError(
            f"--hub_strategy {output.hub_strategy} says what --push_to_hub uploads during the run: "
            "pass --push_to_hub too"
        )
    if not output.checkpointing_steps:
        raise InputError(
            f"--hub_strategy {output.hub_strategy} uploads at each checkpoint, and this run saves "
            "none: pass --checkpointing_steps N"
        )


def check_average_last(output: OutputArgs, schedule: SchedulePlan) -> None:
    """--average_last K: at least two of the checkpoints this run writes, all kept to the end."""
    count = output.average_last
    if count is None:
        return
    if count < 2:
        raise InputError("--average_last must be at least 2: the mean of the last K checkpoints")
    if not output.checkpointing_steps:
        raise InputError("--average_last averages the run's last step_N checkpoints: pass --checkpointing_steps N")
    if output.checkpoints_total_limit is not None and output.checkpoints_total_limit < count:
        raise InputError(
            f"--average_last {count} needs the last {count} checkpoints, and --checkpoints_total_limit "
            f"{output.checkpoints_total_limit} keeps fewer"
        )
    first = schedule.parent_step or 0  # a decay branch writes its own checkpoints from its parent's step on
    written = schedule.max_train_steps // output.checkpointing_steps - first // output.checkpointing_steps
    if written < count:
        raise InputError(
            f"--average_last {count}: the run writes {written} checkpoints (every {output.checkpointing_steps} "
            f"steps to step {schedule.max_train_steps})"
        )


def check_vocabulary(model: ModelArgs, data: DataArgs, sources: Sources | None) -> None:
    """--extend_vocabulary's needs: a positive N, a loaded model whose vocabulary it extends, and a domain of text
    to learn from (one corpus, or the source --extend_vocabulary_from names), not pairs already tokenized."""
    if data.extend_vocabulary is None:
        if data.extend_vocabulary_from:
            raise InputError(
                "--extend_vocabulary_from names the source --extend_vocabulary learns from: pass "
                "--extend_vocabulary N too, or drop it"
            )
        return
    if data.extend_vocabulary <= 0:
        raise InputError(f"--extend_vocabulary {data.extend_vocabulary}: give the number of pieces to add (1 or more)")
    if not model.model_name_or_path:
        raise InputError(
            "--extend_vocabulary extends a loaded model's vocabulary: pass --model_name_or_path (a new "
            "model's tokenizer is trained on its corpus, --vocab_size pieces)"
        )
    if data.prepared_data or data.preprocess_only:
        raise InputError(
            f"--extend_vocabulary with --{'prepared_data' if data.prepared_data else 'preprocess_only'}: "
            "prepared pairs are tokenized once, before training; extend the vocabulary in a run that "
            "reads its corpus"
        )
    names = sources.names if sources is not None else []
    if len(names) > 1 and not data.extend_vocabulary_from:
        raise InputError(
            f"--extend_vocabulary with {len(names)} sources: name the domain to learn the pieces from "
            f"with --extend_vocabulary_from (one of {', '.join(names)})"
        )
    if data.extend_vocabulary_from and data.extend_vocabulary_from not in names:
        raise InputError(
            f"--extend_vocabulary_from {data.extend_vocabulary_from}: no such source"
            + (f" (the sources: {', '.join(names)})" if names else " (this run reads one corpus)")
        )
    domain = sources.sources[names.index(data.extend_vocabulary_from or names[0])] if names else None
    if domain is not None and domain.prepared_data:
        raise InputError(
            f"--extend_vocabulary: source {domain.name} is a prepared folder, its pairs tokenized "
            "already; learn the pieces from a source of text"
        )


def hardware_and_precision(optimization: OptimizationArgs) -> tuple[Hardware, Precision]:
    """This machine, and the precision the run takes on it (--mixed_precision, the launcher's, --tf32), in force."""
    hardware = detect()
    precision = choose_precision(
        hardware, optimization.mixed_precision, os.environ.get("ACCELERATE_MIXED_PRECISION"), optimization.tf32
    )
    use_tf32(precision)
    return hardware, precision


def choose_step(
    args: PretrainingArguments, hardware: Hardware, precision: Precision
) -> tuple[bool, str | None, list[str]]:
    """The step the run takes: (compiled, torch.compile's mode or the whole-step graph, the start line's note).
    --torch_compile_mode auto is resolved for this run's device, processes and precision (`step_graph.default_mode`),
    with a note when that is not the default's fastest; any other mode is the arguments'."""
    model = args.model
    if model.torch_compile_mode != AUTO:
        return model.torch_compile, model.torch_compile_mode, []
    mode, note = step_graph.default_mode(
        hardware.device,
        args.processes,
        requested_sharding(),
        precision.mixed_precision,
        model.gradient_checkpointing,
        rollback=args.optimization.on_divergence == "rollback",
    )
    return mode is not None, mode, [note] if note else []
