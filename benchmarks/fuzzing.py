"""Seeded mutations of every input kind the scripts read, and the code paths that read them.

Each kind has a valid seed input, written into a fresh folder, and a target: the functions a script runs on that
input, in the script's order (reading, checking columns and labels, tokenizing, building features or pairs,
loading a model or a checkpoint). A case mutates the seed with `random.Random(seed)` and runs the target. The
outcome is one of:

- run: the target returned (the mutation left valid input);
- skip: the target returned after logging a skip with a count (a malformed row, a too-short document);
- refusal: an InputError, i.e. one `error:` line from the entry point (or argparse's own error for an argument file);
- traceback: any other exception, a bug;
- hang: the case took longer than its time limit.

Used by tests/test_fuzz_inputs.py (a few hundred cases) and benchmarks/fuzz_inputs.py (thousands, with counts). It
lives in the checkout, not in the package: it reads tests/fixtures, which a wheel does not have.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import random
import shutil
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from albert_hf.errors import InputError

OUTCOMES = ("run", "skip", "refusal", "traceback", "hang")
# The small TF checkpoints the "tf_checkpoint" kind starts from (written by tests/fixtures/make_tf_checkpoints.py).
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


# ----------------------------------------------------------------------------------------------------------------
# Mutations


def _random_bytes(rng: random.Random, count: int) -> bytes:
    pool = [
        b"\x00",
        b"\xff",
        b"\xc3",
        b"\t",
        b"\n",
        b"\r\n",
        b",",
        b'"',
        b"{",
        b"}",
        b"[",
        b"]",
        b":",
        b"\xef\xbb\xbf",
        b"\xe2\x96\x81",
        b"\\",
        b"null",
        b"-1",
        b"1e999",
        b"NaN",
    ]
    out = b""
    while len(out) < count:
        out += rng.choice(pool) if rng.random() < 0.5 else bytes([rng.randrange(256)])
    return out


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """One to three byte-level edits: truncation, deletion, insertion, overwrite, duplication, line shuffles."""
    for _ in range(rng.randint(1, 3)):
        n = len(data)
        op = rng.choice(["truncate", "delete", "insert", "overwrite", "duplicate", "lines", "empty_or_blank"])
        if op == "truncate":
            data = data[: rng.randrange(n + 1)]
        elif op == "delete" and n:
            start = rng.randrange(n)
            data = data[:start] + data[start + rng.randint(1, max(1, n // 4)) :]
        elif op == "insert":
            at = rng.randrange(n + 1)
            data = data[:at] + _random_bytes(rng, rng.randint(1, 16)) + data[at:]
        elif op == "overwrite" and n:
            at = rng.randrange(n)
            patch = _random_bytes(rng, rng.randint(1, 8))
            data = data[:at] + patch + data[at + len(patch) :]
        elif op == "duplicate" and n:
            start = rng.randrange(n)
            end = min(n, start + rng.randint(1, 64))
            data = data[:end] + data[start:end] + data[end:]
        elif op == "lines":
            lines = data.split(b"\n")
            choice = rng.choice(["drop", "swap", "repeat", "tabs"])
            i = rng.randrange(len(lines))
            if choice == "drop":
                del lines[i]
            elif choice == "swap":
                j = rng.randrange(len(lines))
                lines[i], lines[j] = lines[j], lines[i]
            elif choice == "repeat":
                lines.insert(i, lines[i])
            else:
                lines[i] = lines[i].replace(b"\t", b",") if rng.random() < 0.5 else lines[i].replace(b",", b"\t")
            data = b"\n".join(lines)
        elif op == "empty_or_blank":
            data = rng.choice([b"", b"\n\n", b"   ", b"\xef\xbb\xbf"])
    return data


_STRANGE_VALUES = [
    None,
    "",
    " ",
    0,
    -1,
    1,
    2,
    7,
    3.5,
    float("inf"),
    True,
    [],
    {},
    [1, 2],
    {"a": 1},
    "x" * 3000,
    "\u2581",
    "<unk>",
    "[MASK]",
    "A",
    "entailment",
    "\x00",
    "😀" * 5,
]


def _strange(rng: random.Random):
    return copy.deepcopy(rng.choice(_STRANGE_VALUES))  # a fresh object: a shared one could come to hold itself


def mutate_json(value, rng: random.Random):
    """One to three structural edits of parsed JSON: drop or rename a key, replace a value with a strange one,
    empty a list, wrap or unwrap a value."""
    for _ in range(rng.randint(1, 3)):
        value = _mutate_once(value, rng)
    return value


def _containers(value, path=()):
    if isinstance(value, dict):
        yield path, value
        for key, item in value.items():
            yield from _containers(item, path + (key,))
    elif isinstance(value, list):
        yield path, value
        for i, item in enumerate(value):
            yield from _containers(item, path + (i,))


def _mutate_once(value, rng: random.Random):
    containers = list(_containers(value))
    if not containers or rng.random() < 0.05:
        return rng.choice([_strange(rng), [value], {"data": value}])
    _, container = rng.choice(containers)
    keys = list(container.keys()) if isinstance(container, dict) else list(range(len(container)))
    if not keys:
        if isinstance(container, list):
            container.append(_strange(rng))
        else:
            container[rng.choice(["text", "label", "id", "x"])] = _strange(rng)
        return value
    key = rng.choice(keys)
    op = rng.choice(["drop", "strange", "strange", "rename", "empty", "wrap"])
    if op == "drop":
        del container[key]
    elif op == "strange":
        container[key] = _strange(rng)
    elif op == "rename" and isinstance(container, dict):
        container[key + "_" if isinstance(key, str) else key] = container.pop(key)
    elif op == "empty":
        item = container[key]
        container[key] = type(item)() if isinstance(item, (list, dict, str)) else None
    else:
        container[key] = [container[key]]
    return value


def mutate_file(path: Path, rng: random.Random, structural: bool) -> None:
    """Mutate `path` in place: a JSON file structurally (when asked and it parses), else its bytes."""
    data = path.read_bytes()
    if structural and rng.random() < 0.7:
        try:
            if path.suffix == ".jsonl":
                rows = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
                rows = mutate_json(rows, rng)
                lines = (
                    [json.dumps(row, ensure_ascii=rng.random() < 0.5) for row in rows]
                    if isinstance(rows, list)
                    else [json.dumps(rows)]
                )
                path.write_text("\n".join(lines) + "\n", encoding="utf-8")
            else:
                path.write_text(json.dumps(mutate_json(json.loads(data), rng)), encoding="utf-8")
            return
        except ValueError:
            pass
    path.write_bytes(mutate_bytes(data, rng))


# ----------------------------------------------------------------------------------------------------------------
# Seed inputs


MRPC_TSV = (
    "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    "1\t1\t2\tThe cat sat on the mat.\tA cat was sitting on the mat.\n"
    "0\t3\t4\tStocks fell sharply on Monday.\tThe weather was warm in Paris.\n"
    "1\t5\t6\tHe bought a new car.\tHe purchased a new automobile.\n"
    "0\t7\t8\tThe meeting was cancelled.\tShe plays the violin well.\n"
)
SST2_CSV = 'sentence,label\n"a gripping, moving film",1\ndull and far too long,0\n"wonderful cast, weak plot",1\n'
RTE_JSONL = "".join(
    json.dumps(row) + "\n"
    for row in [
        {"sentence1": "A man is playing a guitar.", "sentence2": "A man plays music.", "label": "entailment"},
        {"sentence1": "The sun rises in the west.", "sentence2": "The sun rises in the east.", "label": 1},
        {"sentence1": "Dogs are animals.", "sentence2": "Dogs are living beings.", "label": "not_entailment"},
    ]
)
SQUAD = {
    "version": "v2.0",
    "data": [
        {
            "title": "Sky",
            "paragraphs": [
                {
                    "context": "The sky is blue because air scatters blue light more than red light.",
                    "qas": [
                        {
                            "id": "q1",
                            "question": "Why is the sky blue?",
                            "answers": [{"text": "air scatters blue light", "answer_start": 24}],
                        },
                        {
                            "id": "q2",
                            "question": "What colour is the sky?",
                            "answers": [{"text": "blue", "answer_start": 11}],
                        },
                    ],
                },
                {
                    "context": "Paris is the capital of France. It lies on the Seine.",
                    "qas": [
                        {
                            "id": "q3",
                            "question": "Which river runs through Paris?",
                            "answers": [{"text": "the Seine", "answer_start": 44}],
                        }
                    ],
                },
            ],
        }
    ],
}
RACE_ARTICLES = {
    "high/1.txt": {
        "id": "high1.txt",
        "article": "Tom walked to school. He was late because it rained.",
        "questions": ["Why was Tom late?", "Tom went to _ ."],
        "options": [["it rained", "he slept", "the bus broke", "he was ill"], ["school", "work", "the park", "a shop"]],
        "answers": ["A", "A"],
    },
    "middle/2.txt": {
        "id": "middle2.txt",
        "article": "Mary likes apples. She eats one every day.",
        "questions": ["What does Mary like?"],
        "options": [["pears", "apples", "grapes", "plums"]],
        "answers": ["B"],
    },
}
CORPUS_DOCUMENTS = [
    "The first document has a few sentences. Each one is short. They follow each other in order. The end is near.",
    "A second document talks about trains. Trains run on rails. Some are fast and some are slow. Most are late.",
    "Rivers flow to the sea. The sea is salty. Rain falls on the hills and fills the rivers again.",
]


@dataclass
class Resources:
    """What targets share across cases: the tiny checkpoint and its tokenizer, a TF checkpoint, a step checkpoint."""

    tiny_checkpoint: Path
    workdir: Path
    tokenizer: object = None
    _step_checkpoint: Path | None = None
    _extra: dict = field(default_factory=dict)

    def __post_init__(self):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.tiny_checkpoint)

    def step_checkpoint(self) -> Path:
        """A complete step checkpoint of the tiny model (written once)."""
        if self._step_checkpoint is None:
            accelerator, checkpoints = _checkpointing(self.tiny_checkpoint, self.workdir / "step_run")
            checkpoints.save(1, {"step": 1, "epoch": 0, "batches_in_epoch": 1})
            self._step_checkpoint = self.workdir / "step_run" / "step_1"
        return self._step_checkpoint

    def close(self) -> None:
        """Forget the accelerator: accelerate keeps its state per process, and later tests start their own."""
        if _PREPARED:
            _PREPARED.clear()
            _reset_accelerate()


def _reset_accelerate():
    from accelerate.state import AcceleratorState, GradientState, PartialState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


_PREPARED = {}


def _checkpointing(tiny_checkpoint: Path, output_dir: Path):
    """An accelerator with the tiny pretraining model and its LAMB optimizer prepared, and StepCheckpoints on
    `output_dir` (made once per process: accelerate's state is a singleton)."""
    from albert_hf.optimization import get_official_schedule
    from albert_hf.pretraining.output.checkpoints import StepCheckpoints

    if "accelerator" not in _PREPARED:
        from accelerate import Accelerator

        from albert_hf import AlbertHFForPreTraining
        from albert_hf.optimization import Lamb

        _reset_accelerate()  # a fresh state, whatever ran before in this process
        accelerator = Accelerator(cpu=True)
        model = AlbertHFForPreTraining.from_pretrained(tiny_checkpoint)
        optimizer = Lamb(model.parameters(), lr=1e-3)
        _PREPARED["accelerator"] = accelerator
        _PREPARED["objects"] = accelerator.prepare(model, optimizer)
    accelerator = _PREPARED["accelerator"]
    output_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = StepCheckpoints(
        output_dir,
        accelerator,
        schedule=_PREPARED.setdefault("schedule", get_official_schedule(_PREPARED["objects"][1], 10, 100)),
    )
    return accelerator, checkpoints


# ----------------------------------------------------------------------------------------------------------------
# Targets: what each script does with the input


def _glue(task_name: str, file_name: str):
    def target(folder: Path, res: Resources):
        from albert_hf.tasks.glue.data import GlueDataArguments
        from albert_hf.tasks.glue.features import tokenize_function
        from albert_hf.tasks.glue.files import load_raw_splits, prepare_splits

        args = GlueDataArguments(task_name=task_name, train_file=str(folder / file_name))
        task = args.task_data.task
        raw, sources = load_raw_splits(args, task, {"train"})
        splits = prepare_splits(raw, sources, task)
        splits["train"].map(tokenize_function(res.tokenizer, task, 32, False), batched=True)

    return target


def _squad(training: bool):
    def target(folder: Path, res: Resources):
        from albert_hf.tasks.squad import data as squad_data
        from albert_hf.tasks.squad import features as squad_features

        path = str(folder / "squad.json")
        args = squad_data.SquadDataArguments(
            train_file=path, version_2_with_negative=True, max_seq_length=48, max_query_length=16, doc_stride=16
        )
        splits = squad_data.load_squad_splits(args)
        if training:
            examples = squad_data.select_trainable(splits["train"], True, path)
            squad_features.features_dataset(examples, res.tokenizer, args, training=True)
        else:
            squad_features.prepare_questions(splits["train"], res.tokenizer, args, path)

    return target


def _race(folder: Path, res: Resources):
    from albert_hf.tasks.race import data as race_data
    from albert_hf.tasks.race import features as race_features

    args = race_data.RaceDataArguments(train_file=str(folder / "race"), max_seq_length=48, max_qa_length=16)
    questions = race_data.load_race_split(args, "train")
    race_features.encode_questions(questions, res.tokenizer, args)


def _corpus(source_name: str, layout: str = "document_per_file"):
    """run_pretraining.py's data path (`build_data`): corpus, held-out split, tokenizer, training and held-out pairs."""

    def target(folder: Path, res: Resources):
        from albert_hf.pretraining.data.inputs import build_data
        from albert_hf.pretraining.job import parse_args

        args = parse_args(
            [
                "--train_files",
                str(folder / source_name),
                "--layout",
                layout,
                "--tokenizer_name",
                str(res.tiny_checkpoint),
                "--max_seq_length",
                "32",
                "--dupe_factor",
                "1",
                "--validation_split_percentage",
                "34",
                "--output_dir",
                str(folder / "out"),
            ]
        )
        build_data(args.data, args.objective.task, args.optimization.seed)

    return target


def _model_folder(folder: Path, res: Resources):
    """The fine-tuning scripts' loading of --model_name_or_path: tokenizer, config and weights, then one input."""
    import torch

    from albert_hf import AlbertHFForSequenceClassification
    from albert_hf.tasks.arguments import ModelArguments
    from albert_hf.tasks.inputs import load_tokenizer_and_model

    tokenizer, model = load_tokenizer_and_model(
        ModelArguments(model_name_or_path=str(folder / "model")), AlbertHFForSequenceClassification
    )
    batch = tokenizer(["a short sentence to encode"], return_tensors="pt", return_token_type_ids=True)
    with torch.no_grad():
        model(**batch)


def _step_checkpoint(folder: Path, res: Resources):
    accelerator, checkpoints = _checkpointing(res.tiny_checkpoint, res.workdir / "step_run")
    from albert_hf.pretraining.training.step import COUNTS

    path = checkpoints.resolve(str(folder / "step_1"))
    checkpoints.load(path, COUNTS)


def _tf_checkpoint(folder: Path, res: Resources):
    from albert_hf.convert import from_tf_checkpoint

    from_tf_checkpoint(str(folder / "tf" / "model.ckpt-best"), str(folder / "converted"))


def _argument_file(suffix: str):
    def target(folder: Path, res: Resources):
        from albert_hf.pretraining.job import parse_args

        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parse_args([str(folder / f"args{suffix}")])
        except SystemExit as stop:  # argparse's own `error:` line (after its usage line), status 2
            if stop.code != 2 or ": error: " not in stderr.getvalue().strip().splitlines()[-1]:
                raise
            raise InputError(stderr.getvalue().strip().splitlines()[-1]) from None

    return target


# ----------------------------------------------------------------------------------------------------------------
# Kinds: seed writer, which file(s) to mutate, structural JSON edits or bytes, target


def _write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _seed_glue(name, text):
    return lambda folder, res: _write_text(folder / name, text)


def _seed_squad(folder, res):
    _write_text(folder / "squad.json", json.dumps(SQUAD))


def _seed_race(folder, res):
    for name, record in RACE_ARTICLES.items():
        _write_text(folder / "race" / name, json.dumps(record))


def _seed_text_corpus(folder, res):
    for i, text in enumerate(CORPUS_DOCUMENTS):
        _write_text(folder / "corpus" / f"{i}.txt", text)


def _seed_sentence_per_line(folder, res):
    text = "\n\n".join("\n".join(doc.replace(". ", ".\n").splitlines()) for doc in CORPUS_DOCUMENTS)
    _write_text(folder / "corpus.txt", text + "\n")


def _seed_jsonl_corpus(folder, res):
    _write_text(folder / "corpus.jsonl", "".join(json.dumps({"text": doc}) + "\n" for doc in CORPUS_DOCUMENTS))


def _seed_parquet_corpus(folder, res):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": CORPUS_DOCUMENTS}), folder / "corpus.parquet")


def _seed_model(folder, res):
    shutil.copytree(res.tiny_checkpoint, folder / "model")


def _seed_step(folder, res):
    shutil.copytree(res.step_checkpoint(), folder / "step_1")


def _seed_tf(folder, res):
    source = FIXTURES / "tf_albert" / "all_shared"
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: the tf_checkpoint kind needs a checkout of albert_hf's repository")
    (folder / "tf").mkdir()
    for name in (
        "model.ckpt-best.index",
        "model.ckpt-best.data-00000-of-00001",
        "albert_config.json",
        "30k-clean.model",
    ):
        shutil.copy(source / name, folder / "tf" / name)


ARGUMENTS = {
    "max_train_steps": 2,
    "per_device_train_batch_size": 4,
    "max_seq_length": 64,
    "learning_rate": 1e-3,
    "model_config": "tiny",
    "task": "sop",
    "output_dir": "out",
}


def _seed_arguments(suffix):
    def seed(folder, res):
        if suffix == ".json":
            _write_text(folder / "args.json", json.dumps(ARGUMENTS))
        else:
            _write_text(folder / "args.yaml", "".join(f"{key}: {value}\n" for key, value in ARGUMENTS.items()))

    return seed


@dataclass
class Kind:
    seed: object  # (folder, resources) -> None: writes the valid input
    files: tuple  # glob patterns (relative to the folder) of the files a case may mutate
    structural: bool  # JSON files get structural edits (else bytes only)
    target: object  # (folder, resources) -> None


KINDS = {
    "glue_tsv": Kind(_seed_glue("train.tsv", MRPC_TSV), ("train.tsv",), False, _glue("mrpc", "train.tsv")),
    "glue_csv": Kind(_seed_glue("train.csv", SST2_CSV), ("train.csv",), False, _glue("sst2", "train.csv")),
    "glue_jsonl": Kind(_seed_glue("train.jsonl", RTE_JSONL), ("train.jsonl",), True, _glue("rte", "train.jsonl")),
    "squad_train": Kind(_seed_squad, ("squad.json",), True, _squad(training=True)),
    "squad_eval": Kind(_seed_squad, ("squad.json",), True, _squad(training=False)),
    "race": Kind(_seed_race, ("race/*/*.txt",), True, _race),
    "text_corpus": Kind(_seed_text_corpus, ("corpus/*.txt",), False, _corpus("corpus")),
    "sentence_per_line": Kind(
        _seed_sentence_per_line, ("corpus.txt",), False, _corpus("corpus.txt", "sentence_per_line")
    ),
    "jsonl_corpus": Kind(_seed_jsonl_corpus, ("corpus.jsonl",), True, _corpus("corpus.jsonl")),
    "parquet_corpus": Kind(_seed_parquet_corpus, ("corpus.parquet",), False, _corpus("corpus.parquet")),
    "tokenizer_json": Kind(_seed_model, ("model/tokenizer.json",), True, _model_folder),
    "tokenizer_config": Kind(
        _seed_model, ("model/tokenizer_config.json", "model/special_tokens_map.json"), True, _model_folder
    ),
    "config_json": Kind(_seed_model, ("model/config.json",), True, _model_folder),
    "safetensors": Kind(_seed_model, ("model/model.safetensors",), False, _model_folder),
    "step_checkpoint": Kind(_seed_step, ("step_1/*",), True, _step_checkpoint),
    "tf_checkpoint": Kind(
        _seed_tf,
        ("tf/model.ckpt-best.index", "tf/model.ckpt-best.data-00000-of-00001", "tf/albert_config.json"),
        True,
        _tf_checkpoint,
    ),
    "arguments_json": Kind(_seed_arguments(".json"), ("args.json",), True, _argument_file(".json")),
    "arguments_yaml": Kind(_seed_arguments(".yaml"), ("args.yaml",), False, _argument_file(".yaml")),
}


# ----------------------------------------------------------------------------------------------------------------
# Running cases


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


class _SkipCounter(logging.Handler):
    """Counts warnings that report skipped input ("skipped 3 malformed row(s)", "... read as empty text")."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record):
        message = record.getMessage().lower()
        if "skipped" in message or "skipping" in message or "read as empty" in message:
            self.count += 1


@dataclass
class Case:
    kind: str
    seed: int
    outcome: str
    detail: str = ""


def run_case(kind_name: str, seed: int, res: Resources, time_limit: int = 20) -> Case:
    """Write the kind's seed input into a fresh folder, mutate it with `seed`, run the target, classify."""
    kind = KINDS[kind_name]
    folder = res.workdir / "cases" / f"{kind_name}-{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    kind.seed(folder, res)
    rng = random.Random(f"{kind_name}:{seed}")
    files = sorted(path for pattern in kind.files for path in folder.glob(pattern))
    for path in rng.sample(files, k=rng.randint(1, min(2, len(files)))):
        mutate_file(path, rng, kind.structural)
    skips = _SkipCounter()
    root = logging.getLogger()
    root.addHandler(skips)
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(time_limit)
    try:
        kind.target(folder, res)
        outcome, detail = ("skip" if skips.count else "run"), ""
    except InputError as error:
        message = str(error)
        outcome, detail = "refusal", message
        if not message.strip() or "\n" in message.strip():
            outcome, detail = "traceback", f"InputError that is not one line: {message!r}"
    except _Hang:
        outcome, detail = "hang", f"over {time_limit} s"
    except (Exception, BaseException) as error:  # noqa: BLE001 - what the fuzzing looks for (a Rust panic too)
        if isinstance(error, KeyboardInterrupt):
            raise
        import traceback

        outcome, detail = "traceback", "".join(traceback.format_exception(error))[-1500:]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        root.removeHandler(skips)
    if outcome in ("run", "skip", "refusal"):
        shutil.rmtree(folder, ignore_errors=True)  # the failing ones stay, to reproduce
    return Case(kind_name, seed, outcome, detail)


def run_cases(res: Resources, kinds, seeds) -> tuple[Counter, list[Case]]:
    """Counts per (kind, outcome), and the failing cases."""
    counts, failures = Counter(), []
    for kind in kinds:
        for seed in seeds:
            case = run_case(kind, seed, res)
            counts[kind, case.outcome] += 1
            if case.outcome in ("traceback", "hang"):
                failures.append(case)
    return counts, failures


@contextlib.contextmanager
def quiet_libraries():
    """datasets' and transformers' progress bars and info logs off (thousands of cases each print several), put
    back as they were afterwards."""
    import datasets
    import transformers

    bars = datasets.is_progress_bar_enabled()
    levels = datasets.logging.get_verbosity(), transformers.logging.get_verbosity()
    ours = logging.getLogger("albert_hf").level
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_error()
    logging.getLogger("albert_hf").setLevel(logging.WARNING)
    try:
        yield
    finally:
        if bars:
            datasets.enable_progress_bars()
        datasets.logging.set_verbosity(levels[0])
        transformers.logging.set_verbosity(levels[1])
        logging.getLogger("albert_hf").setLevel(ours)


__all__ = ["KINDS", "OUTCOMES", "Resources", "run_case", "run_cases", "quiet_libraries"]
