"""Faults of the machine a run writes to: a full disk, a read-only folder, a folder it may not write.

A write refused for one of these ends the run with one line (`StorageError`, printed as every `InputError` is by
`cli.run_entry_point`) that names what was being written and where, the space needed and free, and what is
intact. The writer removes its partial temporary folder first, so the space is free again at once.

A full disk does not always raise OSError(ENOSPC): torch's zip writer raises RuntimeError ("unexpected pos ...",
"PytorchStreamWriter failed writing file ...") and safetensors its SafetensorError ("... No space left on device
(os error 28)"), so those messages count too.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..errors import InputError, first_line

FAULTS = {
    errno.ENOSPC: "no space left",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}
FULL_DISK_MESSAGES = (
    "No space left on device",
    "os error 28",
    "unexpected pos",
    "PytorchStreamWriter failed writing",
    "Disk quota exceeded",
)


class StorageError(InputError):
    """A write the machine refused; the message is one line naming what is intact and how to go on."""


def chain(error: BaseException):
    """`error`, then what caused it, and so on."""
    while error is not None:
        yield error
        error = error.__cause__ or error.__context__


def fault_of(error: BaseException) -> str | None:
    """'no space left', 'read-only file system', ... when `error` (or what caused it) is the machine refusing a
    write; None for any other error."""
    for seen in chain(error):
        if isinstance(seen, OSError) and seen.errno in FAULTS:
            return FAULTS[seen.errno]
        if any(message in str(seen) for message in FULL_DISK_MESSAGES):
            return FAULTS[errno.ENOSPC]
    return None


def write_fault(write) -> str | None:
    """Runs `write()`; the fault when the machine refused it (see `fault_of`), None when it was written. Any other
    error is raised as it is."""
    try:
        write()
    except Exception as error:  # noqa: BLE001 - re-raised unless it is a refused write
        fault = fault_of(error)
        if fault is None:
            raise
        return fault
    return None


def shared_fault(accelerator, fault: str | None, main_only: bool = False) -> str | None:
    """Every process learns whether any of them (or, `main_only`, the main one) had a write refused: a collective
    every process reaches, so that all stop together and none waits for the others forever."""
    from accelerate.utils import broadcast_object_list, gather_object

    if accelerator.num_processes == 1:
        return fault
    if main_only:
        return broadcast_object_list([fault])[0]
    return next((found for found in gather_object([fault]) if found), None)


def existing_parent(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def mount_point(path: Path) -> Path:
    path = existing_parent(path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing_parent(path)).free


def megabytes(count: int) -> str:
    return f"{count / 1e6:,.0f} MB" if count >= 1e6 else f"{count / 1e3:,.0f} kB"


def folder_bytes(path: Path) -> int:
    """The bytes of the files under `path` (or of the file); a file that is gone by the time it is measured counts
    0 (another process may be removing the folder)."""
    path = Path(path)
    total = 0
    for file in [path] if path.is_file() else path.rglob("*") if path.is_dir() else []:
        try:
            total += file.stat().st_size if file.is_file() else 0
        except FileNotFoundError:
            pass
    return total


def fault_line(fault: str, what: str, path: Path, needed: int | None = None, intact: str = "") -> str:
    """E.g. 'no space left on /scratch writing the step-20 checkpoint (13 MB needed, 4 MB free); step_10 is
    complete: free space, then --resume_from_checkpoint latest'."""
    free = free_bytes(path)
    space = ""
    if fault in (FAULTS[errno.ENOSPC], FAULTS[errno.EDQUOT]):
        space = f" ({megabytes(needed)} needed, {megabytes(free)} free)" if needed else f" ({megabytes(free)} free)"
    where = mount_point(path) if fault != FAULTS[errno.EACCES] else existing_parent(path)
    return f"{fault} on {where} writing {what} ({path}){space}" + (f"; {intact}" if intact else "")


def check_writable(folder: Path, flag: str) -> None:
    """Stops with one line before any work when `folder` (or, before it exists, the folder it would be made in)
    cannot be written: read-only, forbidden. Leaves nothing behind."""
    target = existing_parent(folder)
    if not target.is_dir():
        return  # a file in the way: the folder's own checks say so
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tmp-write-check-", dir=target))
    except OSError as error:
        fault = fault_of(error)
        if fault is None:
            raise
        raise StorageError(
            f"{flag} {folder}: {fault} on {mount_point(target)}; choose a folder this process can write"
        ) from None


def check_free_space(folder: Path, needed: int, what: str, flag: str) -> None:
    """Stops with one line when `folder`'s file system has less free space than `needed` bytes for `what`."""
    free = free_bytes(folder)
    if free < needed:
        raise StorageError(
            f"{flag} {folder}: {megabytes(free)} free on {mount_point(folder)}, less than "
            f"{what} needs ({megabytes(needed)}); free space or choose another folder"
        )


def unplaced_fault(error: BaseException) -> str | None:
    """The one line for a refused write that no writer of ours reported with its context (a library's results
    file, say): the fault, the file and the free space; None when `error` is no such fault."""
    fault = fault_of(error)
    if fault is None:
        return None
    path = next((e.filename for e in chain(error) if isinstance(e, OSError) and e.filename), None)
    if path is None:
        return f"{fault} while writing: {first_line(error)}"
    return f"{fault} on {mount_point(Path(path))} writing {path} ({megabytes(free_bytes(Path(path)))} free)"


def write_json(path, data: dict) -> None:
    """Written whole beside it, then renamed over `path`: a run killed mid-write leaves the previous version."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
