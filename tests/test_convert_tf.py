"""`python -m albert_hf.convert --from_tf`: official TensorFlow ALBERT checkpoints, read without TensorFlow.

The fixtures under tests/fixtures/tf_albert/ were written by TensorFlow itself (make_tf_checkpoints.py, the only
place that needs tensorflow-cpu) with the official variable names. Each parity test computes the official forward
pass in numpy, in float64, from the fixture's weights.npz (the same arrays, stored by numpy, not read through the
code under test), and compares the converted model with it.
"""

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from albert_hf import (
    AlbertHFForMultipleChoice,
    AlbertHFForPreTraining,
    AlbertHFForQuestionAnswering,
    AlbertHFForQuestionAnsweringWithAnswerability,
    AlbertHFForSequenceClassification,
)
from albert_hf.convert import from_tf_checkpoint, main
from albert_hf.convert.tf_checkpoint import TFCheckpoint, TFCheckpointError, crc32c
from albert_hf.runtime.cli import run_entry_point
from helpers import run_python

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tf_albert"
ATOL = 1e-5
INPUT_IDS = np.array([[2, 17, 33, 9, 41, 5, 3, 0], [2, 60, 12, 3, 28, 51, 7, 3]])
TOKEN_TYPES = np.array([[0, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]])
MASK = np.array([[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
REAL = MASK.astype(bool)


def weights(*folders: str) -> dict:
    arrays = {}
    for folder in folders:
        with np.load(FIXTURES / folder / "weights.npz") as stored:
            arrays.update({name: stored[name].astype(np.float64) for name in stored.files})
    return arrays


def fixture_config(folder: str) -> dict:
    return json.loads((FIXTURES / folder / "albert_config.json").read_text())


# ------------------------------------------------------------------------------------------------------------------
# The official forward pass (google-research/albert modeling.py semantics), written out in numpy


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def layer_norm(x, w, scope):
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + 1e-12) * w[f"{scope}/gamma"] + w[f"{scope}/beta"]


def dense(x, w, scope):
    return x @ w[f"{scope}/kernel"] + w[f"{scope}/bias"]


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def official_block(h, w, scope, heads, mask):
    batch, length, hidden = h.shape
    size = hidden // heads

    def split(x):
        return x.reshape(batch, length, heads, size).transpose(0, 2, 1, 3)

    q, k, v = (split(dense(h, w, f"{scope}/attention_1/self/{part}")) for part in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(size) + (1.0 - mask[:, None, None, :]) * -10000.0
    context = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
    attention = layer_norm(dense(context, w, f"{scope}/attention_1/output/dense") + h, w, f"{scope}/LayerNorm")
    ffn = gelu_tanh(dense(attention, w, f"{scope}/ffn_1/intermediate/dense"))
    ffn = dense(ffn, w, f"{scope}/ffn_1/intermediate/output/dense")
    return layer_norm(ffn + attention, w, f"{scope}/LayerNorm_1")


def official_forward(w, config, input_ids=INPUT_IDS, token_types=TOKEN_TYPES, mask=MASK):
    """(sequence output, pooled output, MLM logits or None, SOP logits or None)."""
    length = input_ids.shape[1]
    embedded = (
        w["bert/embeddings/word_embeddings"][input_ids]
        + w["bert/embeddings/position_embeddings"][:length]
        + w["bert/embeddings/token_type_embeddings"][token_types]
    )
    h = dense(layer_norm(embedded, w, "bert/embeddings/LayerNorm"), w, "bert/encoder/embedding_hidden_mapping_in")
    layers, groups = config["num_hidden_layers"], config["num_hidden_groups"]
    for layer in range(layers):
        group = int(layer / layers * groups)
        for inner in range(config["inner_group_num"]):
            scope = f"bert/encoder/transformer/group_{group}/inner_group_{inner}"
            h = official_block(h, w, scope, config["num_attention_heads"], mask.astype(np.float64))
    pooled = np.tanh(dense(h[:, 0], w, "bert/pooler/dense"))
    mlm = sop = None
    if "cls/predictions/output_bias" in w:
        transformed = layer_norm(
            gelu_tanh(dense(h, w, "cls/predictions/transform/dense")), w, "cls/predictions/transform/LayerNorm"
        )
        mlm = transformed @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]
        sop = pooled @ w["cls/seq_relationship/output_weights"].T + w["cls/seq_relationship/output_bias"]
    return h, pooled, mlm, sop


def torch_inputs(mask=MASK):
    return dict(
        input_ids=torch.tensor(INPUT_IDS), token_type_ids=torch.tensor(TOKEN_TYPES), attention_mask=torch.tensor(mask)
    )


def assert_close(actual: torch.Tensor, expected: np.ndarray):
    np.testing.assert_allclose(actual.detach().double().numpy(), expected, rtol=0, atol=ATOL)


# ------------------------------------------------------------------------------------------------------------------
# The reader


def test_crc32c_matches_the_standard_check_value_and_the_bytewise_loop():
    """CRC32C's published check value, and the chunked numpy path agreeing with a plain bytewise loop."""
    assert crc32c(b"123456789") == 0xE3069283
    data = np.random.default_rng(0).integers(0, 256, 70_001, dtype=np.uint8).tobytes()
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    assert crc32c(data) == crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("folder", ["all_shared", "two_groups"])
def test_reader_returns_the_arrays_tensorflow_saved(folder):
    reader = TFCheckpoint(FIXTURES / folder)
    stored = weights(folder)
    for name, array in stored.items():
        value = reader.read(name)
        assert value.dtype == np.float32 and value.shape == array.shape, name
        np.testing.assert_array_equal(value, array.astype(np.float32), err_msg=name)
    if folder == "all_shared":  # a training checkpoint: also the step counter and Adam's slots
        assert reader.read("global_step").item() == 1234
        assert sum(name.endswith(("/adam_m", "/adam_v")) for name in reader.names()) == 2 * len(stored)


# ------------------------------------------------------------------------------------------------------------------
# Conversion: outputs equal the official forward pass


@pytest.mark.parametrize("folder", ["all_shared", "two_groups"])
def test_pretraining_checkpoint_converts_to_the_official_outputs(tmp_path, folder):
    """all_shared also carries global_step and Adam slots: they are skipped, not loaded and not an error."""
    model = from_tf_checkpoint(FIXTURES / folder, tmp_path / "out")
    assert type(model) is AlbertHFForPreTraining
    assert model.config.hidden_act == "gelu_new"  # the official "gelu" is the tanh approximation
    loaded = AlbertHFForPreTraining.from_pretrained(tmp_path / "out").eval()
    hidden, _, mlm, sop = official_forward(weights(folder), fixture_config(folder))
    with torch.no_grad():
        out = loaded(**torch_inputs(), output_hidden_states=True)
    assert_close(out.hidden_states[-1][REAL], hidden[REAL])
    assert_close(out.prediction_logits[REAL], mlm[REAL])
    assert_close(out.sop_logits, sop)


def test_converted_folder_loads_in_a_fresh_process_without_albert_hf(tmp_path):
    """AutoModel / AutoTokenizer with trust_remote_code, from the folder alone; the tokenizer is the spm model's."""
    import sentencepiece as spm

    from_tf_checkpoint(FIXTURES / "all_shared", tmp_path / "out")
    text = "the model reads a checkpoint without tensorflow"
    code = (
        "import json, torch\n"
        "from transformers import AutoModelForPreTraining, AutoTokenizer\n"
        f"folder = {str(tmp_path / 'out')!r}\n"
        "model = AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True).eval()\n"
        "tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)\n"
        f"ids = {INPUT_IDS[1].tolist()}\n"
        f"types = {TOKEN_TYPES[1].tolist()}\n"
        "with torch.no_grad():\n"
        "    out = model(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]))\n"
        "print('RESULT', json.dumps({'class': type(model).__name__, 'sop': out.sop_logits[0].tolist(),\n"
        f"    'pieces': tokenizer({text!r}, add_special_tokens=False)['input_ids'], 'size': len(tokenizer)}}))\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ")[1])
    assert result["class"] == "AlbertHFForPreTraining"
    _, _, _, sop = official_forward(
        weights("all_shared"), fixture_config("all_shared"), INPUT_IDS[1:], TOKEN_TYPES[1:], MASK[1:]
    )  # the second row alone, which has no padding
    np.testing.assert_allclose(result["sop"], sop[0], rtol=0, atol=ATOL)
    processor = spm.SentencePieceProcessor(model_file=str(FIXTURES / "all_shared" / "30k-clean.model"))
    assert result["pieces"] == processor.encode(text) and result["size"] == 64


def test_classifier_head(tmp_path):
    model = from_tf_checkpoint(FIXTURES / "classifier", tmp_path / "out")
    assert type(model) is AlbertHFForSequenceClassification and model.config.num_labels == 3
    w = weights("all_shared", "classifier")
    _, pooled, _, _ = official_forward(w, fixture_config("classifier"))
    with torch.no_grad():
        logits = AlbertHFForSequenceClassification.from_pretrained(tmp_path / "out").eval()(**torch_inputs()).logits
    assert_close(logits, pooled @ w["output_weights"].T + w["output_bias"])


def test_squad_v1_head(tmp_path):
    """The official SQuAD graph builds the pooler without using it: dropped, the span head converted."""
    model = from_tf_checkpoint(FIXTURES / "squad_v1", tmp_path / "out")
    assert type(model) is AlbertHFForQuestionAnswering
    w = weights("all_shared", "squad_v1")
    hidden, _, _, _ = official_forward(w, fixture_config("squad_v1"))
    logits = hidden @ w["cls/squad/output_weights"].T + w["cls/squad/output_bias"]
    with torch.no_grad():
        out = AlbertHFForQuestionAnswering.from_pretrained(tmp_path / "out").eval()(**torch_inputs())
    assert_close(out.start_logits[REAL], logits[..., 0][REAL])
    assert_close(out.end_logits[REAL], logits[..., 1][REAL])


def test_squad_v2_head(tmp_path):
    model = from_tf_checkpoint(FIXTURES / "squad_v2", tmp_path / "out")
    assert type(model) is AlbertHFForQuestionAnsweringWithAnswerability
    w = weights("all_shared", "squad_v2")
    no_padding = np.ones_like(MASK)  # every position is a candidate, as with p_mask = 0
    hidden, _, _, _ = official_forward(w, fixture_config("squad_v2"), mask=no_padding)
    inputs = torch_inputs(no_padding)
    start_logits = dense(hidden, w, "start_logits/dense")[..., 0]
    start_probs = softmax(start_logits)
    start_feature = np.einsum("blh,bl->bh", hidden, start_probs)
    answer = np.tanh(dense(np.concatenate([start_feature, hidden[:, 0]], -1), w, "answer_class/dense_0"))
    cls_logits = (answer @ w["answer_class/dense_1/kernel"])[:, 0]
    start = 3  # the end head, given a start: official end_logits scope
    joined = np.concatenate([hidden, np.repeat(hidden[:, start : start + 1], hidden.shape[1], 1)], -1)
    end = layer_norm(np.tanh(dense(joined, w, "end_logits/dense_0")), w, "end_logits/LayerNorm")
    end_logits = dense(end, w, "end_logits/dense_1")[..., 0]
    converted = AlbertHFForQuestionAnsweringWithAnswerability.from_pretrained(tmp_path / "out").eval()
    with torch.no_grad():
        out = converted(**inputs, start_positions=torch.tensor([start, start]))
    assert_close(out.cls_logits, cls_logits)
    assert_close(out.start_log_probs, np.log(start_probs))
    assert_close(out.end_log_probs, np.log(softmax(end_logits)))


def test_race_head_needs_the_head_named_then_converts(tmp_path):
    """A one-row output_weights is RACE's head or a regression classifier: the names alone do not say which."""
    with pytest.raises(ValueError, match="output_weights has one row.*--tf_head"):
        from_tf_checkpoint(FIXTURES / "race", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    model = from_tf_checkpoint(FIXTURES / "race", tmp_path / "out", tf_head="multiple_choice")
    assert type(model) is AlbertHFForMultipleChoice
    w = weights("all_shared", "race")
    _, pooled, _, _ = official_forward(w, fixture_config("race"))  # the two rows are the two choices of one question
    with torch.no_grad():
        converted = AlbertHFForMultipleChoice.from_pretrained(tmp_path / "out").eval()
        logits = converted(**{name: value[None] for name, value in torch_inputs().items()}).logits
    assert_close(logits, (pooled @ w["output_weights"].T + w["output_bias"]).reshape(1, 2))
    regression = from_tf_checkpoint(FIXTURES / "race", tmp_path / "regression", tf_head="regression")
    assert regression.config.num_labels == 1 and regression.config.problem_type == "regression"


# ------------------------------------------------------------------------------------------------------------------
# Refusals, each one line


def cli_error(*argv) -> str:
    """What `python -m albert_hf.convert ARGV` prints on stderr, checked to be one `error:` line with status 2."""
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as stopped, contextlib.redirect_stderr(stderr):
        run_entry_point(lambda: main([str(arg) for arg in argv]))
    assert stopped.value.code == 2
    message = stderr.getvalue()
    assert message.startswith("error: ") and message.count("\n") == 1, message
    return message.rstrip("\n")


def test_unknown_and_missing_variables_are_named_and_stop(tmp_path):
    message = cli_error("--from_tf", FIXTURES / "unknown_and_missing", tmp_path / "out")
    assert "bert/encoder/transformer/group_0/inner_group_0/attention_1/relative_bias" in message
    missing = "bert/encoder/transformer/group_0/inner_group_0/LayerNorm_1/beta"
    assert f"missing variables that AlbertHFModel needs: {missing}" in message
    assert not (tmp_path / "out").exists()


def test_albert_zh_original_layout_is_refused(tmp_path):
    message = cli_error("--from_tf", FIXTURES / "albert_zh_original", tmp_path / "out")
    assert "albert_zh" in message and "word_embeddings_2" in message and "layer_shared" in message
    assert "bias-free E->H projection of the word embedding" in message
    assert not (tmp_path / "out").exists()


def damaged_copy(tmp_path, damage) -> Path:
    folder = tmp_path / "damaged"
    shutil.copytree(FIXTURES / "all_shared", folder)
    damage(folder / "model.ckpt-best.data-00000-of-00001", folder / "model.ckpt-best.index")
    return folder


def test_truncated_shard_is_a_clear_error(tmp_path):
    def truncate(data, index):
        data.write_bytes(data.read_bytes()[:5000])

    folder = damaged_copy(tmp_path, truncate)
    with pytest.raises(TFCheckpointError, match=r"data-00000-of-00001: truncated: \S+ needs bytes .* has 5000 bytes"):
        from_tf_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert "truncated" in cli_error("--from_tf", folder, tmp_path / "out")


def test_corrupted_shard_and_index_are_clear_errors(tmp_path):
    def flip(data, index):
        raw = bytearray(data.read_bytes())
        raw[100] ^= 0xFF
        data.write_bytes(bytes(raw))
        index.with_name("cut.index").write_bytes(index.read_bytes()[:-10])
        index.with_name("cut.data-00000-of-00001").write_bytes(data.read_bytes())

    folder = damaged_copy(tmp_path, flip)
    with pytest.raises(TFCheckpointError, match="corrupted: the bytes of .* do not match their checksum"):
        from_tf_checkpoint(folder / "model.ckpt-best", tmp_path / "out")
    message = cli_error("--from_tf", folder / "cut", tmp_path / "out")
    assert "cut.index: not a TensorFlow checkpoint index" in message


def test_bad_paths_name_the_flag(tmp_path):
    assert cli_error("--from_tf", tmp_path / "nothing", tmp_path / "out").startswith(f"error: --from_tf {tmp_path}")
    assert cli_error(
        "--from_tf", FIXTURES / "two_groups", tmp_path / "out", "--config", tmp_path / "none.json"
    ).startswith("error: --config ")
    assert cli_error(
        "--from_tf", FIXTURES / "two_groups", tmp_path / "out", "--spm_model", tmp_path / "none.model"
    ).startswith("error: --spm_model ")
    bare = tmp_path / "bare"
    shutil.copytree(FIXTURES / "two_groups", bare)
    (bare / "albert_config.json").unlink()
    assert cli_error("--from_tf", bare, tmp_path / "out").startswith("error: --config: no albert_config.json")


def test_config_that_does_not_fit_the_weights_is_named_with_both_shapes(tmp_path):
    config = fixture_config("two_groups") | {"intermediate_size": 12}
    (tmp_path / "wrong.json").write_text(json.dumps(config))
    message = cli_error("--from_tf", FIXTURES / "two_groups", tmp_path / "out", "--config", tmp_path / "wrong.json")
    assert "shapes that do not fit wrong.json: " in message
    assert (
        "bert/encoder/transformer/group_0/inner_group_0/ffn_1/intermediate/dense/kernel [8, 16] (expected [8, 12])"
        in message
    )


def test_albert_zh_google_zh_vocab_txt_becomes_a_bert_tokenizer(tmp_path):
    """albert_zh's *_google_zh releases use Google's names (they convert as above) with BERT's vocab.txt: the
    folder gets the BERT tokenizer albert_zh documents, one piece per Chinese character, lower-cased."""
    source = tmp_path / "albert_zh_google"
    shutil.copytree(FIXTURES / "all_shared", source)
    (source / "30k-clean.model").unlink()
    chars = ["我", "们", "读", "取", "模", "型", "中", "文"]
    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, "hello"]
    pieces += [f"[unused{i}]" for i in range(64 - len(pieces))]
    (source / "vocab.txt").write_text("\n".join(pieces) + "\n", encoding="utf-8")
    from_tf_checkpoint(source, tmp_path / "out")
    code = (
        "import json\n"
        "from transformers import AutoTokenizer\n"
        f"tokenizer = AutoTokenizer.from_pretrained({str(tmp_path / 'out')!r}, trust_remote_code=True)\n"
        "encoded = tokenizer('我们读取中文模型 HELLO')\n"
        "print('RESULT', json.dumps({'ids': encoded['input_ids'], 'types': encoded['token_type_ids'],\n"
        "                            'size': len(tokenizer)}))\n"
    )
    done = run_python(code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ")[1])
    assert result["ids"] == [2, 5, 6, 7, 8, 11, 12, 9, 10, 13, 3]  # [CLS] 我 们 读 取 中 文 模 型 hello [SEP]
    assert result["types"] == [0] * 11 and result["size"] == 64
    (source / "vocab.txt").write_text("\n".join(pieces[:40]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="vocab.txt: 40 pieces, but the config's vocab_size is 64"):
        from_tf_checkpoint(source, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()
