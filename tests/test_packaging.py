"""setup.cfg declares every package that albert_hf imports: a module importing an undeclared package works here only
because something else happened to install it."""

import ast
import configparser
import re
import sys

from conftest import REPO

# import name -> distribution name, where they differ
DISTRIBUTIONS = {"sklearn": "scikit-learn", "yaml": "pyyaml"}


def imported_top_level_modules(package_dir) -> dict[str, set[str]]:
    """{top-level module: the files importing it} for every absolute import in the package (relative ones are its own)."""
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
