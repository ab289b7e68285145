"""Shared test set-up: offline Hub, a throwaway HF_HOME, tiny configs."""

import os
import sys
import tempfile
from pathlib import Path

# Set before transformers/datasets are imported anywhere, so no test can reach the network.
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="albert_hf_test_home_"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # Tiny models: thread start-up costs more than it saves, and CI has 2 cores shared with subprocess tests.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_config(**overrides):
    from albert_hf import AlbertHFConfig

    return AlbertHFConfig.from_preset("tiny", **overrides)


def run_python(code: str, cwd, env_extra=None, timeout=300):
    """Run `code` in a fresh interpreter with albert_hf made unimportable (as on a machine without the package)."""
    import subprocess

    blocker = (
        "import sys\n"
        "class _BlockAlbertHF:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'albert_hf' or name.startswith('albert_hf.'):\n"
        "            raise ImportError('albert_hf is deliberately not importable in this test')\n"
        "sys.meta_path.insert(0, _BlockAlbertHF())\n"
    )
    env = {**os.environ, **(env_extra or {})}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, "-c", blocker + code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A saved tiny AlbertHFForPreTraining (random weights) with a 1000-piece tokenizer trained on the embedded
    corpus: the starting point of the fine-tuning script tests. Read-only: copy it before writing into it."""
    from data_fixtures import tokenizer

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining

    directory = tmp_path_factory.mktemp("tiny_albert")
    tok = tokenizer()
    torch.manual_seed(0)
    AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", vocab_size=len(tok))).save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory
