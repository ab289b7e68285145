"""Parameter counts (albert_hf.analysis.params) against ALBERT_SPEC.md section 2, the spec's formulas and transformers.

The counts in the spec were computed independently of this code, so they are valid expected values.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AlbertForPreTraining, AlbertModel, BertConfig, BertModel

from albert_hf import AlbertHFConfig
from albert_hf.analysis.params import (
    LAYER_GROUPS,
    TABLES,
    component_sizes,
    count_parameters,
    layer_group_counts,
    paper_string,
)

ROWS = {row.label: row for table in TABLES.values() for row in table}


def formula(V=30000, E=128, H=768, L=12, I=3072, G=1, K=1, sharing="all", project=None, pooler=True, heads=False):  # noqa: E741, E501 - the paper's symbols
    """The spec's per-component formulas (section 2.1), as an independent check on the built modules."""
    embeddings = V * E + 512 * E + 2 * E + 2 * E
    projection = E * H + H if (E != H if project is None else project) else 0
    attention = 4 * (H * H + H) + 2 * H
    ffn = 2 * H * I + I + H + 2 * H
    blocks = {"all": (G * K, G * K), "attention": (1, L), "ffn": (L, 1), "none": (L, L)}[sharing]
    total = embeddings + projection + blocks[0] * attention + blocks[1] * ffn
    total += (H * H + H) if pooler else 0
    total += (H * E + E + 2 * E + V) + (2 * H + 2) if heads else 0  # MLM head (decoder tied) + SOP head
    return total


# Spec section 2.2: backbone incl. pooler, + MLM/SOP heads, not shared (E=128), BERT-style (E=H, not shared).
RELEASED = {
    "base": (11_683_584, 11_813_810, 89_650_176, 109_081_344),
    "large": (17_683_968, 17_847_474, 307_397_120, 334_607_360),
    "xlarge": (58_724_864, 59_021_490, 1_216_965_120, 1_275_291_648),
    "xxlarge": (222_595_584, 223_158_450, 2_437_773_824, 2_558_332_928),
}


@pytest.mark.parametrize("preset", RELEASED)
def test_released_configs(preset):
    backbone, with_heads, not_shared, bert_style = RELEASED[preset]
    config = AlbertHFConfig.from_preset(preset)
    assert count_parameters(config) == backbone
    assert count_parameters(config, heads=True) == with_heads
    assert count_parameters(AlbertHFConfig.from_preset(preset, sharing="none")) == not_shared
    hidden = config.hidden_size
    bert = AlbertHFConfig.from_preset(preset, sharing="none", embedding_size=hidden, project_when_equal=False)
    assert count_parameters(bert) == bert_style
    # transformers' always-on projection adds exactly one H->H dense layer.
    bert.project_when_equal = True
    assert count_parameters(bert) == bert_style + hidden * hidden + hidden


def test_base_components():
    # Spec section 2.1, ALBERT-base breakdown.
    assert component_sizes(AlbertHFConfig.from_preset("base")) == {
        "embeddings": 3_906_048,
        "E->H projection": 99_072,
        "attention block": 2_363_904,
        "FFN block": 4_723_968,
        "pooler": 590_592,
        "MLM head": 128_688,
        "SOP head": 1_538,
    }


def test_layer_groups():
    counts = {(g, k): n for g, k, n in layer_group_counts()}
    assert list(counts) == LAYER_GROUPS
    # G = 2 by hand from the spec's per-component formulas (base dims, E = 128).
    V, E, H, I = 30000, 128, 768, 3072  # noqa: E741 - the paper's symbols
    embeddings = V * E + 512 * E + 2 * E + 2 * E
    projection = E * H + H
    block = 4 * (H * H + H) + 2 * H + 2 * H * I + I + H + 2 * H
    pooler = H * H + H
    assert counts[2, 1] == embeddings + projection + 2 * block + pooler == 18_771_456
    assert counts[1, 2] == counts[2, 1]  # parameters depend on G*K only
    spec_millions = {1: 11.68, 2: 18.77, 3: 25.86, 4: 32.95, 6: 47.12, 12: 89.65}
    for g, millions in spec_millions.items():
        assert round(counts[g, 1] / 1e6, 2) == millions
        assert counts[g, 1] == formula(G=g)
    assert counts[12, 1] == RELEASED["base"][2]  # G = L all-shared is BERT-like not-shared


# Spec section 2.3: (incl. pooler, excl. pooler), in millions as the spec rounds them.
ABLATIONS = {
    "E=64 not-shared": (87.648, 87.057),
    "E=128 not-shared": (89.650, 89.060),
    "E=256 not-shared": (93.655, 93.064),
    "E=768 not-shared": (109.081, 108.491),
    "E=64 all-shared": (9.681, 9.091),
    "E=128 all-shared": (11.684, 11.093),
    "E=256 all-shared": (15.688, 15.097),
    "E=768 all-shared": (31.115, 30.524),
    "E=768 shared-attention": (83.078, 82.488),
    "E=768 shared-FFN": (57.118, 56.527),
    "E=128 shared-attention": (63.647, 63.057),
    "E=128 shared-FFN": (37.687, 37.096),
    "BERT-base": (109.081, 108.491),
    "BERT-large": (334.607, 333.558),
    "ALBERT-base": (11.684, 11.093),
    "ALBERT-large": (17.684, 16.634),
    "ALBERT-xlarge": (58.725, 54.529),
    "BERT-xlarge": (1275.292, 1271.095),  # the spec gives 1275.3M / 1271.1M
    "ALBERT-xxlarge": (222.596, 205.814),  # the spec gives 205.8M excl. pooler
}


@pytest.mark.parametrize("label", ROWS)
def test_paper_rows(label):
    row = ROWS[label]
    counts = row.counts()
    incl, excl = ABLATIONS[label]
    assert round(counts["incl. pooler"] / 1e6, 3) == incl
    assert round(counts["excl. pooler"] / 1e6, 3) == excl
    # Exactly, from the formulas, with the projection only when E != H.
    config = row.config()
    dims = dict(
        V=config.vocab_size,
        E=config.embedding_size,
        H=config.hidden_size,
        L=config.num_hidden_layers,
        I=config.intermediate_size,
        G=config.num_hidden_groups,
        sharing=config.sharing,
    )
    assert counts["incl. pooler"] == formula(**dims)
    assert counts["excl. pooler"] == formula(**dims, pooler=False)
    assert counts["+ MLM/SOP heads"] == formula(**dims, heads=True)


def test_every_spec_row_is_in_the_tables():
    assert set(ABLATIONS) == set(ROWS)
    assert sum(len(rows) for rows in TABLES.values()) == 23  # Tables 3 and 4 share four rows


def test_which_convention_reproduces_the_paper():
    for label, row in ROWS.items():
        verdict = row.reproduced_by(row.counts())
        if "not-shared" in label or label.startswith("BERT"):
            assert verdict == "excl. pooler", label
        elif label not in ("ALBERT-xlarge", "ALBERT-xxlarge"):
            assert verdict.startswith("incl. pooler"), label
    xlarge, xxlarge = ROWS["ALBERT-xlarge"], ROWS["ALBERT-xxlarge"]
    assert xlarge.reproduced_by(xlarge.counts()) == "60M: none; 59M (arXiv v1): incl. pooler, + MLM/SOP heads"
    assert xxlarge.reproduced_by(xxlarge.counts()) == "235M: none; 233M (arXiv v1): none"
    # transformers' always-on projection would break E=768 all-shared (31.7M -> 32M, paper 31M).
    projected = count_parameters(AlbertHFConfig.from_preset("base", embedding_size=768))
    assert projected == 31_705_344 and round(projected / 1e6) == 32


def test_heads_need_the_pooler():
    with pytest.raises(ValueError, match="pooler"):
        count_parameters(AlbertHFConfig.from_preset("tiny"), heads=True, pooler=False)


def hf_count(model_class, config):
    with torch.device("meta"):
        return sum(p.numel() for p in model_class(config).parameters())


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("base", {}),
        ("xxlarge", {}),
        ("base", dict(num_hidden_groups=3, inner_group_num=2)),
        ("large", dict(sharing="none")),
        ("base", dict(embedding_size=768)),  # E = H: both keep the projection (project_when_equal defaults to True)
    ],
)
def test_matches_transformers(preset, overrides):
    config = AlbertHFConfig.from_preset(preset, **overrides)
    hf_config = config.to_albert_config()
    assert count_parameters(config) == hf_count(AlbertModel, hf_config)
    assert count_parameters(config, heads=True) == hf_count(AlbertForPreTraining, hf_config)


@pytest.mark.parametrize("vocab_size", [30000, 30522])
def test_bert_rows_match_transformers_bert(vocab_size):
    row = ROWS["BERT-base"]
    bert = BertConfig(vocab_size=vocab_size, hidden_size=768, num_hidden_layers=12, intermediate_size=3072)
    assert row.counts(vocab_size=vocab_size)["incl. pooler"] == hf_count(BertModel, bert)
    if vocab_size == 30522:
        assert hf_count(BertModel, bert) == 109_482_240  # bert-base-uncased, as commonly quoted


@pytest.fixture(scope="module")
def printed():
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "albert_hf.analysis.params"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_main_prints_every_table(printed):
    lines = printed.splitlines()
    for title, rows in TABLES.items():
        assert title in printed
        for row in rows:
            counts = row.counts()
            line = next(line for line in lines if line.startswith(f"| {row.label} "))
            for n in counts.values():
                assert f"{n:,}" in line
            assert paper_string(row) in line
            assert row.reproduced_by(counts) in line
    for g, k, n in layer_group_counts():
        assert any(line.startswith(f"| {g:>2} | {k} |") and f"{n:,}" in line for line in lines)


def test_main_explains_the_mismatches(printed):
    words = " ".join(printed.split())  # the notes are wrapped
    for text in (
        "235M",
        "233M",
        "222.6M",
        "223.2M",
        "transformers documents xxlarge as 223M",
        "0.74*H^2",
        "60M",
        "59M",
        "30522",
        "109,482,240",
        "31,705,344",
        "by one of them 21/23",
    ):
        assert text in words, text
