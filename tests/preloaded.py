"""The scripts the tests start, in processes forked from one interpreter that has already imported the stack.

A fresh interpreter spends about 3 s of CPU importing torch, transformers, accelerate, datasets and albert_hf before
a tiny run does anything, and the suite starts over a hundred such processes: on 2 cores that is a third of its
time. `start` runs `python SCRIPT ...` or `python -m MODULE ...` in a process forked by the standard library's
forkserver, which imports all that once per test worker. What a test sees is what a fresh process gives: a pid of
its own (signals reach it, it can be killed with its children), its own exit status, its stdout and stderr in
files, the command's argv, working folder, environment and `sys.path`, module-level state as just imported (nothing
runs in the server but imports), multiprocessing as in a main process (the default start method, no parent), the
signals a Popen child has (the caller's blocked mask and ignored signals, the rest as a fresh interpreter sets them;
one sent before the script runs is held, not lost), and the interpreter's ending (threads joined, atexit handlers
run).

A command is served this way only where that holds. The rest start as plain subprocesses: another interpreter,
`python -c`, and an environment that differs from the server's in a variable read when a library is imported or the
interpreter starts (thread counts, the CPU ISA caps, the HF_* folders, PYTHON*, TORCH*, CUDA*).

Launchers (`-m accelerate.commands.launch`, `-m torch.distributed.run`) are served too, and so are the workers their
elastic agent starts (each a fresh interpreter under a real launch: a launched test paid 2 x 4 s of imports). Before
the launcher runs, it forks a copy of itself that does nothing but fork workers on request (`_serve_workers`); each
worker gets what torch's agent gives one (its argv, environment and folder, a session of its own, the launcher as its
parent, so that the agent waits on it, signals its group and reads its status as with Popen), and becomes the script
as a served command does. The copy ignores the signals a scheduler sends every process of a job (they are for the
launcher and its workers) and ends with the launcher. Its workers' /proc/PID/environ is the server's: `launched_rank`
tells a test which rank a process is.
"""

import atexit
import ctypes
import gc
import json
import multiprocessing
import os
import pickle
import random
import runpy
import select
import signal
import subprocess
import sys
import threading
import time

# Read by a library or the interpreter when it starts, so the server's values would win over the command's. (KMP_*
# belong to Intel's OpenMP, which neither torch's nor scikit-learn's Linux wheels load; scikit-learn sets two on
# import.)
STARTUP_VARIABLES = (
    "OMP_",
    "MKL_",
    "GOMP_",
    "ATEN_",
    "ONEDNN_",
    "DNNL_",
    "PYTHON",
    "LD_",
    "MALLOC",
    "HF_",
    "TRANSFORMERS_",
    "TOKENIZERS_",
    "TORCH",
    "CUDA",
    "NCCL",
    "TRITON",
    "XDG_",
)
# ... except these, read when used (torch sets the second in the tests' own process on its first compile).
READ_WHEN_USED = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}

PRELOAD = [
    "torch",
    "numpy",
    "transformers",
    "transformers.trainer",
    "accelerate",
    "accelerate.commands.launch",
    "torch.distributed.run",
    "datasets",
    "evaluate",
    "safetensors.torch",
    "scipy.stats",
    "sklearn.metrics",
    "seqeval.metrics",
    "albert_hf",
]

LAUNCHERS = ("accelerate.commands.launch", "torch.distributed.run")
# Set by torch's elastic agent for its workers and read when used (by torch.distributed), not at start-up.
LAUNCH_VARIABLES = ("TORCHELASTIC_", "TORCH_NCCL_")
# What a scheduler sends every process of a job: the copy that forks the workers ignores them, the workers get them.
JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
PR_SET_NAME, PR_SET_CHILD_SUBREAPER = 15, 36  # prctl(2)
WORKER_NAME = "rank "  # a served worker's process name (psutil's name()): "rank 1"

_server = {}  # the environment and sys.path the server was started with, once started


def _albert_hf_modules() -> list[str]:
    import pkgutil

    import albert_hf

    return [
        f"albert_hf.{info.name}"
        for info in pkgutil.walk_packages(albert_hf.__path__)
        if not info.name.startswith("metrics")
    ]


def _ensure_server(env: dict) -> None:
    """Start the forkserver with `env` (the tests' subprocess environment) and the preloaded modules."""
    if _server:
        return
    fresh_path = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    multiprocessing.set_forkserver_preload(PRELOAD + _albert_hf_modules())
    from multiprocessing import forkserver, resource_tracker

    # Started first: starting it unblocks SIGTERM and SIGINT in this thread, which the server must get blocked.
    resource_tracker.ensure_running()
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    # The server holds the job signals blocked, so that one sent to a served process before it runs (`_run`) waits
    # for the process's own dispositions: the server's would drop it (SIGINT) or act on it as the server's. And it
    # starts with none ignored (exec keeps SIG_IGN): each child gets the server's first dispositions back before it
    # runs, and setting SIG_IGN discards a held signal.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    handlers = {signum: signal.getsignal(signum) for signum in JOB_SIGNALS}
    for signum in JOB_SIGNALS:
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    try:
        forkserver.ensure_running()  # the server takes this process's environment, mask and ignored signals
    finally:
        for signum, handler in handlers.items():
            if handler is not None:  # None: set outside Python, left as it is
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.environ.clear()
        os.environ.update(saved)
    _server.update(env=dict(env), path=json.loads(fresh_path))


def servable(command, env: dict, server_env: dict) -> bool:
    """Whether `command` runs in a forked process as it would in a fresh one (see the module docstring), from the
    server started with `server_env` (or already started)."""
    return _runs_a_script(command) and not _differs_at_start_up(env, _server.get("env", server_env))


def _runs_a_script(command) -> bool:
    """`python SCRIPT.py ...` or `python -m MODULE ...` with this interpreter and no option."""
    command = [str(part) for part in command]
    if len(command) < 2 or command[0] != sys.executable:
        return False
    if command[1] == "-m":
        return len(command) >= 3
    return not command[1].startswith("-") and command[1].endswith(".py")


def _differs_at_start_up(env: dict, server_env: dict, read_when_used: tuple = ()) -> bool:
    differing = {name for name in set(env) | set(server_env) if env.get(name) != server_env.get(name)}
    return any(
        name.startswith(STARTUP_VARIABLES) and not name.startswith(read_when_used)
        for name in differing - READ_WHEN_USED
    )


def launched_rank(process) -> str | None:
    """The RANK a launcher gave `process` (a psutil.Process): from its environment, or from its name for a worker
    forked by `_serve_workers` (whose /proc/PID/environ is the server's); None for any other process."""
    name = process.name()
    if name.startswith(WORKER_NAME):
        return name[len(WORKER_NAME) :]
    return process.environ().get("RANK")


class ForkedProcess:
    """What the tests use of subprocess.Popen: pid, poll, wait(timeout), returncode, send_signal, kill."""

    def __init__(self, process):
        self._process = process
        self.pid = process.pid
        self.returncode = None

    def poll(self):
        if self.returncode is None and not self._process.is_alive():
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(str(self.pid), timeout)
        return self.returncode

    def send_signal(self, signum):
        os.kill(self.pid, signum)

    def kill(self):
        self._process.kill()


def start(
    command, *, env: dict, cwd, stdout: str, stderr: str, server_env: dict, new_session: bool = False
) -> ForkedProcess:
    """`command` (servable) in a forked process writing to the files `stdout` and `stderr`, in a session (and process
    group) of its own with `new_session`. The server is started on first use with `server_env`."""
    _ensure_server(server_env)
    context = multiprocessing.get_context("forkserver")
    process = context.Process(
        target=_run,
        args=(
            [str(part) for part in command[1:]],
            str(cwd or os.getcwd()),
            dict(env),
            stdout,
            stderr,
            _server["path"],
            new_session,
            _popen_signals(),
        ),
        daemon=False,
    )
    process.start()
    return ForkedProcess(process)


def _popen_signals() -> tuple[set, set]:
    """What a child started now by subprocess.Popen from this thread inherits of signals: the blocked ones, and the
    job signals ignored (exec keeps SIG_IGN and resets the handled ones)."""
    return (
        signal.pthread_sigmask(signal.SIG_BLOCK, ()),
        {signum for signum in JOB_SIGNALS if signal.getsignal(signum) == signal.SIG_IGN},
    )


def _as_started_by_popen(signals: tuple[set, set]) -> None:
    """In a forked process whose job signals are blocked: the job signals' dispositions a fresh interpreter started
    with `signals` (`_popen_signals`) has, then its mask; a signal held meanwhile is handled now."""
    blocked, ignored = signals
    for signum in JOB_SIGNALS:
        fresh = signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
        signal.signal(signum, signal.SIG_IGN if signum in ignored else fresh)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _run(
    argv: list[str],
    cwd: str,
    env: dict,
    stdout: str,
    stderr: str,
    fresh_path: list[str],
    new_session: bool,
    signals: tuple[set, set],
) -> None:
    """In the forked process: become `python *argv` started in `cwd` with `env` and `signals`."""
    if new_session:
        os.setsid()  # as subprocess.Popen(start_new_session=True)
    _as_started_by_popen(signals)
    gc.freeze()  # the preloaded objects: not traversed by every collection the script triggers
    # A main process of its own, as a fresh interpreter is: multiprocessing's default start method (not the
    # server's forkserver, which DataLoader workers would otherwise go through) and no parent process.
    multiprocessing.set_start_method(None, force=True)
    this = multiprocessing.current_process()
    this._name, this._identity, this._parent_pid, this._parent_name = "MainProcess", (), None, None
    multiprocessing.process._parent_process = None
    for fd, path in ((1, stdout), (2, stderr)):
        file = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
    os.chdir(cwd)
    server_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    if argv[0] == "-m" and argv[1] in LAUNCHERS:
        _serve_workers(fresh_path, server_env)
    raise SystemExit(_main(argv, fresh_path))


def _main(argv: list[str], fresh_path: list[str]):
    """`python *argv` in this process, from the folder it is in; returns its SystemExit code (None, an int or a
    message), after the interpreter's ending."""
    random.seed()  # a fresh interpreter seeds these from the OS; forked ones would all share the server's state
    import numpy

    numpy.random.seed()
    try:
        if argv[0] == "-m":
            sys.modules.pop(argv[1], None)  # preloaded, but run afresh as __main__ (and without runpy's warning)
            sys.path[:] = [os.getcwd(), *fresh_path]
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *fresh_path]
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
        code = None
    except SystemExit as stop:
        code = stop.code
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception, status 1
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        threading._shutdown()  # as the interpreter ends: non-daemon threads first, then the atexit handlers
        atexit._run_exitfuncs()
    return code


def _serve_workers(fresh_path: list[str], server_env: dict) -> None:
    """In a served launcher, before it runs: its elastic agent's workers are forked from a copy of this process
    (see the module docstring) wherever a fresh one would be no different; the others start as under a real launch."""
    from torch.distributed.elastic.multiprocessing.subprocess_handler import subprocess_handler

    libc = ctypes.CDLL(None, use_errno=True)
    # The workers' parent is the launcher, as under a real launch: forked twice from the copy, each is orphaned at
    # once and adopted by its nearest subreaper ancestor, this process.
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return
    launcher = os.getpid()
    requests_read, requests_write = os.pipe()
    replies_read, replies_write = os.pipe()
    # The copy, and each worker until it is the launcher's (`_worker`), hold the job signals blocked: a signal to the
    # job in that moment waits for the worker's own dispositions, as it does for a Popen child.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, JOB_SIGNALS)
    if os.fork() == 0:
        os.close(requests_write), os.close(replies_read)
        _fork_workers(requests_read, replies_write, launcher, fresh_path, libc)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(requests_read), os.close(replies_write)
    requests, replies, lock = os.fdopen(requests_write, "wb"), os.fdopen(replies_read, "rb"), threading.Lock()
    popen = subprocess_handler.SubprocessHandler._popen

    def forked_popen(handler, args, env):
        argv = [str(part) for part in args]
        if argv[1:2] == ["-u"] and server_env.get("PYTHONUNBUFFERED"):  # the server's streams are unbuffered
            argv = [argv[0], *argv[2:]]
        if (
            handler._stdout is not None
            or handler._stderr is not None
            or not _runs_a_script(argv)
            or _differs_at_start_up(env, server_env, LAUNCH_VARIABLES)
        ):
            return popen(handler, args, env)
        with lock:
            pickle.dump((argv[1:], dict(env), _popen_signals()), requests)
            requests.flush()
            return ServedWorker(int(replies.readline()), argv)

    subprocess_handler.SubprocessHandler._popen = forked_popen


def _fork_workers(requests_fd: int, replies_fd: int, launcher: int, fresh_path: list[str], libc) -> None:
    """The launcher's copy: forks a worker for each request until the launcher ends (then exits)."""
    for signum in JOB_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    requests = os.fdopen(requests_fd, "rb")
    while True:
        ready, _, _ = select.select([requests], [], [], 1.0)
        if not ready:
            if os.getppid() != launcher:
                os._exit(0)
            continue
        try:  # one request at a time (the launcher sends the next after this one's reply): none waits in the buffer
            argv, env, signals = pickle.load(requests)
        except EOFError:
            os._exit(0)
        pid_read, pid_write = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(pid_read)
            worker = os.fork()
            if worker == 0:
                os.close(pid_write), os.close(replies_fd)
                requests.close()
                _worker(argv, env, signals, launcher, fresh_path, libc)
            os.write(pid_write, b"%d" % worker)
            os._exit(0)
        os.close(pid_write)
        with os.fdopen(pid_read, "rb") as pid:
            worker = int(pid.read())
        os.waitpid(middle, 0)  # it has ended: its worker is the launcher's child now
        os.write(replies_fd, b"%d\n" % worker)


def _worker(argv: list[str], env: dict, signals: tuple[set, set], launcher: int, fresh_path: list[str], libc) -> None:
    """In a forked worker: become `python *argv` as torch's agent starts it (its own session, `env`, the signals of
    the agent's Popen child); never returns."""
    while os.getppid() != launcher:  # adopted once the process that forked it has ended (a moment)
        time.sleep(0.001)
    os.setsid()
    _as_started_by_popen(signals)
    os.environ.clear()
    os.environ.update(env)
    libc.prctl(PR_SET_NAME, f"{WORKER_NAME}{env.get('RANK')}".encode(), 0, 0, 0)
    code = _main(argv, fresh_path)
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # as the interpreter ends on SystemExit("message")
        print(code, file=sys.stderr)
        status = 1
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(status & 0xFF)


class ServedWorker:
    """What torch's elastic agent uses of a worker's Popen (pid, args, returncode, poll, wait, send_signal,
    terminate, kill), for a worker `_serve_workers` forked: this process's child, waited on as Popen waits."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args, self.returncode = pid, args, None

    def poll(self):
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)
        return self.returncode

    def send_signal(self, signum):
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)
