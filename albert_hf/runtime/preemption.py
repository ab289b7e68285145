"""Stopping when a scheduler asks: SIGTERM (preemption, `scancel`, the end of a SLURM time limit with
`--signal=TERM@120`), SIGUSR1 (SLURM's usual early-warning signal) and SIGINT (Ctrl-C).

Without this, such a signal kills the run at once and every step since the last checkpoint is lost. With it, a
signal only records that a stop was asked for. The training loop looks at that between optimizer steps: every
process finishes the step it is in, a complete checkpoint is written with the usual atomic step_N protocol, and
the run exits with status `PREEMPTED` (75, sysexits' EX_TEMPFAIL: "try again later") and one line saying how to
continue. Further signals while that happens are noted and ignored, so a launcher that forwards the scheduler's
signal a second time cannot interrupt the save (SIGKILL still can; the previous checkpoints then stay whole).

In a multi-process run the signal may reach one process only (a scheduler that signals one task, a Ctrl-C in one
terminal of a multi-node run). The processes agree on it at every step boundary with one tiny all-reduce, so all of
them stop after the same step and take part in the same checkpoint. Each boundary reads the all-reduce of the one
before (long arrived), so on a GPU the poll never waits for the queued work: the stop comes one step later.
"""

import logging
import signal
import threading

import torch
import torch.distributed as dist

logger = logging.getLogger("albert_hf.runtime.preemption")

PREEMPTED = 75  # exit status after a stop on a signal, with a checkpoint written (sysexits.h EX_TEMPFAIL)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopOnSignal:
    """Within `with StopOnSignal() as stop:`, SIGTERM, SIGINT and SIGUSR1 set `stop.received` (the first signal's
    number) instead of ending the process; the previous handlers come back on exit.

    `stop.agreed()` is what a training loop asks at a step boundary: the signal any process received (the same
    answer in all of them), or None. It is a collective when torch.distributed is initialised: every process must
    call it at the same points.
    """

    def __init__(self, signals=STOP_SIGNALS):
        self.signals = signals
        self.received: int | None = None
        self._previous = {}
        self._polled = None  # multi-process: the last poll's all-reduced flag on the host, and its copy's event

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # Python runs signal handlers in the main thread only; elsewhere signals keep their effect
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._record)
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is SystemExit and self.received is not None:
            # Leaving with the stop status: a late signal must not turn that exit into a kill. Ignored, not handled:
            # Python puts its own handlers back to the default (fatal) ones while the interpreter shuts down.
            for signum in self._previous:
                signal.signal(signum, signal.SIG_IGN)
            return False
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        return False

    def _record(self, signum, frame):
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = signum
            logger.warning("%s received: finishing the current step, then saving a checkpoint and stopping", name)
        else:
            logger.warning("%s received again: already stopping; the checkpoint is being written (SIGKILL stops at "
                           "once, and the previous checkpoints stay whole)", name)

    def agreed(self, device=None) -> int | None:
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
