"""The tests' set-up and fixtures: offline Hub, a throwaway HF_HOME, one thread per test, a tiny checkpoint. The
helpers tests call by name live in tests/helpers.py."""

import atexit
import os
import shutil
import tempfile

# Set before transformers/datasets are imported anywhere, so no test can reach the network. HF_HOME and the
# torch.compile cache are the pytest run's own, unless the environment names them: made by pytest's first process
# (pytest-xdist's workers inherit them) and removed when it exits (else each `make test` pass leaves about 100 MB
# behind). torch 2.13 does not key the compile cache on ATEN_CPU_CAPABILITY: a kernel cached under the AVX2 caps of
# `make test`'s second pass can abort a process of another pass.
for _variable, _prefix in (("HF_HOME", "albert_hf_test_home_"), ("TORCHINDUCTOR_CACHE_DIR", "albert_hf_inductor_")):
    if _variable not in os.environ:
        os.environ[_variable] = tempfile.mkdtemp(prefix=_prefix)
        atexit.register(shutil.rmtree, os.environ[_variable], True)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests read a started script's output while it runs (its first logged loss says it is training): block-buffered,
# a line shows only once the process ends. Set here for every process a test starts (and the preloaded server whose
# stdout forked scripts inherit), not left to the shell the suite happens to run in.
os.environ["PYTHONUNBUFFERED"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import THREADS, reset_accelerate_state, signals_left_as_found  # noqa: E402

# The files that take longest, longest first (seconds per file: BENCHMARKS.md, "The test suite"). pytest-xdist hands
# each worker whole files in collection order, so starting with these lets the workers finish together.
SLOWEST_FILES = [
    "test_preemption.py",
    "test_compile.py",
    "test_distributed.py",
    "test_combinations.py",
    "test_hub_push.py",
    "test_streaming.py",
    "test_ner.py",
    "test_pretraining.py",
    "test_squad.py",
    "test_interop.py",
    "test_tokenization.py",
    "test_bad_input.py",
    "test_resume.py",
    "test_divergence.py",
    "test_mixing.py",
    "test_continued.py",
]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _output_locks():
    """A script's main() called in the test's own process leaves no output-folder lock behind for the next test (the
    scripts' entry point releases it, cli.run_entry_point; a bare main() call does not)."""
    yield
    from albert_hf.runtime import output_lock

    output_lock.release_all()


@pytest.fixture(autouse=True)
def _signals_left_as_found():
    """A stop signal left blocked by one test (a script imported in-process) would be inherited by the processes
    later tests start, which then cannot be stopped by it (a served script would ignore SIGTERM)."""
    with signals_left_as_found():
        yield


@pytest.fixture(autouse=True, scope="session")
def _test_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh_accelerate_state():
    """An accelerate state built in the test (an in-process Accelerator) is cleared before and after it."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)
    yield
    reset_accelerate_state()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A saved tiny AlbertHFForPreTraining (random weights) with a 1000-piece tokenizer trained on the embedded
    corpus: the starting point of the fine-tuning script tests. Read-only: copy it before writing into it."""
    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from data_fixtures import tokenizer

    directory = tmp_path_factory.mktemp("tiny_albert")
    tok = tokenizer()
    torch.manual_seed(0)
    AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", vocab_size=len(tok))).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def glue_root(tmp_path_factory):
    """Every GLUE task's folder in its original layout, tiny (albert_hf.testing.glue_folders)."""
    from albert_hf.testing.glue_folders import write_glue_folders

    return write_glue_folders(tmp_path_factory.mktemp("glue_fixtures"))


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """One uninterrupted 12-step pretraining run with a checkpoint every 3 steps, the curve resumed runs must
    follow."""
    from pretraining_runs import RESUME_ARGS, pretrain

    reference = tmp_path_factory.mktemp("reference") / "run"
    pretrain(reference, *RESUME_ARGS)
    return reference
