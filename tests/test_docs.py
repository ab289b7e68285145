"""What users get (README, docs, the package, examples, benchmarks) refers only to things they have.

Internal design notes and the data folder next to this checkout are not shipped, so nothing a user reads may send
them there: the references are the paper, google-research/albert's code and the project's own docs.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER_FACING = ["README.md", "BENCHMARKS.md", "docs", "albert_hf", "examples", "benchmarks"]
TEXT_SUFFIXES = {".md", ".py", ".txt", ".json", ".yaml", ".yml", ".cfg", ".toml", ".csv", ".sh"}
# The notes by name, and the data folder as a path string or built with pathlib ("shared" / "data").
UNSHIPPED = re.compile(r"""ALBERT_SPEC|HF_V5_NOTES|shared/data|\.\./shared\b|["']shared["']\s*/\s*["']data["']""")


def user_facing_files():
    for name in USER_FACING:
        path = REPO / name
        if path.is_file():
            yield path
        else:
            yield from sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts
            )


def test_nothing_user_facing_cites_unshipped_notes_or_data():
    files = list(user_facing_files())
    assert any(path.name == "modeling_albert_hf.py" for path in files)  # the walk reaches the package
    hits = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if UNSHIPPED.search(line)
    ]
    assert not hits, "references users cannot follow:\n" + "\n".join(hits)


def test_docs_links_point_at_existing_files():
    """Relative links in README.md and docs/*.md name files of the project."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def heading_anchors(page: Path) -> set:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", page.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_docs_links_to_a_section_name_a_heading_of_that_page():
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text(encoding="utf-8")):
            linked = (page.parent / target) if target else page
            if linked.suffix == ".md" and anchor not in heading_anchors(linked):
                broken.append(f"{page.relative_to(REPO)} -> {target}#{anchor}")
    assert not broken, "links to sections that are not there:\n" + "\n".join(broken)
