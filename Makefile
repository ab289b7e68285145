# Two entry points (see README): `make pretrain` and `make test` (and `make test-fast` while developing). All
# create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup pretrain lint test test-fast clean

setup: $(VENV)/.installed

# torch is installed first and pinned to the CPU build that lies on this machine's disk: a bare `torch`
# requirement with no torch present would pull a multi-GB CUDA build. The package itself asks for torch>=2.4.
# PYTHONWARNINGS: setuptools' screenful noting that an editable install finds albert_hf in this folder (its purpose).
$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install -q -e ".[test]"
	touch $@

# The main job on its embedded default: the small ALBERT (E=128, H=256, 4 layers) pretrained on the embedded corpus
# for 700 steps of 32 pairs of 64 tokens, then reloaded with AutoModel (a demo: a second `make pretrain` replaces
# the first one's outputs/albert-pretraining). 5.5 minutes on 2 AVX2 cores, 1.5 with AMX (docs/pretraining.md,
# "The demo"): LAMB at 5e-3 with --adam_beta2 0.98, in the precision run_pretraining.py's default (auto) picks: bf16
# autocast on CPUs with bf16 units, fp32 on the others. The flags are in recipes/demo.yaml.
pretrain: setup
	$(BIN)/python run_pretraining.py recipes/demo.yaml

# Tests never touch the network: offline Hub, and each pass its own HF_HOME and torch.compile cache, removed at its end
# (tests/conftest.py; torch 2.13 does not key the compile cache on ATEN_CPU_CAPABILITY). Each test
# runs one thread (tests/conftest.py), so the files are spread over one worker per core (pytest-xdist; at most 4), a
# file's tests in one worker so that its module fixtures run once, the slowest files first (conftest.SLOWEST_FILES;
# xdist would otherwise order the files by their number of tests). The scripts the tests start, and the workers of
# the launchers they start, are forked from an interpreter that has imported the stack once per worker
# (tests/preloaded.py): 4 s of imports saved a process.
# The suite runs in an environment reduced to what it needs (`env -i`): PATH, HOME, a UTF-8 locale, TMPDIR and
# ALBERT_HF_TEST_THREADS where set, and the variables below. A variable of the developer's shell cannot change the
# outcome: a test that passes only under it (PYTHONUNBUFFERED, say) fails here as on a machine without it.
CLEAN_ENV = env -i PATH="$$PATH" HOME="$$HOME" LANG=C.UTF-8 $${TMPDIR:+TMPDIR="$$TMPDIR"} \
	$${ALBERT_HF_TEST_THREADS:+ALBERT_HF_TEST_THREADS="$$ALBERT_HF_TEST_THREADS"}
PYTEST_RUN = HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	$(BIN)/python -m pytest -q -p no:cacheprovider --numprocesses auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder \
	--durations 15
PYTEST = $(CLEAN_ENV) $(PYTEST_RUN)
# Most CI runners and cloud VMs have AVX2 and no AVX-512: a trained model's last bits differ there, and the precision
# auto picks is fp32 (no bf16 units). On a CPU with AVX-512 (or AMX), the tests whose outcome depends on that (marker
# `rounding`) run a second time with torch's, oneDNN's and MKL's kernels capped at AVX2, so that a test which holds
# only on this CPU's kernels fails here too. Each pass ends with its 15 slowest tests, so that growth shows.
AVX2_CAPS = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2

# pyflakes, pycodestyle and import order ([tool.ruff] in pyproject.toml), before every test run: a second or two.
lint: setup
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

test: lint
	$(PYTEST) tests
	@if [ "$$($(BIN)/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" = AVX512 ]; then \
		echo "make test: the tests marked 'rounding' again, with the kernels capped at AVX2"; \
		$(CLEAN_ENV) $(AVX2_CAPS) $(PYTEST_RUN) -m rounding tests; \
	else \
		echo "make test: no AVX-512 kernels on this CPU, so the run above already had what the AVX2 caps give"; \
	fi

# The quick loop while developing: everything but the launched multi-process runs, torch.compile, the tests that
# train to an outcome and the whole-corpus reads, except one cheap test (`quick`) of each file that has only those
# (`make test` runs them all).
test-fast: lint
	$(PYTEST) -m "not launched and not compiles and not trains and not corpus or quick" tests

clean:
	rm -rf $(VENV) *.egg-info
