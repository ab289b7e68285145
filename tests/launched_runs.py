"""Several run_pretraining.py runs in one process (or one launched group of processes), one after the other:

    python tests/launched_runs.py RUNS.json
    python -m accelerate.commands.launch ... tests/launched_runs.py RUNS.json

RUNS.json is a list of {"argv": [...], "env": {...}, "steps_only": false, "hooks": {...}}: each run is
`pretraining.main(argv)` with `env` set on top of the launch's environment for that run only (`steps_only`: `prepare`
and `fit`, no final save; `hooks`: what `with_hooks` plants in that run, for the divergence tests). The runs share the
interpreter and the process group: a launch costs seconds of imports and start-up per process, a tiny run a fraction of
that. Between runs the Accelerator's state is reset, not the process group (`end_distributed` is left to the last). The
first process writes RUNS.json.results: per run, "status" (0, 2 for an `error:` line, or "traceback") and "line" (the
error line or the traceback's last line). A traceback in one run does not stop the others, except in a launched group,
where the other processes may be waiting in a collective: there the launch ends.
"""

import json
import os
import sys
import traceback
from pathlib import Path

import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

from albert_hf.errors import InputError, first_line
from albert_hf.pretraining import job as pretraining
from albert_hf.pretraining.resolution import parse_args
from albert_hf.pretraining.training import loop
from albert_hf.runtime.distributed import end_distributed


def run_once(run: dict, launched_mode) -> dict:
    saved = dict(os.environ)
    os.environ.update(run.get("env", {}))
    undo = with_hooks(run.get("hooks", {}))
    try:
        return _run(run, launched_mode)
    finally:
        undo()
        os.environ.clear()
        os.environ.update(saved)


def with_hooks(hooks: dict):
    """Plants what a run's `hooks` ask for; returns the function that takes it out again.
    - "nan_gradient_at": {"step": k, "rank": r, "accumulation": a}: the loss of the last micro-batch of optimizer
      step k (of a per step) is multiplied by NaN in process r, so that step's gradients are NaN (in every process,
      once synchronised).
    - "dropped_step_at": k: optimizer step k takes its batches and advances the schedule, nothing else: the run
      that dropped that step, to compare with one that skipped it.
    - "fake_hub": ROOT: the Hub is tests/fake_hub.py's, in the folder ROOT (each process patches its own API)."""
    from albert_hf.pretraining.training import step

    undo = []
    if "fake_hub" in hooks:
        from fake_hub import FakeHub

        patches = FakeHub(hooks["fake_hub"]).patched()
        patches.__enter__()
        undo.append(patches.close)
    if "nan_gradient_at" in hooks:
        at, real, calls = hooks["nan_gradient_at"], step.weighted_loss, []

        def poisoned(outputs, batch, weights):
            calls.append(1)
            loss = real(outputs, batch, weights)
            last = len(calls) == at["step"] * at["accumulation"]  # the step's last micro-batch in this process
            return loss * float("nan") if last and int(os.environ.get("RANK", "0")) == at["rank"] else loss

        step.weighted_loss = poisoned
        undo.append(lambda: setattr(step, "weighted_loss", real))
    if "dropped_step_at" in hooks:
        at, real, calls = hooks["dropped_step_at"], loop.optimizer_step, []

        def dropped(run, micro_batches):
            calls.append(1)
            if len(calls) != at:
                return real(run, micro_batches)
            run.optimizer.zero_grad(set_to_none=True)
            run.scheduler.step()
            return torch.zeros(step.GRAD_NORM + 1, dtype=torch.float64, device=run.accelerator.device)  # and a norm

        loop.optimizer_step = dropped  # where fit looks it up
        undo.append(lambda: setattr(loop, "optimizer_step", real))
    return lambda: [restore() for restore in undo]


def _run(run: dict, launched_mode) -> dict:
    # A launched group keeps its process group (PartialState), in the mode accelerate gave it: FSDP on CPUs
    # changes that mode to FSDP in PartialState (distributed._enable_fsdp2_on_cpu), and does so again in each run.
    AcceleratorState._reset_state(reset_partial_state=launched_mode is None)
    if launched_mode is not None and PartialState._shared_state:  # from the second run on
        PartialState._shared_state["distributed_type"] = launched_mode
    try:
        if run.get("steps_only"):
            args = parse_args(run["argv"])
            job = pretraining.prepare(args)
            pretraining.fit(job)
            job.accelerator.wait_for_everyone()
        else:
            pretraining.main(run["argv"])
        return {"status": 0, "line": ""}
    except InputError as error:
        return {"status": 2, "line": f"error: {first_line(error)}"}
    except SystemExit as stop:
        return {"status": stop.code, "line": ""}
    except Exception as error:  # noqa: BLE001 - reported to the test, which fails on it
        traceback.print_exc()
        return {"status": "traceback", "line": f"{type(error).__name__}: {first_line(error)}"}


def main(path: str):
    runs = json.loads(Path(path).read_text())
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    pretraining.end_distributed = lambda accelerator=None, timeout=5.0: 0  # the group serves the next run
    launched_mode = None  # the mode accelerate gives a launched group (CPUs: gloo; GPUs: NCCL)
    if distributed:
        launched_mode = DistributedType.MULTI_GPU if torch.cuda.is_available() else DistributedType.MULTI_CPU
    results = []
    for run in runs:
        results.append(run_once(run, launched_mode))
        if distributed and results[-1]["status"] == "traceback":
            break
    if int(os.environ.get("RANK", "0")) == 0:
        Path(path + ".results").write_text(json.dumps(results))
    end_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
