"""A checkpoint is data from outside: what a resume reads is never unpickled with code, and is checked against the
record of what was written. Both trainers' checkpoints (pretraining's step_N, fine-tuning's checkpoint-N) keep one
record, checked here.

- The record: at save, every file of the checkpoint with its size and sha256 (`record`), written last into
  RECORD_FILE through a part file renamed into place (`write_record`). At resume, `recorded_damage` names the first
  file that is missing, larger or smaller than written, changed, or not written by the run at all; nothing is loaded
  before that check passes. A checkpoint without a record (written before records, or by a run stopped while
  writing it: `unrecorded`) is the trainer's to judge; `newest_intact` names the checkpoint to go back to.
- Data only: the processes of our scripts load pickles as data (`torch.load(weights_only=True)`, even where a
  library asks otherwise: `weights_only_loads`). A pickle that would run code is refused, and `unreadable` names the
  file when a load fails.
"""

import contextlib
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

from ..errors import first_line

RECORD_FILE = "files.json"  # a checkpoint's record: every other file's size and sha256
EARLIER_RECORD_FILES = ("checkpoint_files.json",)  # fine-tuning's name for it before, still read

# Files torch.load reads (pickles in a zip, or bare pickles): loaded as data only.
PICKLED = (".bin", ".pkl", ".pt", ".pth")
HASH_CHUNK = 8 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def files_in(folder: Path, leave_out: tuple[str, ...] = ()) -> list[str]:
    """The files under `folder`, as sorted relative POSIX paths, but those named in `leave_out`."""
    folder = Path(folder)
    return sorted(
        path.relative_to(folder).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and path.relative_to(folder).as_posix() not in leave_out
    )


def record(folder: Path, leave_out: tuple[str, ...] = ()) -> dict[str, dict]:
    """{relative path: {"bytes": size, "sha256": digest}} for every file under `folder` but `leave_out`."""
    folder = Path(folder)
    return {
        name: {"bytes": (folder / name).stat().st_size, "sha256": sha256(folder / name)}
        for name in files_in(folder, leave_out)
    }


def link_files(source: Path, folder: Path) -> None:
    """Hard links in `folder` to every file of `source` it does not hold yet (copies where links cannot be made):
    files many checkpoints share, at no cost in bytes."""
    for path in sorted(Path(source).iterdir()):
        target = Path(folder) / path.name
        if path.is_file() and not target.exists():
            try:
                os.link(path, target)
            except OSError:
                shutil.copyfile(path, target)


def write_record(folder: Path, name: str = RECORD_FILE) -> None:
    """`record` of `folder` written to the file `name` in it, {"files": ...}: through a part file renamed into
    place, so that a record is never half-written (neither is in the record)."""
    folder = Path(folder)
    part = folder / record_part(name)
    files = record(folder, leave_out=(name, part.name))
    part.write_text(json.dumps({"files": files}, indent=1))
    os.replace(part, folder / name)


def record_part(name: str = RECORD_FILE) -> str:
    """The part file `write_record` writes before renaming it to `name`: never a record, nor a stray file."""
    return f".{name}.part"


def record_name(folder: Path) -> str | None:
    """The record file `folder` holds (RECORD_FILE, or an earlier name), or None."""
    return next((name for name in (RECORD_FILE, *EARLIER_RECORD_FILES) if (Path(folder) / name).is_file()), None)


def recorded_damage(folder: Path) -> str | None:
    """'FILE: what' for the first file of checkpoint `folder` that differs from its record (the record itself
    unreadable included), or None when every file matches. The folder holds a record (`record_name`)."""
    folder = Path(folder)
    name = record_name(folder)
    try:
        files = json.loads((folder / name).read_text()).get("files")
    except (OSError, ValueError, AttributeError) as error:
        return f"{name}: {first_line(error)}"
    if not valid_record(files):
        return f"{name}: not the sizes and sha256 of files inside the checkpoint"
    return damage(folder, files, leave_out=(name, record_part(name)))


def unrecorded(folder: Path) -> str:
    """Why checkpoint `folder` holds no record, for a warning line."""
    if (Path(folder) / record_part()).is_file():
        return f"{folder}: its record ({RECORD_FILE}) was never completed (the run stopped while writing it)"
    return f"{folder} was written before checkpoints recorded their files' sizes and sha256"


def newest_intact(earlier: list[Path], damage_of) -> str:
    """'the newest earlier intact checkpoint is P: --resume_from_checkpoint P' for the newest of `earlier` (oldest
    first) whose `damage_of` is None, or that there is none."""
    intact = next((path for path in reversed(earlier) if damage_of(path) is None), None)
    if intact is None:
        return "no earlier intact checkpoint is beside it"
    return f"the newest earlier intact checkpoint is {intact}: --resume_from_checkpoint {intact}"


def valid_record(files) -> bool:
    """Whether `files` (read from a checkpoint) is a record as `record` writes it, naming files inside the folder."""
    return isinstance(files, dict) and all(
        isinstance(name, str)
        and name
        and not name.startswith("/")
        and ".." not in name.split("/")
        and isinstance(entry, dict)
        and type(entry.get("bytes")) is int
        and entry["bytes"] >= 0
        and isinstance(entry.get("sha256"), str)
        and len(entry["sha256"]) == 64
        for name, entry in files.items()
    )


def damage(folder: Path, files: dict[str, dict], leave_out: tuple[str, ...] = ()) -> str | None:
    """'NAME: what is wrong' for the first file of `folder` that differs from the record `files`, or None. Sizes
    first (a cut-short copy is found without reading anything), then the digests."""
    folder = Path(folder)
    for name in files_in(folder, leave_out):
        if name not in files:
            return f"{name}: not written by the run (it is not in the checkpoint's record)"
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name}: missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return (
                f"{name}: {size:,} bytes where {entry['bytes']:,} were written "
                f"({'cut short' if size < entry['bytes'] else 'larger than written'})"
            )
    for name, entry in files.items():
        if sha256(folder / name) != entry["sha256"]:
            return f"{name}: changed since it was written (its sha256 differs from the record)"
    return None


# What the `.metadata` of a sharded (torch.distributed.checkpoint) checkpoint may name: its own dataclasses, torch's
# sizes, dtypes and layouts, and paths. torch reads that file with a plain pickle.load, which runs whatever it names.
DCP_METADATA_GLOBALS = {
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}


class DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles a sharded checkpoint's `.metadata` as data: a global outside DCP_METADATA_GLOBALS (and torch's
    dtypes) is refused before anything is called."""

    def find_class(self, module, name):
        import torch

        if (module, name) in DCP_METADATA_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"{module}.{name}: not data of a sharded checkpoint's metadata (loading it would run code): not loaded"
        )


class _DataOnlyPickle:
    """The `pickle` module as torch.distributed.checkpoint's file reader sees it within `weights_only_loads`."""

    def __getattr__(self, name):
        return getattr(pickle, name)

    @staticmethod
    def load(file, **kwargs):
        return DataOnlyUnpickler(file, **kwargs).load()


@contextlib.contextmanager
def weights_only_loads():
    """Every torch.load within is `weights_only=True`, also those that ask for less (accelerate loads the objects
    registered for checkpointing with `weights_only=False`): torch's own switch, TORCH_FORCE_WEIGHTS_ONLY_LOAD. A
    sharded checkpoint's `.metadata` is read by `DataOnlyUnpickler`."""
    from torch.distributed.checkpoint import filesystem

    name = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(name)
    os.environ[name] = "1"
    filesystem.pickle = _DataOnlyPickle()
    try:
        yield
    finally:
        filesystem.pickle = pickle
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def unreadable(folder: Path, names: list[str] | None = None) -> str | None:
    """'NAME: why' for the first of `names` (default: every file under `folder`) that cannot be read as data: a
    pickle that is not plain data (one that would run code), a safetensors file or JSON that does not parse; None
    when all can. Called after a load failed, to name the file."""
    import torch
    from accelerate.utils.other import TORCH_SAFE_GLOBALS
    from safetensors import safe_open

    folder = Path(folder)
    for name in names if names is not None else files_in(folder):
        path = folder / name
        try:
            if name.endswith(PICKLED):
                with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
                    torch.load(path, map_location="cpu", weights_only=True)
            elif name.endswith(".safetensors"):
                with safe_open(str(path), framework="pt") as file:
                    for key in file.keys():
                        file.get_slice(key)
            elif name.endswith(".json"):
                json.loads(path.read_text())
            elif path.name == ".metadata":  # a sharded checkpoint's index
                with open(path, "rb") as file:
                    DataOnlyUnpickler(file).load()
        except Exception as error:  # noqa: BLE001 - whatever the reader raised names this file
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            if name.endswith(PICKLED) and "Weights only load failed" in str(error):
                reason = "a pickle that is not plain data (loading it would run code): not loaded"
            return f"{name}: {reason}"
    return None
