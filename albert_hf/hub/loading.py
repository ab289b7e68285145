"""Checks before and around `from_pretrained`: a model, tokenizer or config that cannot be found or read stops with
one line naming the argument (`loading`), a local folder's JSON files are checked first (`check_folder_files`), and
a tokenizer's damaged settings are caught before they fail while encoding (`check_tokenizer`)."""

import json
from contextlib import contextmanager
from pathlib import Path

from ..errors import InputError, first_line

# The JSON files of a model or tokenizer folder, and the fields transformers uses before any check of its own: a
# wrong type there fails deep inside from_pretrained, with a traceback.
FOLDER_JSON_FIELDS = {
    "config.json": {"model_type": (str,), "architectures": (list,), "auto_map": (dict,)},
    "tokenizer.json": {"added_tokens": (list,)},
    "tokenizer_config.json": {
        "tokenizer_class": (str,),
        "auto_map": (dict, list),
        "model_max_length": (int, float),
        "added_tokens_decoder": (dict,),
        "extra_special_tokens": (dict, list),
    },
    "special_tokens_map.json": {},
    "generation_config.json": {},
}
CONFIG_DTYPES = ("float32", "float16", "bfloat16", "float64", "auto")
CHECKPOINT_STATE = "training_state.json"  # what every complete step_N of run_pretraining.py holds


def check_folder_files(folder: Path, flag: str, name) -> None:
    """InputError naming the file and field when a local folder's JSON files are not what transformers expects."""
    for file_name, fields in FOLDER_JSON_FIELDS.items():
        if not (folder / file_name).is_file():
            continue
        where = f"{flag} {name}: {file_name}"
        try:
            value = json.loads((folder / file_name).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InputError(f"{where} is not JSON ({first_line(error)})") from None
        if not isinstance(value, dict):
            raise InputError(f"{where} holds a {type(value).__name__}, not a JSON object")
        for key, kinds in fields.items():
            if key in value and not isinstance(value[key], kinds):
                raise InputError(
                    f"{where}: {key} {value[key]!r:.40} is not of type {' or '.join(kind.__name__ for kind in kinds)}"
                )
        for key in ("dtype", "torch_dtype") if file_name == "config.json" else ():
            if value.get(key) not in (None, *CONFIG_DTYPES):
                raise InputError(f"{where}: {key} {value[key]!r:.40} is none of {CONFIG_DTYPES}")
        if not all(
            isinstance(token, dict) and type(token.get("id")) is int and isinstance(token.get("content"), str)
            for token in value.get("added_tokens", [])
            if file_name == "tokenizer.json"
        ):
            raise InputError(f"{where}: added_tokens are not all tokens with an integer id and a content string")


def check_tokenizer(tokenizer, flag: str, name):
    """Stop with one line when a tokenizer loaded but its settings are damaged (a tokenizer_config.json edited by
    hand): transformers takes them as they are, and fails later, while encoding."""
    if type(tokenizer.model_max_length) is not int or tokenizer.model_max_length < 1:
        raise InputError(
            f"{flag} {name}: model_max_length {tokenizer.model_max_length!r:.40} in its "
            "tokenizer_config.json is not a positive integer"
        )
    for token in ("cls_token", "sep_token", "pad_token", "mask_token", "unk_token"):
        value = getattr(tokenizer, token, None)
        if value is not None and not isinstance(value, str):
            raise InputError(f"{flag} {name}: its {token} {value!r:.40} is not a string")
    return tokenizer


def library_errors() -> tuple[type[Exception], ...]:
    """What `from_pretrained` raises for files it cannot find or read: OSError (a missing folder or file, an unknown
    repo, an unreachable Hub), a config's own checks ValueError or TypeError (huggingface_hub's StrictDataclassError
    for the fields transformers validates), KeyError, weights whose shapes the config contradicts RuntimeError,
    and safetensors its SafetensorError. tokenizers raises a bare Exception or panics (pyo3's PanicException, a
    BaseException of a class each Rust extension makes for itself) on a tokenizer.json it cannot parse: `loading`
    takes those by their exact type and name."""
    from huggingface_hub.errors import StrictDataclassError
    from safetensors import SafetensorError

    return (OSError, ValueError, TypeError, KeyError, RuntimeError, SafetensorError, StrictDataclassError)


@contextmanager
def loading(flag: str, name):
    """Stop with one line naming the argument when `from_pretrained(name)` cannot find or read it.

    transformers raises OSError for a folder that does not exist or lacks the files, an unknown Hub repo, and a
    Hub that cannot be reached (offline, or HF_HUB_OFFLINE=1); its traceback buries which argument was wrong.
    A local folder's JSON files are checked first; other damage is recognised by `library_errors`.
    """
    folder = Path(str(name))
    if folder.is_dir() and (folder / CHECKPOINT_STATE).is_file() and not (folder / "config.json").is_file():
        raise InputError(
            f"{flag} {name}: a run_pretraining.py checkpoint written without the model's files (config, "
            "tokenizer, code); make it loadable with: python -m albert_hf.pretraining.output.loadable "
            f"{name}"
        )
    if folder.is_dir():
        check_folder_files(folder, flag, name)
    try:
        yield
    except BaseException as error:  # noqa: B036 - Rust panics are BaseExceptions, one class per extension
        if isinstance(error, InputError) or not (
            isinstance(error, library_errors()) or type(error) is Exception or type(error).__name__ == "PanicException"
        ):
            raise  # ours already, a bug, or KeyboardInterrupt / SystemExit
        from huggingface_hub import constants

        hint = ""
        if not folder.exists():
            where = "no local folder by that name, so it was looked up on the Hub"
            if constants.HF_HUB_OFFLINE:
                hint = "; the Hub is switched off (HF_HUB_OFFLINE), so pass a local folder"
        elif isinstance(error, OSError):
            where = "a local folder, but it does not hold what is needed"
        else:
            where = "a local folder, with a file that cannot be read"
        raise InputError(f"{flag} {name}: cannot load it ({where}): {first_line(error)}{hint}") from None
