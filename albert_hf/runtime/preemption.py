"""Stopping when a scheduler asks: SIGTERM (preemption, `scancel`, the end of a SLURM time limit with
`--signal=TERM@120`), SIGUSR1 (SLURM's usual early-warning signal) and SIGINT (Ctrl-C).

Without this, such a signal kills the run at once and every step since the last checkpoint is lost. With it, what a
signal does depends on whether the run has anything to save:
- Before the first optimizer step (reading the corpus, training the tokenizer, building the pairs, the model, the
  first step with its compilation or graph capture), there is nothing to save: the signal interrupts at once
  (`Stopped`, a KeyboardInterrupt, so that libraries clean up their temporary files) and the entry point prints one
  line naming the stage (`stop_line`) and exits with status `PREEMPTED`.
- From then on a signal only records that a stop was asked for. The training loop looks at that between optimizer
  steps: every process finishes the step it is in, a complete checkpoint is written with the usual atomic step_N
  protocol, and the run exits with status `PREEMPTED` (75, sysexits' EX_TEMPFAIL: "try again later") and one line
  saying how to continue. Further signals while that happens are noted and ignored, so a launcher that forwards the
  scheduler's signal a second time cannot interrupt the save (SIGKILL still can; the previous checkpoints then stay
  whole).

Schedulers often signal every process of a job, not only the main one: SLURM every process of a job step, `timeout`
and a terminal the whole process group. The workers a run forks while a `StopOnSignal` is active (DataLoader
workers, `datasets`' `num_proc` pool and its manager) therefore leave the decision to their parent (`shield_child`):
the stop signals no longer end them, their parent's SIGTERM (how DataLoader and multiprocessing end their workers)
still does, and they leave when their parent is gone.

In a multi-process run the signal may reach one process only (a scheduler that signals one task, a Ctrl-C in one
terminal of a multi-node run). The processes agree on it at every step boundary with one tiny all-reduce, so all of
them stop after the same step and take part in the same checkpoint. Each boundary reads the all-reduce of the one
before (long arrived), so on a GPU the poll never waits for the queued work: the stop comes one step later.
"""

import contextlib
import logging
import mmap
import os
import signal
import sys
import threading
import time

import psutil
import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

PREEMPTED = 75  # exit status after a stop on a signal, with a checkpoint written (sysexits.h EX_TEMPFAIL)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Stopped(KeyboardInterrupt):
    """A stop signal that arrived while the run had nothing to save: `stage` is what it interrupted."""

    def __init__(self, signum: int, stage: str):
        super().__init__(f"{signal.Signals(signum).name} while {stage}")
        self.signum, self.stage = signum, stage


_active: "StopOnSignal | None" = None  # the innermost StopOnSignal in effect in this process
_ended_by: "StopOnSignal | None" = None  # the one that received a signal, for the entry point's line
# One byte this process shares with the workers it forks: 1 once a stop signal has interrupted it (`_interrupt`),
# before it ends them (a pool's terminate, `end_children`); read by them (`_wait_for_parent`).
_interrupting = mmap.mmap(-1, 1)


class StopOnSignal:
    """Within `with StopOnSignal(stage) as stop:`, SIGTERM, SIGINT and SIGUSR1 no longer end the process at once.

    While `stop.stage` names a stage (`at_stage`), the run has nothing to save: the first signal raises `Stopped` in
    the main thread (outside a `deferred()` block). `stop.saving()` (after the first optimizer step) switches to
    recording: the signal sets `stop.received` (the first signal's number) for the training loop to act on. The
    previous handlers come back on exit, and workers forked meanwhile are shielded (`shield_child`).

    `stop.shared_signal()` is what a training loop asks at a step boundary: the signal any process received (the same
    answer in all of them), or None. It is a collective when torch.distributed is initialised: every process must
    call it at the same points.
    """

    def __init__(self, stage: str | None = None, signals=STOP_SIGNALS, until_exit: bool = False):
        self.signals = signals
        self.until_exit = until_exit  # an entry point's: on leaving, the process ends, and a late signal is ignored
        self.stage = stage  # set: nothing to save yet, a signal interrupts this stage; None: a signal is recorded
        self.received: int | None = None
        self.interrupted: str | None = None  # the stage a signal interrupted
        self.quiet = False  # a nested one stopped the run: further signals are ignored
        self._pid = os.getpid()  # the process whose handlers these are
        self._deferring = 0
        self._redelivered = False  # the signal sent again after a fork's hooks (`_after_fork_in_parent`)
        self._previous = {}
        self._outer = None
        self._unraisablehook = None  # the hook in place before this one's (`_swallowed`)
        self._polled = None  # multi-process: the last poll's all-reduced flag on the host, and its copy's event

    def __enter__(self):
        global _active, _ended_by
        if threading.current_thread() is not threading.main_thread():
            return self  # Python runs signal handlers in the main thread only; elsewhere signals keep their effect
        self._pid = os.getpid()
        _register_fork_hooks()
        if _active is None:
            _ended_by = None  # a new outermost one: what ended an earlier one in this interpreter is not its business
            _interrupting[0] = 0
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)
        self._unraisablehook, sys.unraisablehook = sys.unraisablehook, self._swallowed
        self._outer, _active = _active, self
        # the scripts block them while they import (run_*.py): one that came meanwhile is handled now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
        return self

    def __exit__(self, exc_type, exc, traceback):
        global _active
        if not self._previous:
            return False
        _active = self._outer
        sys.unraisablehook = self._unraisablehook
        if exc_type is not None and self.received is not None and self._outer is not None:
            # stopping: the one it is nested in takes the signals back, and ignores them from now on
            self._outer.received, self._outer.quiet = self._outer.received or self.received, True
        if self.until_exit:
            # The entry point's: the process ends now, and a late signal must not turn that exit (after a stop, or
            # after the run's results) into a kill. Ignored, not handled: Python puts its own handlers back to the
            # default (fatal) ones while the interpreter shuts down. Nested ones give the signals back to it.
            for signum in self._previous:
                signal.signal(signum, signal.SIG_IGN)
            self._previous.clear()
            return False
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False

    def saving(self) -> None:
        """From now on the run has something to save: a signal is recorded for the training loop (`shared_signal`), by
        this StopOnSignal and those it is nested in (whose handlers come back when it ends)."""
        self.raise_if_interrupted()
        stop = self
        while stop is not None:
            stop.stage, stop = None, stop._outer

    def raise_if_interrupted(self) -> None:
        """Stopped again, when the interruption was swallowed on its way (raised inside a finalizer, where Python
        prints it and goes on): the next stage must not start."""
        if self.interrupted is not None:
            raise Stopped(self.received, self.interrupted)

    def _record(self, signum, frame):
        global _ended_by
        if self.quiet or os.getpid() != self._pid:  # a forked worker, before `shield_child` blocks the signals
            return
        if self._redelivered and signum == self.received:  # ours, once the fork's hooks were done
            self._redelivered = False
            if self.stage is not None and not self._deferring and not self.interrupted:
                self._interrupt()
            return
        name = signal.Signals(signum).name
        first = self.received is None
        if first:
            self.received, _ended_by = signum, self
        if self.stage is not None and first:
            if not self._deferring:
                self._interrupt()
            logger.warning("%s received while %s: stopping once this part is complete", name, self.stage)
        elif first:
            logger.warning("%s received: finishing the current step, then saving a checkpoint and stopping", name)
        elif self.interrupted or self.stage is not None:
            logger.warning("%s received again: already stopping", name)
        else:
            logger.warning(
                "%s received again: already stopping; the checkpoint is being written (SIGKILL stops at "
                "once, and the previous checkpoints stay whole)",
                name,
            )

    def _swallowed(self, unraisable) -> None:
        """An interruption raised inside a finalizer or a weakref callback (a garbage collection can run one at any
        moment) is swallowed, and Python prints it with its traceback: ours is raised again at the next stage
        (`raise_if_interrupted`) and ends with the stop line, so it prints nothing. Anything else goes on as before."""
        if not isinstance(unraisable.exc_value, Stopped):
            self._unraisablehook(unraisable)

    def _interrupt(self) -> None:
        self.interrupted = self.stage
        _interrupting[0] = 1
        raise Stopped(self.received, self.stage)

    def _end_deferral(self) -> None:
        self._deferring -= 1
        if not self._deferring and self.received is not None and self.stage is not None and not self.interrupted:
            self._interrupt()

    def shared_signal(self, device=None) -> int | None:
        """The stop signal received by any process (the highest number if several), or None; with several
        processes, as it stood at the previous call (see the module's docstring)."""
        local = self.received or 0
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # every process answers with the previous poll's agreement, the same in all of them
            flag = torch.tensor([local], dtype=torch.int64, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            answer, event = self._polled if self._polled is not None else (torch.zeros(1, dtype=torch.int64), None)
            if event is not None:
                event.synchronize()  # recorded a step ago: done by now
            local = int(answer.numpy()[0])  # a host tensor: no device read
            if flag.device.type == "cuda":  # copied to pinned host memory behind the queued work
                host, event = torch.empty(1, dtype=torch.int64, pin_memory=True), torch.cuda.Event()
                host.copy_(flag, non_blocking=True)
                event.record()
                self._polled = (host, event)
            else:
                self._polled = (flag, None)
        if local and self.received is None:
            self.received = local  # another process got it: this one stops too
        return local or None

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received).name if self.received else None


def at_stage(stage: str) -> None:
    """Names what the run is doing for the stop line, while it has nothing to save (no effect after that, or
    outside a StopOnSignal)."""
    if _active is not None and _active.stage is not None:
        _active.raise_if_interrupted()
        _active.stage = stage


@contextlib.contextmanager
def deferred():
    """A block that a stop signal must not cut in half (files moved into place one by one): a signal that arrives
    within it interrupts at its end."""
    stop = _active
    if stop is None:
        yield
        return
    stop._deferring += 1
    try:
        yield
    finally:
        stop._end_deferral()


def stop_line() -> str | None:
    """The line a run interrupted before it had anything to save ends with (the entry point prints it and exits
    with PREEMPTED), or None when no stop signal interrupted this process."""
    stop = _ended_by
    if stop is None or stop.interrupted is None:
        return None
    return (
        f"Stopped by {stop.name} while {stop.interrupted}, before the first optimizer step: there was nothing "
        "to save. Run the same command again"
    )


def end_children() -> None:
    """SIGTERM from this process to its own children, before it exits after a stop: workers whose owner the
    interruption cut short (a pool or its manager started a moment before) end as their owner would have ended them,
    and none is left for the interpreter's exit to wait on."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            child.terminate()


def shield_child(parent: int, parent_interrupting: mmap.mmap) -> None:
    """In a worker just forked from `parent`: the stop signals are blocked in every thread and taken by one that
    waits for them (`_wait_for_parent`). It ends the worker on its parent's SIGTERM (DataLoader's and
    multiprocessing's way of ending workers) and when the parent is gone, and ignores the others: the parent decides
    when the run stops."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # threads started later inherit the mask
    threading.Thread(
        target=_wait_for_parent, args=(parent, parent_interrupting), name="albert_hf stop signals", daemon=True
    ).start()


# How long a worker waits for its parent's SIGTERM after one from another process that may have absorbed it.
ABSORBED_SIGTERM_GRACE = 10.0


def _wait_for_parent(parent: int, parent_interrupting: mmap.mmap) -> None:
    """A pending signal is not queued twice: the parent's SIGTERM, sent while the scheduler's is still pending here,
    is lost in it, and a pool's terminate would wait for this worker for ever. The parent sends it only once
    interrupted (`parent_interrupting`), so only a SIGTERM from another process taken after that can hide it; the
    worker then ends if its parent's has not come within ABSORBED_SIGTERM_GRACE. Not sooner: a worker ended before
    its pool's terminate began may hold the pool's queue lock, which the terminate takes first."""
    deadline = None
    while True:
        info = signal.sigtimedwait(STOP_SIGNALS, 1.0)
        if info is not None and info.si_signo == signal.SIGTERM:
            if info.si_pid == parent:
                os._exit(0)  # as torch's own workers do on their parent's SIGTERM
            if parent_interrupting[0] and deadline is None:
                deadline = time.monotonic() + ABSORBED_SIGTERM_GRACE
        if (deadline is not None and time.monotonic() > deadline) or (info is None and os.getppid() != parent):
            os._exit(0)


def _before_fork() -> None:
    """A signal during a fork's hooks (logging's lock release, say) would raise inside one, where Python prints the
    traceback and goes on: from here to `_after_fork_in_parent` it is recorded only."""
    if _active is not None:
        _active._deferring += 1


def _after_fork_in_parent() -> None:
    stop = _active
    if stop is None:
        return
    stop._deferring -= 1
    if not stop._deferring and stop.received is not None and stop.stage is not None and not stop.interrupted:
        # it came during the fork: the main thread gets it again in a moment, past the hooks, and stops there
        stop._redelivered = True
        threading.Timer(0.01, signal.pthread_kill, (threading.main_thread().ident, stop.received)).start()


_fork_hooks_registered = False


def _register_fork_hooks() -> None:
    """Once, at the first StopOnSignal: registered after the libraries' own hooks, so that ours enclose them (the
    hooks run in reverse order of registration before a fork and in order after it)."""
    global _fork_hooks_registered
    if not _fork_hooks_registered:
        _fork_hooks_registered = True
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


def _after_fork_in_child() -> None:
    global _active, _ended_by, _interrupting
    parent_interrupting, _interrupting = _interrupting, mmap.mmap(-1, 1)  # the parent's; this process's own
    if _active is not None:
        _active, _ended_by = None, None  # the parent's stop: its handlers (`_record` ignores them here), its line
        shield_child(os.getppid(), parent_interrupting)


os.register_at_fork(after_in_child=_after_fork_in_child)
