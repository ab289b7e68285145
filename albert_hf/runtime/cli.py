"""Command lines of the scripts: HfArgumentParser dataclasses from flags or from one .json/.yaml file, and every
mistake in them reported as one line naming the flag, key or file (argparse's `error:` line), never a traceback."""

import contextlib
import dataclasses
import enum
import json
import os
import sys
import types
import typing
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from ..errors import InputError, NothingProduced, first_line
from . import output_lock
from .preemption import PREEMPTED, StopOnSignal, end_children, stop_line
from .storage import unplaced_fault

ARGUMENT_FILE_SUFFIXES = (".json", ".yaml", ".yml")
# argparse's exit status for a command line it refuses; ours for any input it refuses.
INPUT_ERROR_STATUS = 2
NOTHING_PRODUCED_STATUS = 1  # the run ended as asked but without its output: a failure for a pipeline


def argument_file(argv) -> Path | None:
    """The .json/.yaml file of arguments when it is the first argument (flags after it override its values)."""
    return Path(argv[0]) if argv and argv[0].endswith(ARGUMENT_FILE_SUFFIXES) else None


def read_argument_file(path: Path) -> dict:
    text = path.read_text(encoding="utf-8-sig")
    return yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)


def parse_into_dataclasses(
    parser: HfArgumentParser, argv=None, defaults: dict | None = None, mapping_lists=()
) -> tuple:
    """The dataclasses of `parser` from `argv` (default: the command line), or from the .json/.yaml file it starts
    with and the flags after it (which override the file's values); `defaults` (argument name -> value) replace the
    dataclasses' own defaults, and what argv gives wins. `mapping_lists`: the arguments a file may give as a list of
    mappings (checked by the job that reads them)."""
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    defaults = defaults or {}
    parser.set_defaults(**defaults)
    path = argument_file(argv)
    if path is not None:
        if not path.is_file():
            parser.error(f"{path}: no such arguments file")
        try:
            values = read_argument_file(path)
            if not isinstance(values, dict):
                parser.error(f"{path}: expected a mapping of argument names to values, found {type(values).__name__}")
            check_value_types(parser, values, path, mapping_lists)
            known = {
                field.name for dataclass_type in parser.dataclass_types for field in dataclasses.fields(dataclass_type)
            }
            unknown = sorted(set(values) - known)
            if unknown:
                parser.error(f"{path}: unknown argument(s) {unknown[:5]}")
            if len(argv) == 1:
                return parser.parse_dict({**defaults, **values})
            parser.set_defaults(**{**defaults, **values})  # the flags after the file win
            for action in parser._actions:  # one the file gives is no longer required on the command line
                if action.dest in values:
                    action.required = False
            argv = argv[1:]
        except (ValueError, TypeError, yaml.YAMLError) as error:
            parser.error(f"{path}: {str(error).strip().splitlines()[0]}")
    try:
        *groups, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    except InputError:
        raise
    except ValueError as error:  # a dataclass's own check, e.g. TrainingArguments' on --load_best_model_at_end
        raise InputError(" ".join(str(error).split())[:400]) from error  # its paragraph as one line
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    return tuple(groups)


def _matches(value, expected) -> bool:
    """Whether a value read from a .json/.yaml file has the annotated type (what argparse would have converted)."""
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin in (list, tuple):
        return isinstance(value, list) and all(_matches(item, args[0]) for item in value) if args else True
    if origin is dict or expected is dict:
        return isinstance(value, dict)
    if expected is type(None):
        return value is None
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    if isinstance(expected, type) and issubclass(expected, enum.Enum):
        return isinstance(value, expected) or value in {member.value for member in expected}
    return True  # Any, or a type argparse would not check either


def check_value_types(parser: HfArgumentParser, values: dict, path: Path, mapping_lists=()) -> None:
    """`parser.error` naming the key whose value has the wrong type or is not one of its choices: parse_dict passes
    values to the dataclasses unchecked, where a list for --output_dir or a string for --max_train_steps would
    fail much later, with a traceback."""
    for dataclass_type in parser.dataclass_types:
        try:
            hints = typing.get_type_hints(dataclass_type)
        except (NameError, TypeError):  # an annotation that cannot be resolved: left to the dataclass
            continue
        for field in dataclasses.fields(dataclass_type):
            if field.name not in values or field.name not in hints:
                continue
            value = values[field.name]
            if (
                field.name in mapping_lists
                and isinstance(value, list)
                and all(isinstance(item, dict) for item in value)
            ):
                continue  # a list of mappings, checked by the job that reads it (pretraining's `sources:`)
            if not _matches(value, hints[field.name]):
                parser.error(f"{path}: {field.name}: {value!r:.60} is not of type {typing_name(hints[field.name])}")
            choices = field.metadata.get("choices")
            if choices and value is not None and value not in choices:
                parser.error(f"{path}: {field.name}: {value!r:.60} is not one of {list(choices)}")


def typing_name(expected) -> str:
    return getattr(expected, "__name__", None) or str(expected).replace("typing.", "")


def explicit_arguments(argv, dataclass_types) -> set[str]:
    """Names of the arguments the user set explicitly (on the command line or in the .json file).

    Re-parses argv with every default replaced by a sentinel, so abbreviations, `--a=b` and `--a-b` spellings
    are all recognised exactly as HfArgumentParser recognises them.
    """
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]  # as parse_into_dataclasses reads it
    path = argument_file(argv)
    from_file = set(read_argument_file(path)) if path is not None else set()
    argv = argv[1:] if path is not None else argv
    if path is not None and not argv:
        return from_file
    parser = HfArgumentParser(dataclass_types)
    unset = object()
    parser.set_defaults(**{action.dest: unset for action in parser._actions if action.dest != "help"})
    for action in parser._actions:  # what is required may be in the file: only what argv gives is asked here
        action.required = False
    namespace, _ = parser.parse_known_args(argv)
    return from_file | {name for name, value in vars(namespace).items() if value is not unset}


def is_first_process() -> bool:
    # The launcher's rank, read from the environment: an InputError can come before accelerate is set up.
    return os.environ.get("RANK", "0") == "0"


def run_entry_point(main, finish=None, stage: str | None = None) -> None:
    """Run `main()`; an InputError becomes one `error:` line on stderr (from the first process only, under
    `accelerate launch`: every process checks the same input) and exit status 2; a NothingProduced its line and
    status 1. A stop signal that interrupted the
    run before it had anything to save becomes its one line (`preemption.stop_line`) and status PREEMPTED, whatever
    error the interruption turned into on its way out (a library's cleanup, a compiler's wrapper). `finish()`, when
    given, runs after main in every case, before the process exits: the fine-tuning scripts free their process
    group there. A SystemExit (argparse's own error, a preempted run's status) passes through after `finish`.

    With `stage` (a training script: what its start does), stop signals are handled from the first moment
    (`preemption.StopOnSignal`): until the job says it has something to save, one ends the run at once with its
    line; one that arrives after the job's own handling ended (its results being written) is noted and the run
    completes."""
    status = 0
    try:
        with StopOnSignal(stage, until_exit=True) if stage else contextlib.nullcontext() as stop:
            main()
            if stop is not None and stop.received is not None and is_first_process():
                print(f"{stop.name} received after training: the run completed", file=sys.stderr, flush=True)
    except BaseException as error:  # noqa: BLE001 - each kind handled below; anything else is raised again
        stopped = stop_line() if stage else None
        if stopped is not None:
            if is_first_process():
                print(stopped, file=sys.stderr, flush=True)
            status = PREEMPTED
        elif isinstance(error, (InputError, NothingProduced)):
            if is_first_process():
                print(f"error: {first_line(error)}", file=sys.stderr, flush=True)
            status = INPUT_ERROR_STATUS if isinstance(error, InputError) else NOTHING_PRODUCED_STATUS
        elif isinstance(error, SystemExit):
            status = error.code
        elif isinstance(error, Exception) and (fault := unplaced_fault(error)) is not None:
            # from whichever process failed: the others may not have
            print(f"error: {fault}", file=sys.stderr, flush=True)
            status = INPUT_ERROR_STATUS
        else:
            raise
    finally:
        if stage and status == PREEMPTED:
            end_children()
        output_lock.release_all()  # the output folder's lock, if the job took one (runtime/output_lock.py)
        if finish is not None:
            finish()
    if status:
        raise SystemExit(status)
