"""transformers' ALBERT checkpoints load into albert_hf (and back) with identical outputs in fp32."""

import json
import subprocess
import sys

import pytest
import torch
import transformers
from transformers import AlbertConfig

import albert_hf
from albert_hf.convert import convert
from albert_hf.errors import InputError
from helpers import REPO, run_python

ATOL = 1e-5


def hf_config(layers=4, groups=1, inner=1, **kwargs):
    return AlbertConfig(
        vocab_size=120,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=layers,
        num_hidden_groups=groups,
        inner_group_num=inner,
        num_attention_heads=4,
        intermediate_size=48,
        max_position_embeddings=64,
        **kwargs,
    )


def inputs(batch=3, length=20):
    input_ids = torch.randint(0, 120, (batch, length))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 14:] = 0
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 9:] = 1
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


BATCH = inputs()
REAL = BATCH["attention_mask"].bool()


def at_real_tokens(tensor):
    """Per-position outputs at the real tokens. albert_hf skips the padding by default (`unpad_inputs`), so its
    padded positions hold zeros where transformers has values that nothing should read."""
    return tensor[REAL] if tensor.dim() >= 2 and tensor.shape[:2] == REAL.shape else tensor


def save_theirs(model_class, config, path):
    model = getattr(transformers, model_class)(config).eval()
    # transformers initialises the MLM bias with zeros; give it values so that the bias path is compared too
    if hasattr(model, "predictions"):
        with torch.no_grad():
            model.predictions.bias.normal_()
    model.save_pretrained(path)
    return model


@pytest.mark.parametrize("layers, groups, inner", [(4, 1, 1), (4, 2, 1), (4, 2, 2), (6, 3, 1), (3, 3, 1), (5, 2, 2)])
def test_pretraining_checkpoint_gives_identical_outputs(tmp_path, layers, groups, inner):
    theirs = save_theirs("AlbertForPreTraining", hf_config(layers, groups, inner), tmp_path)
    ours = albert_hf.AlbertHFForPreTraining.from_pretrained(tmp_path).eval()
    assert ours.config.model_type == "albert_hf"
    batch = inputs()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 2::4] = batch["input_ids"][:, 2::4]
    labels[~batch["attention_mask"].bool()] = -100  # nothing is predicted at padding
    order = torch.tensor([1, 0, 1])
    with torch.no_grad():
        a = theirs(**batch, labels=labels, sentence_order_label=order, output_hidden_states=True)
        b_full = ours(**batch, output_hidden_states=True)
        b = ours(**batch, labels=labels, sentence_order_label=order)
    assert len(a.hidden_states) == len(b_full.hidden_states) == 1 + layers * inner
    for x, y in zip(a.hidden_states, b_full.hidden_states):
        torch.testing.assert_close(y, x, rtol=0, atol=ATOL)
    torch.testing.assert_close(b_full.prediction_logits, a.prediction_logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(b.prediction_logits, a.prediction_logits[labels != -100], rtol=0, atol=ATOL)
    torch.testing.assert_close(b.sop_logits, a.sop_logits, rtol=0, atol=ATOL)
    torch.testing.assert_close(b.loss, a.loss, rtol=0, atol=ATOL)


@pytest.mark.parametrize("layers, groups, inner", [(4, 1, 1), (4, 2, 2)])
def test_base_model_gives_identical_hidden_states_and_pooled_output(tmp_path, layers, groups, inner):
    theirs = save_theirs("AlbertModel", hf_config(layers, groups, inner), tmp_path)
    ours = albert_hf.AlbertHFModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        a, b = theirs(**BATCH), ours(**BATCH)
    torch.testing.assert_close(
        at_real_tokens(b.last_hidden_state), at_real_tokens(a.last_hidden_state), rtol=0, atol=ATOL
    )
    torch.testing.assert_close(b.pooler_output, a.pooler_output, rtol=0, atol=ATOL)


@pytest.mark.parametrize(
    "head, output",
    [
        ("ForMaskedLM", "logits"),
        ("ForSequenceClassification", "logits"),
        ("ForTokenClassification", "logits"),
        ("ForQuestionAnswering", "start_logits"),
        ("ForQuestionAnswering", "end_logits"),
    ],
)
def test_task_heads_load_with_identical_outputs(tmp_path, head, output):
    labels = {} if head == "ForQuestionAnswering" else dict(num_labels=3)  # a QA head always has 2 outputs
    theirs = save_theirs("Albert" + head, hf_config(**labels), tmp_path)
    ours = getattr(albert_hf, "AlbertHF" + head).from_pretrained(tmp_path).eval()
    exact = getattr(albert_hf, "AlbertHF" + head).from_pretrained(tmp_path, unpad_inputs=False).eval()
    with torch.no_grad():
        expected = getattr(theirs(**BATCH), output)
        actual = getattr(ours(**BATCH), output)
        torch.testing.assert_close(at_real_tokens(actual), at_real_tokens(expected), rtol=0, atol=ATOL)
        # without padding removal, every position (padding included) equals transformers'
        torch.testing.assert_close(getattr(exact(**BATCH), output), expected, rtol=0, atol=ATOL)


def test_multiple_choice_head_loads_with_identical_outputs(tmp_path):
    theirs = save_theirs("AlbertForMultipleChoice", hf_config(), tmp_path)
    ours = albert_hf.AlbertHFForMultipleChoice.from_pretrained(tmp_path).eval()
    choices = {k: v.unsqueeze(0) for k, v in BATCH.items()}
    with torch.no_grad():
        torch.testing.assert_close(ours(**choices).logits, theirs(**choices).logits, rtol=0, atol=ATOL)


def test_base_model_loads_from_a_pretraining_checkpoint(tmp_path):
    theirs = save_theirs("AlbertForPreTraining", hf_config(), tmp_path)
    ours = albert_hf.AlbertHFModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**BATCH).pooler_output, theirs.albert(**BATCH).pooler_output, rtol=0, atol=ATOL)


def test_num_labels_override_applies_to_a_transformers_checkpoint(tmp_path):
    save_theirs("AlbertForPreTraining", hf_config(), tmp_path)
    model = albert_hf.AlbertHFForSequenceClassification.from_pretrained(tmp_path, num_labels=5)
    assert model.classifier.out_features == 5


def test_v1_gelu_checkpoint_keeps_its_activation(tmp_path):
    theirs = save_theirs("AlbertModel", hf_config(hidden_act="gelu"), tmp_path)
    ours = albert_hf.AlbertHFModel.from_pretrained(tmp_path).eval()
    assert ours.config.hidden_act == "gelu"
    with torch.no_grad():
        torch.testing.assert_close(
            at_real_tokens(ours(**BATCH).last_hidden_state),
            at_real_tokens(theirs(**BATCH).last_hidden_state),
            rtol=0,
            atol=ATOL,
        )


def test_convert_cli_round_trip(tmp_path):
    theirs = save_theirs("AlbertForPreTraining", hf_config(groups=2), tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer_config.json").write_text("{}")
    run = [sys.executable, "-m", "albert_hf.convert"]
    done = subprocess.run(run + [str(tmp_path / "hf"), str(tmp_path / "ours")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["format"] == "albert_hf"
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["model_type"] == "albert_hf" and saved["architectures"] == ["AlbertHFForPreTraining"]
    assert (tmp_path / "ours" / "modeling_albert_hf.py").is_file()
    assert (tmp_path / "ours" / "tokenizer_config.json").is_file()

    done = subprocess.run(run + [str(tmp_path / "ours"), str(tmp_path / "back")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    back = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(**BATCH).prediction_logits, theirs(**BATCH).prediction_logits)


def test_convert_refuses_partial_sharing_and_non_empty_output(tmp_path):
    model = albert_hf.AlbertHFForPreTraining(albert_hf.AlbertHFConfig.from_preset("tiny", sharing="attention"))
    model.save_pretrained(tmp_path / "ours")
    with pytest.raises(
        InputError,
        match="ours: sharing='attention' has no transformers AlbertConfig equivalent; it stays an albert_hf checkpoint",
    ):
        convert(str(tmp_path / "ours"), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # refused before anything is written
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "albert_hf.convert",
            str(tmp_path / "ours"),
            str(tmp_path / "out2"),
            "--to",
            "transformers",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr and not (tmp_path / "out2").exists()
    assert done.stderr.strip().splitlines()[-1].startswith("error: ") and "sharing='attention'" in done.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(InputError, match="not empty"):
        convert(str(tmp_path / "ours"), str(tmp_path / "full"))


def test_a_converted_folder_loads_its_tokenizer_without_a_prompt(tmp_path):
    """A transformers ALBERT checkpoint with its tokenizer, converted to albert_hf: the tokenizer comes along and
    loads as the card says, in a fresh process without albert_hf."""
    from data_fixtures import tokenizer
    from helpers import check_tokenizer_loads_without_prompt

    tok = tokenizer()
    config = hf_config()
    config.vocab_size = len(tok)
    save_theirs("AlbertForMaskedLM", config, tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    done = subprocess.run(
        [sys.executable, "-m", "albert_hf.convert", str(tmp_path / "hf"), str(tmp_path / "ours")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    check_tokenizer_loads_without_prompt(tmp_path / "ours")


SAVED_BEFORE_LAYOUT = REPO / "tests" / "fixtures" / "saved_before_layout"


def test_a_folder_saved_before_the_subpackages_loads_with_albert_hf(tmp_path):
    """A folder saved by an earlier albert_hf (SAVED_BEFORE_LAYOUT, with its own copy of the remote code and the
    outputs it gave) loads through the Auto classes of this one and gives those outputs."""
    import shutil

    from transformers import AutoModelForPreTraining

    expected = json.loads((SAVED_BEFORE_LAYOUT / "expected_outputs.json").read_text())
    folder = shutil.copytree(SAVED_BEFORE_LAYOUT, tmp_path / "saved")  # a copy: loading may write a lock or cache
    model = AutoModelForPreTraining.from_pretrained(folder).eval()
    assert type(model) is albert_hf.AlbertHFForPreTraining
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(expected["input_ids"]), token_type_ids=torch.tensor(expected["token_type_ids"])
        )
    assert out.prediction_logits[0, 1, :8].tolist() == pytest.approx(expected["mlm_logits_first_row"], abs=1e-5)
    assert out.sop_logits[0].tolist() == pytest.approx(expected["sop_logits"], abs=1e-5)


def test_a_folder_saved_before_the_subpackages_loads_without_albert_hf(tmp_path):
    """The same folder in a fresh process where albert_hf cannot be imported: its own remote code serves it."""
    import shutil

    folder = shutil.copytree(SAVED_BEFORE_LAYOUT, tmp_path / "saved")
    code = (
        "import json, torch\n"
        "from transformers import AutoModelForPreTraining\n"
        f"folder = {str(folder)!r}\n"
        "expected = json.load(open(folder + '/expected_outputs.json'))\n"
        "model = AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True).eval()\n"
        "with torch.no_grad():\n"
        "    out = model(input_ids=torch.tensor(expected['input_ids']), "
        "token_type_ids=torch.tensor(expected['token_type_ids']))\n"
        "got = out.prediction_logits[0, 1, :8].tolist() + out.sop_logits[0].tolist()\n"
        "want = expected['mlm_logits_first_row'] + expected['sop_logits']\n"
        "print('MODULE', type(model).__module__)\n"
        "print('MAXDIFF', max(abs(a - b) for a, b in zip(got, want)))\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if line.startswith(("MODULE", "MAXDIFF")))
    assert not lines["MODULE"].startswith("albert_hf"), lines  # the folder's copy of the code, not the package
    assert float(lines["MAXDIFF"]) < 1e-5
