"""A run's learning-rate schedule over its life, and going on from a checkpoint under it.

- `--lr_scheduler_type official` (the default): the paper's warm-up and linear decay to 0 at --max_train_steps
  (`optimization.get_official_schedule`). Every step's rate depends on the run's length, so the length is fixed: a
  resume with another --max_train_steps is refused.
- `--lr_scheduler_type wsd`: warm-up, the peak held, a 1-sqrt decay over the last --decay_steps
  (`optimization.get_wsd_schedule`). Until the decay starts no rate depends on the length, so
  - a resume from a checkpoint whose decay has not begun may set another --max_train_steps ("extended from N to M
    steps"): it ends as the longer run planned from the start would;
  - `--decay_from OUTPUT_DIR/step_N` trains a decay branch: the decay over --decay_steps from a checkpoint of the
    stable phase, into its own --output_dir, with the checkpoint's full state (and the data where it was).

Each checkpoint records its plan (`SchedulePlan.record`: schedule.json's "plan", beside the schedule's position), so
that a resume or a branch knows where the checkpoint stands: warming up, stable, or decaying. A checkpoint written
before plans were recorded ran the official schedule. The plan is resolved with the arguments (`resolve_schedule`);
a resume's refusals come once the checkpoint's files are checked (`check_resumed`), and a run extended in its own
folder sets aside the later checkpoints of its earlier plan (`superseded`).
"""

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..errors import InputError, first_line
from ..optimization import SCHEDULES, get_official_schedule, get_wsd_schedule
from .output.checkpoints import LEGACY_SCHEDULE_FILE, PLAN_KEY, SCHEDULE_FILE, StepCheckpoints

WARMUP_FRACTION = 0.025  # the official ratio (3125 of 125k steps)
DECAY_FRACTION = 0.2  # wsd's default decay: a fifth of the run (Hägele et al. 2024: then on par with cosine)
DECAY_SHAPE = "1-sqrt"
SCHEDULE_FLAGS = frozenset({"max_train_steps", "num_warmup_steps", "decay_steps"})  # what a resume may take from


@dataclass(frozen=True)
class SchedulePlan:
    """The schedule a run trains on: its kind, warm-up and length, and under wsd the decay's length; a decay branch
    also names the checkpoint it left from (`parent`, at `parent_step`). `extended_from` is the length of the run a
    resume changed, `replaced` a branch's note on the --max_train_steps it replaced (this start's notes only; not
    recorded)."""

    kind: str
    num_warmup_steps: int
    max_train_steps: int
    decay_steps: int | None = None
    parent: str | None = None
    parent_step: int | None = None
    extended_from: int | None = None
    replaced: str | None = None
    # A resume's: the plan the arguments asked for (with `given`, the flags among SCHEDULE_FLAGS they gave), from
    # which the checkpoint loaded is checked once its files are (`check_resumed`).
    requested: "SchedulePlan | None" = field(default=None, compare=False, repr=False)
    given: frozenset = field(default=frozenset(), compare=False, repr=False)

    @property
    def decay_start(self) -> int | None:
        """The last step at the peak (wsd): the decay's rates begin after it."""
        return None if self.decay_steps is None else self.max_train_steps - self.decay_steps

    def phase(self, step: int) -> str:
        """Where a checkpoint at `step` stands: "warming up", "stable", "decaying" (wsd) or "official"."""
        if self.kind == "official":
            return "official"
        if step < self.num_warmup_steps:
            return "warming up"
        return "stable" if step <= self.decay_start else "decaying"

    def make(self, optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        if self.kind == "official":
            return get_official_schedule(optimizer, self.num_warmup_steps, self.max_train_steps)
        return get_wsd_schedule(optimizer, self.num_warmup_steps, self.decay_steps, self.max_train_steps)

    def factors(self, steps) -> list[float]:
        """The peak's multiplier at each of `steps` (the schedule's own function)."""
        probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        factor = self.make(probe).lr_lambdas[0]
        return [factor(step) for step in steps]

    def record(self) -> dict:
        fields = ("kind", "num_warmup_steps", "max_train_steps", "decay_steps", "parent", "parent_step")
        return {name: getattr(self, name) for name in fields}

    @classmethod
    def from_record(cls, value, where: str) -> "SchedulePlan":
        """A checkpoint's recorded plan, checked field by field (it is input)."""
        ints = ("num_warmup_steps", "max_train_steps", "decay_steps", "parent_step")
        if not (
            isinstance(value, dict)
            and value.keys() == {*ints, "kind", "parent"}
            and value["kind"] in SCHEDULES
            and all(value[name] is None or type(value[name]) is int for name in ints)
            and isinstance(value["num_warmup_steps"], int)
            and isinstance(value["max_train_steps"], int)
            and (value["decay_steps"] is None) == (value["kind"] == "official")
            and (value["parent"] is None or isinstance(value["parent"], str))
            and (value["parent"] is None) == (value["parent_step"] is None)
        ):
            raise InputError(f"{where}: {PLAN_KEY!r} is not a learning-rate schedule's plan")
        return cls(**value)

    def results(self) -> dict:
        """all_results.json's account of the schedule: its kind, its decay, and a branch's parent and step."""
        found = {"lr_scheduler_type": self.kind, "num_warmup_steps": self.num_warmup_steps}
        if self.kind == "wsd":
            found |= {"decay_steps": self.decay_steps, "decay_shape": DECAY_SHAPE}
        if self.parent is not None:
            found |= {"decay_branch_parent": self.parent, "decay_branch_step": self.parent_step}
        return found

    def shape(self) -> str:
        """The schedule in words: its kind, warm-up, decay and end."""
        if self.kind == "official":
            return (
                f"the official schedule (warm-up {self.num_warmup_steps} steps, linear decay to 0 at step "
                f"{self.max_train_steps})"
            )
        return (
            f"wsd (warm-up {self.num_warmup_steps} steps, the peak to step {self.decay_start}, {DECAY_SHAPE} decay "
            f"over {self.decay_steps} steps to 0 at step {self.max_train_steps})"
        )

    def card_line(self) -> str:
        """The model card's: the shape, and the run a decay branch left."""
        if self.parent is None:
            return self.shape()
        return (
            f"{self.shape()}: a decay branch of the run in {Path(self.parent).parent}, from its step {self.parent_step}"
        )

    def describe(self) -> str:
        """The start line's: the shape, a branch's parent checkpoint, a resume's change of length."""
        line = f"learning rate: {self.shape()}"
        if self.parent is not None:
            line += f", a decay branch of {self.parent} (step {self.parent_step})"
        if self.extended_from is not None:
            change = "extended" if self.max_train_steps > self.extended_from else "shortened"
            line += f"; {change} from {self.extended_from} to {self.max_train_steps} steps"
        return line if self.replaced is None else f"{line}; {self.replaced}"

    def sketch(self, width: int = 60) -> str:
        """The learning rate over the run in `width` characters (▁ to █: 0 to the peak), for --dry_run."""
        marks = "▁▂▃▄▅▆▇█"
        steps = [round(i * self.max_train_steps / width) for i in range(width)]
        return "".join(marks[min(len(marks) - 1, math.floor(f * len(marks)))] for f in self.factors(steps))


def read_record(checkpoint: Path) -> tuple[SchedulePlan | None, int | None]:
    """(The plan recorded in a step_N checkpoint, or None for one written before plans were recorded; the optimizer
    steps it holds, the schedule's position, None where the schedule is in accelerate's pickle, which only `load`
    reads, as data)."""
    where = f"{checkpoint / SCHEDULE_FILE}"
    try:
        saved = json.loads((checkpoint / SCHEDULE_FILE).read_text())
    except FileNotFoundError:
        if (checkpoint / LEGACY_SCHEDULE_FILE).is_file():  # written before the schedule was data: no plan, no step
            return None, None
        raise InputError(f"{checkpoint}: not a step_N checkpoint of run_pretraining.py (no {SCHEDULE_FILE})") from None
    except (OSError, ValueError) as error:
        raise InputError(f"{where}: {first_line(error)}") from None
    step = saved.get("last_epoch") if isinstance(saved, dict) else None
    if type(step) is not int or step < 0:
        raise InputError(f"{where}: no step count ('last_epoch')")
    plan = SchedulePlan.from_record(saved[PLAN_KEY], where) if PLAN_KEY in saved else None
    return plan, step


def last_stable(folder: Path, plan: SchedulePlan) -> Path | None:
    """The newest complete checkpoint in `folder` whose step is in `plan`'s stable phase, or None."""
    stable = [path for step, path in StepCheckpoints.complete_in(folder) if plan.phase(step) == "stable"]
    return stable[-1] if stable else None


def requested_plan(optimization) -> SchedulePlan:
    """The plan the arguments ask for on a fresh start, defaults filled (warm-up and decay as fractions of the run)."""
    steps = optimization.max_train_steps
    warmup = optimization.num_warmup_steps
    warmup = round(WARMUP_FRACTION * steps) if warmup is None else warmup
    if optimization.lr_scheduler_type == "official":
        return SchedulePlan("official", warmup, steps)
    decay = optimization.decay_steps or max(1, round(DECAY_FRACTION * steps))
    return SchedulePlan("wsd", warmup, steps, decay)


def check_fits(plan: SchedulePlan) -> SchedulePlan:
    """The plan's warm-up and decay fit in its length (the one check of them, on every plan a run starts with)."""
    if plan.num_warmup_steps < 0:
        raise InputError("--num_warmup_steps must be at least 0")
    if plan.num_warmup_steps > plan.max_train_steps:
        raise InputError("--num_warmup_steps exceeds --max_train_steps")
    if plan.kind == "wsd" and plan.num_warmup_steps + plan.decay_steps > plan.max_train_steps:
        raise InputError(
            f"--num_warmup_steps {plan.num_warmup_steps} and --decay_steps {plan.decay_steps} do not fit in "
            f"--max_train_steps {plan.max_train_steps}"
        )
    return plan


def resolve_schedule(optimization, output, explicit: set[str]) -> SchedulePlan:
    """The run's plan: from the arguments, the checkpoint a resume continues (its warm-up and decay kept unless given
    again), or the checkpoint a decay branch leaves from. Stops with one line on what cannot go on."""
    if optimization.decay_steps is not None and optimization.decay_steps < 1:
        raise InputError("--decay_steps must be at least 1")
    if optimization.decay_from:
        if "lr_scheduler_type" in explicit and optimization.lr_scheduler_type != "wsd":
            raise InputError("--decay_from trains the decay of a wsd run: drop --lr_scheduler_type or make it wsd")
        return branch_plan(optimization, output, explicit)
    if optimization.decay_steps is not None and optimization.lr_scheduler_type != "wsd":
        raise InputError("--decay_steps is the decay of --lr_scheduler_type wsd; the official schedule decays all run")
    requested = replace(requested_plan(optimization), given=frozenset(explicit & SCHEDULE_FLAGS))
    source = local_resumed(output)
    if source is None:
        return check_fits(requested)
    try:  # the checkpoint's plan gives what the command does not (and the start line its change of length)
        recorded, step = read_record(source)
        plan = continued(requested, recorded, step, source, requested.given)
    except InputError:  # said once the checkpoint's files are checked, when it is loaded (`check_resumed`)
        plan = requested
    return replace(check_fits(plan), requested=requested)


def local_resumed(output) -> Path | None:
    """The local checkpoint --resume_from_checkpoint names ("latest": the newest step_N of --output_dir), or None
    (none, or a Hub repo's: checked once downloaded, `check_resumed`)."""
    value = output.resume_from_checkpoint
    if not value:
        return None
    if value != "latest":
        path = Path(value)
        return path if (path / SCHEDULE_FILE).is_file() else None
    found = StepCheckpoints.complete_in(output.output_dir)
    return found[-1][1] if found else None


def continued(
    requested: SchedulePlan, recorded: SchedulePlan | None, step: int, source: Path, explicit: set[str]
) -> SchedulePlan:
    """The plan of a resume from `source` (at `step`, its plan `recorded`): the same schedule, under wsd with another
    length while the checkpoint's decay has not begun. What the command does not give (the length, the warm-up, the
    decay) is the checkpoint's."""
    where = f"--resume_from_checkpoint {source}"
    if recorded is not None:
        kept = ["max_train_steps", "num_warmup_steps"] + (["decay_steps"] if recorded.kind == requested.kind else [])
        requested = replace(requested, **{name: getattr(recorded, name) for name in kept if name not in explicit})
    if recorded is None or recorded.kind == "official":
        if requested.kind != "official":
            raise InputError(f"{where}: written under the official schedule: resume it with that schedule")
        if recorded is None:  # written before plans were recorded: its length is not known here
            return requested
        if requested.max_train_steps != recorded.max_train_steps:
            raise InputError(
                f"--max_train_steps {requested.max_train_steps}: {where} was written under the official schedule, "
                f"whose learning rate at every step depends on the run's length ({recorded.max_train_steps} steps): "
                f"resume with --max_train_steps {recorded.max_train_steps}; a run that can be extended trains with "
                "--lr_scheduler_type wsd"
            )
        if requested.num_warmup_steps != recorded.num_warmup_steps:
            raise InputError(f"--num_warmup_steps: {where} warmed up over {recorded.num_warmup_steps} steps")
        return requested
    if requested.kind != "wsd":
        raise InputError(f"{where}: written under --lr_scheduler_type wsd: resume it with that schedule")
    if requested.num_warmup_steps != recorded.num_warmup_steps:
        raise InputError(
            f"--num_warmup_steps {requested.num_warmup_steps}: {where} warmed up over {recorded.num_warmup_steps} steps"
        )
    plan = replace(requested, parent=recorded.parent, parent_step=recorded.parent_step)
    if recorded.phase(step) == "decaying":
        if (plan.max_train_steps, plan.decay_steps) != (recorded.max_train_steps, recorded.decay_steps):
            stable = last_stable(source.parent, recorded)
            instead = (
                f"extend the run from {stable}, the last checkpoint of its stable phase"
                if stable is not None
                else f"no checkpoint of its stable phase is left in {source.parent}"
            )
            raise InputError(
                f"{where}: step {step} is past the start of its decay (step {recorded.decay_start}), so its length "
                f"and decay stay {recorded.max_train_steps} and {recorded.decay_steps} steps; {instead}"
            )
        return plan
    if plan.max_train_steps - plan.decay_steps < step:
        raise InputError(
            f"--max_train_steps {plan.max_train_steps} with a decay of {plan.decay_steps} steps would start the "
            f"decay at step {plan.max_train_steps - plan.decay_steps}, before {source}'s step {step}"
        )
    if plan.max_train_steps != recorded.max_train_steps:
        plan = replace(plan, extended_from=recorded.max_train_steps)
    return plan


def branch_plan(optimization, output, explicit: set[str]) -> SchedulePlan:
    """--decay_from: a decay of --decay_steps (default: its run's) from a checkpoint of a wsd run's stable phase."""
    parent = Path(optimization.decay_from)
    where = f"--decay_from {parent}"
    recorded, step = read_record(parent)
    if recorded is None or recorded.kind == "official":
        raise InputError(
            f"{where}: written under the official schedule, which decays over its whole run: a decay branches off "
            "a run trained with --lr_scheduler_type wsd"
        )
    phase = recorded.phase(step)
    if phase == "warming up":
        raise InputError(
            f"{where}: step {step} is still in the warm-up ({recorded.num_warmup_steps} steps): branch from a "
            "checkpoint of the stable phase"
        )
    if phase == "decaying":
        stable = last_stable(parent.parent, recorded)
        raise InputError(
            f"{where}: step {step} is already decaying (its decay starts after step {recorded.decay_start}): branch "
            "from a checkpoint of the stable phase"
            + (f", such as {stable}" if stable is not None else f"; none is left in {parent.parent}")
        )
    if Path(output.output_dir).resolve() == parent.resolve().parent:
        raise InputError(f"{where}: a decay branch writes its own --output_dir, not its run's ({output.output_dir})")
    if "num_warmup_steps" in explicit and optimization.num_warmup_steps != recorded.num_warmup_steps:
        raise InputError(f"--num_warmup_steps: {where} warmed up over {recorded.num_warmup_steps} steps")
    decay = optimization.decay_steps if "decay_steps" in explicit else recorded.decay_steps
    plan = SchedulePlan("wsd", recorded.num_warmup_steps, step + decay, decay, str(parent), step)
    if "max_train_steps" in explicit and optimization.max_train_steps != plan.max_train_steps:
        plan = replace(
            plan,
            replaced=f"--max_train_steps {optimization.max_train_steps} replaced: the branch ends at step "
            f"{plan.max_train_steps}",
        )
    return plan


def check_resumed(plan: SchedulePlan, checkpoint: Path) -> None:
    """Once the checkpoint loaded (the one "latest" chose, a Hub repo's) has had its files checked: its schedule
    goes on as the run's plan says (`continued` from what the arguments asked, as `resolve_schedule` saw it); or the
    run stops with one line, a refusal of the resume among them."""
    recorded, step = read_record(checkpoint)
    if plan.parent is not None and checkpoint.resolve() == Path(plan.parent).resolve():
        if step != plan.parent_step:
            raise InputError(f"--decay_from {checkpoint}: it holds step {step}, not {plan.parent_step}")
        return
    requested = plan.requested or replace(plan, given=SCHEDULE_FLAGS)  # a branch's: as planned
    resumed = continued(replace(requested, extended_from=None), recorded, step, checkpoint, requested.given)
    plan = replace(plan, extended_from=None, replaced=None)
    if replace(resumed, extended_from=None) != plan:
        raise InputError(
            f"--resume_from_checkpoint {checkpoint}: its schedule ({(recorded or plan).describe()}) is not this "
            f"run's ({plan.describe()})"
        )


def superseded(folder: Path, plan: SchedulePlan, step: int) -> list[Path]:
    """The checkpoints in `folder` past `step` that another plan wrote: a run resumed there under a changed plan (an
    extension) writes its own, which `StepCheckpoints.save` would otherwise take as already written."""
    found = []
    for later, path in StepCheckpoints.complete_in(folder):
        if later <= step:
            continue
        try:
            recorded, _ = read_record(path)
        except InputError:  # not a checkpoint that can be read: left as it is
            continue
        if recorded is not None and recorded.record() != plan.record():  # one written before plans: as before
            found.append(path)
    return found
