"""A pretraining run's training state in its output folder: step_N checkpoints written atomically and resumed, and
an earlier run recognised (refused, or cleared with --overwrite_output_dir) by the names it writes. The final model
beside them is final_folder.py's.

A checkpoint is input when resumed (copied between clusters, downloaded from someone's Hub repo): its files are
checked against the record written with it, and read as data only (runtime/checkpoint_files.py); every state a
resume restores is restored, or the run stops with one line naming the file."""

import itertools
import json
import logging
import os
import pickle
import random
import re
import shutil
import threading
from pathlib import Path

import numpy as np
import torch
from accelerate.utils import broadcast_object_list

from ...errors import InputError, first_line
from ...runtime import checkpoint_files
from ...runtime.checkpoint_files import RECORD_FILE
from ...runtime.storage import StorageError, fault_line, folder_bytes, shared_fault, write_fault
from ..training.divergence import newest_finite
from ..training.state import STATE_FILE, checked_position

logger = logging.getLogger(__name__)

STEP_DIR = re.compile(r"^step_(\d+)$")
STREAM_STATE_FILE = "stream_state_{}.json"  # --streaming: each process's position in its stream (datasets' state)
SCHEDULE_FILE = "schedule.json"  # the learning-rate schedule's position (its state_dict, all numbers) and plan
PLAN_KEY = "plan"  # the schedule's plan in SCHEDULE_FILE (pretraining/schedule.py)
# The schedule's position in a checkpoint without SCHEDULE_FILE: accelerate's pickle of a registered object, which
# `load` reads as data (weights-only) into the schedule.
LEGACY_SCHEDULE_FILE = "custom_checkpoint_0.pkl"
RANDOM_STATE_FILE = "random_states_{}.pkl"  # accelerate's: each process's random generators
# The record of a checkpoint's files (runtime/checkpoint_files.py: RECORD_FILE, both trainers'), written last, beside
# STATE_FILE, which names it under RECORD. It is hashed in the background, while training goes on (`save`).
RECORD = "record"
FILL_MASK_FILE = "fill_mask_examples.json"  # the summary's fill-mask examples (all_results.json: metrics only)
MODEL_FILES_DIR = ".model_files"  # the config, tokenizer and code every checkpoint links to (loadable.py)


def set_aside(path: Path, why: str) -> Path:
    """`path` renamed with `why` after its name (step_10.damaged; step_10.damaged-2 where an earlier one took that
    name), out of the step_N a run resumes from or writes; returns the new path."""
    names = (f"{path.name}.{why}{f'-{n}' if n > 1 else ''}" for n in itertools.count(1))
    target = next(path.with_name(name) for name in names if not path.with_name(name).exists())
    path.rename(target)
    return target


class StepCheckpoints:
    """`output_dir/step_N` folders holding accelerate's full state plus `training_state.json`.

    A checkpoint is written into `.tmp-step_N` and renamed when complete, so a kill at any moment leaves the
    previous checkpoints untouched and never a half-written `step_N`.
    """

    def __init__(
        self,
        output_dir,
        accelerator,
        total_limit: int | None = None,
        schedule=None,
        schedule_plan: dict | None = None,
        model_files=None,
        expected_bytes: int | None = None,
    ):
        """`schedule`: the learning-rate schedule, saved and restored with the state (as JSON, not accelerate's
        pickle), with `schedule_plan` beside its position (`schedule.SchedulePlan.record`); `model_files`: the
        config, tokenizer and code linked into each (`loadable.ModelFiles`, on the main process); `expected_bytes`:
        a checkpoint's size before the first is written, for the line a failed write gives."""
        self.output_dir = Path(output_dir)
        self.accelerator = accelerator
        self.total_limit = total_limit
        self.schedule, self.model_files, self.expected_bytes = schedule, model_files, expected_bytes
        self.schedule_plan = schedule_plan
        self._recording: threading.Thread | None = None  # the newest checkpoint's record being written (main)
        self._checked: Path | None = None  # the checkpoint `latest` found intact (main): not hashed again by `load`

    def intact(self) -> str:
        """What a run stopped by a failed write can go on from."""
        found = self.complete()
        if not found:
            return "no checkpoint is complete yet: free space (or fix the folder), then run again"
        return f"{found[-1][1].name} is complete: free space (or fix the folder), then --resume_from_checkpoint latest"

    @staticmethod
    def complete_in(output_dir) -> list[tuple[int, Path]]:
        found = []
        output_dir = Path(output_dir)
        if output_dir.is_dir():
            for path in output_dir.iterdir():
                match = STEP_DIR.match(path.name)
                if match and (path / STATE_FILE).is_file():
                    found.append((int(match.group(1)), path))
        return sorted(found)

    def complete(self) -> list[tuple[int, Path]]:
        return self.complete_in(self.output_dir)

    @staticmethod
    def problem(path: Path) -> str | None:
        """Why `path` cannot be resumed from, or None when it is a complete checkpoint."""
        if not path.exists():
            return "no such folder"
        if not path.is_dir():
            return "not a folder"
        if not (path / STATE_FILE).is_file():
            return (
                f"not a complete checkpoint (no {STATE_FILE}; a save that was interrupted leaves such a folder, "
                "and step_N folders written by this script end with it)"
            )
        return None

    def resolve(self, value: str) -> Path | None:
        if value == "latest":
            return self.newest_finite_or_none()
        path = Path(value)
        problem = self.problem(path)
        if problem:
            raise InputError(f"{path}: {problem}")
        return path

    def newest_finite_or_none(self) -> Path | None:
        """--resume_from_checkpoint latest: the newest complete checkpoint with finite weights. Newer ones, with
        non-finite weights (saved by a run that did not check its weights before a checkpoint), are renamed
        `step_N.non-finite`, with a line, so that the resumed run writes its own step_N; when none is finite, the
        run stops (pretraining/training/divergence.py)."""
        found = [path for _, path in self.complete()]
        if self.accelerator.is_main_process:
            found = self._pass_over_damaged(found)
        found = broadcast_object_list([found])[0]
        # the weights are read once, by the first process, not by every process of the run
        newest = broadcast_object_list([newest_finite(found) if self.accelerator.is_main_process else None])[0]
        if newest is None and found:
            raise InputError(
                f"--resume_from_checkpoint latest: every checkpoint in {self.output_dir} holds "
                "non-finite weights (a run that diverged): pass --overwrite_output_dir to start over"
            )
        if newest is None:
            logger.info("--resume_from_checkpoint latest: no checkpoint in %s, starting from scratch", self.output_dir)
            return None
        passed = found[found.index(newest) + 1 :]
        self.accelerator.wait_for_everyone()  # every process has read them before one is renamed
        if passed and self.accelerator.is_main_process:
            for path in passed:
                set_aside(path, "non-finite")
            logger.warning(
                "--resume_from_checkpoint latest: %s held non-finite weights (a run that diverged): "
                "renamed *.non-finite; resuming from %s",
                ", ".join(p.name for p in passed),
                newest.name,
            )
        self.accelerator.wait_for_everyone()
        return newest

    def _pass_over_damaged(self, found: list[Path]) -> list[Path]:
        """`found` (oldest first) up to its newest intact checkpoint: newer damaged ones are renamed
        `step_N.damaged`, with a line each, so that the resumed run writes its own step_N."""
        while found and (damage := self.damage(found[-1])) is not None:
            path = found.pop()
            set_aside(path, "damaged")
            logger.warning(
                "--resume_from_checkpoint latest: passed over %s (%s), renamed %s.damaged", path.name, damage, path.name
            )
        self._checked = found[-1] if found else None
        return found

    @staticmethod
    def damage(path: Path) -> str | None:
        """What differs in checkpoint `path` from the record written with it ('FILE: what'), or None. One written
        before checkpoints held a record is resumed unchecked, with a line."""
        try:
            state = json.loads((path / STATE_FILE).read_text())
        except (OSError, ValueError) as error:
            return f"{STATE_FILE}: {first_line(error)}"
        named = state.get(RECORD) if isinstance(state, dict) else None
        if named is None:
            logger.warning("%s: its files are not checked", checkpoint_files.unrecorded(path))
            return None
        if named != RECORD_FILE:
            return f"{STATE_FILE}: '{RECORD}' names {named!r}, not {RECORD_FILE}"
        if not (path / RECORD_FILE).is_file():
            logger.warning(
                "%s: its record (%s) was never written (the run ended while hashing the files): its files "
                "are not checked",
                path,
                RECORD_FILE,
            )
            return None
        return checkpoint_files.recorded_damage(path)

    def wait_for_record(self) -> None:
        """The newest checkpoint's record is written (main process; nothing to wait for elsewhere). Before a
        checkpoint is read, uploaded or rotated away, and before the next one; the interpreter's exit waits too."""
        if self._recording is not None:
            self._recording.join()
            self._recording = None

    def _record_in_background(self, folder: Path) -> None:
        """Hashes `folder`'s files while training goes on (a save would take twice as long at base size:
        BENCHMARKS.md, "The checkpoint record") and writes the record last; only then are the checkpoints beyond
        --checkpoints_total_limit removed, so a kill while hashing leaves the one before in place. A failure to
        write the record is a line, and the checkpoint resumes unchecked (the older ones stay)."""

        def write():
            try:
                checkpoint_files.write_record(folder, RECORD_FILE)
            except OSError as error:
                logger.warning(
                    "%s: its record of the files could not be written (%s): it resumes unchecked, and the "
                    "checkpoints before it are kept",
                    folder,
                    first_line(error),
                )
                return
            self._rotate()

        self._recording = threading.Thread(target=write, name="albert_hf checkpoint record", daemon=False)
        self._recording.start()

    def load(self, path: Path, window_length: int) -> dict:
        """Restores accelerate's state from `path` (model, optimizer, RNGs) and the schedule's, and returns the
        loop's position (`training_state.json`, checked once here: the position, and the logging window of
        `window_length` sums when saved). First the files are checked against their record; nothing is unpickled
        with code. A checkpoint that cannot be loaded, or a state that cannot be restored, stops with one line."""
        from safetensors import SafetensorError
        from torch.distributed.checkpoint.api import CheckpointException

        self.wait_for_record()
        fault = None
        if self.accelerator.is_main_process and path != self._checked and (damage := self.damage(path)) is not None:
            fault = f"--resume_from_checkpoint {path}: {damage}{self.earlier_than(path)}"
        fault = shared_fault(self.accelerator, fault, main_only=True)
        if fault is None:
            fault = shared_fault(self.accelerator, self._unreadable_random_state(path))
        if fault is not None:
            raise InputError(fault)
        legacy_schedule = (
            self.schedule is not None
            and not (path / SCHEDULE_FILE).exists()
            and (path / LEGACY_SCHEDULE_FILE).is_file()
        )
        if legacy_schedule:  # accelerate reads it into the schedule, as data (weights_only_loads)
            self.accelerator.register_for_checkpointing(self.schedule)
        try:
            with checkpoint_files.weights_only_loads():
                self.accelerator.load_state(str(path))
            state = json.loads((path / STATE_FILE).read_text())
        except (
            OSError,
            RuntimeError,
            ValueError,
            KeyError,
            EOFError,
            pickle.UnpicklingError,
            SafetensorError,
            CheckpointException,
        ) as error:  # CheckpointException: a sharded state's reader failed
            culprit = checkpoint_files.unreadable(path)
            raise InputError(
                f"--resume_from_checkpoint {path}: cannot load {culprit or f'it: {first_line(error)}'}"
                f"{self.earlier_than(path)}"
            ) from None
        finally:
            if legacy_schedule:  # saved as data from now on (save)
                self.accelerator._custom_objects.remove(self.schedule)
        fault = self._random_state_not_restored(path)
        if fault is None and not legacy_schedule and self.schedule is not None:
            fault = self._restore_schedule(path)
        fault = shared_fault(self.accelerator, fault)
        if fault is not None:
            raise InputError(f"--resume_from_checkpoint {path}: {fault}")
        return checked_position(path, state, window_length)

    @classmethod
    def earlier_than(cls, path: Path) -> str:
        """'; the newest earlier intact checkpoint is ...: --resume_from_checkpoint ...', or that there is none."""
        match = STEP_DIR.match(Path(path).name)
        step = int(match.group(1)) if match else None
        earlier = [
            found
            for n, found in cls.complete_in(Path(path).parent)
            if found != Path(path) and (step is None or n < step)
        ]
        return f"; {checkpoint_files.newest_intact(earlier, cls.damage)}"

    def _random_states(self, path: Path):
        """This process's random states in checkpoint `path`, read as data (as accelerate reads them)."""
        from accelerate.utils.other import TORCH_SAFE_GLOBALS

        with torch.serialization.safe_globals(TORCH_SAFE_GLOBALS):
            return torch.load(path / RANDOM_STATE_FILE.format(self.accelerator.process_index), weights_only=True)

    def _unreadable_random_state(self, path: Path) -> str | None:
        """Why this process's random states cannot be restored from `path`, or None (accelerate skips them with a
        debug line: exact resume would be lost in silence)."""
        name = RANDOM_STATE_FILE.format(self.accelerator.process_index)
        if not (path / name).is_file():
            return (
                f"--resume_from_checkpoint {path}: {name}: missing (process {self.accelerator.process_index}'s "
                "random states; resume with the number of processes that wrote it)"
            )
        try:
            states = self._random_states(path)
        except Exception:  # noqa: BLE001 - named by what cannot be read
            return f"--resume_from_checkpoint {path}: cannot load {checkpoint_files.unreadable(path, [name])}"
        wanted = ["random_state", "numpy_random_seed", "torch_manual_seed"]
        if not isinstance(states, dict) or not all(key in states for key in wanted):
            return f"--resume_from_checkpoint {path}: {name}: not the random states accelerate writes"
        return None

    def _random_state_not_restored(self, path: Path) -> str | None:
        """After accelerate's load: its generators hold the saved states, or the line of which did not."""
        saved = self._random_states(path)
        restored = {
            "random_state": random.getstate() == saved["random_state"],
            "numpy_random_seed": all(
                np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
                for a, b in zip(np.random.get_state(), saved["numpy_random_seed"])
            ),
            "torch_manual_seed": torch.equal(torch.get_rng_state(), saved["torch_manual_seed"]),
        }
        lost = [key for key, same in restored.items() if not same]
        if lost:
            return (
                f"{RANDOM_STATE_FILE.format(self.accelerator.process_index)}: could not be restored "
                f"({', '.join(lost)}): the run would not continue as it would have"
            )
        return None

    def _restore_schedule(self, path: Path) -> str | None:
        """The schedule's position from SCHEDULE_FILE, checked against the schedule's own fields; or why not."""
        current = self.schedule.state_dict()
        try:
            saved = json.loads((path / SCHEDULE_FILE).read_text())
        except FileNotFoundError:
            return f"{SCHEDULE_FILE}: missing (the learning-rate schedule's position)"
        except (OSError, ValueError) as error:
            return f"{SCHEDULE_FILE}: {first_line(error)}"
        if isinstance(saved, dict):
            saved.pop(PLAN_KEY, None)  # the run's plan, checked before the run began (pretraining/schedule.py)

        def same_shape(value, like) -> bool:
            if isinstance(like, bool) or like is None:
                return type(value) is type(like)
            if isinstance(like, (int, float)):
                return type(value) in (int, float) and (type(like) is float or type(value) is int)
            if isinstance(like, list):
                return isinstance(value, list) and len(value) == len(like) and all(map(same_shape, value, like))
            return value == like  # the schedule's function: made from the arguments, never read from the file

        if not (
            isinstance(saved, dict)
            and saved.keys() == current.keys()
            and all(same_shape(saved[key], current[key]) for key in current)
        ):
            return f"{SCHEDULE_FILE}: not the state of this run's learning-rate schedule ({', '.join(current)})"
        self.schedule.load_state_dict(saved)
        return None

    def stream_state(self, path: Path) -> dict:
        """This process's stream position saved in checkpoint `path` (`save(..., stream_state=...)`)."""
        file = path / STREAM_STATE_FILE.format(self.accelerator.process_index)
        if not file.is_file():
            written = len(list(path.glob(STREAM_STATE_FILE.format("*"))))
            raise InputError(
                f"--resume_from_checkpoint {path}: it holds the stream positions of {written} "
                f"process(es), none for process {self.accelerator.process_index}: resume a --streaming "
                "run with --streaming and the number of processes that wrote it"
            )
        try:
            state = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            raise InputError(f"--resume_from_checkpoint {path}: {file.name}: {first_line(error)}") from None
        if not isinstance(state, dict):
            raise InputError(f"--resume_from_checkpoint {path}: {file.name}: not a stream position")
        return state

    def save(self, step: int, state: dict, stream_state: dict | None = None, full_model=None) -> Path:
        """A collective: the full training state into step_N, with the model's files (loadable.py: links
        to the run's `model_files`, and under FSDP `full_model`'s gathered weights, on the main process)."""
        final = self.output_dir / f"step_{step}"
        tmp = self.output_dir / f".tmp-step_{step}"
        # Every process must make the same collective calls (save_state, wait_for_everyone). Whether the checkpoint
        # already exists (a run resumed from an older step) is therefore decided once, by the main process: a
        # slower process that looked for itself could see the folder the main process had just renamed into
        # place, skip the calls, and leave the others waiting forever.
        self.wait_for_record()  # the previous one's, before rotation may remove it
        exists = (final / STATE_FILE).is_file() if self.accelerator.is_main_process else None
        if broadcast_object_list([exists])[0]:
            return final

        def write_state():
            self.accelerator.save_state(str(tmp))
            tmp.mkdir(parents=True, exist_ok=True)
            if stream_state is not None:  # each process's own position in its own stream
                (tmp / STREAM_STATE_FILE.format(self.accelerator.process_index)).write_text(json.dumps(stream_state))
            if self.schedule is not None and self.accelerator.is_main_process:
                saved = self.schedule.state_dict() | ({PLAN_KEY: self.schedule_plan} if self.schedule_plan else {})
                (tmp / SCHEDULE_FILE).write_text(json.dumps(saved))
            if self.accelerator.is_main_process:
                if full_model is not None:  # FSDP: the state holds shards only
                    full_model.save_pretrained(tmp)
                if self.model_files is not None:
                    checkpoint_files.link_files(self.model_files.folder(), tmp)

        def complete():
            # complete from here; the record of what every process wrote follows (`_record_in_background`)
            (tmp / STATE_FILE).write_text(json.dumps({**state, RECORD: RECORD_FILE}, indent=2))
            if final.exists():  # an incomplete leftover of the same name
                shutil.rmtree(final)
            os.replace(tmp, final)

        # save_state has every process write its own files (its random states) and returns without waiting for
        # the others: the folder is renamed only once all of them have written, or a slower process would write
        # into a folder that is gone (seen with one process delayed). The collective also tells every process
        # whether any write failed.
        fault = shared_fault(self.accelerator, write_fault(write_state))
        if fault is None and self.accelerator.is_main_process:
            fault = write_fault(complete)
        fault = shared_fault(self.accelerator, fault, main_only=True)
        if fault is not None:
            written = folder_bytes(tmp)
            # every process has measured it before it goes: a process still walking the folder while the main
            # process removed it failed on a vanished file (exit 1, seen once in ~20 runs under load)
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)  # the space it holds is free again at once
            self.accelerator.wait_for_everyone()
            needed = max(written, self.expected_bytes or 0, self.newest_bytes())
            raise StorageError(fault_line(fault, f"the step-{step} checkpoint", self.output_dir, needed, self.intact()))
        if self.accelerator.is_main_process:
            self._record_in_background(final)
        self.accelerator.wait_for_everyone()
        return final

    def newest_bytes(self) -> int:
        found = self.complete()
        return folder_bytes(found[-1][1]) if found else 0

    def _rotate(self):
        if self.total_limit:
            for _, path in self.complete()[: -self.total_limit]:
                shutil.rmtree(path, ignore_errors=True)


def remove_partial(output_dir: Path, accelerator) -> None:
    """What saves killed before their rename left (`.tmp-step_N`), removed before a run starts (a collective)."""
    if accelerator.is_main_process and Path(output_dir).is_dir():
        for path in Path(output_dir).glob(".tmp-step_*"):
            shutil.rmtree(path, ignore_errors=True)
    accelerator.wait_for_everyone()
