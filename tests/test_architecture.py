"""The architecture's rules, each stated as the intent it protects and each shown to catch a planted violation: no
import cycle, each layer importing only those below it, a folder a job, the pretraining job's object and arguments
kept to the job's modules, the arguments as parsed, functions and modules of a size a reader holds, the tasks' one
shape, and one training step readable in three files. The packaging checks are test_packaging.py's."""

import ast
from pathlib import Path

from helpers import REPO, module_name

MODULE_LINES = 500
LONGER_ALLOWED = {"albert_hf/modeling_albert_hf.py"}  # the model: one file, as transformers' modeling files are


def long_modules(root: Path) -> list[str]:
    """albert_hf's modules over MODULE_LINES lines, but the model's."""
    found = []
    for path in sorted((root / "albert_hf").rglob("*.py")):
        name = path.relative_to(root).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MODULE_LINES and name not in LONGER_ALLOWED:
            found.append(f"{name} ({lines} lines)")
    return found


def test_the_module_size_check_catches_a_long_module_and_lets_the_model_be(tmp_path):
    (tmp_path / "albert_hf" / "pretraining").mkdir(parents=True)
    (tmp_path / "albert_hf" / "pretraining" / "long.py").write_text("x = 1\n" * 501)
    (tmp_path / "albert_hf" / "pretraining" / "short.py").write_text("x = 1\n" * 500)
    (tmp_path / "albert_hf" / "modeling_albert_hf.py").write_text("x = 1\n" * 1500)
    assert long_modules(tmp_path) == ["albert_hf/pretraining/long.py (501 lines)"]


def test_a_reader_finds_each_job_in_modules_of_at_most_500_lines():
    """One module, one job a reader can hold: a module that grows past 500 lines is split by what it does."""
    found = long_modules(REPO)
    assert not found, found


def rebound_arguments(source: str) -> list[str]:
    """Where an arguments object (a name ending in `args`, not `kwargs`) is bound after parsing: any assignment to such
    a name but `args = parse_args(...)`, a parameter of that kind rebound in its function among them."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
            or isinstance(node, ast.AnnAssign)
            and node.value is None
        ):  # a field declared, nothing bound
            continue
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func).endswith("parse_args")
        ):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [
            part.id
            for target in targets
            for part in ast.walk(target)
            if isinstance(part, ast.Name)
            and isinstance(part.ctx, ast.Store)
            and part.id.endswith("args")
            and not part.id.endswith("kwargs")
        ]
        found += [f"{node.lineno}: {name}" for name in names]
    return found


def test_the_rebinding_check_catches_arguments_replaced_by_a_function():
    planted = (
        "def setup(args):\n    args, notes = choose_step(args)\n    return args\n\n"
        "def main(argv):\n    args = parse_args(argv)\n    model_args = args.model\n    kwargs = {}\n"
    )
    assert rebound_arguments(planted) == ["2: args", "7: model_args"]


def test_pretraining_reads_its_arguments_as_parsed():
    """The pretraining job's arguments are resolved once, in `resolution.parse_args`; what the machine decides (the
    step, the micro-batch, the precision) is `machine.MachinePlan`, beside them, so `args` means one thing
    everywhere."""
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted((REPO / "albert_hf" / "pretraining").rglob("*.py"))
        if path.name != "resolution.py"
        for where in rebound_arguments(path.read_text())
    ]
    assert not found, found


def internal_imports(package_dir) -> dict[str, set[str]]:
    """{module: the albert_hf modules it imports}, every import statement counted: at module level, inside
    functions and under TYPE_CHECKING. `from .x import y` counts as importing x.y where that is a module."""
    paths = {module_name(path, package_dir): path for path in package_dir.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                imported.update(
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base for alias in node.names
                )
        graph[name] = {module for module in imported if module in paths and module != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None (depth-first search)."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    package = tmp_path / "albert_hf"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from .b import thing\n")
    (package / "b.py").write_text("def thing():\n    from . import a\n")
    (package / "c.py").write_text("from albert_hf.a import thing\n")
    graph = internal_imports(package)
    assert graph["albert_hf.c"] == {"albert_hf.a"}
    assert find_cycle(graph) == ["albert_hf.a", "albert_hf.b", "albert_hf.a"]
    (package / "b.py").write_text("def thing():\n    pass\n")
    assert find_cycle(internal_imports(package)) is None


def test_no_import_cycle_in_albert_hf():
    cycle = find_cycle(internal_imports(REPO / "albert_hf"))
    assert cycle is None, " -> ".join(cycle)


# The layers of albert_hf, lowest first: a module imports its own layer and those below, never one above. The
# top-level modules (the model, the optimizers, the tokenizer, errors) are the base; what the jobs report beside
# their results (`reports`) sits with the Hub and the metrics; each job has its folder (`testing` writes synthetic
# inputs for the jobs, so it sits beside them); the paper's analyses read trained models and the jobs' data
# building, and the checkpoint evaluations read a pretraining run and fine-tune it, so they are on top and no job
# imports them.
LAYERS = (
    ("core",),
    ("runtime",),
    ("hub", "metrics", "reports"),
    ("pretraining", "tasks", "convert", "average", "testing"),
    ("analysis", "checkpoint_evals"),
)


def area(module: str, package_dir) -> str:
    """The folder a module of albert_hf lies in ("pretraining", "runtime", ...), or "core" for a top-level one."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (package_dir / parts[1]).is_dir() else "core"


def upward_imports(package_dir) -> list[str]:
    """Imports of a module in a higher layer than the importer's. The package's `__init__` is left out: it
    re-exports the public names (the collator among them) from wherever they live."""
    rank = {name: level for level, names in enumerate(LAYERS) for name in names}
    found = []
    for module, imported in sorted(internal_imports(package_dir).items()):
        if module == "albert_hf":
            continue
        for target in sorted(imported):
            if rank.get(area(target, package_dir), 0) > rank.get(area(module, package_dir), 0):
                found.append(f"{module} -> {target}")
    return found


def test_the_layer_check_catches_a_runtime_module_importing_a_job(tmp_path):
    package = tmp_path / "albert_hf"
    for folder in ("runtime", "pretraining"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("from .pretraining import job\n")
    (package / "errors.py").write_text("")
    (package / "pretraining" / "job.py").write_text("from ..runtime import cli\nfrom .. import errors\n")
    (package / "runtime" / "cli.py").write_text("def f():\n    from ..pretraining.job import main\n")
    assert upward_imports(package) == ["albert_hf.runtime.cli -> albert_hf.pretraining.job"]
    (package / "runtime" / "cli.py").write_text("from ..errors import x\n")
    assert upward_imports(package) == []


def test_the_layer_check_catches_a_job_importing_an_analysis(tmp_path):
    package = tmp_path / "albert_hf"
    for folder in ("pretraining", "analysis", "reports"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "analysis" / "intrinsic.py").write_text("from ..pretraining.pairs import build\n")
    (package / "pretraining" / "pairs.py").write_text("def build():\n    pass\n")
    (package / "pretraining" / "job.py").write_text("from ..analysis.intrinsic import x\n")
    assert upward_imports(package) == ["albert_hf.pretraining.job -> albert_hf.analysis.intrinsic"]
    (package / "pretraining" / "job.py").write_text("from ..reports.curves import x\n")
    assert upward_imports(package) == []


def test_no_module_imports_a_layer_above_its_own():
    found = upward_imports(REPO / "albert_hf")
    assert not found, found


def test_each_job_has_its_folder_and_the_top_level_stays_small():
    """A newcomer finds a job by its folder: the top level keeps the model (the remote-code pair) and the few
    modules every job shares."""
    package = REPO / "albert_hf"
    folders = {path.name for path in package.iterdir() if (path / "__init__.py").is_file()}
    assert {"pretraining", "tasks", "convert", "metrics", "reports", "analysis", "runtime", "hub"} <= folders
    top_level = sorted(path.name for path in package.glob("*.py"))
    assert len(top_level) <= 12, top_level
    assert {"configuration_albert_hf.py", "modeling_albert_hf.py"} <= set(top_level)
    assert {name for names in LAYERS for name in names} - {"core"} == folders


# The pretraining job's modules: run.py defines the job's object and builds it, loop.py trains it, job.py saves it.
PRETRAINING_JOB = (
    "albert_hf/pretraining/job.py",
    "albert_hf/pretraining/run.py",
    "albert_hf/pretraining/training/loop.py",
)


def test_only_the_job_and_its_loop_see_the_whole_pretraining_job():
    """The job's object (`pretraining.run.Run`) stays in the job's modules (`PRETRAINING_JOB`): run.py builds
    it, loop.py trains it, job.py saves it; no other module of albert_hf imports it or has a function taking a
    `run`; the modules below the job take explicit arguments."""
    found = []
    for path in sorted((REPO / "albert_hf").rglob("*.py")):
        if path.relative_to(REPO).as_posix() in PRETRAINING_JOB:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(alias.name == "Run" for alias in node.names):
                found.append(f"{path.name}:{node.lineno} imports Pretraining")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if "run" in [arg.arg for arg in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]:
                    found.append(f"{path.name}:{node.lineno} {node.name}(run, ...)")
    assert not found, found


# The pretraining entry: the only modules that see the whole run's arguments (run.py's `Run` holds them).
PRETRAINING_ENTRY = (
    *PRETRAINING_JOB,
    "albert_hf/pretraining/arguments.py",
    "albert_hf/pretraining/resolution.py",
    "albert_hf/pretraining/plan.py",
)


def whole_run_arguments(source: str) -> list[str]:
    """Where a module takes the whole run's arguments: a parameter annotated `PretrainingArguments` (or its name as
    a string), or an import of the class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and any(alias.name == "PretrainingArguments" for alias in node.names):
            found.append(f"{node.lineno}: imports PretrainingArguments")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            found += [
                f"{node.lineno}: {node.name}({arg.arg})"
                for arg in arguments
                if arg.annotation is not None and "PretrainingArguments" in ast.unparse(arg.annotation)
            ]
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_whole_arguments_finder_catches_a_planted_parameter():
    planted = (
        "from .arguments import DataArgs, PretrainingArguments\n"
        "def build(data: DataArgs, seed: int):\n    pass\n"
        "def card(args: 'PretrainingArguments'):\n    pass\n"
    )
    assert whole_run_arguments(planted) == ["1: imports PretrainingArguments", "4: card(args)"]


def test_no_function_below_the_pretraining_entry_takes_the_whole_run_arguments():
    """Each part of the run takes the group of arguments it needs (`DataArgs`, `ModelArgs`, ...) or explicit values;
    only the entry (job.py and loop.py, the job's two modules; arguments.py, which defines them; resolution.py, which
    resolves them; plan.py, --dry_run's plan and the batch-size search) holds the whole `PretrainingArguments`."""
    found = [
        f"{path.relative_to(REPO)}:{where}"
        for path in sorted((REPO / "albert_hf").rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in PRETRAINING_ENTRY
        for where in whole_run_arguments(path.read_text())
    ]
    assert not found, found


def code_files() -> list:
    """albert_hf's modules and the run_*.py scripts: the code the structure rules below hold for."""
    return sorted([*(REPO / "albert_hf").rglob("*.py"), *REPO.glob("run_*.py")])


def assignments_to_arguments(source: str) -> list[str]:
    """`x_args.field = ...` (or +=, or `setattr(x_args, ...)`) anywhere in the source: an arguments object (a name
    ending in `args`) changed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id.endswith("args")
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        found += [
            f"{node.lineno}: {ast.unparse(target)}"
            for target in targets
            for part in ast.walk(target)
            if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id.endswith("args")
        ]
    return found


def test_the_assignment_finder_finds_an_argument_changed_in_a_tuple_target():
    planted = (
        "def fit(data_args, config):\n    n, data_args.max_seq_length = 1, 2\n    training_args.seed += 1\n"
        "    setattr(model_args, 'revision', 'x')\n"
    )
    assert assignments_to_arguments(planted) == [
        "2: (n, data_args.max_seq_length)",
        "3: training_args.seed",
        "4: setattr(model_args, 'revision', 'x')",
    ]


def test_no_code_changes_the_arguments_after_parsing():
    """The scripts' and the pretraining job's arguments keep the values they were checked with: a value that must
    be fitted (a length capped at the model's positions) makes a checked copy (`dataclasses.replace`), and
    --paper_hparams parses the arguments again with the recipe as their defaults (`recipe.apply_paper_hparams`)."""
    found = [f"{path.name}:{where}" for path in code_files() for where in assignments_to_arguments(path.read_text())]
    assert not found, found


def long_functions(source: str, limit: int = 60) -> list[str]:
    """Functions whose code (signature to last line, the docstring not counted) is over `limit` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0]
            docstring = (
                first.end_lineno - first.lineno + 1
                if isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                else 0
            )
            length = node.end_lineno - node.lineno + 1 - docstring
            if length > limit:
                found.append(f"{node.name} ({length} lines)")
    return found


def test_the_length_finder_counts_code_not_docstrings():
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    assert long_functions(f'def short():\n    """Doc.\n\n    More.\n    """\n{body}') == []  # 60 lines of code
    assert long_functions(f"def long(a,\n         b):\n{body}") == ["long (61 lines)"]


def test_no_function_does_several_jobs_in_over_60_lines():
    """A function over 60 lines of code is split where it does several jobs; none is left in albert_hf or the
    scripts."""
    found = [f"{path.name}: {where}" for path in code_files() for where in long_functions(path.read_text())]
    assert not found, found


# Every task's package has the same modules for the same jobs; each script imports its task's package alike.
TASK_PACKAGES = ("glue", "squad", "race", "ner", "own_data")


TASK_MODULES = ("data.py", "features.py", "definition.py")  # the data arguments and reading; the inputs; the task


SCRIPT_TASKS = {"run_glue.py": "glue", "run_squad.py": "squad", "run_race.py": "race", "run_ner.py": "ner"}


def task_shape_problems(repo) -> list[str]:
    """What breaks the tasks' one shape: a task package without one of TASK_MODULES, a task module left outside
    the packages (tasks/<name>.py other than the shared ones), or a script that does not import its task as
    `from albert_hf.tasks.<task> import data, definition, evaluation, features`."""
    found = [
        f"tasks/{task}/{name}: missing"
        for task in TASK_PACKAGES
        for name in TASK_MODULES
        if not (repo / "albert_hf" / "tasks" / task / name).is_file()
    ]
    shared = {
        "__init__.py",
        "arguments.py",
        "finetuned_card.py",
        "finetuning.py",
        "inputs.py",
        "outputs.py",
        "paper_hparams.py",
        "seeds.py",
        "trainer.py",
    }
    found += [
        f"tasks/{path.name}: a task outside its package"
        for path in (repo / "albert_hf" / "tasks").glob("*.py")
        if path.name not in shared
    ]
    for script, task in SCRIPT_TASKS.items():
        imports = [
            node
            for node in ast.walk(ast.parse((repo / script).read_text()))
            if isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("albert_hf.tasks.")
            and (node.module or "").split(".")[2] in TASK_PACKAGES
        ]
        shapes = [(node.module, sorted(alias.name for alias in node.names)) for node in imports]
        if shapes != [(f"albert_hf.tasks.{task}", ["data", "definition", "evaluation", "features"])]:
            found.append(f"{script}: imports its task as {shapes}")
    return found


def test_the_task_shape_check_catches_a_missing_module_a_flat_task_and_a_script_importing_names(tmp_path):
    for task in TASK_PACKAGES:
        (tmp_path / "albert_hf" / "tasks" / task).mkdir(parents=True)
        for name in TASK_MODULES:
            (tmp_path / "albert_hf" / "tasks" / task / name).write_text("")
    for script, task in SCRIPT_TASKS.items():
        (tmp_path / script).write_text(f"from albert_hf.tasks.{task} import data, definition, evaluation, features\n")
    assert task_shape_problems(tmp_path) == []
    (tmp_path / "albert_hf" / "tasks" / "race" / "features.py").unlink()
    (tmp_path / "albert_hf" / "tasks" / "ner.py").write_text("")
    (tmp_path / "run_squad.py").write_text("from albert_hf.tasks.squad.evaluation import SquadTrainer\n")
    assert task_shape_problems(tmp_path) == [
        "tasks/race/features.py: missing",
        "tasks/ner.py: a task outside its package",
        "run_squad.py: imports its task as [('albert_hf.tasks.squad.evaluation', ['SquadTrainer'])]",
    ]


def test_every_task_has_the_same_shape_and_every_script_imports_it_alike():
    found = task_shape_problems(REPO)
    assert not found, found


def test_one_training_step_reads_in_three_files_without_going_back():
    """job.py -> training/loop.py -> training/step.py: the loop imports the step, the step neither the loop nor the
    job (it returns to its caller only), and the loop not the job."""
    graph = internal_imports(REPO / "albert_hf")
    job, loop, step = (f"albert_hf.pretraining.{name}" for name in ("job", "training.loop", "training.step"))
    assert loop in graph[job] and step in graph[loop]
    assert not graph[step] & {job, loop} and job not in graph[loop]
