import json

import pytest
from transformers import AlbertConfig, AutoConfig

from albert_hf import AlbertHFConfig


def test_defaults_are_albert_v2():
    config = AlbertHFConfig()
    # ALBERT_SPEC.md §1.2: v2 = gelu_new (tanh GELU), no dropout; the constructor defaults equal xxlarge.
    assert config.model_type == "albert_hf"
    assert (config.vocab_size, config.embedding_size, config.max_position_embeddings) == (30000, 128, 512)
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (4096, 12, 64)
    assert config.intermediate_size == 16384
    assert config.hidden_act == "gelu_new"
    assert config.hidden_dropout_prob == 0.0 and config.attention_probs_dropout_prob == 0.0
    assert config.layer_norm_eps == 1e-12 and config.initializer_range == 0.02
    assert (config.num_hidden_groups, config.inner_group_num, config.type_vocab_size) == (1, 1, 2)
    assert config.sharing == "all"


@pytest.mark.parametrize(
    "name, hidden, layers, heads, intermediate",
    [
        ("base", 768, 12, 12, 3072),
        ("large", 1024, 24, 16, 4096),
        ("xlarge", 2048, 24, 16, 8192),
        ("xxlarge", 4096, 12, 64, 16384),
    ],
)
def test_presets_match_released_v2_configs(name, hidden, layers, heads, intermediate):
    config = AlbertHFConfig.from_preset(name)
    assert (config.hidden_size, config.num_hidden_layers) == (hidden, layers)
    assert (config.num_attention_heads, config.intermediate_size) == (heads, intermediate)
    assert (config.vocab_size, config.embedding_size, config.hidden_act) == (30000, 128, "gelu_new")


def test_tiny_preset_is_small_and_overridable():
    config = AlbertHFConfig.from_preset("tiny", num_hidden_layers=2)
    assert config.hidden_size <= 64 and config.vocab_size <= 1000
    assert config.num_hidden_layers == 2


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(hidden_size=30, num_attention_heads=4), "hidden_size"),
        (dict(num_hidden_layers=2, num_hidden_groups=3), "num_hidden_groups"),
        (dict(sharing="most"), "sharing"),
        (dict(vocab_size=-5), "vocab_size"),
        (dict(embedding_size=0), "embedding_size"),
        (dict(intermediate_size=-1), "intermediate_size"),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
        (dict(sharing="attention", num_hidden_groups=2), "sharing"),
        (dict(sharing="none", num_hidden_layers=4, num_hidden_groups=2), "num_hidden_groups"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        AlbertHFConfig.from_preset("tiny", **kwargs)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ValueError, match="huge.*base"):
        AlbertHFConfig.from_preset("huge")


def test_sharing_none_gives_every_layer_its_own_group():
    config = AlbertHFConfig.from_preset("tiny", sharing="none", num_hidden_layers=22)
    assert config.num_hidden_groups == 22
    assert config.layer_group_order() == list(range(22))


def test_official_group_formula_with_uneven_groups():
    # ALBERT_SPEC.md §1.5: L=12, G=5 gives group sizes 3, 2, 3, 2, 2.
    order = AlbertHFConfig.from_preset("tiny", num_hidden_layers=12, num_hidden_groups=5).layer_group_order()
    assert [order.count(g) for g in range(5)] == [3, 2, 3, 2, 2]
    assert order == sorted(order)


def test_save_and_reload_round_trip(tmp_path):
    config = AlbertHFConfig.from_preset("tiny", sharing="ffn", project_when_equal=False, hidden_act="gelu")
    config.save_pretrained(tmp_path)
    reloaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(reloaded, AlbertHFConfig)
    assert reloaded.to_diff_dict() == config.to_diff_dict()
    assert (reloaded.sharing, reloaded.project_when_equal, reloaded.hidden_act) == ("ffn", False, "gelu")


def test_official_albert_config_json_fields_are_accepted(tmp_path):
    # The released albert_config.json files carry fields the official code ignores (spec §1.1).
    extra = dict(down_scale_factor=1, net_structure_type=0, gap_size=0, num_memory_blocks=0, layers_to_keep=[])
    config = AlbertHFConfig.from_preset("tiny", **extra)
    assert config.hidden_size == 32


def test_transformers_albert_config_is_read_as_albert_hf(tmp_path):
    AlbertConfig(
        hidden_act="gelu",
        num_hidden_layers=6,
        num_hidden_groups=6,
        hidden_size=64,
        num_attention_heads=4,
        architectures=["AlbertForMaskedLM"],
    ).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "albert"
    config = AlbertHFConfig.from_pretrained(tmp_path)
    assert config.model_type == "albert_hf"
    assert config.hidden_act == "gelu"  # v1 Hub configs keep their exact-erf GELU
    assert config.sharing == "none" and config.num_hidden_groups == 6
    assert config.architectures == ["AlbertHFForMaskedLM"]


def test_to_albert_config_refuses_what_transformers_cannot_express():
    with pytest.raises(ValueError, match="sharing"):
        AlbertHFConfig.from_preset("tiny", sharing="attention").to_albert_config()
    with pytest.raises(ValueError, match="projection"):
        AlbertHFConfig.from_preset("tiny", embedding_size=32, project_when_equal=False).to_albert_config()
    # transformers computes int(l / (L / G)); for L=18, G=14 that differs from the official int(l / L * G).
    with pytest.raises(ValueError, match="group formula"):
        AlbertHFConfig.from_preset("tiny", num_hidden_layers=18, num_hidden_groups=14).to_albert_config()
    albert = AlbertHFConfig.from_preset("tiny", num_hidden_groups=2).to_albert_config()
    assert isinstance(albert, AlbertConfig) and albert.num_hidden_groups == 2
