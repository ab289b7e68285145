"""Credentials stay out of everything a run writes or shows: tracker configs, saved arguments (pickles included),
prepared-data manifests, the output folder's lock and the lines that quote it.

A secret is an argument whose name has the word token, key, secret or password (`--hub_token`, `--api_key`; not
`--tokenizer_name`). Its value is replaced by `<NAME>`, the mask transformers' `TrainingArguments.to_dict()` uses
for `hub_token` (`<HUB_TOKEN>`).
"""

import copy
import re

SECRET_WORDS = frozenset({"token", "key", "secret", "password"})


def is_secret(name: str, abbreviated: bool = False) -> bool:
    """Whether an argument named `name` (with or without its leading dashes) holds a credential. `abbreviated`: the
    name as a command line may shorten it (argparse takes `--hub_tok` for `--hub_token`)."""
    words = re.split(r"[_\-]+", name.strip("-").lower())
    if abbreviated and len(words[-1]) >= 3 and any(word.startswith(words[-1]) for word in SECRET_WORDS):
        return True
    return not SECRET_WORDS.isdisjoint(words)


def mask(name: str) -> str:
    return f"<{name.strip('-').replace('-', '_').upper()}>"


def without_secrets(values: dict) -> dict:
    """`values` (argument name -> value) with each secret that is set replaced by its mask."""
    return {name: mask(name) if is_secret(name) and value is not None else value for name, value in values.items()}


def command_line(argv) -> str:
    """The command `argv` as one line, the value of each secret option masked (`--hub_token X`, `--hub_token=X`)."""
    shown, hide_next = [], None
    for arg in map(str, argv):
        if hide_next is not None:
            shown.append(mask(hide_next))
            hide_next = None
            continue
        option, equals, _ = arg.partition("=")
        if option.startswith("--") and is_secret(option, abbreviated=True):
            if equals:
                shown.append(f"{option}={mask(option)}")
            else:
                shown.append(option)
                hide_next = option
            continue
        shown.append(arg)
    return " ".join(shown)


class SecretsNotPickled:
    """A mixin for an arguments dataclass that is pickled to disk (Trainer writes `training_args.bin` into every
    checkpoint and output folder, which `push_to_hub` uploads): the pickle holds each secret's mask, while copies
    made in the process keep the real values (Trainer pushes with them)."""

    def __getstate__(self):
        return without_secrets(dict(self.__dict__))

    def __copy__(self):
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def __deepcopy__(self, memo):
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone
