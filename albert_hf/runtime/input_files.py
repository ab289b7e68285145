"""Reading and checking the users' data files: one clear line naming a file that is missing, empty, not JSON where
JSON is expected, or unreadable, before `datasets` or pyarrow fail on it less clearly. The pretraining corpus and
every fine-tuning task read their files through here."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError, datasets_read_errors, input_errors


def check_json_start(path) -> None:
    """Refuse a .json/.jsonl file whose first value is not an object or a list, before datasets reads it: pyarrow's
    JSON reader (pyarrow 26) crashes the process with a segmentation fault on a file that starts with `null`."""
    with open(path, "rb") as file:
        start = file.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if start and start[:1] not in (b"{", b"["):
        raise InputError(f"{path}: not JSON objects (one per line) or a JSON list: it starts with {start[:20]!r}")


def check_not_empty(path: Path) -> None:
    """A user's data file that is missing or holds nothing but blanks (and a BOM) stops the run naming it."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    with path.open("rb") as file:
        start = file.read(4096)
    if not start.strip(b"\xef\xbb\xbf \t\r\n"):
        raise InputError(f"{path}: the file is empty")


def read_with_datasets(path, builder: str, **options):
    """A csv/json/parquet file as a `datasets.Dataset`; an empty or unreadable file stops the run naming it."""
    from datasets import load_dataset

    path = Path(path)
    check_not_empty(path)
    if builder == "json":
        check_json_start(path)
    with input_errors(f"{path}: could not be read as {builder}", *datasets_read_errors()):
        dataset = load_dataset(builder, data_files={"data": str(path)}, split="data", **options)
    if len(dataset) == 0:
        raise InputError(f"{path}: no data rows")
    return dataset
