"""AlbertHFConfig: ALBERT's hyper-parameters, named as in transformers' AlbertConfig.

This file is shipped to the Hub next to the weights (remote code): it imports only transformers.
"""

from transformers import PreTrainedConfig

SHARING_MODES = ("all", "attention", "ffn", "none")

# The released v2 models' dimensions. All share V=30000, E=128, 512 positions, gelu_new, dropout 0.
# xlarge uses 16 heads, as the released weights do (the paper's H/64 rule would say 32).
PRESETS = {
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
    "xlarge": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16, intermediate_size=8192),
    "xxlarge": dict(hidden_size=4096, num_hidden_layers=12, num_attention_heads=64, intermediate_size=16384),
    # The small ALBERT of the small-scale reproductions (examples/): E=128 as the paper, all layers shared, 1.5M
    # parameters with a 4000-piece vocabulary.
    "small": dict(
        embedding_size=128,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    ),
    # For tests: seconds on a laptop CPU.
    "tiny": dict(
        vocab_size=1000,
        embedding_size=16,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    ),
}


class AlbertHFConfig(PreTrainedConfig):
    r"""Configuration of an ALBERT model.

    The fields and defaults are those of transformers' `AlbertConfig` (the constructor defaults equal xxlarge v2),
    plus three of ours: `sharing`, `project_when_equal` and `unpad_inputs`. The fields of the released
    `albert_config.json` files that the official code ignores (`down_scale_factor`, `net_structure_type`, `gap_size`,
    `num_memory_blocks`, `layers_to_keep`) are accepted and dropped.

    Args:
        vocab_size (`int`, defaults to 30000): the number of token ids, V.
        embedding_size (`int`, defaults to 128): the width E of the (factorized) embeddings.
        hidden_size (`int`, defaults to 4096): the width H of the transformer blocks.
        num_hidden_layers (`int`, defaults to 12): the number of layers L; each applies one layer group.
        num_hidden_groups (`int`, defaults to 1): the number of distinct layer groups G that the L layers share.
        num_attention_heads (`int`, defaults to 64): attention heads per block; must divide `hidden_size`.
        intermediate_size (`int`, defaults to 16384): the width of each block's feed-forward layer.
        inner_group_num (`int`, defaults to 1): blocks with their own parameters in each group, applied in order.
        hidden_act (`str`, defaults to `"gelu_new"`): the activation of the FFN and the MLM head: `"gelu_new"`
            (ALBERT's tanh GELU), `"gelu"` (the exact GELU of the v1 configs) or another name of transformers' `ACT2FN`.
        hidden_dropout_prob (`float`, defaults to 0.0): dropout of the embeddings and of each block's two outputs.
        attention_probs_dropout_prob (`float`, defaults to 0.0): dropout of the attention probabilities.
        max_position_embeddings (`int`, defaults to 512): the longest sequence the model takes.
        type_vocab_size (`int`, defaults to 2): the number of token type (segment) ids.
        initializer_range (`float`, defaults to 0.02): std of the truncated-normal initialisation (cut at 2 std).
        layer_norm_eps (`float`, defaults to 1e-12): the epsilon of every LayerNorm.
        classifier_dropout_prob (`float`, defaults to 0.1): dropout in the sequence-classification,
            multiple-choice, token-classification and answerability heads.
        sharing (`str`, defaults to `"all"`): cross-layer parameter sharing, the paper's Table 4 ablation.
            - `"all"`: ALBERT. `num_hidden_groups` groups of `inner_group_num` blocks; layer `l` applies group
              `int(l / num_hidden_layers * num_hidden_groups)` (the official float formula).
            - `"attention"`: one attention block shared by all layers, a separate FFN per layer.
            - `"ffn"`: one FFN shared by all layers, a separate attention block per layer.
            - `"none"`: BERT-style, every layer has its own parameters (needs `num_hidden_groups == num_hidden_layers`,
              which is set for you when `num_hidden_groups` is left at 1).
            `"attention"` and `"ffn"` need `num_hidden_groups=1` and `inner_group_num=1`.
        project_when_equal (`bool`, defaults to `True`): keep the E->H projection `embedding_hidden_mapping_in` when
            `embedding_size == hidden_size`. transformers always creates it; the official code only when E != H.
            Set False to reproduce the paper's E=768 counts.
        unpad_inputs (`bool`, defaults to `True`): when the batch has padding, run the token-wise work (projections,
            FFN, LayerNorms: all but the attention scores) on the real tokens only, on CPUs (on CUDA devices the
            padded batch goes to SDPA as it is). Same results at every real token; the hidden states at padded
            positions come out as zeros instead of transformers' meaningless values. Off when the whole model is
            compiled (`compile_blocks` keeps it on), with `output_hidden_states` / `output_attentions`, with a mask
            other than `(batch_size, sequence_length)`, for the span QA head (`keep_padding`), and for attention
            kernels other than sdpa and eager.
        pad_token_id (`int`, *optional*, defaults to 0), bos_token_id (defaults to 2), eos_token_id (defaults to 3):
            the special token ids, as in transformers' `AlbertConfig`.
        tie_word_embeddings (`bool`, defaults to `True`): the MLM decoder shares the word embedding table.
        **kwargs: `PreTrainedConfig`'s own arguments (`num_labels`, `id2label`, `problem_type`, `architectures`,
            ...) and extra attributes, such as `start_n_top` / `end_n_top` of the answerability QA head.

    Raises:
        ValueError: a field out of range or a combination the model cannot build, naming the field (`validate`).
    """

    model_type = "albert_hf"

    vocab_size: int = 30000
    embedding_size: int = 128
    hidden_size: int = 4096
    num_hidden_layers: int = 12
    num_hidden_groups: int = 1
    num_attention_heads: int = 64
    intermediate_size: int = 16384
    inner_group_num: int = 1
    hidden_act: str = "gelu_new"
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    classifier_dropout_prob: float = 0.1
    sharing: str = "all"
    project_when_equal: bool = True
    unpad_inputs: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | None = 3
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        # Fields of the released albert_config.json files that the official modeling.py ignores: accept, drop.
        for ignored in ("down_scale_factor", "net_structure_type", "gap_size", "num_memory_blocks", "layers_to_keep"):
            kwargs.pop(ignored, None)
        if self.sharing == "none" and self.num_hidden_groups == 1 and self.num_hidden_layers > 1:
            self.num_hidden_groups = self.num_hidden_layers
        super().__post_init__(**kwargs)
        self.validate()

    def validate(self):
        """Raise a ValueError naming the offending field."""
        positive = (
            "vocab_size",
            "embedding_size",
            "hidden_size",
            "num_hidden_layers",
            "num_hidden_groups",
            "num_attention_heads",
            "intermediate_size",
            "inner_group_num",
            "max_position_embeddings",
            "type_vocab_size",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"AlbertHFConfig.{name} must be a positive integer, got {value!r}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout_prob"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"AlbertHFConfig.{name} must be a probability in [0, 1), got {value!r}")
        for name in ("initializer_range", "layer_norm_eps"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) <= 0:
                raise ValueError(f"AlbertHFConfig.{name} must be positive, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"AlbertHFConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.num_hidden_groups > self.num_hidden_layers:
            raise ValueError(
                f"AlbertHFConfig.num_hidden_groups ({self.num_hidden_groups}) cannot exceed "
                f"num_hidden_layers ({self.num_hidden_layers})"
            )
        if self.sharing not in SHARING_MODES:
            raise ValueError(f"AlbertHFConfig.sharing must be one of {SHARING_MODES}, got {self.sharing!r}")
        if self.sharing == "none" and self.num_hidden_groups != self.num_hidden_layers:
            raise ValueError(
                f"AlbertHFConfig.num_hidden_groups must equal num_hidden_layers ({self.num_hidden_layers}) "
                f"with sharing='none', got {self.num_hidden_groups}"
            )
        if self.sharing in ("attention", "ffn") and (self.num_hidden_groups, self.inner_group_num) != (1, 1):
            raise ValueError(
                f"AlbertHFConfig.sharing={self.sharing!r} shares one block across all layers and needs "
                f"num_hidden_groups=1 and inner_group_num=1, got {self.num_hidden_groups} and {self.inner_group_num}"
            )

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "AlbertHFConfig":
        """The config of a preset: `base`, `large`, `xlarge`, `xxlarge` (official v2 dimensions), `small` or `tiny`.

        Args:
            name (`str`): the preset; `"small"` is the model of the small-scale reproductions, `"tiny"` is for tests.
            **overrides: config fields that replace the preset's values (e.g. `num_hidden_layers=2`).

        Returns:
            An `AlbertHFConfig`, the other fields at their defaults.

        Raises:
            ValueError: an unknown preset name (the message lists the choices), or an override `validate` refuses.
        """
        if name not in PRESETS:
            raise ValueError(f"Unknown ALBERT preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def from_albert_config(cls, albert_config) -> "AlbertHFConfig":
        """Build from a transformers `AlbertConfig` (or its dict), keeping every field (e.g. v1's `gelu`)."""
        values = albert_config if isinstance(albert_config, dict) else albert_config.to_dict()
        values = {k: v for k, v in values.items() if k not in ("model_type", "auto_map")}
        # AlbertForX -> AlbertHFForX, so the head a checkpoint was saved from is kept
        architectures = [a.replace("Albert", "AlbertHF", 1) for a in values.get("architectures") or []]
        values["architectures"] = architectures or None
        if values.get("num_hidden_groups", 1) == values.get("num_hidden_layers", 12) > 1:
            values["sharing"] = "none"
        return cls(**values)

    @classmethod
    def get_config_dict(cls, pretrained_model_name_or_path, **kwargs):
        """Read config.json; a transformers ALBERT config (model_type "albert") is converted on the fly, so every
        `albert-*` checkpoint loads with `AlbertHFFor*.from_pretrained` (the weight names are the same)."""
        config_dict, kwargs = super().get_config_dict(pretrained_model_name_or_path, **kwargs)
        if not config_dict:  # transformers 5 reads a folder without config.json as {}: a default config, silently
            raise OSError(f"{pretrained_model_name_or_path} holds no config.json")
        if config_dict.get("model_type") == "albert":
            config_dict = cls.from_albert_config(config_dict).to_dict()
        elif config_dict.get("model_type") != cls.model_type:
            # else every missing field would silently take its default (ALBERT base's sizes)
            raise ValueError(
                f"{pretrained_model_name_or_path}: config.json has model_type "
                f"{config_dict.get('model_type')!r:.40}, neither {cls.model_type!r} nor transformers' "
                "'albert'"
            )
        return config_dict, kwargs

    def to_albert_config(self):
        """The transformers `AlbertConfig` with the same architecture, or a ValueError if it has none."""
        from transformers import AlbertConfig

        if self.sharing in ("attention", "ffn"):
            raise ValueError(f"sharing={self.sharing!r} has no transformers AlbertConfig equivalent")
        if self.embedding_hidden_mapping_skipped:
            raise ValueError(
                "project_when_equal=False with embedding_size == hidden_size: transformers' ALBERT "
                "always has the E->H projection"
            )
        hf_order = [int(i / (self.num_hidden_layers / self.num_hidden_groups)) for i in range(self.num_hidden_layers)]
        if hf_order != self.layer_group_order():
            raise ValueError(
                f"num_hidden_layers={self.num_hidden_layers}, num_hidden_groups={self.num_hidden_groups}: "
                "transformers' group formula orders these layers differently from the official one"
            )
        ours_only = ("model_type", "sharing", "project_when_equal", "unpad_inputs", "auto_map")
        values = {k: v for k, v in self.to_dict().items() if k not in ours_only}
        values["architectures"] = [a.replace("AlbertHF", "Albert", 1) for a in self.architectures or []] or None
        return AlbertConfig(**values)

    @property
    def embedding_hidden_mapping_skipped(self) -> bool:
        return self.embedding_size == self.hidden_size and not self.project_when_equal

    def layer_group_order(self) -> list[int]:
        """The layer group applied at each of the `num_hidden_layers` layers (sharing "all" and "none").

        The official code's float formula `int(l / L * G)` (modeling.py). With sharing="none" every layer has its own
        group, in order: the float formula would repeat a group for some L = G (e.g. L = G = 22 at l = 15).
        """
        layers, groups = self.num_hidden_layers, self.num_hidden_groups
        if self.sharing == "none":
            return list(range(layers))
        return [int(layer / layers * groups) for layer in range(layers)]


__all__ = ["AlbertHFConfig", "PRESETS", "SHARING_MODES"]
