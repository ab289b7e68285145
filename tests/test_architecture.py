"""The architecture's rules, each stated as the intent it protects and each shown to catch a planted violation: the
size of a module, and pretraining's arguments as parsed."""

import ast
from pathlib import Path

from helpers import REPO

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
