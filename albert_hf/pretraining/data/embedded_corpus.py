"""The embedded default corpus: the docstrings of the Python standard library this interpreter ships, as documents in
source order, built once into the cache (a few seconds) and then loaded from there. What `run_pretraining.py` trains
on when no corpus is given."""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import os
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from ...tokenization import cache_root, paragraphs

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    pass


EMBEDDED_CORPUS_VERSION = 1
_SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "turtledemo"}


def _clean_docstring(doc: str) -> str:
    """Keep the prose of a (cleandoc-ed) docstring: drop doctest and indented code blocks, re-flow paragraphs."""
    kept = []
    for block in paragraphs(doc):
        lines = block.split("\n")
        if any(line.lstrip().startswith((">>>", "...")) for line in lines):
            continue  # doctest
        if lines[0].startswith((" ", "\t")):
            continue  # indented code or a literal block
        kept.append(" ".join(block.split()))
    return "\n\n".join(kept)


def _docstrings_in_source_order(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, str]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            doc = ast.get_docstring(node, clean=True)
            if doc:
                yield name, doc
            yield from _docstrings_in_source_order(node, prefix=f"{name}.")


def stdlib_docstring_documents(stdlib_dir: str | None = None) -> Iterator[dict]:
    """Module, class and function docstrings of the standard library, one document each, in source order.

    Sources are parsed with `ast`, never imported. Test suites and vendored packages are skipped.
    """
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not _SKIPPED_DIRS.intersection(p.relative_to(root).parts))
    unparsable = 0
    for path in files:
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            unparsable += 1  # e.g. deliberately broken files shipped as data
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        entries = []
        if ast.get_docstring(tree, clean=True):
            entries.append((module, ast.get_docstring(tree, clean=True)))
        entries.extend((f"{module}:{name}", doc) for name, doc in _docstrings_in_source_order(tree))
        for source, doc in entries:
            text = _clean_docstring(doc)
            if text:
                yield {"text": text, "source": source}
    if unparsable:
        logger.info("Embedded corpus: skipped %d stdlib files that do not parse", unparsable)


def embedded_corpus_path() -> Path:
    stdlib = sysconfig.get_paths()["stdlib"]
    key = hashlib.sha256(f"{EMBEDDED_CORPUS_VERSION}:{stdlib}:{sys.version}".encode()).hexdigest()[:12]
    version = f"{sys.implementation.name}{sys.version_info.major}.{sys.version_info.minor}"
    return cache_root() / "embedded_corpus" / f"stdlib_docstrings-{version}-{key}.jsonl"


def embedded_corpus():
    """The default corpus on any machine: stdlib docstrings as a `datasets.Dataset` ("text", "source").

    Built on first use (a few seconds) into `cache_root()/embedded_corpus/*.jsonl`, then loaded from there.
    """
    import datasets

    path = embedded_corpus_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        count = 0
        with open(tmp, "w", encoding="utf-8") as f:
            for doc in stdlib_docstring_documents():
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
                count += 1
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
        logger.info("Built the embedded corpus: %d docstrings -> %s", count, path)
    return datasets.Dataset.from_json(str(path))


if __name__ == "__main__":  # the demo's corpus as a file (a source of --sources): python -m ... general.jsonl
    import shutil

    if len(sys.argv) != 2:
        sys.exit("usage: python -m albert_hf.pretraining.data.embedded_corpus OUT.jsonl")
    embedded_corpus()
    shutil.copyfile(embedded_corpus_path(), sys.argv[1])
    print(f"the embedded corpus -> {sys.argv[1]}")
