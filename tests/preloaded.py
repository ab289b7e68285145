"""The scripts the tests start, in processes forked from one interpreter that has already imported the stack.

A fresh interpreter spends about 3 s of CPU importing torch, transformers, accelerate, datasets and albert_hf before
a tiny run does anything, and the suite starts over a hundred such processes: on 2 cores that was a third of its
time. `start` runs `python SCRIPT ...` or `python -m MODULE ...` in a process forked by the standard library's
forkserver, which imports all that once per test worker. What a test sees is what a fresh process gives: a pid of
its own (signals reach it, it can be killed with its children), its own exit status, its stdout and stderr in
files, the command's argv, working folder, environment and `sys.path`, module-level state as just imported (nothing
runs in the server but imports), multiprocessing as in a main process (the default start method, no parent), and
the interpreter's ending (threads joined, atexit handlers run).

A command is served this way only where that holds. The rest start as plain subprocesses: another interpreter,
`python -c`, and an environment that differs from the server's in a variable read when a library is imported or the
interpreter starts (thread counts, the CPU ISA caps, the HF_* folders, PYTHON*, TORCH*, CUDA*). Launchers
(`-m accelerate.commands.launch`, `-m torch.distributed.run`) are served too; the workers they start are fresh
processes, as under a real launch.
"""

import atexit
import gc
import json
import multiprocessing
import os
import random
import runpy
import subprocess
import sys
import threading

# Read by a library or the interpreter when it starts, so the server's values would win over the command's. (KMP_*
# belong to Intel's OpenMP, which neither torch's nor scikit-learn's Linux wheels load; scikit-learn sets two on
# import.)
STARTUP_VARIABLES = ("OMP_", "MKL_", "GOMP_", "ATEN_", "ONEDNN_", "DNNL_", "PYTHON", "LD_", "MALLOC", "HF_",
                     "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "CUDA", "NCCL", "TRITON", "XDG_")
# ... except these, read when used (torch sets the second in the tests' own process on its first compile).
READ_WHEN_USED = {"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"}

PRELOAD = ["torch", "numpy", "transformers", "transformers.trainer", "accelerate", "accelerate.commands.launch",
           "torch.distributed.run", "datasets", "evaluate", "safetensors.torch", "scipy.stats", "sklearn.metrics",
           "seqeval.metrics", "albert_hf"]

_server = {}  # the environment and sys.path the server was started with, once started


def _albert_hf_modules() -> list[str]:
    import pkgutil

    import albert_hf

    return [f"albert_hf.{info.name}" for info in pkgutil.walk_packages(albert_hf.__path__)
            if not info.name.startswith("metrics")]


def _ensure_server(env: dict) -> None:
    """Start the forkserver with `env` (the tests' subprocess environment) and the preloaded modules."""
    if _server:
        return
    fresh_path = subprocess.run([sys.executable, "-c", "import json, sys; print(json.dumps(sys.path[1:]))"],
                                env=env, capture_output=True, text=True, check=True).stdout
    multiprocessing.set_forkserver_preload(PRELOAD + _albert_hf_modules())
    from multiprocessing import forkserver

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        forkserver.ensure_running()  # the server takes this process's environment when it starts
    finally:
        os.environ.clear()
        os.environ.update(saved)
    _server.update(env=dict(env), path=json.loads(fresh_path))


def servable(command, env: dict, server_env: dict) -> bool:
    """Whether `command` runs in a forked process as it would in a fresh one (see the module docstring), from the
    server started with `server_env` (or already started)."""
    command = [str(part) for part in command]
    if len(command) < 2 or command[0] != sys.executable:
        return False
    if command[1] == "-m":
        if len(command) < 3:
            return False
    elif command[1].startswith("-") or not command[1].endswith(".py"):
        return False
    server_env = _server.get("env", server_env)
    differing = {name for name in set(env) | set(server_env) if env.get(name) != server_env.get(name)}
    return not any(name.startswith(STARTUP_VARIABLES) for name in differing - READ_WHEN_USED)


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


def start(command, *, env: dict, cwd, stdout: str, stderr: str, server_env: dict,
          new_session: bool = False) -> ForkedProcess:
    """`command` (servable) in a forked process writing to the files `stdout` and `stderr`, in a session (and process
    group) of its own with `new_session`. The server is started on first use with `server_env`."""
    _ensure_server(server_env)
    context = multiprocessing.get_context("forkserver")
    process = context.Process(target=_run, args=([str(part) for part in command[1:]], str(cwd or os.getcwd()),
                                                 dict(env), stdout, stderr, _server["path"], new_session),
                              daemon=False)
    process.start()
    return ForkedProcess(process)


def _run(argv: list[str], cwd: str, env: dict, stdout: str, stderr: str, fresh_path: list[str],
         new_session: bool) -> None:
    """In the forked process: become `python *argv` started in `cwd` with `env`."""
    if new_session:
        os.setsid()  # as subprocess.Popen(start_new_session=True)
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
    os.environ.clear()
    os.environ.update(env)
    random.seed()  # a fresh interpreter seeds these from the OS; forked ones would all share the server's state
    import numpy

    numpy.random.seed()
    try:
        if argv[0] == "-m":
            sys.modules.pop(argv[1], None)  # preloaded, but run afresh as __main__ (and without runpy's warning)
            sys.path[:] = [cwd, *fresh_path]
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0])), *fresh_path]
            sys.argv = argv
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - printed as the interpreter prints an uncaught exception, status 1
        sys.excepthook(*sys.exc_info())
        raise SystemExit(1)
    finally:
        threading._shutdown()  # as the interpreter ends: non-daemon threads first, then the atexit handlers
        atexit._run_exitfuncs()
