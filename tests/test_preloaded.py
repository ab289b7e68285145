"""tests/preloaded.py: a script started through the preloaded interpreter gets what a fresh `python SCRIPT` gets."""

import json
import multiprocessing
import signal
import subprocess
import sys
import time

import pytest

import preloaded
from helpers import REPO, run_bounded, signals_left_as_found, start_process, subprocess_env

SCRIPT = """\
import atexit, json, multiprocessing, os, random, sys, threading, time
import torch, albert_hf
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "name": __name__,
                  "value": os.environ.get("ALBERT_HF_PROBE"), "pid": os.getpid(), "random": random.random(),
                  "threads": torch.get_num_threads(), "start_method": multiprocessing.get_start_method(),
                  "process": multiprocessing.current_process().name,
                  "has_parent": multiprocessing.parent_process() is not None}))
print("to stderr", file=sys.stderr)
if sys.argv[1] == "fail":
    raise RuntimeError("the script failed")
if sys.argv[1] == "wait":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text(SCRIPT)
    return path


def report(done) -> dict:
    return json.loads(done.stdout.splitlines()[0])


def test_a_served_script_has_its_argv_folder_environment_and_ending(script, tmp_path):
    assert preloaded.servable([sys.executable, script, "3"], subprocess_env(ALBERT_HF_PROBE="x"), subprocess_env())
    work = tmp_path / "work"
    work.mkdir()
    runs = [
        run_bounded([sys.executable, script, "3"], 60, cwd=work, env=subprocess_env(ALBERT_HF_PROBE=str(n)))
        for n in range(2)
    ]
    first, second = map(report, runs)
    assert runs[0].returncode == 3
    assert first["argv"] == [str(script), "3"] and first["name"] == "__main__"
    assert first["cwd"] == str(work) and first["path0"] == str(tmp_path)
    assert (first["value"], second["value"]) == ("0", "1")
    assert first["threads"] == int(subprocess_env()["OMP_NUM_THREADS"])
    # multiprocessing as in a fresh main process: the platform's default start method (DataLoader workers would
    # otherwise go through the server), no parent
    assert (first["start_method"], first["process"], first["has_parent"]) == (
        multiprocessing.get_all_start_methods()[0],
        "MainProcess",
        False,
    )
    assert first["pid"] != second["pid"] and first["random"] != second["random"]  # seeded afresh, as a new process
    assert runs[0].stdout.splitlines()[1:] == ["thread joined", "atexit ran"]  # threads joined, then atexit
    assert runs[0].stderr == "to stderr\n"


def test_an_uncaught_exception_prints_its_traceback_and_exits_1(script, tmp_path):
    done = run_bounded([sys.executable, script, "fail"], 60, cwd=tmp_path, env=subprocess_env())
    assert done.returncode == 1
    assert done.stderr.startswith("to stderr\nTraceback (most recent call last):")
    assert done.stderr.rstrip().endswith("RuntimeError: the script failed")


def test_a_signal_reaches_the_served_process(script, tmp_path):
    process = start_process(
        [sys.executable, script, "wait"],
        env=subprocess_env(),
        cwd=tmp_path,
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
    )
    assert isinstance(process, preloaded.ForkedProcess)
    deadline = time.time() + 60
    while "pid" not in (tmp_path / "out").read_text():
        assert time.time() < deadline and process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == -signal.SIGTERM


def test_a_signal_sent_before_the_script_runs_is_held_for_it(script, tmp_path):
    """Sent as soon as the process exists, before its dispositions are its own: it still ends the process (the
    server ignores SIGINT and would have dropped it). Started as a shell's foreground job is: neither ignored (a
    background job, or nohup, hands them on ignored, and the script would keep them so)."""
    with signals_left_as_found():
        handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for signum in handlers:
                process = start_process(
                    [sys.executable, script, "wait"],
                    env=subprocess_env(),
                    cwd=tmp_path,
                    stdout=tmp_path / "out",
                    stderr=tmp_path / "err",
                )
                process.send_signal(signum)
                status = process.wait(timeout=60)  # the script would sleep 60 s after its imports
                assert status != 0 and "atexit ran" not in (tmp_path / "out").read_text(), (signum, status)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)


# The job signals' state in /proc/self/status, as bits: blocked, ignored, caught.
SIGNALS_PROBE = f"""\
import json
job_signals = {sorted(int(signum) for signum in preloaded.JOB_SIGNALS)}
bits = {{name: int(value, 16) for name, value in (line.split(":") for line in open("/proc/self/status"))
        if name in ("SigBlk", "SigIgn", "SigCgt")}}
print(json.dumps({{name: [n for n in job_signals if value >> (n - 1) & 1] for name, value in bits.items()}}))
"""


@pytest.mark.parametrize("caller", ["as found", "SIGTERM and SIGUSR1 blocked, SIGHUP ignored"])
def test_a_served_process_has_the_signals_a_popen_child_has(tmp_path, caller):
    """Whatever the server's own state: a stop signal blocked in the caller when the server started must not be
    inherited by every served process, which SIGTERM then could not end (test_a_signal_reaches_the_served_process).
    Compared with a real Popen child of the same interpreter."""
    probe = tmp_path / "signals.py"
    probe.write_text(SIGNALS_PROBE)
    with signals_left_as_found():
        blocked, hangup = signal.pthread_sigmask(signal.SIG_BLOCK, ()), signal.getsignal(signal.SIGHUP)
        try:
            if caller != "as found":
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
                signal.signal(signal.SIGHUP, signal.SIG_IGN)
            popen = json.loads(
                subprocess.run(
                    [sys.executable, probe],
                    env=subprocess_env(),
                    capture_output=True,
                    text=True,
                    check=True,
                    timeout=60,
                ).stdout
            )
            process = start_process(
                [sys.executable, probe],
                env=subprocess_env(),
                cwd=tmp_path,
                stdout=tmp_path / "out",
                stderr=tmp_path / "err",
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            signal.signal(signal.SIGHUP, hangup)
        assert isinstance(process, preloaded.ForkedProcess)
        assert process.wait(timeout=60) == 0, (tmp_path / "err").read_text()
    served = json.loads((tmp_path / "out").read_text())
    if caller != "as found":  # the planted state reached the Popen child: the comparison can tell
        assert {signal.SIGUSR1, signal.SIGTERM} <= set(popen["SigBlk"]) and signal.SIGHUP in popen["SigIgn"], popen
    assert served == popen


def test_a_test_that_leaves_a_signal_blocked_or_ignored_fails_and_the_state_is_put_back():
    """The guard every test runs in (conftest): a test that changes the signals later processes inherit fails."""
    for plant, undo in (
        (
            lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}),
            lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}),
        ),
        (lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN), lambda: signal.signal(signal.SIGUSR2, signal.SIG_DFL)),
    ):
        try:
            with pytest.raises(pytest.fail.Exception, match="changed this process's signals"):
                with signals_left_as_found():
                    plant()
            assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, ())
            assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
        finally:
            undo()


def test_importing_a_script_leaves_the_importers_signals_alone(tmp_path):
    """Run as scripts they hold the stop signals while the libraries load; imported (a test, a notebook) they must
    not: the importer's Ctrl-C, and every process it starts later, would inherit them blocked."""
    probe = tmp_path / "imports.py"
    probe.write_text(
        f"import signal, sys\nsys.path.insert(0, {str(REPO)!r})\n"
        "import run_glue, run_ner, run_pretraining, run_race, run_squad\n"
        "print(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ())))\n"
    )
    done = run_bounded([sys.executable, probe], 120, cwd=tmp_path, env=subprocess_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_an_environment_read_at_start_up_gets_a_fresh_process(script, tmp_path):
    for variable in ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "HF_HOME", "PYTHONPATH", "TORCHINDUCTOR_FREEZING"):
        assert not preloaded.servable(
            [sys.executable, script, "0"], subprocess_env(**{variable: "2"}), subprocess_env()
        ), variable
    process = start_process(
        [sys.executable, script, "0"],
        env=subprocess_env(OMP_NUM_THREADS="2"),
        cwd=tmp_path,
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
    )
    assert isinstance(process, subprocess.Popen)
    assert process.wait(timeout=120) == 0
    assert json.loads((tmp_path / "out").read_text().splitlines()[0])["threads"] == 2


def test_other_interpreters_and_code_strings_are_not_served(script):
    env = subprocess_env()
    assert not preloaded.servable(["python3", script], env, env)
    assert not preloaded.servable([sys.executable, "-c", "print(1)"], env, env)
    assert preloaded.servable([sys.executable, "-m", "albert_hf.analysis.params"], env, env)


WORKER = """\
import json, os, sys, time
preloaded = "torch" in sys.modules  # before this script imports anything: a fresh interpreter has no torch yet
folder = os.path.dirname(os.path.abspath(__file__))
report = {"rank": os.environ["RANK"], "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0),
          "preloaded": preloaded, "argv": sys.argv, "name": __name__,
          "signals": [line for line in open("/proc/self/status") if line.startswith(("SigBlk", "SigIgn"))]}
path = os.path.join(folder, f"rank{report['rank']}.json")
with open(path + ".part", "w") as file:
    json.dump(report, file)
os.replace(path + ".part", path)  # whole once it is there
if sys.argv[1] == "wait":
    time.sleep(120)
sys.exit(3 if sys.argv[1] == "fail" and report["rank"] == "1" else 0)
"""
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "0"]


def launch(tmp_path, *args):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launcher = start_process(
        [*TORCHRUN, *args[:-1], script, args[-1]],
        env=subprocess_env(),
        cwd=tmp_path,
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
        new_session=True,
    )
    reports = [tmp_path / f"rank{rank}.json" for rank in range(2)]
    deadline = time.time() + 120
    while not all(report.exists() for report in reports):
        assert time.time() < deadline and launcher.poll() is None, (tmp_path / "err").read_text()[-3000:]
        time.sleep(0.02)
    return launcher, [json.loads(report.read_text()) for report in reports]


def test_a_launchers_workers_are_forked_with_what_torchs_agent_gives_them(tmp_path):
    """Each worker is the launcher's child in a session of its own with its rank and argv, a script run as
    __main__ with the stack already imported; `launched_rank` finds it; its exit status reaches the launcher."""
    import psutil

    from helpers import signal_job

    launcher, reports = launch(tmp_path, "wait")
    assert isinstance(launcher, preloaded.ForkedProcess)
    for rank, report in enumerate(reports):
        assert report["preloaded"] and report["name"] == "__main__", report
        assert report["rank"] == str(rank) and report["argv"] == [str(tmp_path / "worker.py"), "wait"], report
        assert report["ppid"] == launcher.pid and report["sid"] == report["pid"], report  # as Popen(start_new_session)
    tree = psutil.Process(launcher.pid).children(recursive=True)
    assert {preloaded.launched_rank(process): process.pid for process in tree if preloaded.launched_rank(process)} == {
        str(rank): report["pid"] for rank, report in enumerate(reports)
    }
    # a scheduler's signal to every process of the job: the workers end, the launcher with them, nothing is left
    assert signal_job(launcher.pid, signal.SIGTERM) == 3
    assert launcher.wait(timeout=60) != 0
    _, left = psutil.wait_procs(tree, timeout=30)
    assert not left, left

    failed = tmp_path / "failed"
    failed.mkdir()
    launcher, reports = launch(failed, "fail")
    assert launcher.wait(timeout=60) != 0
    assert "exitcode  : 3" in (failed / "err").read_text()  # rank 1's status, read by the agent


def test_workers_whose_output_the_launcher_redirects_start_fresh_and_forked_ones_have_their_signals(tmp_path):
    """torch's agent writes a worker's output to its own files with --redirects: not served (the copy that forks
    the workers has the launcher's descriptors, not those files). Those real workers' blocked and ignored signals
    are the forked ones' too: none held back by the copy, which blocks and ignores them itself."""
    launcher, reports = launch(tmp_path, "--redirects", "3", "--log-dir", str(tmp_path / "logs"), "exit")
    assert launcher.wait(timeout=60) == 0
    assert [report["preloaded"] for report in reports] == [False, False]
    forked = tmp_path / "forked"
    forked.mkdir()
    launcher, forked_reports = launch(forked, "exit")
    assert launcher.wait(timeout=60) == 0
    assert [report["preloaded"] for report in forked_reports] == [True, True]
    assert [report["signals"] for report in forked_reports] == [report["signals"] for report in reports]
