"""accelerate configs made the way users make them: `accelerate config`'s own question flow (its
`get_cluster_input`), answered from a script, and the environment its launcher gives the processes."""

from unittest import mock

from accelerate.commands.config import cluster
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import prepare_multi_gpu_env

# The answers of a user who wants FSDP over 2 processes on one machine; every question not listed here gets the
# default `accelerate config` offers (Enter).
FSDP_ANSWERS = {
    "type of machine": "multi-GPU",
    "How many different machines": "1",
    "How many GPU(s)": "2",
    "FullyShardedDataParallel": "yes",
    "FSDP version": "2",
    "mixed precision": "no",
}


def write_config(path, answers: dict) -> dict:
    """Runs `accelerate config`'s questions with `answers` (a piece of the question -> the answer as typed, or
    the label of the chosen option) and writes the YAML file it would write. Returns {question: answer given}."""
    asked = {}

    def answer_for(question):
        return next((value for key, value in answers.items() if key.lower() in question.lower()), None)

    def ask_field(question, convert_value=None, default=None, error_message=None):
        value = asked[question.strip()] = answer_for(question)
        if value is None and default is not None:
            return default
        value = "" if value is None else value
        return convert_value(value) if convert_value is not None else value

    def ask_options(question, options=(), convert_value=None, default=0):
        value = asked[question.strip()] = answer_for(question)
        index = default if value is None else [str(option) for option in options].index(str(value))
        return convert_value(index) if convert_value is not None else index

    with mock.patch.object(cluster, "_ask_field", ask_field), mock.patch.object(cluster, "_ask_options", ask_options):
        config = cluster.get_cluster_input()
    config.to_yaml_file(str(path))
    return asked


def fsdp_config(path, **answers) -> str:
    """An FSDP config for 2 processes with FSDP_ANSWERS plus `answers`; returns its path as a string."""
    write_config(path, {**FSDP_ANSWERS, **answers})
    return str(path)


def launcher_environment(config_path) -> dict:
    """The variables `accelerate launch --config_file config_path` sets for its processes (its own code)."""
    args = launch_command_parser().parse_args(["--config_file", str(config_path), "script.py"])
    args = _validate_launch_command(args)[0]
    return prepare_multi_gpu_env(args)
