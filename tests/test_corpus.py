"""Corpus reading: files and layouts, bad bytes and bad files, `datasets` sources, the embedded corpus."""

import itertools
import json
import logging
import os

import datasets
import pytest

from albert_hf.errors import InputError
from albert_hf.pretraining.data.corpus import (
    decode_text,
    find_text_files,
    load_corpus,
    load_text_dataset,
    load_text_files,
)
from albert_hf.pretraining.data.embedded_corpus import embedded_corpus_path
from albert_hf.tokenization import split_sentences
from data_fixtures import embedded
from helpers import shared_data


def test_decode_text_counts_replacements_and_never_raises():
    # cp1252 bytes: é (0xE9) and curly quotes (0x93, 0x94) are not valid UTF-8.
    text, replaced = decode_text(b"caf\xe9 \x93quoted\x94\r\nnext line")
    assert replaced == 3
    assert text == "caf\ufffd \ufffdquoted\ufffd\nnext line"
    # A U+FFFD already in the file is text, not a replacement; a BOM is dropped.
    text, replaced = decode_text("\ufeffkeep \ufffd here".encode("utf-8"))
    assert (text, replaced) == ("keep \ufffd here", 0)


def test_split_sentences_reflows_paragraphs_and_keeps_abbreviations():
    text = "Mr. Smith went to\nWashington. He met Dr. Jones\nthere.\n\nA new paragraph starts here"
    assert split_sentences(text) == [
        "Mr. Smith went to Washington.",
        "He met Dr. Jones there.",
        "A new paragraph starts here",
    ]
    # Official format: each line is a sentence, even without final punctuation.
    assert split_sentences("one line\n  \nsecond line. Still second\n", sentence_per_line=True) == [
        "one line",
        "second line. Still second",
    ]


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_text_files_bad_input_is_skipped_and_counted(tmp_path, caplog):
    _write(tmp_path / "a_good.txt", b"First sentence here. Second one.\n\nAnother paragraph.")
    _write(tmp_path / "b_empty.txt", b"")
    _write(tmp_path / "c_blank.txt", b"  \n\n \t\n")
    _write(tmp_path / "d_cp1252.txt", b"Caf\xe9 society. It was \x93fine\x94.")
    _write(tmp_path / "e_binary.txt", b"\x00\x01\x02binary\x00")
    with caplog.at_level(logging.INFO, logger="albert_hf"):
        ds = load_text_files(tmp_path, cache_dir=str(tmp_path / "cache"))
    assert ds["source"] == [str(tmp_path / "a_good.txt"), str(tmp_path / "d_cp1252.txt")]
    assert ds["text"][1] == "Caf\ufffd society. It was \ufffdfine\ufffd."
    log = caplog.text
    assert "skipped 2 empty and 1 binary files" in log
    assert (
        f"1 file(s) hold byte sequences that are not valid UTF-8 (cp1252?), 3 in all, replaced by U+FFFD: "
        f"{tmp_path / 'd_cp1252.txt'} (3)" in log
    )
    assert f"Skipped 1 file(s) with NUL bytes (not text): {tmp_path / 'e_binary.txt'}" in log


def test_problems_repeated_per_file_are_one_line_with_a_count_and_the_first_names(tmp_path, caplog):
    for i in range(40):
        _write(tmp_path / f"cp1252_{i:02d}.txt", b"Caf\xe9 society, number %d." % i)
        _write(tmp_path / f"empty_{i:02d}.txt", b"")
    with caplog.at_level(logging.INFO, logger="albert_hf"):
        ds = load_text_files(tmp_path, cache_dir=str(tmp_path / "cache"))
    assert len(ds) == 40
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert warnings[0] == (
        "40 file(s) hold byte sequences that are not valid UTF-8 (cp1252?), 40 in all, replaced "
        f"by U+FFFD: {tmp_path / 'cp1252_00.txt'} (1), {tmp_path / 'cp1252_01.txt'} (1), "
        f"{tmp_path / 'cp1252_02.txt'} (1) and 37 more"
    )
    assert warnings[1] == (
        f"Skipped 40 empty file(s): {tmp_path / 'empty_00.txt'}, {tmp_path / 'empty_01.txt'}, "
        f"{tmp_path / 'empty_02.txt'} and 37 more"
    )
    with caplog.at_level(logging.DEBUG, logger="albert_hf"):  # every file, at debug level
        caplog.clear()
        load_text_files(tmp_path, cache_dir=str(tmp_path / "cache2"))
    assert f"{tmp_path / 'cp1252_39.txt'}: 1 byte sequences are not valid UTF-8" in caplog.text


def test_text_file_layouts(tmp_path):
    body = "Doc one, sentence one.\nDoc one, sentence two.\n\nDoc two only line.\n\n\nDoc three.\n"
    _write(tmp_path / "corpus.txt", body.encode())
    per_file = load_text_files(tmp_path, layout="document_per_file", cache_dir=str(tmp_path / "c1"))
    assert len(per_file) == 1
    blank = load_text_files(tmp_path, layout="blank_line_separated", cache_dir=str(tmp_path / "c2"))
    assert blank["text"] == ["Doc one, sentence one.\nDoc one, sentence two.", "Doc two only line.", "Doc three."]
    lines = load_text_files(tmp_path, layout="sentence_per_line", cache_dir=str(tmp_path / "c3"))
    assert split_sentences(lines["text"][0], sentence_per_line=True) == [
        "Doc one, sentence one.",
        "Doc one, sentence two.",
    ]


def test_text_files_cache_follows_file_changes(tmp_path):
    path = _write(tmp_path / "doc.txt", b"Original text.")
    assert load_text_files(path, cache_dir=str(tmp_path / "c"))["text"] == ["Original text."]
    path.write_bytes(b"Edited text, longer than before.")
    os.utime(path, ns=(1, 1))  # the cache key holds size and mtime
    assert load_text_files(path, cache_dir=str(tmp_path / "c"))["text"] == ["Edited text, longer than before."]


def _empty_folder(root):
    (root / "empty_dir").mkdir()
    return root / "empty_dir"


def _folder_of_an_empty_file(root):
    (root / "only_empty").mkdir()
    _write(root / "only_empty" / "a.txt", b"")
    return root / "only_empty"


def _one_text_file(root):
    _write(root / "x.txt", b"text")
    return root / "x.txt"


@pytest.mark.parametrize(
    "make_source, read, error, message",
    [
        pytest.param(lambda root: root / "nowhere.txt", find_text_files, InputError, "nowhere.txt", id="missing-file"),
        pytest.param(_empty_folder, find_text_files, InputError, "empty_dir", id="empty-folder"),
        pytest.param(
            _folder_of_an_empty_file,
            lambda path: load_text_files(path, cache_dir=str(path.parent / "c")),
            ValueError,
            "No text in 1 file",
            id="only-empty-files",
        ),
        pytest.param(
            _one_text_file,
            lambda path: load_text_files(path, layout="one_per_line", cache_dir=str(path.parent / "c")),
            ValueError,
            "layout",
            id="unknown-layout",
        ),
        pytest.param(
            lambda root: root / "typo.jsonl", load_corpus, InputError, "typo.jsonl", id="missing-file-not-a-hub-name"
        ),  # not mistaken for a Hub dataset name
    ],
)
def test_missing_paths_and_unknown_layouts_are_clear_errors(tmp_path, make_source, read, error, message):
    with pytest.raises(error, match=message):
        read(make_source(tmp_path))


def test_datasets_sources_with_a_text_column(tmp_path):
    rows = [{"id": i, "content": f"Document {i}. It has two sentences."} for i in range(5)]
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    ds = load_text_dataset(jsonl, text_column="content")
    assert "text" in ds.column_names and "content" not in ds.column_names
    assert ds["text"] == [r["content"] for r in rows]

    csv = tmp_path / "docs.csv"
    datasets.Dataset.from_list(rows).to_csv(str(csv))
    assert load_corpus(csv, text_column="content")["text"] == [r["content"] for r in rows]

    parquet = tmp_path / "docs.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    streamed = load_text_dataset(parquet, text_column="content", streaming=True)
    assert isinstance(streamed, datasets.IterableDataset)
    assert [r["text"] for r in streamed] == [r["content"] for r in rows]


def test_missing_text_column_names_the_column_and_the_file(tmp_path):
    path = tmp_path / "docs.jsonl"
    path.write_text(json.dumps({"body": "Some text."}) + "\n")
    with pytest.raises(ValueError, match=r"no text column 'text'.*\['body'\]") as error:
        load_text_dataset(path)
    assert "docs.jsonl" in str(error.value)


def test_malformed_json_is_an_error_naming_the_file(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"text": "fine"}\n{"text": "unterminated\n')
    with pytest.raises(ValueError, match="broken.jsonl"):
        load_text_dataset(path)


def test_embedded_corpus_is_stdlib_docstrings_in_source_order():
    ds = embedded()
    assert len(ds) > 3000  # thousands of real English documents on any Python install
    sources, texts = ds["source"], ds["text"]
    # json.decoder: the module docstring, then JSONDecoder, then its methods in the order they are defined.
    order = [s for s in sources if s.startswith("json.decoder")]
    assert order[0] == "json.decoder"
    assert (
        order.index("json.decoder:JSONDecoder")
        < order.index("json.decoder:JSONDecoder.__init__")
        < order.index("json.decoder:JSONDecoder.decode")
        < order.index("json.decoder:JSONDecoder.raw_decode")
    )
    # Each module's docstrings form one block (module by module), and no test-suite module is in it.
    modules = [s.split(":")[0] for s in sources]
    blocks = [module for module, _ in itertools.groupby(modules)]
    assert len(blocks) == len(set(blocks))
    assert not any(m.startswith("test.") or ".test." in m or ".tests." in m for m in modules)
    # Prose only: no doctest prompts, and every document is re-flowed text.
    assert not any(paragraph.startswith(">>>") for t in texts for paragraph in t.split("\n\n"))
    mean = texts[sources.index("statistics:mean")]
    assert "Return the sample arithmetic mean of data." in mean and ">>> mean(" not in mean
    assert all(t.strip() == t and t for t in texts)
    multi = sum(len(split_sentences(t)) >= 2 for t in texts[:2000])
    assert multi > 500  # enough multi-sentence documents for sentence-order pairs


def test_embedded_corpus_is_cached_after_the_first_build():
    embedded()
    path = embedded_corpus_path()
    assert path.exists()
    stamp = path.stat().st_mtime_ns
    from albert_hf.pretraining.data.embedded_corpus import embedded_corpus

    assert len(embedded_corpus()) == len(embedded())
    assert path.stat().st_mtime_ns == stamp  # read, not rebuilt


def _invalid_utf8_sequences(data: bytes) -> int:
    # Independent count: walk the strict decoder's errors one by one.
    count, start = 0, 0
    while True:
        try:
            data[start:].decode("utf-8")
            return count
        except UnicodeDecodeError as error:
            count += 1
            start += error.end


def test_real_gutenberg_and_state_union_files_decode_with_counted_replacements(caplog, tmp_path):
    folders = [shared_data("corpus", "gutenberg_nltk"), shared_data("corpus", "state_union")]
    files = find_text_files(folders)
    expected = {str(f): _invalid_utf8_sequences(f.read_bytes()) for f in files}
    assert sum(1 for n in expected.values() if n) >= 5  # several real files are cp1252
    with caplog.at_level(logging.DEBUG, logger="albert_hf"):  # per file at debug level
        ds = load_text_files(folders, cache_dir=str(tmp_path))
    assert len(ds) == len(files)
    for path, n in expected.items():
        if n:
            assert f"{path}: {n} byte sequences are not valid UTF-8" in caplog.text
    assert sum(t.count("\ufffd") for t in ds["text"]) == sum(expected.values())
