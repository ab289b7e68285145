"""A domain's own vocabulary for a continued run (--extend_vocabulary N, data/vocabulary.py): the new pieces are
the domain's and absent from the loaded vocabulary, both encoders agree on them, text without them is encoded and
modelled as before bit for bit, the new rows start as their pieces' means, the run resumes exactly, the folder loads
without albert_hf and fine-tunes; every way to ask for it wrongly stops in one line."""

import json
import random
import re

import pytest
import torch
from safetensors.torch import load_file

from albert_hf.errors import InputError
from data_fixtures import SQUAD_V1, embedded, write_json
from helpers import glue_args, run_glue, run_python, run_squad, squad_args
from pretraining_runs import metrics, pretrain_runs

TERMS = [
    "tuberculosis",
    "streptomycin",
    "bronchoscopy",
    "pneumothorax",
    "haemoptysis",
    "sputum",
    "mycobacterium",
    "isoniazid",
    "radiograph",
    "pleural",
    "effusion",
    "rifampicin",
]
FRAMES = [
    "The patient presented with {a} and was treated with {b}.",
    "A {a} was seen on the {b} after admission.",
    "{a} is rare, and {b} is the first line of care.",
    "We report {a} in a woman, confirmed by {b}.",
    "After {a}, the {b} was repeated twice.",
]


def domain_documents(count: int, seed: int) -> list[str]:
    """The embedded corpus's documents, each with clinical sentences between its paragraphs: text the loaded
    vocabulary (trained on the embedded corpus) knows, and terms it splits into many pieces."""
    rng = random.Random(seed)
    documents = []
    for row in embedded().select(range(seed * count, (seed + 1) * count)):
        paragraphs = row["text"].split("\n\n")[:6]
        clinical = [
            " ".join(rng.choice(FRAMES).format(a=rng.choice(TERMS), b=rng.choice(TERMS)).capitalize() for _ in range(3))
            for _ in paragraphs
        ]
        documents.append("\n\n".join(part for pair in zip(paragraphs, clinical) for part in pair))
    return documents


@pytest.fixture(scope="module")
def domain(tmp_path_factory):
    """The domain as a jsonl corpus, and its documents."""
    root = tmp_path_factory.mktemp("domain")
    documents = domain_documents(240, seed=0)
    with open(root / "domain.jsonl", "w") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")
    return {"corpus": root / "domain.jsonl", "documents": documents, "root": root}


@pytest.fixture(scope="module")
def extended(tiny_checkpoint, domain):
    """The tiny checkpoint's tokenizer extended by 16 pieces of the domain, as a run builds it."""
    import datasets
    from transformers import AutoTokenizer

    from albert_hf.pretraining.data.vocabulary import extend_vocabulary

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint)
    documents = datasets.Dataset.from_dict({"text": domain["documents"][:200]})
    held_out = datasets.Dataset.from_dict({"text": domain["documents"][200:]})
    new, extension = extend_vocabulary(
        tokenizer, 16, "the domain", documents, "document_per_file", held_out, 100_000, seed=3
    )
    return {"old": tokenizer, "new": new, "extension": extension}


@pytest.mark.quick
def test_the_new_pieces_are_the_domains_and_follow_the_loaded_ones(extended):
    old, new, extension = extended["old"], extended["new"], extended["extension"]
    assert len(new) == len(old) + 16 == extension.base_size + len(extension.pieces)
    old_vocab, new_vocab = old.get_vocab(), new.get_vocab()
    assert all(new_vocab[piece] == index for piece, index in old_vocab.items())  # every old piece keeps its id
    assert not set(extension.pieces) & set(old_vocab)
    # the domain's terms, which the loaded vocabulary cut into pieces, are among the most frequent new ones
    whole = [term for term in TERMS if f"▁{term}" in extension.pieces]
    assert len(whole) >= 8, extension.pieces
    assert all(len(old.tokenize(term)) >= 3 for term in whole)
    assert new.tokenize("Tuberculosis and sputum.")[:2] == ["▁tuberculosis", "▁and"]
    before, after = extension.pieces_per_word
    assert after < 0.8 * before


@pytest.mark.quick
def test_both_encoders_agree_on_the_extended_vocabulary(extended, domain):
    from albert_hf.pretraining.data.sentences import plain_backend
    from albert_hf.pretraining.data.spm_encoder import SentencePieceEncoder

    new = extended["new"]
    backend = plain_backend(new)
    fast = SentencePieceEncoder.for_tokenizer(new, backend)
    assert fast is not None  # the edited spiece.model holds the fast tokenizer's pieces and scores
    sentences = [s for text in domain["documents"][200:] for s in text.split(". ")]
    assert fast.encode(sentences) == [e.ids for e in backend.encode_batch(sentences, add_special_tokens=False)]


@pytest.mark.quick
def test_at_step_0_text_without_new_pieces_is_encoded_and_modelled_as_before_bit_for_bit(tiny_checkpoint, extended):
    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from albert_hf.pretraining.training.model import build_model

    old, new, extension = extended["old"], extended["new"], extended["extension"]
    source = AlbertHFForPreTraining.from_pretrained(tiny_checkpoint).eval()
    model = build_model(
        AlbertHFConfig.from_pretrained(tiny_checkpoint), str(tiny_checkpoint), new, "sop", vocabulary=extension
    ).eval()
    sentences = [
        s.strip() + "."
        for text in embedded().select(range(2000, 2040))["text"]
        for s in text.replace("\n", " ").split(". ")
    ]
    ids = [new(text)["input_ids"] for text in sentences]
    texts = [text for text, found in zip(sentences, ids) if 8 < len(found) < 64 and max(found) < len(old)][:8]
    assert len(texts) == 8
    batch = new(texts, padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], old(texts, padding=True, return_tensors="pt")["input_ids"])
    with torch.no_grad():
        got, expected = model(**batch), source(**batch)
    assert torch.equal(got.prediction_logits[..., : len(old)], expected.prediction_logits)
    assert torch.equal(got.sop_logits, expected.sop_logits)

    rows, source_rows = model.albert.embeddings.word_embeddings.weight, source.albert.embeddings.word_embeddings.weight
    assert torch.equal(rows[: len(old)], source_rows)
    assert torch.equal(model.predictions.bias[: len(old)], source.predictions.bias)
    assert model.predictions.decoder.weight is rows and model.config.vocab_size == len(new)
    for offset, piece in enumerate(extension.pieces):  # each new row: the mean of its pieces under the old vocabulary
        ids = [token.id for token in old.backend_tokenizer.model.tokenize(piece)]
        assert "".join(old.convert_ids_to_tokens(ids)) == piece
        torch.testing.assert_close(rows[len(old) + offset], source_rows[ids].mean(0), rtol=0, atol=1e-7)
        torch.testing.assert_close(
            model.predictions.bias[len(old) + offset], source.predictions.bias[ids].mean(), rtol=0, atol=1e-7
        )


@pytest.fixture(scope="module")
def extended_runs(tiny_checkpoint, domain):
    """A continued run with 40 new pieces (evaluated, checkpointed), its resume, and a mixed run learning them from
    one of its sources."""
    root = domain["root"]
    general = root / "general.jsonl"
    with open(general, "w") as f:
        for row in embedded().select(range(200)):
            f.write(json.dumps({"text": row["text"]}) + "\n")
    run = [
        "--model_name_or_path",
        str(tiny_checkpoint),
        "--train_files",
        str(domain["corpus"]),
        "--extend_vocabulary",
        "40",
        "--max_train_steps",
        "6",
        "--eval_steps",
        "3",
        "--checkpointing_steps",
        "3",
    ]
    mixed = [
        "--model_name_or_path",
        str(tiny_checkpoint),
        "--extend_vocabulary",
        "40",
        "--extend_vocabulary_from",
        "clinic",
        "--sources",
        f"name=clinic,weight=0.9,train_files={domain['corpus']}",
        f"name=general,weight=0.1,train_files={general}",
        "--max_train_steps",
        "2",
        "--eval_steps",
        "0",
    ]
    runs = [
        (root / "run", run, {}, False),
        (root / "resumed", [*run, "--resume_from_checkpoint", str(root / "run" / "step_3")], {}, False),
        (root / "mixed", mixed, {}, True),
    ]
    results, done = pretrain_runs(runs)
    assert [r["status"] for r in results] == [0] * len(runs), results
    return {"stderr": done.stderr, "run": root / "run", "resumed": root / "resumed"}


@pytest.mark.trains
def test_the_start_line_and_results_say_what_was_added(extended_runs, tiny_checkpoint, domain):
    lines = re.findall(
        r"--extend_vocabulary 40: 40 pieces learned from (.*?) added \(1,000 -> 1,040\); pieces per "
        r"word on its held-out documents ([\d.]+) -> ([\d.]+); each new embedding row",
        extended_runs["stderr"],
    )
    assert [where for where, *_ in lines] == [f"--train_files {domain['corpus']}"] * 2 + ["source clinic"]
    assert all(float(after) < float(before) for _, before, after in lines)
    results = json.loads((extended_runs["run"] / "all_results.json").read_text())
    assert results["vocabulary_added"] == 40 and results["vocabulary_size"] == 1040
    assert results["pieces_per_word_after"] == pytest.approx(float(lines[0][2]), abs=1e-3)


@pytest.mark.trains
def test_a_run_with_an_extended_vocabulary_resumes_exactly(extended_runs):
    expected, got = (load_file(extended_runs[name] / "model.safetensors") for name in ("run", "resumed"))
    assert expected["albert.embeddings.word_embeddings.weight"].shape[0] == 1040
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6, msg=name)
    assert [row["step"] for row in metrics(extended_runs["run"]) if "eval_mlm_loss" in row] == [0, 3, 6]


@pytest.mark.trains
def test_the_extended_folder_loads_without_albert_hf_and_fine_tunes_with_run_glue_and_run_squad(
    extended_runs, glue_root, tmp_path
):
    folder = extended_runs["run"]
    done = run_python(
        "from transformers import AutoModel, AutoTokenizer\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)\n"
        f"model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)\n"
        "ids = tokenizer('Tuberculosis treated with streptomycin.', return_tensors='pt')\n"
        "print('PIECES', tokenizer.convert_ids_to_tokens(ids['input_ids'][0]))\n"
        "print('SHAPE', len(tokenizer), tuple(model(**ids).last_hidden_state.shape))\n",
        cwd=folder.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'▁tuberculosis'" in done.stdout and "'▁streptomycin'" in done.stdout
    assert "SHAPE 1040 (1, " in done.stdout
    run_glue(
        glue_args(
            folder,
            tmp_path / "mrpc",
            "--task_name",
            "mrpc",
            "--data_dir",
            glue_root,
            "--do_train",
            "--do_eval",
            "--max_steps",
            2,
        )
    )
    results = json.loads((tmp_path / "mrpc" / "eval_results.json").read_text())
    assert 0 <= results["eval_accuracy"] <= 1
    squad = write_json(tmp_path / "train-v1.1.json", SQUAD_V1)
    run_squad(
        [
            "--train_file",
            squad,
            "--validation_file",
            squad,
            "--do_train",
            "--do_eval",
            *squad_args(folder, tmp_path / "squad", steps=2),
        ]
    )
    results = json.loads((tmp_path / "squad" / "eval_results.json").read_text())
    assert 0 <= results["eval_f1"] <= 100


@pytest.mark.quick
@pytest.mark.parametrize(
    "extra, line",
    [
        (["--extend_vocabulary", "0"], "--extend_vocabulary 0: give the number of pieces to add (1 or more)"),
        (["--extend_vocabulary", "-5"], "--extend_vocabulary -5: give the number of pieces to add (1 or more)"),
        (
            ["--extend_vocabulary_from", "clinic"],
            "--extend_vocabulary_from names the source --extend_vocabulary learns "
            "from: pass --extend_vocabulary N too, or drop it",
        ),
        (
            ["--extend_vocabulary", "8", "--prepared_data", "PREPARED"],
            "--extend_vocabulary with --prepared_data: "
            "prepared pairs are tokenized once, before training; extend the vocabulary in a run that reads its corpus",
        ),
        (
            ["--extend_vocabulary", "8", "--preprocess_only"],
            "--extend_vocabulary with --preprocess_only: prepared pairs "
            "are tokenized once, before training; extend the vocabulary in a run that reads its corpus",
        ),
        (
            [
                "--extend_vocabulary",
                "8",
                "--sources",
                "name=a,weight=1,train_files=CORPUS",
                "name=b,weight=1,train_files=CORPUS",
            ],
            "--extend_vocabulary with 2 sources: name the domain to learn the pieces from with "
            "--extend_vocabulary_from "
            "(one of a, b)",
        ),
        (
            [
                "--extend_vocabulary",
                "8",
                "--extend_vocabulary_from",
                "c",
                "--sources",
                "name=a,weight=1,train_files=CORPUS",
                "name=b,weight=1,train_files=CORPUS",
            ],
            "--extend_vocabulary_from c: no such source (the sources: a, b)",
        ),
        (
            ["--extend_vocabulary", "8", "--extend_vocabulary_from", "c", "--train_files", "CORPUS"],
            "--extend_vocabulary_from c: no such source (this run reads one corpus)",
        ),
        (
            [
                "--extend_vocabulary",
                "8",
                "--sources",
                "name=a,weight=1,train_files=CORPUS",
                "name=b,weight=1,prepared_data=PREPARED",
                "--extend_vocabulary_from",
                "b",
            ],
            "--extend_vocabulary: source b is a prepared folder, its pairs tokenized already; learn the pieces from a "
            "source "
            "of text",
        ),
    ],
)
def test_each_wrong_request_stops_in_one_line(extra, line, tiny_checkpoint, domain, tmp_path):
    from albert_hf.pretraining import job
    from albert_hf.pretraining.data import prepared_data

    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / prepared_data.MANIFEST).write_text(
        json.dumps(
            {
                "format_version": prepared_data.FORMAT_VERSION,
                "pairs_version": prepared_data.PAIRS_VERSION,
                "arguments": {
                    "max_seq_length": 64,
                    "short_seq_prob": 0.1,
                    "dupe_factor": 1,
                    "task": "sop",
                    "layout": "document_per_file",
                    "validation_split_percentage": 5,
                    "max_eval_samples": 64,
                },
            }
        )
    )
    extra = [a.replace("CORPUS", str(domain["corpus"])).replace("PREPARED", str(prepared)) for a in extra]
    with pytest.raises(InputError) as raised:
        job.parse_args(["--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tiny_checkpoint), *extra])
    assert str(raised.value) == line


@pytest.mark.quick
def test_extending_needs_a_loaded_model_tied_to_its_rows_and_a_unigram_tokenizer(tiny_checkpoint, extended, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from albert_hf.pretraining import job
    from albert_hf.pretraining.data.vocabulary import base_model_proto
    from albert_hf.pretraining.training.model import extend_embeddings

    with pytest.raises(
        InputError,
        match=r"^--extend_vocabulary extends a loaded model's vocabulary: pass "
        r"--model_name_or_path \(a new model's tokenizer is trained",
    ):
        job.parse_args(["--output_dir", str(tmp_path / "out"), "--extend_vocabulary", "8"])
    extension = extended["extension"]
    untied = AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", vocab_size=1000, tie_word_embeddings=False))
    with pytest.raises(
        InputError, match="^--extend_vocabulary: SRC has an MLM decoder not tied to its word embeddings"
    ):
        extend_embeddings(untied, extension, "SRC")
    padded = AlbertHFForPreTraining(AlbertHFConfig.from_preset("tiny", vocab_size=1008))
    with pytest.raises(
        InputError, match="^--extend_vocabulary: SRC has 1,008 embedding rows and its tokenizer 1,000 pieces"
    ):
        extend_embeddings(padded, extension, "SRC")
    bpe = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[])))
    with pytest.raises(
        InputError,
        match="^--extend_vocabulary adds SentencePiece unigram pieces, and the tokenizer of this run is a BPE one$",
    ):
        base_model_proto(bpe, "the domain")
