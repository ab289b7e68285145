"""Input the user can fix.

Every check of a file, column, label, flag, config or checkpoint raises `InputError` with one line naming what is
wrong and where. The entry points (`run_pretraining.py`, `run_glue.py`, `run_squad.py`, `run_race.py`, `run_ner.py`,
`python -m albert_hf.convert`) print it as `error: <message>` and exit with status 2, as argparse does for a bad
flag (`runtime.cli.run_entry_point`). A write the machine refuses (a full disk, a read-only folder: runtime/storage.py)
ends the same way. A run that produced nothing to use (`NothingProduced`) exits with status 1 after its line. Any other
exception is a bug and keeps its traceback.
"""

from contextlib import contextmanager


class InputError(ValueError):
    """Input the user can fix. The message is one line that names the file, field, flag or argument."""


class NothingProduced(Exception):
    """A run that ended without the output it exists for (a --seeds run in which no seed learned): the entry points
    print its one line as `error: <message>` and exit with status 1, so that a pipeline does not go on."""


def first_line(error: BaseException) -> str:
    """An error's message cut to its first line (library errors often run on for a paragraph), or its type."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextmanager
def input_errors(where: str, *types: type[BaseException]):
    """Re-raise the given library exceptions (parse errors of a file, a config's checks) as InputError naming
    `where`: their own messages rarely say which file or flag they came from. A wrapped error (datasets'
    DatasetGenerationError) is described by its cause."""
    try:
        yield
    except InputError:
        raise
    except types as error:
        detail = "it holds no rows" if isinstance(error, StopIteration) else first_line(error.__cause__ or error)
        raise InputError(f"{where}: {detail}") from None


def datasets_read_errors() -> tuple[type[BaseException], ...]:
    """What `datasets.load_dataset` raises for a local file it cannot parse: its own DatasetGenerationError, Arrow's
    errors (OSError for a damaged parquet footer), the ValueError / TypeError / KeyError of its builders (json with
    mixed types, a csv with a ragged row), and StopIteration from its json builder for a file that yields no
    table. Imported here lazily, so that the entry points that never read datasets do not import it."""
    import datasets
    import pyarrow

    return (
        datasets.exceptions.DatasetGenerationError,
        pyarrow.ArrowException,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        StopIteration,
    )
