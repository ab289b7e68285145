"""Small files in the layout of each original GLUE download folder (field order, headers, the quirks of each task:
CoLA without a header, MRPC's byte-order mark, MNLI's five annotator labels), for tests, examples and benchmarks
that need GLUE without the download."""

from pathlib import Path

PAIRS = [
    ("A man is playing a guitar.", 'He said " it was fine .'),
    ("The cat sat.", "A dog ran away quickly."),
    ("It rains.", "Rain falls from the sky today."),
    ("Birds fly south.", "Birds migrate in winter."),
]


def write_tsv(path, header, rows, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ([("\ufeff" if bom else "") + "\t".join(header)] if header else []) + ["\t".join(map(str, r)) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_glue_folders(root: Path) -> Path:
    """Small files in the layout of each original GLUE download folder (field order, headers, quirks)."""
    for split in ("train", "dev"):
        write_labelled_split(root, split)
    write_mnli(root)
    write_test_files(root)
    return root


def write_labelled_split(root: Path, split: str) -> None:
    """The train or dev file of every task but MNLI, as its download has it."""
    binary = lambda i: i % 2  # noqa: E731
    write_tsv(
        root / "CoLA" / f"{split}.tsv",
        None,
        [("gj04", binary(i), "*" if not binary(i) else "", a) for i, (a, b) in enumerate(PAIRS * 2)],
    )
    write_tsv(
        root / "SST-2" / f"{split}.tsv",
        ["sentence", "label"],
        [(a + " ", binary(i)) for i, (a, b) in enumerate(PAIRS * 2)],
    )
    write_tsv(
        root / "MRPC" / f"{split}.tsv",
        ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
        [(binary(i), 100 + i, 200 + i, a, b) for i, (a, b) in enumerate(PAIRS * 2)],
        bom=True,
    )
    write_tsv(
        root / "STS-B" / f"{split}.tsv",
        ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2", "score"],
        [
            (i, "main-news", "f", "2012", f"{i:04d}", "none", "none", a, b, f"{i * 0.6:.3f}")
            for i, (a, b) in enumerate(PAIRS * 2)
        ],
    )
    write_tsv(
        root / "QQP" / f"{split}.tsv",
        ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
        [(7 * i, i, i + 1, a, b, binary(i)) for i, (a, b) in enumerate(PAIRS * 2)],
    )
    for task in ("QNLI", "RTE"):
        write_tsv(
            root / task / f"{split}.tsv",
            [
                "index",
                "question" if task == "QNLI" else "sentence1",
                "sentence" if task == "QNLI" else "sentence2",
                "label",
            ],
            [(i, a, b, ["entailment", "not_entailment"][binary(i)]) for i, (a, b) in enumerate(PAIRS * 2)],
        )
    write_tsv(
        root / "WNLI" / f"{split}.tsv",
        ["index", "sentence1", "sentence2", "label"],
        [(i, a, b, binary(i)) for i, (a, b) in enumerate(PAIRS * 2)],
    )


def write_mnli(root: Path) -> None:
    """MNLI's train, matched and mismatched dev and test files, with its parses and five annotators' labels."""
    nli = ["entailment", "neutral", "contradiction"]
    mnli_parse = [
        "promptID",
        "pairID",
        "genre",
        "sentence1_binary_parse",
        "sentence2_binary_parse",
        "sentence1_parse",
        "sentence2_parse",
    ]
    write_tsv(
        root / "MNLI" / "train.tsv",
        ["index", *mnli_parse, "sentence1", "sentence2", "label1", "gold_label"],
        [
            (i, i, f"{i}e", "slate", "(x)", "(y)", "(X)", "(Y)", a, b, nli[i % 3], nli[i % 3])
            for i, (a, b) in enumerate(PAIRS * 2)
        ],
    )
    for part in ("matched", "mismatched"):
        write_tsv(
            root / "MNLI" / f"dev_{part}.tsv",
            ["index", *mnli_parse, "sentence1", "sentence2", *[f"label{k}" for k in range(1, 6)], "gold_label"],
            [
                (i, i, f"{i}n", "slate", "(x)", "(y)", "(X)", "(Y)", a, b, *[nli[i % 3]] * 5, nli[i % 3])
                for i, (a, b) in enumerate(PAIRS * 2)
            ],
        )
        write_tsv(
            root / "MNLI" / f"test_{part}.tsv",
            ["index", *mnli_parse, "sentence1", "sentence2"],
            [(i, i, i, "travel", "(x)", "(y)", "(X)", "(Y)", a, b) for i, (a, b) in enumerate(PAIRS)],
        )


def write_test_files(root: Path) -> None:
    """Each task's unlabelled test file (and the diagnostic set)."""
    for task, columns in [
        ("CoLA", ["index", "sentence"]),
        ("SST-2", ["index", "sentence"]),
        ("MRPC", ["index", "#1 ID", "#2 ID", "#1 String", "#2 String"]),
        ("STS-B", ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2"]),
        ("QQP", ["id", "question1", "question2"]),
        ("QNLI", ["index", "question", "sentence"]),
        ("RTE", ["index", "sentence1", "sentence2"]),
        ("WNLI", ["index", "sentence1", "sentence2"]),
        ("diagnostic", ["index", "sentence1", "sentence2"]),
    ]:
        rows = []
        for i, (a, b) in enumerate(PAIRS):
            values = {
                "index": 10 + i,
                "id": 10 + i,
                "sentence": a,
                "#1 String": a,
                "#2 String": b,
                "sentence1": a,
                "sentence2": b,
                "question": a,
                "question1": a,
                "question2": b,
            }
            rows.append([values.get(name, "x") for name in columns])
        write_tsv(root / task / ("diagnostic.tsv" if task == "diagnostic" else "test.tsv"), columns, rows)
