"""The packaging and the project's conventions: setup.cfg declares every package that albert_hf imports (a module
importing an undeclared one works here only because something else happened to install it), make test's reduced
environment, imports by name, `__init__`s that only re-export, the package reading nothing of the checkout,
docstrings naming what exists, loggers by module, tests independent of each other, comments without history. The
architecture's rules are test_architecture.py's."""

import ast
import configparser
import os
import re
import sys

from helpers import REPO, module_name

# import name -> distribution name, where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "yaml": "pyyaml"}


def imported_top_level_modules(package_dir) -> dict[str, set[str]]:
    """{top-level module: the files importing it} for every absolute import in the package (relative ones are its
    own)."""
    found = {}
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(path.relative_to(package_dir.parent).as_posix())
    return found


def declared(requirements: str) -> set[str]:
    names = set()
    for line in requirements.strip().splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.\-]+)", line)
        if match:
            names.add(match.group(1).lower().replace("_", "-"))
    return names


def test_every_third_party_import_of_the_package_is_declared():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    required = declared(config["options"]["install_requires"])
    extras = {name: declared(value) for name, value in config["options.extras_require"].items()}
    optional = set().union(*(names for extra, names in extras.items() if extra != "test"))
    undeclared = {}
    for module, files in imported_top_level_modules(REPO / "albert_hf").items():
        if module in sys.stdlib_module_names or module == "albert_hf" or module == "__future__":
            continue
        distribution = DISTRIBUTIONS.get(module, module).lower().replace("_", "-")
        if distribution not in required and distribution not in optional:
            undeclared[distribution] = sorted(files)
    assert not undeclared, f"imported by albert_hf but not in setup.cfg: {undeclared}"
    assert {"huggingface-hub", "tqdm", "torch", "transformers"} <= required  # the parser reads what it should


def test_every_arguments_parameter_says_its_type():
    """A function that takes a job's arguments as `args` annotates them (`PretrainingArguments`, frozen, in
    run_pretraining.py's entry; TrainingArguments in a Trainer callback), so a reader sees what it receives."""
    found = []
    for path in sorted((REPO / "albert_hf").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found += [
                    f"{path.name}:{node.lineno} {node.name}"
                    for arg in node.args.args + node.args.kwonlyargs
                    if arg.arg == "args" and arg.annotation is None
                ]
    assert not found, found


def pytest_commands(makefile, target: str) -> list[str]:
    """The pytest commands `make TARGET` would run with this Makefile (a dry run: nothing is executed)."""
    import subprocess

    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), "-f", str(makefile), target], capture_output=True, text=True, check=True
    )
    return [line for line in dry.stdout.replace("\\\n", " ").splitlines() if "-m pytest" in line]


def runs_in_the_reduced_environment(command: str) -> bool:
    """`env -i ...` is the command that starts pytest: nothing of the caller's environment but what it names."""
    start, pytest = command.find("env -i "), command.find("-m pytest")
    return 0 <= start < pytest and not any(separator in command[start:pytest] for separator in (";", "&&", "||"))


def test_make_test_runs_every_pytest_in_a_reduced_environment(tmp_path):
    """A variable of the developer's shell (PYTHONUNBUFFERED, say) cannot change the suite's outcome: every pytest
    that `make test` and `make test-fast` start runs under `env -i` (shown to catch a Makefile without it)."""
    for target in ("test", "test-fast"):
        commands = pytest_commands(REPO / "Makefile", target)
        assert commands and all(map(runs_in_the_reduced_environment, commands)), commands
    planted = tmp_path / "Makefile"
    planted.write_text(
        (REPO / "Makefile").read_text().replace("PYTEST = $(CLEAN_ENV) $(PYTEST_RUN)", "PYTEST = $(PYTEST_RUN)")
    )
    assert not all(map(runs_in_the_reduced_environment, pytest_commands(planted, "test")))


def test_a_pytest_run_removes_its_throwaway_folders_when_it_ends(tmp_path):
    """The HF_HOME and torch.compile cache a pytest run makes for itself (tests/conftest.py) are gone when it ends:
    each `make test` pass left them in the temp folder, about 100 MB a run. A run with its own TMPDIR and neither
    variable set leaves nothing there but pytest's own base folder."""
    import getpass
    import subprocess

    temp = tmp_path / "temp"
    temp.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": os.environ["HOME"], "LANG": "C.UTF-8", "TMPDIR": str(temp)}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_squad_metrics.py"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert {path.name for path in temp.iterdir()} <= {f"pytest-of-{getpass.getuser()}"}


def path_edits(source: str) -> list[str]:
    """`sys.path.insert/append/extend/remove(...)` and assignments to `sys.path` or a slice of it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and ast.unparse(node.func.value) == "sys.path"
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [
                f"{node.lineno}: {ast.unparse(target)} = ..."
                for target in targets
                if ast.unparse(target).startswith("sys.path")
            ]
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_path_edit_finder_catches_inserts_and_slice_assignments():
    planted = "import sys\nsys.path.insert(0, 'x')\nsys.path[:] = []\nprint(sys.path[0])\nsys.path += ['y']\n"
    assert path_edits(planted) == ["2: sys.path.insert(0, 'x')", "3: sys.path[:] = ...", "5: sys.path = ..."]


def test_tests_benchmarks_and_examples_import_by_name_without_path_edits():
    """Tests import the scripts and benchmarks by name (setup.cfg's pytest `pythonpath`), and the synthetic data that
    examples and benchmarks share lives in albert_hf.testing. tests/preloaded.py is the one exception: it gives a
    script forked from the preloaded interpreter the sys.path a fresh `python SCRIPT` would have."""
    files = [*REPO.glob("tests/*.py"), *REPO.glob("benchmarks/*.py"), *REPO.glob("examples/*.py")]
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted(files)
        if path.name != "preloaded.py"
        for where in path_edits(path.read_text())
    ]
    assert not found, found


def beyond_reexports(source: str) -> list[str]:
    """The statements of an `__init__.py` other than its docstring, imports and `__all__`."""
    found = []
    for index, node in enumerate(ast.parse(source).body):
        if index == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["__all__"]:
            continue
        found.append(f"{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


def test_the_reexport_finder_catches_code_in_an_init():
    planted = '"""Doc."""\nfrom .a import b\n__all__ = ["b"]\nX = 1\ndef f():\n    pass\nfor k in []:\n    pass\n'
    assert beyond_reexports(planted) == ["4: X = 1", "5: def f():", "7: for k in []:"]


def test_each_init_holds_only_reexports_and_a_docstring():
    """A reader finds code in the module named for it: every `__init__.py` of albert_hf re-exports and says what its
    folder holds, nothing else (the Auto-class registration is auto_classes.py, imported by the package)."""
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted((REPO / "albert_hf").rglob("__init__.py"))
        for where in beyond_reexports(path.read_text())
    ]
    assert not found, found


CHECKOUT_ONLY = {"tests", "benchmarks", "examples"}  # folders of a source checkout that a wheel does not have


def checkout_paths(source: str) -> list[str]:
    """Paths built into a folder that only a checkout has: `... / "tests"` (or "benchmarks", "examples")."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and any(isinstance(side, ast.Constant) and side.value in CHECKOUT_ONLY for side in (node.left, node.right))
    ]


def test_the_checkout_path_finder_catches_a_fixtures_folder():
    planted = 'from pathlib import Path\nFIXTURES = Path(__file__).parents[2] / "tests" / "fixtures"\nname = "tests"\n'
    assert checkout_paths(planted) == ["2: Path(__file__).parents[2] / 'tests'"]


def test_the_package_reads_nothing_of_the_checkout():
    """albert_hf holds what a wheel's user can run: no module reads the checkout's tests, benchmarks or examples
    (the fuzzing cases, which start from tests/fixtures, live in benchmarks/)."""
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted((REPO / "albert_hf").rglob("*.py"))
        for where in checkout_paths(path.read_text())
    ]
    assert not found, found


def test_conftest_holds_fixtures_and_no_test_imports_it():
    """Helpers that tests call live in tests/helpers.py; conftest.py is pytest's, holding set-up and fixtures."""
    importers = [
        path.name
        for path in sorted(REPO.glob("tests/*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and "conftest" in ([alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module])
    ]
    assert not importers, importers
    tree = ast.parse((REPO / "tests" / "conftest.py").read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    not_fixtures = [
        node.name
        for node in functions
        if not node.name.startswith("pytest_")
        and not any("fixture" in ast.unparse(decorator) for decorator in node.decorator_list)
    ]
    assert not not_fixtures, not_fixtures


# A backticked dotted name in albert_hf's prose (`checkpoints.StepCheckpoints.resolve`, `albert_hf.hub.upload`) whose
# first parts name a module of albert_hf, by its path or the end of it (the nearest package first, as a relative
# import would find it), must name that module's attribute, unless a parameter or local where the prose is has that
# name (`trainer.evaluate` in a function taking a `trainer`). Any other first part must be a module-level name of the
# file, a class of albert_hf, a name albert_hf imports somewhere (`TrainingArguments.main_process_first`), something
# importable or one of `NOT_MODULES`: else it is a module that is gone. Files (`model.safetensors`) are not references.
REFERENCE = re.compile(r"`((?:[A-Za-z_]\w*\.)+[A-Za-z_]\w*)(?:\(.*\)|\[.*\]|\.?…)?`")
FILE_SUFFIXES = {"py", "json", "jsonl", "safetensors", "bin", "txt", "md", "yaml", "model", "index", "pt", "csv", "tsv"}
# the objects the prose names by their usual variable (a model's `config.sharing`, `accelerator.prepare`), TensorFlow
# in the official code (`tf.where`) and a checkpoint folder (`step_N.damaged`)
NOT_MODULES = {
    "config",
    "accelerator",
    "optimizer",
    "scheduler",
    "state",
    "stop",
    "dataset",
    "predictions",
    "tf",
    "step_N",
}


def prose(source: str) -> list[tuple[int, str]]:
    """A module's comments and docstrings, each with its first line."""
    import io
    import tokenize

    found = [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)
        ):
            found.append((node.body[0].lineno, node.body[0].value.value))
    return found


def defined_names(body: list) -> dict:
    """{name: its class or function node, or None} for what a module or class body defines, assigns or imports."""
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            names.update(
                {
                    part.id: None
                    for target in getattr(node, "targets", [getattr(node, "target", None)])
                    for part in ast.walk(target)
                    if isinstance(part, ast.Name)
                }
            )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(alias.asname or alias.name).split(".")[0]: None for alias in node.names})
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            blocks = node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            names.update(
                defined_names(blocks + [part for handler in getattr(node, "handlers", []) for part in handler.body])
            )
    return names


def local_names(tree, line: int) -> set[str]:
    """The names the code around `line` has in scope besides the module's: those of the classes around it, and the
    parameters of the functions around it and every name they assign."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.lineno <= line <= node.end_lineno:
            names |= set(defined_names(node.body))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= node.end_lineno:
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            names |= {arg.arg for arg in [*arguments, node.args.vararg, node.args.kwarg] if arg is not None}
            names |= {
                part.id for part in ast.walk(node) if isinstance(part, ast.Name) and isinstance(part.ctx, ast.Store)
            }
    return names


def has_attribute(node, rest: list[str]) -> bool:
    """Whether a module-level class or function `node` has the attribute path `rest`: a class's own names and
    `self.x` assignments; a class with bases may inherit what it does not define."""
    for part in rest:
        if not isinstance(node, ast.ClassDef):
            return False
        own = defined_names(node.body)
        assigned = {
            target.attr
            for target in ast.walk(node)
            if isinstance(target, ast.Attribute)
            and isinstance(target.ctx, ast.Store)
            and ast.unparse(target.value) == "self"
        }
        if part not in own and part not in assigned:
            return bool(node.bases)
        node = own.get(part)
        if node is None:
            return True
    return True


def stale_references(package_dir) -> list[str]:
    """The backticked references of the package's prose that name nothing (`REFERENCE`), as "file:line `name`: why"."""
    import importlib.util

    paths = {module_name(path, package_dir): path for path in sorted(package_dir.rglob("*.py"))}
    trees = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in paths.items()}
    known = NOT_MODULES | {
        node.name for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
    }
    known |= {
        (alias.asname or alias.name).split(".")[0]
        for tree in trees.values()
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }

    def resolves(module: str, rest: list[str]) -> bool:
        while rest and f"{module}.{rest[0]}" in paths:
            module, rest = f"{module}.{rest[0]}", rest[1:]
        if not rest:
            return True
        names = defined_names(trees[module].body)
        return rest[0] in names and (names[rest[0]] is None or has_attribute(names[rest[0]], rest[1:]))

    found = []
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        scopes = [".".join(package.split(".")[:end]) for end in range(package.count(".") + 1, 0, -1)]
        for line, text in prose(path.read_text(encoding="utf-8")):
            for match in REFERENCE.finditer(text):
                parts = match.group(1).split(".")
                if parts[-1] in FILE_SUFFIXES or parts[0] in local_names(trees[name], line):  # a file; a variable
                    continue
                where = f"{path.relative_to(package_dir.parent).as_posix()}:{line} `{match.group(1)}`"
                for end in range(len(parts), 0, -1):
                    named = ".".join(parts[:end])
                    near = [f"{scope}.{named}" for scope in scopes if f"{scope}.{named}" in paths]
                    candidates = near[:1] or [
                        module for module in paths if module == named or module.endswith(f".{named}")
                    ]
                    if candidates:
                        break
                if len(candidates) > 1:
                    found.append(f"{where}: which of {', '.join(candidates)}?")
                elif candidates and not resolves(candidates[0], parts[end:]):
                    found.append(f"{where}: not in {candidates[0]}")
                elif (
                    not candidates
                    and parts[0] not in known | set(defined_names(trees[name].body))
                    and importlib.util.find_spec(parts[0]) is None
                ):
                    found.append(f"{where}: no such module")
    return found


def test_the_reference_check_catches_a_planted_stale_reference(tmp_path):
    package = tmp_path / "albert_hf"
    for folder in ("pretraining", "runtime", "convert"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    for folder in ("runtime", "convert"):
        (package / folder / "cli.py").write_text("def main():\n    pass\n")
    (package / "__init__.py").write_text("")
    (package / "pretraining" / "checkpoints.py").write_text(
        "import torch\n\nclass StepCheckpoints:\n    def __init__(self):\n        self.folder = None\n\n"
        "    def resolve(self):\n        pass\n\ndef save(checkpointing: bool):\n    pass\n"
    )
    fine = (
        '"""Checks `checkpoints.StepCheckpoints.resolve`, `StepCheckpoints.folder`, `albert_hf.pretraining`, '
        '`checkpoints.torch` and `runtime.cli.main()`; writes `model.safetensors`."""\n\n'
        'def fit(run, checkpoints):\n    """`run.model`, `checkpoints.latest` (the parameter), `os.path`, '
        '`pretraining.checkpoints.StepCheckpoints.folder`."""\n'
    )
    (package / "pretraining" / "job.py").write_text(
        fine + "# `checkpointing.StepCheckpoints`, `checkpoints.StepCheckpoints.load`, `cli.main`, `pretraining.fit`\n"
    )
    assert stale_references(package) == [
        "albert_hf/pretraining/job.py:5 `checkpointing.StepCheckpoints`: no such module",
        "albert_hf/pretraining/job.py:5 `checkpoints.StepCheckpoints.load`: not in albert_hf.pretraining.checkpoints",
        "albert_hf/pretraining/job.py:5 `cli.main`: which of albert_hf.convert.cli, albert_hf.runtime.cli?",
        "albert_hf/pretraining/job.py:5 `pretraining.fit`: not in albert_hf.pretraining",
    ]
    (package / "pretraining" / "job.py").write_text(fine)
    assert stale_references(package) == []


def test_the_docstrings_and_comments_name_modules_and_names_that_exist():
    """A backticked reference in albert_hf's prose names a module and an attribute that exist (shown to catch a
    planted stale one): a name left from a module since renamed sends the reader to a file that is not there."""
    found = stale_references(REPO / "albert_hf")
    assert not found, found


def foreign_loggers(source: str, libraries: set[str]) -> list[str]:
    """`getLogger(...)` calls naming a logger other than the module's own (`__name__`) or a library's that the
    package imports (`"accelerate"`, whose notices the pretraining log quiets)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and (
            getattr(node.func, "attr", None) == "getLogger" or getattr(node.func, "id", None) == "getLogger"
        ):
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Name) and argument.id == "__name__":
                continue
            if isinstance(argument, ast.Constant) and str(argument.value).split(".")[0] in libraries:
                continue
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_logger_check_catches_a_module_logging_under_another_name():
    planted = (
        "import logging\nfrom logging import getLogger\n"
        'logger = logging.getLogger("albert_hf.pretraining.job")\nours = getLogger(__name__)\n'
        'logging.getLogger("accelerate.utils").setLevel(logging.WARNING)\nroot = logging.getLogger()\n'
        'other = getLogger(f"{__name__}.x")\n'
    )
    assert foreign_loggers(planted, {"accelerate"}) == [
        "3: logging.getLogger('albert_hf.pretraining.job')",
        "6: logging.getLogger()",
        "7: getLogger(f'{__name__}.x')",
    ]


def test_every_module_logs_under_its_own_name():
    """A log line names the module that wrote it (`getLogger(__name__)`; the log format prints it), so a reader finds
    the code from the line and a filter on a package (`albert_hf.pretraining`) takes its modules' lines. Shown to
    catch a module logging under another module's name."""
    libraries = set(imported_top_level_modules(REPO / "albert_hf")) - {"albert_hf", *sys.stdlib_module_names}
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted((REPO / "albert_hf").rglob("*.py"))
        for where in foreign_loggers(path.read_text(), libraries)
    ]
    assert not found, found


def imports_of_test_files(source: str) -> list[str]:
    """Imports of a test file (a `test_*` module), at module level or inside a function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        if any(name.split(".")[0].startswith("test_") for name in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_test_import_finder_catches_an_import_inside_a_test():
    planted = (
        "from helpers import REPO\nimport test_glue\nfrom data_fixtures import SQUAD_V1\n\n"
        "def test_x():\n    from test_squad import write_json\n"
    )
    assert imports_of_test_files(planted) == ["2: import test_glue", "6: from test_squad import write_json"]


def test_no_test_file_imports_another():
    """What several test files share lives in tests/helpers.py (calls), data_fixtures.py (inputs), pretraining_runs.py
    (pretraining runs) and conftest.py (fixtures): a test file imported by another one runs its module's code there,
    and its fixtures come back as unused imports (shown to catch a planted import)."""
    found = [
        f"{path.name}:{where}"
        for path in sorted(REPO.glob("tests/*.py"))
        for where in imports_of_test_files(path.read_text())
    ]
    assert not found, found


def long_test_names(source: str, limit: int = 100) -> list[str]:
    """The tests (`test_*` functions) whose name is over `limit` characters."""
    return [
        f"{node.name} ({len(node.name)})"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name.startswith("test_")
        and len(node.name) > limit
    ]


def test_the_name_length_finder_catches_a_101_character_test():
    long, short = "test_" + "x" * 96, "test_" + "x" * 95
    assert long_test_names(f"def {long}():\n    pass\ndef {short}():\n    pass\n") == [f"{long} (101)"]


def test_no_test_name_is_over_100_characters():
    """A test's name says what it shows in a line a terminal and a failure report show whole."""
    found = [
        f"{path.name}: {name}" for path in sorted(REPO.glob("tests/*.py")) for name in long_test_names(path.read_text())
    ]
    assert not found, found


# Prose that tells how the code came to be instead of why it is as it is: a work period named by its number, a
# behaviour it had in the past, the code it replaced.
HISTORY = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(st|nd|rd|th)|this|last|next|previous"
    r"|earlier|later) (session|lease)\b|\bleases?\b|(?<!is )(?<!are )(?<!be )(?<!was )(?<!were )\bused to\b"
    r"|\bonce (hid|ended|did|was|were|had|failed|hung|broke)\b|\bolder versions?\b|\bthe version before\b"
    r"|\bbefore versions\b",
    re.IGNORECASE,
)


def history(prose_parts: list[tuple[int, str]]) -> list[str]:
    """'line: words' for each `HISTORY` match in (line, text) parts of prose, a text's line breaks read as spaces."""
    return [
        f"{line}: {match.group(0)}"
        for line, text in sorted(prose_parts)
        for match in HISTORY.finditer(" ".join(text.split()))
    ]


def makefile_comments(text: str) -> list[tuple[int, str]]:
    return [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.lstrip().startswith("#")]


def test_the_history_finder_catches_sessions_and_what_the_code_used_to_do():
    planted = (
        '"""Measured in the fifth\n    session."""\n# the run used to hang here\n'
        "x = 1  # in a session of its own; released; the lock is used to wait\n"
        '# BENCHMARKS.md, "second lease"\ndef f():\n'
        '    """A step once hid a failure; it is no longer finite."""\n'
    )
    assert history(prose(planted)) == ["1: fifth session", "3: used to", "5: second lease", "7: once hid"]
    makefile = "# PYTHONUNBUFFERED once hid a test\nX = y  # an older version\n\t@echo used to\n"
    assert history(makefile_comments(makefile)) == ["1: once hid"]


def test_comments_say_why_the_code_is_so_not_its_history():
    """albert_hf's, the tests' and the Makefile's comments and docstrings explain the code as it is: the work periods
    it was written in, and what it did before, are the commit log's (shown to catch planted history)."""
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted([*(REPO / "albert_hf").rglob("*.py"), *REPO.glob("tests/*.py")])
        for where in history(prose(path.read_text(encoding="utf-8")))
    ]
    found += [f"Makefile:{where}" for where in history(makefile_comments((REPO / "Makefile").read_text()))]
    assert not found, found
