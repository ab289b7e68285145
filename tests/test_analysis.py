"""albert_hf.analysis: layer transitions (Figure 1) and intrinsic accuracies (Table 5) on tiny inputs."""

import math

import pytest
import torch

from albert_hf import AlbertHFForPreTraining, AlbertHFModel
from albert_hf.analysis import transitions as transitions_cli
from albert_hf.analysis.intrinsic import build_intrinsic_sets, evaluate_intrinsic, sop_by_document
from albert_hf.analysis.intrinsic import main as intrinsic_main
from albert_hf.analysis.transitions import layer_transitions, model_transitions
from albert_hf.errors import InputError
from data_fixtures import embedded, tokenizer
from helpers import REPO, tiny_config

# ------------------------------------------------------------------------------------------------------------
# Layer transitions on hand-made hidden states


def test_identical_input_and_output_give_zero_distance_and_cosine_one():
    h = torch.randn(2, 5, 8)
    r = layer_transitions((h, h.clone(), h.clone()))
    assert r["l2"] == pytest.approx([0.0, 0.0], abs=1e-6)
    assert r["cosine"] == pytest.approx([1.0, 1.0], abs=1e-6)
    assert r["angle_degrees"] == pytest.approx([0.0, 0.0], abs=0.1)
    assert r["tokens"] == 10


def test_orthogonal_and_opposite_vectors():
    x = torch.zeros(1, 1, 4)
    x[..., 0] = 3.0
    y = torch.zeros(1, 1, 4)
    y[..., 1] = 4.0
    r = layer_transitions((x, y, -y))
    # layer 1: orthogonal 3- and 4-vectors -> distance 5, cosine 0, 90 degrees; layer 2: y -> -y: 8, -1, 180
    assert r["l2"] == pytest.approx([5.0, 8.0])
    assert r["cosine"] == pytest.approx([0.0, -1.0], abs=1e-6)
    assert r["angle_degrees"] == pytest.approx([90.0, 180.0], abs=1e-3)


def test_average_over_tokens_and_padding_excluded():
    x = torch.zeros(1, 3, 2)
    x[0, :, 0] = 1.0
    y = x.clone()
    y[0, 1] = torch.tensor([0.0, 1.0])  # token 1 turns by 90 degrees, distance sqrt(2)
    y[0, 2] = torch.tensor([-100.0, 0.0])  # a wild padding token, which must not count
    mask = torch.tensor([[1, 1, 0]])
    r = layer_transitions((x, y), mask)
    assert r["tokens"] == 2
    assert r["l2"] == pytest.approx([math.sqrt(2) / 2])
    assert r["cosine"] == pytest.approx([0.5])
    assert r["angle_degrees"] == pytest.approx([45.0])
    # Without the mask the padding token counts and changes everything.
    assert layer_transitions((x, y))["l2"][0] > 30


def test_bad_hidden_states():
    h = torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="at least 2 hidden states"):
        layer_transitions((h,))
    with pytest.raises(ValueError, match="padding"):
        layer_transitions((h, h), torch.zeros(1, 2))


# ------------------------------------------------------------------------------------------------------------
# On a tiny model


TEXTS = ["The quick brown fox jumps over the lazy dog.", "Return a new list.", "x"]


def test_model_transitions_one_value_per_layer_and_padding_independent():
    tok = tokenizer()
    model = AlbertHFModel(tiny_config(vocab_size=len(tok), num_hidden_layers=3)).eval()
    r = model_transitions(model, tok, TEXTS, batch_size=3)
    assert len(r["l2"]) == len(r["cosine"]) == len(r["angle_degrees"]) == 3
    assert r["tokens"] == sum(len(tok(t)["input_ids"]) for t in TEXTS)
    assert all(v > 0 for v in r["l2"]) and all(-1 <= v <= 1 for v in r["cosine"])
    # One text per batch (no padding at all) must give the same token averages as one padded batch.
    assert tok.backend_tokenizer.padding is None and tok.backend_tokenizer.truncation is None  # state restored
    unpadded = model_transitions(model, tok, TEXTS, batch_size=1)
    assert unpadded["l2"] == pytest.approx(r["l2"], rel=1e-4)
    assert unpadded["cosine"] == pytest.approx(r["cosine"], rel=1e-4)


def test_shared_layers_with_identity_block_do_not_move_embeddings():
    # Zero the block's output projections: each layer is then LayerNorm(x + 0) twice, and a LayerNorm with
    # unit weight and zero bias maps its own output to itself, so every layer after the first is a fixed point.
    tok = tokenizer()
    model = AlbertHFModel(tiny_config(vocab_size=len(tok), num_hidden_layers=4)).eval()
    block = model.encoder.albert_layer_groups[0].albert_layers[0]
    with torch.no_grad():
        for name, p in block.named_parameters():
            if ("dense" in name and "attention" in name) or name.startswith("ffn_output"):
                p.zero_()
    r = model_transitions(model, tok, TEXTS)
    assert r["l2"][1:] == pytest.approx([0, 0, 0], abs=1e-3)
    assert r["cosine"][1:] == pytest.approx([1, 1, 1], abs=1e-5)
    assert r["l2"][0] > 0.1  # the first layer normalises the projected embedding: it moves


def test_transitions_cli_writes_png_and_csv(tmp_path, tiny_checkpoint):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n\n")
    out = tmp_path / "fig" / "fig1.png"
    results = transitions_cli.main(["--model", str(tiny_checkpoint), "--texts", str(texts), "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = out.with_suffix(".csv").read_text().splitlines()
    assert rows[0] == "model,layer,l2,cosine,angle_degrees,tokens"
    assert len(rows) == 1 + 4  # the tiny preset has 4 layers
    (name,) = results
    assert [float(r.split(",")[2]) for r in rows[1:]] == pytest.approx(results[name]["l2"], rel=1e-5)


def test_transitions_cli_clear_errors(tmp_path, tiny_checkpoint):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(InputError, match="empty.txt holds no non-empty line"):
        transitions_cli.main(["--model", str(tiny_checkpoint), "--texts", str(empty), "--out", str(tmp_path / "a.png")])
    texts = tmp_path / "t.txt"
    texts.write_text("hello world\n")
    with pytest.raises(InputError, match="no_such_model"):
        transitions_cli.main(
            ["--model", str(tmp_path / "no_such_model"), "--texts", str(texts), "--out", str(tmp_path / "a.png")]
        )
    with pytest.raises(InputError, match="missing.txt"):
        transitions_cli.main(
            [
                "--model",
                str(tiny_checkpoint),
                "--texts",
                str(tmp_path / "missing.txt"),
                "--out",
                str(tmp_path / "a.png"),
            ]
        )


# ------------------------------------------------------------------------------------------------------------
# Intrinsic evaluation


def _documents(n=60):
    return [d for d in embedded().select(range(2000))["text"] if d.count(".") >= 4][:n]


def test_intrinsic_sets_have_the_documented_sizes_and_labels():
    tok = tokenizer()
    sets = build_intrinsic_sets(_documents(), tok, max_seq_length=64, max_examples=50)
    assert len(sets["nsp"]) == len(sets["sop"]) == 50
    for task in ("nsp", "sop"):
        labels = sets[task]["sentence_order_label"]
        assert set(labels) == {0, 1}
        assert all(len(ids) <= 64 and ids.count(tok.sep_token_id) == 2 for ids in sets[task]["input_ids"])
    # Without a cap every pair of the single pass is kept; the labels are a fair coin (no one-chunk pairs
    # forced to label 1), so neither class dominates.
    full = build_intrinsic_sets(_documents(), tok, max_seq_length=64, max_examples=10**6)
    for task in ("nsp", "sop"):
        labels = full[task]["sentence_order_label"]
        assert 50 < len(labels) < 10**6
        assert 0.3 < sum(labels) / len(labels) < 0.7


def test_evaluate_intrinsic_on_a_random_tiny_model_is_deterministic():
    tok = tokenizer()
    model = AlbertHFForPreTraining(tiny_config(vocab_size=len(tok)))
    docs = _documents()
    r = evaluate_intrinsic(model, tok, docs, max_seq_length=64, max_examples=40, batch_size=16)
    assert set(r) == {"mlm", "nsp", "sop", "mlm_tokens", "nsp_examples", "sop_examples"}
    assert r["nsp_examples"] == r["sop_examples"] == 40
    assert r["mlm_tokens"] > 40  # at least one masked token per pair
    assert all(0.0 <= r[k] <= 1.0 for k in ("mlm", "nsp", "sop"))
    assert r["mlm"] < 0.2  # random weights over 1000 pieces predict almost nothing
    again = evaluate_intrinsic(model, tok, docs, max_seq_length=64, max_examples=40, batch_size=7)
    assert again == r  # same seed: same pairs, same masks, whatever the batch size


def test_intrinsic_reads_the_head_class_against_the_labels():
    # A head that always answers class 1 ("swapped" / "random next") is right exactly on the label-1 pairs.
    tok = tokenizer()
    model = AlbertHFForPreTraining(tiny_config(vocab_size=len(tok)))
    with torch.no_grad():
        model.sop_classifier.classifier.weight.zero_()
        model.sop_classifier.classifier.bias.copy_(torch.tensor([0.0, 5.0]))
    docs = _documents()
    sets = build_intrinsic_sets(docs, tok, max_seq_length=64, max_examples=40)
    r = evaluate_intrinsic(model, tok, docs, sets=sets)
    for task in ("nsp", "sop"):
        labels = sets[task]["sentence_order_label"]
        assert r[task] == pytest.approx(sum(labels) / len(labels))


def test_sop_by_document_scores_each_document_on_its_own_pairs(caplog):
    # The always-"swapped" head again: on each document it is right exactly on that document's label-1 pairs.
    tok = tokenizer()
    model = AlbertHFForPreTraining(tiny_config(vocab_size=len(tok)))
    with torch.no_grad():
        model.sop_classifier.classifier.weight.zero_()
        model.sop_classifier.classifier.bias.copy_(torch.tensor([0.0, 5.0]))
    docs = [" ".join(_documents(60)[i::3]) for i in range(3)]
    result = sop_by_document(
        model, tok, docs + ["Just one sentence here."], ["a", "b", "c", "short"], max_seq_length=64, max_examples=30
    )
    assert list(result) == ["a", "b", "c"]  # the one-sentence document gives no pair: skipped, and logged
    assert "skipped 1 documents" in caplog.text and "short" in caplog.text
    shares = []
    for name, doc in zip("abc", docs):
        labels = build_intrinsic_sets([doc], tok, max_seq_length=64, max_examples=30, tasks=("sop",))["sop"][
            "sentence_order_label"
        ]
        assert result[name] == {"sop": pytest.approx(sum(labels) / len(labels)), "sop_examples": len(labels)}
        shares.append(sum(labels) / len(labels))
    assert len(set(shares)) > 1  # the documents really are scored apart
    with pytest.raises(ValueError, match="2 names for 3 documents"):
        sop_by_document(model, tok, docs, ["a", "b"])
    # Bad arguments are errors, not documents "too short for a pair"
    with pytest.raises(ValueError, match="max_seq_length=600 exceeds"):
        sop_by_document(model, tok, docs, max_seq_length=600)


def test_document_names_are_file_names_numbered_within_a_file():
    import datasets

    from albert_hf.analysis.intrinsic import document_names

    docs = datasets.Dataset.from_dict(
        {"text": ["a", "b", "c", "d"], "source": ["/x/emma.txt", "/y/speeches.txt", "/y/speeches.txt", "/z/a.txt"]}
    )
    assert document_names(docs) == ["emma.txt", "speeches.txt#0", "speeches.txt#1", "a.txt"]
    assert document_names(docs.remove_columns("source")) == ["0", "1", "2", "3"]


def test_intrinsic_needs_the_sentence_head_and_documents():
    tok = tokenizer()
    with pytest.raises(ValueError, match="sop_logits"):
        evaluate_intrinsic(AlbertHFModel(tiny_config(vocab_size=len(tok))), tok, _documents(), max_examples=4)
    with pytest.raises(ValueError, match="No non-empty document"):
        evaluate_intrinsic(AlbertHFForPreTraining(tiny_config(vocab_size=len(tok))), tok, ["", "  "])


def test_intrinsic_cli(tmp_path, tiny_checkpoint, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i, text in enumerate(_documents(20)):
        (docs / f"{i}.txt").write_text(text)
    rows = intrinsic_main(
        [
            "--model",
            str(tiny_checkpoint),
            "--documents",
            str(docs),
            "--max_examples",
            "16",
            "--max_seq_length",
            "64",
            "--json",
            str(tmp_path / "r.json"),
        ]
    )
    assert rows[str(tiny_checkpoint)]["sop_examples"] == 16
    assert "MLM" in capsys.readouterr().out and (tmp_path / "r.json").is_file()
    rows = intrinsic_main(
        [
            "--model",
            str(tiny_checkpoint),
            "--documents",
            str(docs / "0.txt"),
            str(docs / "1.txt"),
            "--max_examples",
            "8",
            "--max_seq_length",
            "64",
            "--per_document",
        ]
    )
    by_document = rows[str(tiny_checkpoint)]["sop_by_document"]
    assert set(by_document) == {"0.txt", "1.txt"}
    assert all(0 < r["sop_examples"] <= 8 for r in by_document.values())
    assert "per document" in capsys.readouterr().out
    with pytest.raises(InputError, match="nowhere"):
        intrinsic_main(["--model", str(tiny_checkpoint), "--documents", str(tmp_path / "nowhere")])
    with pytest.raises(InputError, match="missing_model"):
        intrinsic_main(["--model", str(tmp_path / "missing_model"), "--documents", str(docs), "--max_examples", "4"])


def test_reproduction_passes_its_training_options_to_run_pretraining(tmp_path, monkeypatch):
    """examples/reproduce_sop_vs_nsp.py: the budget flags reach run_pretraining's arguments (the warm-up and
    compilation only when given, so run_pretraining's own defaults apply otherwise; beta2 always, as the
    examples' 0.98 differs from run_pretraining's official 0.999)."""
    import argparse

    import albert_hf.pretraining.job

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    import reproduce_sop_vs_nsp as reproduction

    seen = []
    monkeypatch.setattr(albert_hf.pretraining.job, "main", lambda argv: seen.append(argv))
    for extra in ([], ["--num_warmup_steps", "100", "--adam_beta2", "0.999", "--torch_compile"]):
        parser = argparse.ArgumentParser()
        reproduction.common_arguments(parser, steps=700, output_dir=str(tmp_path))
        args = parser.parse_args(["--learning_rate", "3e-3", "--seed", "1", *extra])
        args.model_fields, args.train_files = dict(reproduction.SMALL_MODEL), None
        run_dir = tmp_path / f"run{len(seen)}"
        run_dir.mkdir()
        reproduction.pretrain(args, run_dir, task="nsp")
        argv = list(seen[-1])
        compiled = "--torch_compile" in argv
        if compiled:
            argv.remove("--torch_compile")
        argv.remove("--overwrite_output_dir")  # an unfinished run of an earlier reproduction starts over
        options = dict(zip(argv[::2], argv[1::2]))
        assert compiled == bool(extra)
        assert (options["--task"], options["--learning_rate"], options["--seed"]) == ("nsp", "0.003", "1")
        assert options["--max_train_steps"] == "700"
        assert options.get("--num_warmup_steps") == (extra[1] if extra else None)
        assert options["--adam_beta2"] == (extra[3] if extra else "0.98")
