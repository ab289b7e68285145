"""Command lines of the scripts: HfArgumentParser dataclasses from flags or from one .json/.yaml file, and every
mistake in them reported as one line naming the flag, key or file (argparse's `error:` line), never a traceback."""

import json
import sys
from pathlib import Path

import yaml
from transformers import HfArgumentParser

ARGUMENT_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def argument_file(argv) -> Path | None:
    """The .json/.yaml file that replaces the flags when it is the only argument."""
    return Path(argv[0]) if len(argv) == 1 and argv[0].endswith(ARGUMENT_FILE_SUFFIXES) else None


def read_argument_file(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    return yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)


def parse_into_dataclasses(parser: HfArgumentParser, argv=None) -> tuple:
    """The dataclasses of `parser` from `argv` (default: the command line), or from its one .json/.yaml file."""
    argv = sys.argv[1:] if argv is None else [str(arg) for arg in argv]
    path = argument_file(argv)
    if path is not None:
        if not path.is_file():
            parser.error(f"{path}: no such arguments file")
        try:
            return parser.parse_dict(read_argument_file(path))
        except (ValueError, TypeError, yaml.YAMLError) as error:
            parser.error(f"{path}: {str(error).strip().splitlines()[0]}")
    *groups, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        parser.error(f"unrecognized arguments: {' '.join(remaining)}")
    return tuple(groups)


def explicit_arguments(argv, dataclass_types) -> set[str]:
    """Names of the arguments the user set explicitly (on the command line or in the .json file).

    Re-parses argv with every default replaced by a sentinel, so abbreviations, `--a=b` and `--a-b` spellings
    are all recognised exactly as HfArgumentParser recognises them.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    path = argument_file(argv)
    if path is not None:
        return set(read_argument_file(path))
    parser = HfArgumentParser(dataclass_types)
    unset = object()
    parser.set_defaults(**{action.dest: unset for action in parser._actions if action.dest != "help"})
    namespace, _ = parser.parse_known_args(argv)
    return {name for name, value in vars(namespace).items() if value is not unset}
