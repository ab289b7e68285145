"""A pretraining run's training state in its output folder: step_N checkpoints written atomically and resumed, and
an earlier run recognised (refused, or cleared with --overwrite_output_dir) by the names it writes. The final model
beside them is final_folder.py's."""

import json
import logging
import os
import pickle
import re
import shutil
from pathlib import Path

from accelerate.utils import broadcast_object_list

from ..errors import InputError, first_line
from ..runtime.output_lock import in_use
from ..runtime.storage import StorageError, agreed, fault_line, folder_bytes, refused
from .divergence import newest_finite

logger = logging.getLogger("albert_hf.pretraining.job")

STEP_DIR = re.compile(r"^step_(\d+)$")
STATE_FILE = "training_state.json"  # written last: a step_N folder without it is not a checkpoint
STREAM_STATE_FILE = "stream_state_{}.json"  # --streaming: each process's position in its stream (datasets' state)
FILL_MASK_FILE = "fill_mask_examples.json"  # the summary's fill-mask examples (all_results.json: metrics only)


# What a run writes into --output_dir: an earlier run is recognised (and, with --overwrite_output_dir, cleared)
# by these names only, so unrelated files a user keeps there are neither a reason to refuse nor deleted.
RUN_OUTPUTS = ("step_*", ".tmp-*", "runs", "metrics.jsonl", "all_results.json", "README.md", "config.json",
               "model.safetensors", "model-*.safetensors", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "special_tokens_map.json", "spiece.model", "configuration_albert_hf.py",
               "modeling_albert_hf.py", FILL_MASK_FILE, "pairs", "prepared_data.json",
               "training_curves.png")


def previous_run_files(output_dir) -> list[str]:
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted({path.name for pattern in RUN_OUTPUTS for path in output_dir.glob(pattern)})


def from_hub(resume_from_checkpoint: str | None) -> bool:
    """Whether --resume_from_checkpoint names a Hub repo's pushed state (`hub`, `hub:REPO[@REVISION]`:
    pretraining/hub_push.py) rather than a local checkpoint."""
    return resume_from_checkpoint == "hub" or (resume_from_checkpoint or "").startswith("hub:")


def check_output_dir(output_dir, resume_from_checkpoint: str | None, overwrite_output_dir: bool) -> None:
    """Stops with one line, before any work, on a --resume_from_checkpoint folder that cannot be resumed, or on an
    --output_dir holding an earlier run that the arguments neither continue nor overwrite."""
    busy = in_use(output_dir, "--output_dir")  # a live run's folder: named as such, whatever else it holds
    if busy:
        raise InputError(busy)
    if resume_from_checkpoint not in (None, "latest") and not from_hub(resume_from_checkpoint):
        problem = StepCheckpoints.problem(Path(resume_from_checkpoint))
        if problem:
            raise InputError(f"--resume_from_checkpoint {resume_from_checkpoint}: {problem}")
    earlier = previous_run_files(output_dir)
    if earlier and not overwrite_output_dir:
        has_checkpoint = bool(StepCheckpoints.complete_in(output_dir))
        if resume_from_checkpoint is None:
            resumable = ("pass --resume_from_checkpoint latest to continue it" if has_checkpoint
                         else "it left no complete step_N checkpoint for --resume_from_checkpoint latest")
            raise InputError(f"--output_dir {output_dir} holds an earlier run ({', '.join(earlier[:4])}"
                             f"{', ...' if len(earlier) > 4 else ''}): {resumable}; pass --overwrite_output_dir to "
                             "start over, or another --output_dir")
        if resume_from_checkpoint == "latest" and not has_checkpoint:
            raise InputError(f"--resume_from_checkpoint latest: --output_dir {output_dir} holds an "
                             "earlier run but no complete step_N checkpoint to continue from; pass "
                             "--overwrite_output_dir to start over, or another --output_dir")


def truncate_metrics_log(path: Path, step: int) -> None:
    """Keep the rows up to `step`: a resumed run logs the later ones again. A row cut short by a kill is dropped."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", 0) <= step:
            kept.append(line + "\n")
    path.write_text("".join(kept))


def clear_previous_run(output_dir) -> list[str]:
    """Delete what an earlier run wrote into output_dir (for --overwrite_output_dir); returns the names."""
    names = previous_run_files(output_dir)
    for name in names:
        path = Path(output_dir) / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return names


class StepCheckpoints:
    """`output_dir/step_N` folders holding accelerate's full state plus `training_state.json`.

    A checkpoint is written into `.tmp-step_N` and renamed when complete, so a kill at any moment leaves the
    previous checkpoints untouched and never a half-written `step_N`.
    """

    def __init__(self, output_dir, accelerator, total_limit=None):
        self.output_dir = Path(output_dir)
        self.accelerator = accelerator
        self.total_limit = total_limit
        self.expected_bytes: int | None = None  # a checkpoint's size before the first is written (prepare sets it)

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
            return (f"not a complete checkpoint (no {STATE_FILE}; a save that was interrupted leaves such a folder, "
                    "and step_N folders written by this script end with it)")
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
        """--resume_from_checkpoint latest: the newest complete checkpoint with finite weights. Newer ones, written
        with non-finite weights by a run that diverged (before versions that check), are renamed
        `step_N.non-finite`, with a line, so that the resumed run writes its own step_N; when none is finite, the
        run stops (pretraining/divergence.py)."""
        found = [path for _, path in self.complete()]
        # the weights are read once, by the first process, not by every process of the run
        newest = broadcast_object_list([newest_finite(found) if self.accelerator.is_main_process else None])[0]
        if newest is None and found:
            raise InputError(f"--resume_from_checkpoint latest: every checkpoint in {self.output_dir} holds "
                             "non-finite weights (a run that diverged): pass --overwrite_output_dir to start over")
        if newest is None:
            logger.info("--resume_from_checkpoint latest: no checkpoint in %s, starting from scratch", self.output_dir)
            return None
        passed = found[found.index(newest) + 1:]
        self.accelerator.wait_for_everyone()  # every process has read them before one is renamed
        if passed and self.accelerator.is_main_process:
            for path in passed:
                path.rename(path.with_name(f"{path.name}.non-finite"))
            logger.warning("--resume_from_checkpoint latest: %s held non-finite weights (a run that diverged): "
                           "renamed *.non-finite; resuming from %s", ", ".join(p.name for p in passed), newest.name)
        self.accelerator.wait_for_everyone()
        return newest

    def load(self, path: Path, window_length: int) -> dict:
        """Restores accelerate's state from `path` (model, optimizer, scheduler, RNGs) and returns the loop's
        position (`training_state.json`, checked once here: the position, and the logging window of
        `window_length` sums when saved); a checkpoint that cannot be loaded stops with one line."""
        from safetensors import SafetensorError

        try:
            self.accelerator.load_state(str(path))
            state = json.loads((path / STATE_FILE).read_text())
        except (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError,
                SafetensorError) as error:
            raise InputError(f"--resume_from_checkpoint {path}: cannot load it: {first_line(error)}"
                             f"{self.earlier_than(path)}") from None
        positions = ("step", "epoch", "batches_in_epoch")
        if not isinstance(state, dict) or not all(type(state.get(key)) is int and state[key] >= 0 for key in positions):
            raise InputError(f"--resume_from_checkpoint {path}: {STATE_FILE} does not hold the loop's position "
                             f"({', '.join(positions)}: integers >= 0)")
        if "window" in state:
            sums = state["window"]
            if not (isinstance(sums, list) and len(sums) == window_length and all(
                    type(v) in (int, float) for v in [*sums, state.get("window_tokens"), state.get("window_seconds")])):
                raise InputError(f"--resume_from_checkpoint {path}: the logging window in its training state is "
                                 f"not {window_length} + 2 numbers")
        skips = ("skipped_steps", "window_skipped", "consecutive_skips")  # written since skipped steps were counted
        if not all(type(state.get(key, 0)) is int and state.get(key, 0) >= 0 for key in skips):
            raise InputError(f"--resume_from_checkpoint {path}: {STATE_FILE}: the skipped-step counts "
                             f"({', '.join(skips)}) are not integers >= 0")
        return state

    @classmethod
    def earlier_than(cls, path: Path) -> str:
        """'; the newest earlier checkpoint is ...: --resume_from_checkpoint ...', or nothing when there is none."""
        match = STEP_DIR.match(Path(path).name)
        step = int(match.group(1)) if match else None
        earlier = [found for n, found in cls.complete_in(Path(path).parent)
                   if found != Path(path) and (step is None or n < step)]
        if not earlier:
            return "; no earlier complete checkpoint is beside it"
        return f"; the newest earlier complete checkpoint is {earlier[-1]}: --resume_from_checkpoint {earlier[-1]}"

    def remove_partial(self):
        if self.accelerator.is_main_process and self.output_dir.is_dir():
            for path in self.output_dir.glob(".tmp-step_*"):
                shutil.rmtree(path, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def stream_state(self, path: Path) -> dict:
        """This process's stream position saved in checkpoint `path` (`save(..., stream_state=...)`)."""
        file = path / STREAM_STATE_FILE.format(self.accelerator.process_index)
        if not file.is_file():
            written = len(list(path.glob(STREAM_STATE_FILE.format("*"))))
            raise InputError(f"--resume_from_checkpoint {path}: it holds the stream positions of {written} "
                             f"process(es), none for process {self.accelerator.process_index}: resume a --streaming "
                             "run with --streaming and the number of processes that wrote it")
        return json.loads(file.read_text())

    def save(self, step: int, state: dict, stream_state: dict | None = None) -> Path:
        final = self.output_dir / f"step_{step}"
        tmp = self.output_dir / f".tmp-step_{step}"
        # Every process must make the same collective calls (save_state, wait_for_everyone). Whether the checkpoint
        # already exists (a run resumed from an older step) is therefore decided once, by the main process: a
        # slower process that looked for itself could see the folder the main process had just renamed into
        # place, skip the calls, and leave the others waiting forever.
        exists = (final / STATE_FILE).is_file() if self.accelerator.is_main_process else None
        if broadcast_object_list([exists])[0]:
            return final

        def write_state():
            self.accelerator.save_state(str(tmp))
            if stream_state is not None:  # each process's own position in its own stream
                tmp.mkdir(parents=True, exist_ok=True)
                (tmp / STREAM_STATE_FILE.format(self.accelerator.process_index)).write_text(json.dumps(stream_state))

        def complete():
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2))
            if final.exists():  # an incomplete leftover of the same name
                shutil.rmtree(final)
            os.replace(tmp, final)
            self._rotate()  # only now that the new checkpoint is complete

        # save_state has every process write its own files (its random states) and returns without waiting for
        # the others: the folder is renamed only once all of them have written, or a slower process would write
        # into a folder that is gone (seen with one process delayed). The collective also tells every process
        # whether any write failed.
        fault = agreed(self.accelerator, refused(write_state))
        if fault is None and self.accelerator.is_main_process:
            fault = refused(complete)
        fault = agreed(self.accelerator, fault, main_only=True)
        if fault is not None:
            written = folder_bytes(tmp)
            # every process has measured it before it goes: a process still walking the folder while the main
            # process removed it failed on a vanished file (exit 1, seen once in ~20 runs under load)
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_main_process:
                shutil.rmtree(tmp, ignore_errors=True)  # the space it holds is free again at once
            self.accelerator.wait_for_everyone()
            needed = max(written, self.expected_bytes or 0, self.newest_bytes())
            raise StorageError(fault_line(fault, f"the step-{step} checkpoint", self.output_dir, needed,
                                        self.intact()))
        self.accelerator.wait_for_everyone()
        return final

    def newest_bytes(self) -> int:
        found = self.complete()
        return folder_bytes(found[-1][1]) if found else 0

    def _rotate(self):
        if self.total_limit:
            for _, path in self.complete()[: -self.total_limit]:
                shutil.rmtree(path, ignore_errors=True)


def clear_earlier_run(output_dir: Path):
    """--overwrite_output_dir: what an earlier run wrote into output_dir is deleted, and logged."""
    cleared = clear_previous_run(output_dir)
    if cleared:
        logger.info("--overwrite_output_dir: deleted the earlier run's %s", ", ".join(cleared))
