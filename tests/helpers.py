"""What tests call by name: the repository's paths, tiny configs, and running scripts and processes that cannot hang
the suite. Fixtures live in conftest.py, which sets the offline environment before this module is imported."""

import contextlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The real data (books, GLUE, SQuAD, RACE) beside the repository; tests that read it skip, saying so, without it.
SHARED_DATA = REPO.parent / "shared" / "data"


def shared_data(*parts: str) -> Path:
    """A file or folder of the real data (`shared_data("glue", "MRPC")`), or the test skipped, naming what is
    missing."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not present (../shared/data not present)")
    return path


# accelerate launch's rendezvous on a free port its launcher binds, not on the default 29500: the launches of two
# pytest workers would race for that one (both find it free, one ends in EADDRINUSE).
ANY_PORT = ["--main_process_port", "0"]
# The tests' launches: fp32, no dynamo, and DDP over 2 processes on this machine.
LAUNCH = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
    *ANY_PORT,
]  # the two-machines test names its own port after it
DDP = [*LAUNCH, "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
FSDP = [*LAUNCH, "--config_file", str(REPO / "examples" / "accelerate_configs" / "fsdp_cpu.yaml")]  # 2 processes


# Torch threads per test and per process a test starts. Tiny models: thread start-up costs more than it saves, and
# CI has 2 cores shared with subprocess tests. ALBERT_HF_TEST_THREADS=2 runs the suite with another summation order
# (a test that holds only for one order asserts a rounding, not a behaviour).
THREADS = int(os.environ.get("ALBERT_HF_TEST_THREADS", "1"))


THREADS_SAID = "1 thread" if THREADS == 1 else f"{THREADS} threads"  # as a start line names them


def subprocess_env(**extra) -> dict:
    """The environment of a process a test starts: this one's, with the tests' thread count."""
    return {**os.environ, "OMP_NUM_THREADS": str(THREADS), "TOKENIZERS_PARALLELISM": "false", **extra}


# The preloaded interpreter's environment (tests/preloaded.py): the tests' own, before any test changes it.
PRELOADED_ENV = subprocess_env()


def tiny_config(**overrides):
    from albert_hf import AlbertHFConfig

    return AlbertHFConfig.from_preset("tiny", **overrides)


BATCH, LENGTH = 3, 24  # make_inputs' shape


def make_inputs(vocab=1000, batch=BATCH, length=LENGTH, pad_from=None):
    """A model's inputs: random ids above the special pieces, the second half of each row segment B; with
    `pad_from`, row 1 padded from there."""
    import torch

    input_ids = torch.randint(5, vocab, (batch, length))
    attention_mask = torch.ones_like(input_ids)
    if pad_from is not None:
        input_ids[1, pad_from:] = 0
        attention_mask[1, pad_from:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, length // 2 :] = 1
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


def mlm_labels(input_ids, every=5):
    """MLM labels on every `every`-th position from 1, the rest ignored (-100)."""
    import torch

    labels = torch.full_like(input_ids, -100)
    labels[:, 1::every] = input_ids[:, 1::every]
    return labels


def padded_batch(batch=4, length=24, real_lengths=(24, 9, 17, 3)):
    """`make_inputs` with each row padded after its real length."""
    inputs = make_inputs(batch=batch, length=length)
    for row, real in enumerate(real_lengths):
        inputs["input_ids"][row, real:] = 0
        inputs["attention_mask"][row, real:] = 0
    return inputs


# the start of a program that runs as on a machine without the package: albert_hf cannot be imported
BLOCK_ALBERT_HF = (
    "import sys\n"
    "class _BlockAlbertHF:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name == 'albert_hf' or name.startswith('albert_hf.'):\n"
    "            raise ImportError('albert_hf is deliberately not importable in this test')\n"
    "sys.meta_path.insert(0, _BlockAlbertHF())\n"
)


def run_python(code: str, cwd, env_extra=None, timeout=300):
    """Run `code` in a fresh interpreter with albert_hf made unimportable (as on a machine without the package)."""
    import subprocess

    env = subprocess_env(**(env_extra or {}))
    env.pop("PYTHONPATH", None)
    return subprocess.run(  # stdin closed, as in a notebook kernel or a job: a prompt cannot be answered
        [sys.executable, "-c", BLOCK_ALBERT_HF + code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def check_tokenizer_loads_without_prompt(folder, fill_mask: bool = False):
    """A folder our scripts wrote, in a fresh process without albert_hf and with stdin closed: the tokenizer loads
    the ways its model card shows (transformers' AlbertTokenizer, no remote code; AutoTokenizer with
    trust_remote_code=True) with no remote-code question and no model-type warning, both alike and giving ALBERT's
    segment ids; with `fill_mask`, the fill-mask pipeline runs on it."""
    code = (
        "from transformers import AlbertTokenizer, AutoTokenizer, pipeline\n"
        f"folder = {str(folder)!r}\n"
        "plain = AlbertTokenizer.from_pretrained(folder)\n"
        "auto = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)\n"
        "assert type(auto).__name__ == 'AlbertTokenizer' and auto.get_vocab() == plain.get_vocab()\n"
        "print('SEGMENTS', plain('first part.', 'second part.')['token_type_ids'])\n"
    )
    if fill_mask:
        code += (
            "fill = pipeline('fill-mask', model=folder, trust_remote_code=True)\n"
            "found = fill(f'She opened the {fill.tokenizer.mask_token} and walked in.')\n"
            "print('FILLED', len(found), type(fill.model).__name__, all(isinstance(f['token'], int) for f in found))\n"
        )
    done = run_python(code, cwd=Path(folder).parent)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Do you wish to run the custom code" not in done.stdout
    assert "custom code" not in done.stderr and "to instantiate a model of type" not in done.stderr
    segments = done.stdout.split("SEGMENTS ")[1].splitlines()[0]
    assert segments.startswith("[0, 0") and segments.endswith("1, 1]")
    if fill_mask:
        assert "FILLED 5 AlbertHFForMaskedLM True" in done.stdout
    card = (Path(folder) / "README.md").read_text()
    assert "AlbertTokenizer.from_pretrained(" in card


def in_hub_cache(repo_id: str, folder) -> str:
    """`folder`'s files as the Hub repo `repo_id` in the tests' HF_HOME cache, where `from_pretrained(repo_id)` finds
    them offline (HF_HUB_OFFLINE=1) as it finds any downloaded repo: refs/main naming a snapshot. Returns repo_id."""
    import shutil

    repo = Path(os.environ["HF_HOME"]) / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = "0" * 39 + "1"
    shutil.copytree(folder, repo / "snapshots" / commit, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return repo_id


def glue_args(checkpoint, output_dir, *extra):
    """The flags of a tiny run_glue.py run: pieces of 32, batches of 4 (16 to evaluate), nothing saved, no trackers."""
    return [
        "--model_name_or_path",
        checkpoint,
        "--output_dir",
        output_dir,
        "--max_seq_length",
        32,
        "--per_device_train_batch_size",
        4,
        "--per_device_eval_batch_size",
        16,
        "--learning_rate",
        1e-3,
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--seed",
        0,
        "--dataloader_pin_memory",
        "false",
        "--disable_tqdm",
        "true",
        *extra,
    ]


def squad_args(checkpoint, output_dir, steps, seq=48, query=16, stride=16):
    """The flags of a tiny run_squad.py run of `steps` steps: windows of `seq` pieces, nothing saved, no trackers."""
    return [
        "--model_name_or_path",
        checkpoint,
        "--output_dir",
        output_dir,
        "--max_seq_length",
        seq,
        "--max_query_length",
        query,
        "--doc_stride",
        stride,
        "--per_device_train_batch_size",
        8,
        "--max_steps",
        steps,
        "--learning_rate",
        "5e-3",
        "--warmup_steps",
        "0.1",
        "--use_cpu",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--seed",
        0,
        "--report_to",
        "none",
    ]


def finetuning_args(checkpoint, output_dir, *extra, learning_rate: float) -> list:
    """The flags of a tiny fine-tuning run (run_ner.py, run_glue.py on your own data): pieces of 32, batches of 16,
    nothing saved before the end, no trackers, no progress bars."""
    return [
        "--model_name_or_path",
        checkpoint,
        "--output_dir",
        output_dir,
        "--overwrite_output_dir",
        "--max_seq_length",
        32,
        "--per_device_train_batch_size",
        16,
        "--learning_rate",
        learning_rate,
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--seed",
        0,
        "--dataloader_pin_memory",
        "false",
        "--disable_tqdm",
        "true",
        *extra,
    ]


@contextlib.contextmanager
def signals_left_as_found():
    """The block fails (pytest.fail) if it changed this thread's blocked signals or the job signals' dispositions,
    which every process started later inherits (Popen keeps a blocked mask and ignored signals across exec); they
    are put back first."""
    import signal

    from preloaded import JOB_SIGNALS

    def state():
        return {
            "blocked": signal.pthread_sigmask(signal.SIG_BLOCK, ()),
            **{signal.Signals(signum).name: signal.getsignal(signum) for signum in JOB_SIGNALS},
        }

    before = state()
    yield
    after = state()
    if after != before:
        signal.pthread_sigmask(signal.SIG_SETMASK, before["blocked"])
        for signum in JOB_SIGNALS:
            if before[signum.name] is not None:  # None: set outside Python, which cannot put it back
                signal.signal(signum, before[signum.name])
        changed = {name: (before[name], after[name]) for name in before if before[name] != after[name]}
        pytest.fail(f"changed this process's signals (before, after): {changed}", pytrace=False)


def reset_accelerate_state():
    """Clears accelerate's process-wide state, so that the next in-process run builds its own Accelerator."""
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    PartialState._reset_state()


def run_script(script_name: str, argv):
    """A script's `main(argv)` in this process (e.g. "run_glue"), with accelerate's state cleared first: each
    script builds its own Accelerator."""
    import importlib

    from albert_hf.runtime import output_lock

    reset_accelerate_state()
    try:
        return importlib.import_module(script_name).main([str(a) for a in argv])
    finally:
        output_lock.release_all()  # as the script's entry point (cli.run_entry_point) releases it


def run_glue(argv):
    return run_script("run_glue", argv)


def run_squad(args):
    """run_squad.py's `main(args)` in this process, accelerate's state cleared first; the output folder's lock stays
    held until the test ends (conftest.py releases it)."""
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(True)
    PartialState._reset_state()
    import run_squad as script

    return script.main([str(a) for a in args])


def run_bounded(command, timeout: float, **kwargs):
    """subprocess.run(capture_output=True, text=True) that cannot hang a test run: on timeout the command and every
    process it started are killed, and the test fails with what the command printed so far.

    `python SCRIPT` and `python -m MODULE` run forked from an interpreter that has imported the stack already
    (tests/preloaded.py), which saves each about 3 s of imports; other commands run as subprocesses.

    A launcher's workers run in sessions of their own (torch's elastic agent starts them so), so killing the
    launcher's process group is not enough; they are found through the process tree before anything is killed.
    Output goes to files rather than pipes, which an orphaned worker would hold open forever.
    """
    import subprocess
    import tempfile

    import psutil

    with tempfile.TemporaryDirectory(prefix="albert_hf_test_output_") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        process = start_process(command, stdout=out, stderr=err, **kwargs)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            tree = [process.pid] + [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
            for pid in tree:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            process.wait()
            pytest.fail(
                f"{' '.join(map(str, command[:4]))} ... still running after {timeout:.0f} s (hung?); killed "
                f"{len(tree)} processes; stderr tail:\n{err.read_text()[-3000:]}"
            )
        return subprocess.CompletedProcess(command, process.returncode, out.read_text(), err.read_text())


def start_process(command, *, stdout: Path, stderr: Path, env=None, cwd=None, new_session: bool = False):
    """subprocess.Popen(command) with stdout and stderr written to these files; forked from the preloaded
    interpreter where that gives what a fresh process would (tests/preloaded.py). `new_session`: in a session and
    process group of its own (Popen's start_new_session), as a scheduler's job is, for `signal_job`."""
    import subprocess

    import preloaded

    env = dict(os.environ if env is None else env)
    stdout.write_text(""), stderr.write_text("")
    if preloaded.servable(command, env, PRELOADED_ENV):
        return preloaded.start(
            command,
            env=env,
            cwd=cwd,
            stdout=str(stdout),
            stderr=str(stderr),
            server_env=PRELOADED_ENV,
            new_session=new_session,
        )
    with open(stdout, "w") as out, open(stderr, "w") as err:
        return subprocess.Popen(
            [str(part) for part in command], stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=new_session
        )


def signal_job(pid: int, signum: int) -> int:
    """`signum` to every process of the job `pid` leads (started with `new_session`), each once, as SLURM signals a
    job step and `timeout` or a terminal a process group: `os.killpg` on its process group and on those of its
    descendants (a launcher's workers run in sessions of their own). Returns the number of groups signalled."""
    import psutil

    groups = {os.getpgid(pid)}
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:  # the job ended between the caller's last look and this one: its group only
        children = []
    for child in children:
        try:
            groups.add(os.getpgid(child.pid))
        except ProcessLookupError:
            pass
    assert os.getpgid(0) not in groups, "the job shares the test's process group: start it with new_session"
    for group in groups:
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            pass
    return len(groups)


def check_seed_summary(output_dir, seeds, metric: str, auto_class) -> dict:
    """What every script's --seeds run writes (tasks/seeds.py), checked against the seeds' own results files:
    one folder per seed, all_seeds_results.json with the median, mean, standard error, minimum and maximum of
    `metric` ("eval_accuracy") over the seeds that learned, worked out here with numpy, and on top the best seed's
    results and weights, which load with `auto_class` (trust_remote_code). Returns the summary."""
    import json

    import numpy as np

    output_dir = Path(output_dir)
    summary = json.loads((output_dir / "all_seeds_results.json").read_text())
    assert summary["seeds"] == list(seeds)
    scores = {
        seed: json.loads((output_dir / f"seed_{seed}" / "eval_results.json").read_text())[metric] for seed in seeds
    }
    learned = [seed for seed in seeds if seed not in summary["did_not_learn"]]
    assert summary["learned"] == len(learned)
    values = np.array([scores[seed] for seed in learned])
    stats = summary["metrics"][metric]
    assert stats["median"] == pytest.approx(np.median(values))
    assert stats["mean"] == pytest.approx(values.mean())
    if len(values) > 1:
        assert stats["standard_error"] == pytest.approx(values.std(ddof=1) / np.sqrt(len(values)))
    assert (stats["min"], stats["max"]) == pytest.approx((values.min(), values.max()))
    assert scores[stats["min_seed"]] == values.min() and scores[stats["max_seed"]] == values.max()
    best = summary["best_seed"]
    assert best in learned and scores[best] == values.max() and summary["best_by"] == metric
    # The top folder is the best seed's: its results, its weights, a card that says so.
    assert json.loads((output_dir / "eval_results.json").read_text())[metric] == scores[best]
    assert (output_dir / "model.safetensors").read_bytes() == (
        output_dir / f"seed_{best}" / "model.safetensors"
    ).read_bytes()
    assert "## Seeds" in (output_dir / "README.md").read_text()
    auto_class.from_pretrained(output_dir, trust_remote_code=True)
    return summary


def check_best_checkpoint(output_dir, metric: str) -> None:
    """--load_best_model_at_end without --metric_for_best_model: the run kept the checkpoint with the best dev
    `metric` (the task's main one, e.g. "eval_accuracy"), where Trainer alone would take the one with the lowest
    loss."""
    import json

    state = json.loads((Path(output_dir) / "trainer_state.json").read_text())
    scores = [(entry[metric], entry["step"]) for entry in state["log_history"] if metric in entry]
    assert len(scores) >= 2, state["log_history"]
    best = max(score for score, _ in scores)
    first_best_step = next(step for score, step in scores if score == best)
    assert state["best_metric"] == best
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{first_best_step}")


def module_name(path, package_dir) -> str:
    """The dotted module name of a file of the package in `package_dir` (an `__init__` named as its package)."""
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
