"""--streaming over plain-text folders: files are read as the run goes (nothing before the first pairs but one batch
of documents), each process streams files of its own, endlessly, and a stopped run resumes exactly from each
process's saved stream position (datasets' state_dict)."""

import logging
import signal
import sys
from pathlib import Path

import psutil
import pytest

from albert_hf.errors import InputError
from albert_hf.pretraining.data.corpus import first_documents, text_file_stream
from albert_hf.pretraining.data.inputs import build_data
from albert_hf.pretraining.resolution import parse_args
from albert_hf.runtime.preemption import PREEMPTED
from data_fixtures import embedded
from helpers import DDP, REPO, run_bounded, subprocess_env
from preloaded import launched_rank
from pretraining_runs import (
    check_same_weights_and_curve,
    metrics,
    pretrain,
    pretrain_runs,
    signal_once_training,
    stopped_step,
)

FILES = 24


def build(args, process_index: int = 0, num_processes: int = 1):
    """run_pretraining.py's data path for these parsed arguments, as process `process_index` of `num_processes`."""
    return build_data(
        args.data,
        args.objective.task,
        args.optimization.seed,
        args.model.model_name_or_path,
        process_index,
        num_processes,
    )


def write_text_folder(folder: Path, files: int = FILES, documents_per_file: int = 60) -> Path:
    """Embedded-corpus documents, `documents_per_file` per file, blank-line separated; file names sort in order."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = embedded().select(range(files * documents_per_file))["text"]
    for k in range(files):
        text = "\n\n".join(" ".join(doc.split()) for doc in rows[k * documents_per_file : (k + 1) * documents_per_file])
        (folder / f"part_{k:03d}.txt").write_text(text + "\n")
    return folder


@pytest.fixture(scope="module")
def text_folder(tmp_path_factory):
    return write_text_folder(tmp_path_factory.mktemp("streamed") / "corpus")


def documents(stream, count):
    taken = []
    for row in stream:
        taken.append(row["text"])
        if len(taken) == count:
            return taken
    return taken


def test_an_endless_stream_reads_pass_after_pass_in_new_orders_and_skips_the_held_out_documents(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    for k in range(4):
        (folder / f"{k}.txt").write_text(f"doc {k} a.\n\ndoc {k} b.\n")
    files = sorted(folder.iterdir())
    held, held_out, more = first_documents(files, "blank_line_separated", 3)
    assert held == ["doc 0 a.", "doc 0 b.", "doc 1 a."] and more
    assert held_out == {str(files[0]): 2, str(files[1]): 1}
    assert first_documents(files, "blank_line_separated", 8)[2] is False  # all 8 documents: none follows

    one_pass = documents(text_file_stream(files, "blank_line_separated", held_out=held_out, endless=False), 100)
    assert one_pass == ["doc 1 b.", "doc 2 a.", "doc 2 b.", "doc 3 a.", "doc 3 b."]
    endless = documents(text_file_stream(files, "blank_line_separated", seed=1, held_out=held_out), 50)
    assert len(endless) == 50  # ten passes and more: it never ends
    passes = [endless[k : k + 5] for k in range(0, 50, 5)]
    assert all(sorted(p) == sorted(one_pass) for p in passes)  # every pass: all training documents, once
    assert len({tuple(p) for p in passes}) > 1  # in more than one file order
    assert not set(held) & set(endless)


def test_the_stream_resumes_exactly_from_its_state_dict(text_folder, tiny_checkpoint):
    """A stream's state after k pairs, loaded into a fresh stream, yields the pairs the first one went on with."""
    args = parse_args(
        [
            "--output_dir",
            "unused",
            "--train_files",
            str(text_folder),
            "--streaming",
            "--layout",
            "blank_line_separated",
            "--tokenizer_name",
            str(tiny_checkpoint),
            "--max_seq_length",
            "64",
            "--dupe_factor",
            "2",
            "--validation_split_percentage",
            "0",
        ]
    )
    stream = build(args).train_pairs
    iterator = iter(stream)
    for _ in range(3000):  # past several 64-document batches (about 600 pairs each here)
        next(iterator)
    state = stream.state_dict()
    expected = [next(iterator)["input_ids"] for _ in range(700)]
    fresh = build(args).train_pairs
    fresh.load_state_dict(state)
    assert [row["input_ids"] for _, row in zip(range(700), fresh)] == expected


def test_each_process_streams_its_own_files_and_the_first_pairs_read_only_one_batch_of_documents(
    text_folder, tiny_checkpoint, monkeypatch
):
    args = parse_args(
        [
            "--output_dir",
            "unused",
            "--train_files",
            str(text_folder),
            "--streaming",
            "--layout",
            "blank_line_separated",
            "--tokenizer_name",
            str(tiny_checkpoint),
            "--max_seq_length",
            "64",
        ]
    )
    read = []
    original = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self.name) or original(self))
    for process in (0, 1):
        read.clear()
        stream = build(args, process, 2).train_pairs
        # the held-out documents (the first 100: 5% x 20) are found reading the first files only; then the check
        # that the process's own files can make a pair reads up to its first document that is not held out
        assert read[:2] == ["part_000.txt", "part_001.txt"]
        assert read[2:] == (["part_000.txt", "part_002.txt"] if process == 0 else ["part_001.txt"])
        read.clear()
        next(iter(stream))
        # one batch of 64 documents (60 a file; the first file's 60 and the second's first 40 are held out) for
        # the first pairs: at most three files of the 24, all this process's own
        assert 2 <= len(read) <= 3 and all(int(name[5:8]) % 2 == process for name in read), read


def test_streaming_stops_with_one_line_when_it_cannot_share_or_hold_out(text_folder, tiny_checkpoint, tmp_path):
    two = tmp_path / "two"
    two.mkdir()
    for k in range(2):
        (two / f"{k}.txt").write_text("One sentence here. Another one follows.\n")
    args = parse_args(
        ["--output_dir", "unused", "--train_files", str(two), "--streaming", "--tokenizer_name", str(tiny_checkpoint)]
    )
    with pytest.raises(
        InputError,
        match=r"--train_files has 2 text file\(s\) for 3 processes, and each process "
        r"streams files of its own",
    ):
        build(args, 0, 3)
    with pytest.raises(InputError, match=r"holds out the corpus's first 100 documents for evaluation .* only 2"):
        build(args)


def test_streaming_plain_text_says_the_tokenizer_is_trained_first(tmp_path, caplog):
    write_text_folder(tmp_path / "c", files=2, documents_per_file=200)
    args = parse_args(
        [
            "--output_dir",
            "unused",
            "--train_files",
            str(tmp_path / "c"),
            "--streaming",
            "--layout",
            "blank_line_separated",
            "--vocab_size",
            "300",
            "--validation_split_percentage",
            "0",
        ]
    )
    with caplog.at_level(logging.INFO):
        data = build(args)
    assert "--streaming without --tokenizer_name: the tokenizer is trained first" in caplog.text
    assert "--streaming: 2 files, each pass in a new file order" in caplog.text
    assert len(data.tokenizer) == 300


# A run of 40 steps, logged every 2; the only checkpoint is the one the signal causes.
def streaming_args(folder, tokenizer):
    return [
        "--train_files",
        str(folder),
        "--streaming",
        "--layout",
        "blank_line_separated",
        "--tokenizer_name",
        str(tokenizer),
        "--max_train_steps",
        "40",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        "--mixed_precision",
        "no",
    ]


@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=pytest.mark.launched)])
@pytest.mark.trains
def test_a_stopped_streaming_run_resumes_to_the_uninterrupted_weights(
    tmp_path, text_folder, tiny_checkpoint, processes
):
    """SIGTERM (to rank 1 only, with 2 processes) mid-run: each process saves its stream position with the step;
    `--resume_from_checkpoint latest` then continues every stream where it was, to the uninterrupted run's
    weights and curve."""
    args = streaming_args(text_folder, tiny_checkpoint)
    launcher = DDP if processes == 2 else None
    if processes == 2:
        args += ["--per_device_train_batch_size", "4"]
    run = tmp_path / "run"

    def targets():
        if processes == 1:
            return [psutil.Process(process.pid)]
        return [child for child in psutil.Process(process.pid).children(recursive=True) if launched_rank(child) == "1"]

    process = pretrain(run, *args, launcher=launcher, started=tmp_path)
    signal_once_training(run, process, targets, signal.SIGTERM)
    stderr = (tmp_path / "stderr.txt").read_text()
    if processes == 1:
        assert process.returncode == PREEMPTED, stderr[-3000:]
        step = stopped_step(stderr)
    else:
        assert f"exitcode  : {PREEMPTED}" in stderr, stderr[-3000:]
        line = next(line for line in stderr.splitlines() if line.startswith("Stopped by SIGTERM after step "))
        step = int(line.split(" after step ")[1].split(" ")[0])
    assert 2 <= step < 40
    saved = {path.name for path in (run / f"step_{step}").iterdir()}
    assert {f"stream_state_{k}.json" for k in range(processes)} <= saved

    # The resumed run and the uninterrupted one, in one launch (a launch costs more than these runs).
    reference = tmp_path / "reference"
    results, done = pretrain_runs(
        [(run, [*args, "--resume_from_checkpoint", "latest"]), (reference, args)], launcher=launcher, steps_only=False
    )
    assert [result["status"] for result in results] == [0, 0], results
    shares = (
        "--streaming: 24 files"
        if processes == 1
        else "--streaming: each of the 2 processes reads its own files, this one 12 of 24"
    )
    assert shares in done.stderr
    assert f"Resumed from {run / f'step_{step}'}: step {step}" in done.stderr
    assert [row["step"] for row in metrics(run)] == list(range(2, 41, 2))
    check_same_weights_and_curve(run, reference, after_step=0)


def test_dataloader_workers_with_streaming_stop_with_one_line(tmp_path):
    with pytest.raises(InputError) as stop:
        parse_args(["--output_dir", str(tmp_path / "run"), "--streaming", "--dataloader_num_workers", "2"])
    assert str(stop.value).startswith(
        "--dataloader_num_workers with --streaming: the stream is read in the training process"
    )
    parse_args(["--output_dir", str(tmp_path / "run"), "--streaming", "--dataloader_num_workers", "0"])  # accepted


def test_preprocess_only_with_streaming_stops_with_one_line(tmp_path):
    with pytest.raises(InputError) as stop:
        parse_args(["--output_dir", str(tmp_path / "run"), "--preprocess_only", "--streaming"])
    assert str(stop.value) == (
        "--preprocess_only writes every pair to disk, and --streaming builds them as training goes: drop one of them"
    )


def test_a_json_stream_of_several_files_is_shared_by_files_without_the_held_out_documents(
    tmp_path, caplog, tiny_checkpoint
):
    """4 jsonl files for 2 processes: each process reads 2 of them; the 100 held-out documents (the stream's
    first, all in the first file and part of the second) are in no process's training documents."""
    import json

    from datasets.distributed import split_dataset_by_node

    from albert_hf.pretraining.data.splits import corpus_splits

    files = []
    for f in range(4):
        files.append(tmp_path / f"part{f}.jsonl")
        files[-1].write_text(
            "".join(json.dumps({"text": f"Document {f}-{k} begins. It ends here."}) + "\n" for k in range(60))
        )
    args = parse_args(
        [
            "--output_dir",
            "unused",
            "--train_files",
            *map(str, files),
            "--streaming",
            "--tokenizer_name",
            str(tiny_checkpoint),
        ]
    )
    corpus = corpus_splits(
        args.data.train_files, streaming=True, held_out_percentage=args.data.validation_split_percentage
    )
    train, held = corpus.tokenizer_documents, corpus.held_out  # every process's training documents, and the held-out
    assert held["text"] == [f"Document {f}-{k} begins. It ends here." for f in range(2) for k in range(60)][:100]
    shares = [[row["text"] for row in split_dataset_by_node(train, rank, 2)] for rank in (0, 1)]
    read = [sorted({text.split()[1].split("-")[0] for text in share}) for share in shares]
    # datasets deals the shards out in turn: files 0 and 2 to the first process (file 0 is all held out), 1 and 3
    # to the second
    assert read == [["2"], ["1", "3"]]
    assert len(shares[0]) + len(shares[1]) == 240 - 100
    assert not set(held["text"]) & set(shares[0] + shares[1])
    with caplog.at_level(logging.INFO):
        build(args, 1, 2)
    assert "--streaming: each of the 2 processes reads its own 2 of 4 shards" in caplog.text


def test_a_stream_that_can_make_no_pair_stops_with_one_line_instead_of_hanging(tmp_path, tiny_checkpoint):
    """A process whose stream holds only one-sentence documents would read pass after pass and never give a pair."""
    import json

    folder = tmp_path / "text"
    folder.mkdir()
    (folder / "a.txt").write_text("A first sentence. A second one follows it.")
    (folder / "b.txt").write_text("Only one sentence here")
    args = parse_args(
        [
            "--output_dir",
            "unused",
            "--train_files",
            str(folder),
            "--streaming",
            "--tokenizer_name",
            str(tiny_checkpoint),
            "--validation_split_percentage",
            "0",
        ]
    )
    build(args, 0, 2)  # process 0 streams a.txt
    with pytest.raises(
        InputError,
        match=r"--train_files: the files of process 1 \(.*b\.txt\) holds no document of "
        r"two sentences or more",
    ):
        build(args, 1, 2)
    lines = tmp_path / "one.jsonl"
    lines.write_text("".join(json.dumps({"text": f"Short document {k}"}) + "\n" for k in range(30)))
    args = parse_args(
        [
            "--output_dir",
            "unused",
            "--train_files",
            str(lines),
            "--streaming",
            "--tokenizer_name",
            str(tiny_checkpoint),
            "--validation_split_percentage",
            "0",
        ]
    )
    with pytest.raises(InputError, match=r"one\.jsonl: process 0's share holds no document of two sentences"):
        build(args)
    # as a user runs it: one line and status 2, not a run waiting forever for pairs
    done = run_bounded(
        [
            sys.executable,
            str(REPO / "run_pretraining.py"),
            "--train_files",
            str(folder / "b.txt"),
            "--streaming",
            "--tokenizer_name",
            str(tiny_checkpoint),
            "--validation_split_percentage",
            "0",
            "--output_dir",
            str(tmp_path / "out"),
        ],
        timeout=120,
        cwd=tmp_path,
        env=subprocess_env(),
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "holds no document of two sentences or more" in done.stderr.strip().splitlines()[-1]
