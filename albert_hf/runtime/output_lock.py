"""One run per output folder: a lock file that the run's first process holds from its start to its end.

A requeued job whose predecessor still runs, or a job submitted twice, would otherwise resume from the same
checkpoints and write the same step folders and metrics rows as the first run, and both would end with status 0. The
lock is `LOCK_FILE` in the output folder. It is made whole or not at all (written beside, then hard-linked into
place, which fails if the file exists), and it holds the host, the PID, the process's start time (so that a reused
PID is not taken for the holder), when the run began and its command, its secrets masked (`secrets.command_line`). A
second run on the folder stops with one line naming the holder. A lock whose process is gone (same host; no such
PID, or one that started at another time) was left by a killed run: the next run takes it over and says so. A lock
of another host cannot be checked from here and is honoured, unless the run is told to take it (`take_over`). It is
released when the job ends, normally or on an error or a stop signal (`release_all`, from `cli.run_entry_point`; at
exit too, as a backstop); a kill -9 leaves it, for the next run to take over.
"""

import atexit
import contextlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from ..errors import InputError
from .secrets import command_line

logger = logging.getLogger(__name__)

# "_": transformers' Trainer leaves such files out of its Hub uploads, as `hub.upload.push_folder` does
LOCK_FILE = "_albert_hf_run.lock"
_held: dict[Path, tuple[dict, bool]] = {}  # the locks this process holds: path -> (its record, folder made for it)


def process_start(pid: int) -> str | None:
    """When the process started, in clock ticks since boot (/proc/PID/stat's 22nd field); None without /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def this_process() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": process_start(os.getpid()),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": command_line(sys.argv)[:500],
    }


def alive(holder: dict) -> bool | None:
    """Whether the lock's process still runs: None when it ran on another host (which cannot be checked here)."""
    if holder.get("host") != socket.gethostname():
        return None
    try:
        os.kill(int(holder["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that PID: it exists
        pass
    start = process_start(int(holder["pid"]))
    return holder.get("process_start") is None or start is None or start == holder["process_start"]


def describe(holder: dict) -> str:
    return (
        f"{holder.get('command') or 'a run'} (host {holder.get('host')}, PID {holder.get('pid')}, since "
        f"{holder.get('started')})"
    )


def read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: no process can be named, so none is waited for


def acquire(folder, flag: str, take_over: bool = False) -> None:
    """Take the lock of `folder` (made if missing) for this process, or stop with one line naming the holder.

    Args:
        folder: the run's output folder.
        flag: the argument that named it (`--output_dir`), for the messages.
        take_over (`bool`, defaults to False): take a lock of another host, which cannot be checked from here.

    Raises:
        InputError: the folder is in use by a live run (or one of another host, without `take_over`).
    """
    folder = Path(folder)
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = (folder / LOCK_FILE).resolve()
    record = this_process()
    if path in _held:
        return  # this process holds it already (a job run twice in one interpreter)
    draft = path.with_name(f".{LOCK_FILE}.{record['pid']}")
    draft.write_text(json.dumps(record) + "\n")
    try:
        for _ in range(3):
            try:
                os.link(draft, path)  # atomic: the lock appears whole, or the link fails because one exists
                break
            except FileExistsError:
                take_over_line(path, flag, take_over)
        else:
            raise InputError(f"{flag} {folder}: another run took its lock while this one was starting")
    finally:
        draft.unlink(missing_ok=True)
    _held[path] = (record, made)
    if len(_held) == 1:
        atexit.register(release_all)


def in_use(folder, flag: str) -> str | None:
    """The line for a folder whose lock a live run of this host holds (another process), else None: read only, for
    the checks that run before the lock is taken (`pretraining.output.folder.check_output_dir`). Asked in a
    launched run's other processes it is None: the lock they see is their own run's (its first process takes it)."""
    if os.environ.get("RANK", "0") != "0":
        return None
    holder = read(Path(folder) / LOCK_FILE)
    if not holder or holder.get("pid") == os.getpid() or not alive(holder):
        return None
    return busy_line(folder, flag, holder)


def busy_line(folder, flag: str, holder: dict) -> str:
    return f"{flag} {folder} is in use by {describe(holder)}: wait for it to end, or pass another {flag}"


def take_over_line(path: Path, flag: str, take_over: bool) -> None:
    """The existing lock at `path` is removed when its run has ended (with a line saying so), else InputError."""
    holder = read(path)
    if holder is None:  # released meanwhile
        return
    state = alive(holder) if holder else False
    folder = path.parent
    if state:  # the message itself, not in_use's reading of the file, which skips this PID and other ranks
        raise InputError(busy_line(folder, flag, holder))
    if state is None and not take_over:
        raise InputError(
            f"{flag} {folder} is locked by {describe(holder)}, on another host, which cannot be "
            f"checked from here; if that run has ended, pass --take_over_lock"
        )
    reason = "on another host, taken over as asked" if state is None else "which has ended"
    logger.warning(
        "%s %s: took over the lock of %s, %s",
        flag,
        folder,
        describe(holder) if holder else "an unreadable lock",
        reason,
    )
    path.unlink(missing_ok=True)


def release_all() -> None:
    """Remove the locks this process holds (those still holding its record), and a folder made for the lock that
    the run left empty (one stopped at its start by bad input)."""
    for path, (record, made) in list(_held.items()):
        if read(path) == record:
            path.unlink(missing_ok=True)
        if made:
            with contextlib.suppress(OSError):  # not empty: the run wrote into it
                path.parent.rmdir()
        del _held[path]


@contextlib.contextmanager
def held(folder, flag: str, take_over: bool = False, first_process: bool = True):
    """The lock of `folder` for the duration of the block, taken by the first process only."""
    if first_process:
        acquire(folder, flag, take_over)
    try:
        yield
    finally:
        if first_process:
            release_all()
