"""ALBERT in PyTorch for the Hugging Face stack (Lan et al., "ALBERT: A Lite BERT", ICLR 2020).

The two ideas of the paper live in two named places:
- factorized embedding: `AlbertHFEmbeddings` works at width E; `AlbertHFTransformer.embedding_hidden_mapping_in`
  projects E -> H once; the MLM decoder maps back through E with the tied word table.
- cross-layer sharing: `AlbertHFTransformer` applies a few parameter sets many times (`config.sharing`).

Parameter names follow transformers' ALBERT, so its checkpoints load unchanged (see `AlbertHFConfig.get_config_dict`).
This file is shipped to the Hub next to the weights (remote code): it imports only torch, transformers and its
sibling configuration file.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .configuration_albert_hf import AlbertHFConfig

# The inputs every model's forward takes, documented once: `_document_inputs` puts them where a forward's
# docstring says {inputs} (transformers' add_start_docstrings_to_model_forward puts its text before the docstring).
INPUTS_DOCSTRING = """\
input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`): token ids; or `inputs_embeds`.
attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*): 1 at real tokens,
    0 at padding; None attends to every position.
token_type_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): segment ids
    (0 up to the first [SEP], 1 after); None gives 0 everywhere.
position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): None gives
    0, 1, ..., sequence_length - 1.
inputs_embeds (`torch.FloatTensor` of shape `(batch_size, sequence_length, embedding_size)`, *optional*):
    word embeddings (width E) instead of `input_ids`."""


def _document_inputs(forward):
    forward.__doc__ = forward.__doc__.replace("{inputs}", INPUTS_DOCSTRING.replace("\n", "\n" + " " * 12))
    return forward


# Every Auto class a saved checkpoint should answer to, written into config.json on save, so that a fresh process
# without albert_hf installed can load any head with trust_remote_code=True.
AUTO_MAP = {
    "AutoConfig": "configuration_albert_hf.AlbertHFConfig",
    "AutoModel": "modeling_albert_hf.AlbertHFModel",
    "AutoModelForPreTraining": "modeling_albert_hf.AlbertHFForPreTraining",
    "AutoModelForMaskedLM": "modeling_albert_hf.AlbertHFForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_albert_hf.AlbertHFForSequenceClassification",
    "AutoModelForMultipleChoice": "modeling_albert_hf.AlbertHFForMultipleChoice",
    "AutoModelForQuestionAnswering": "modeling_albert_hf.AlbertHFForQuestionAnswering",
    "AutoModelForTokenClassification": "modeling_albert_hf.AlbertHFForTokenClassification",
}


class TanhGELU(nn.GELU):
    """ALBERT's tanh GELU ("gelu_new"): torch's kernel eager, x * sigmoid(2u) compiled (BENCHMARKS.md, "What each
    optimisation bought")."""

    def __init__(self):
        super().__init__(approximate="tanh")

    def forward(self, x):
        if torch.compiler.is_compiling():
            two_u = x * (2 * (2 / torch.pi) ** 0.5 * (1 + 0.044715 * x * x))
            return x * torch.sigmoid(two_u)
        return super().forward(x)


def activation_function(name: str) -> nn.Module:
    """The config's activation; ALBERT's own is `TanhGELU`."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return TanhGELU()
    if name == "gelu":
        return nn.GELU()
    return ACT2FN[name]


class AlbertHFEmbeddings(nn.Module):
    """Word + position + token-type embeddings, all of width E (the factorized embedding), then LayerNorm, dropout.

    No padding_idx, as in the official code (transformers sets one; it only changes init and the pad row's grad).
    """

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.embedding_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_ids = nn.Buffer(torch.arange(config.max_position_embeddings).expand((1, -1)), persistent=False)

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        seq_length = inputs_embeds.shape[1]
        max_positions = self.position_embeddings.num_embeddings
        if position_ids is None:
            if seq_length > max_positions:
                raise ValueError(
                    f"Sequence length {seq_length} exceeds max_position_embeddings={max_positions}; "
                    f"truncate the input (e.g. tokenizer(..., truncation=True, max_length={max_positions}))"
                )
            position_ids = self.position_ids[:, :seq_length]
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        if token_type_ids is not None:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        else:
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(embeddings))


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Plain softmax(QK^T * scaling + mask) V; the only implementation that returns attention weights.

    `attention_mask` is additive (eager's mask) or boolean, True where a key may be attended (SDPA's mask, when
    `use_matmul_attention` stands in for SDPA).
    """
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        weights = weights.masked_fill(~attention_mask, torch.finfo(weights.dtype).min)
    elif attention_mask is not None:
        weights = weights + attention_mask
    weights = F.softmax(weights, dim=-1)
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return output, weights


# CPU training computes "sdpa" attention up to this key length as matmul + softmax (BENCHMARKS.md, "Where the
# time goes outside the matmuls").
MATMUL_ATTENTION_MAX_LENGTH = 256


def use_matmul_attention(config, key: torch.Tensor, training: bool) -> bool:
    # the module's training mode, not grad mode: the same inputs in the same mode take the same path (tracing)
    return (
        config._attn_implementation == "sdpa"
        and key.device.type == "cpu"
        and training
        and key.shape[-2] <= MATMUL_ATTENTION_MAX_LENGTH
    )


class RealTokens:
    """The real (unpadded) tokens of a padded batch, so the token-wise work skips the padding (`unpad_inputs`).

    Projections, FFN and LayerNorms (~90% of the FLOPs) act on each token alone, so they run on a (rows, H) pack
    of the real tokens; only attention needs the (batch, seq) layout, and re-pads per layer. The pack is rounded
    up to a multiple of `ROW_MULTIPLE` rows (filler copies of token 0, dropped on re-padding): oneDNN builds and
    caches kernels per matrix shape, and a new row count every batch cost time and grew memory without bound.
    """

    ROW_MULTIPLE = 64

    def __init__(self, attention_mask: torch.Tensor):
        self.batch, self.length = attention_mask.shape
        indices = attention_mask.flatten().nonzero().squeeze(1)
        filler = -(-indices.numel() // self.ROW_MULTIPLE) * self.ROW_MULTIPLE - indices.numel()
        # Filler rows read token 0 and are written to a spare row past the end, which scatter drops; no Python
        # int of the real count reaches the layers, so a compiled block does not specialise on it.
        self.gather_indices = torch.cat([indices, indices.new_zeros(filler)])
        self.scatter_indices = torch.cat([indices, indices.new_full((filler,), self.batch * self.length)])

    @staticmethod
    def pays_on(device: torch.device) -> bool:
        """CPUs only: tuned for oneDNN; on CUDA the padded batch goes to SDPA's kernels as it is (unmeasured)."""
        return device.type == "cpu"

    @classmethod
    def pack_if_smaller(cls, attention_mask: torch.Tensor) -> "RealTokens | None":
        """The pack, or None when its rounded-up rows are no fewer than the padded batch's."""
        real_tokens = cls(attention_mask)
        return real_tokens if real_tokens.gather_indices.numel() < attention_mask.numel() else None

    def gather(self, padded: torch.Tensor) -> torch.Tensor:
        """(batch, seq, ...) -> (rows, ...)"""
        return padded.flatten(0, 1).index_select(0, self.gather_indices)

    def scatter(self, packed: torch.Tensor) -> torch.Tensor:
        """(rows, ...) -> (batch, seq, ...), zeros at the padding"""
        padded = packed.new_zeros(self.batch * self.length + 1, *packed.shape[1:])
        padded = padded.index_copy(0, self.scatter_indices, packed)
        return padded[:-1].view(self.batch, self.length, *packed.shape[1:])


class SharedLinear(torch.autograd.Function):
    """`x W^T + b` with W and b made ready once per forward (`AlbertHFTransformer.ready_weights`: cast to the
    autocast dtype, Q, K and V side by side), for every application of a shared block.

    The weight and bias passed are detached copies; the gradient goes to `parameters` (the fp32 weights then the
    fp32 biases whose rows W and b stack), computed in fp32 per application: the L applications of a shared block
    then add up in fp32. A cast copy would collect them in bf16 first (autograd sums a tensor's uses in its dtype).
    """

    @staticmethod
    def forward(ctx, x, weight, bias, *parameters):
        ctx.input_dtype = x.dtype
        x = x.to(weight.dtype)  # autocast's cast of the input, done here so that backward has the same x
        ctx.save_for_backward(x, weight)
        ctx.rows = [p.shape[0] for p in parameters[: len(parameters) // 2]]
        return F.linear(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.to(weight.dtype)
        grad_x = (grad @ weight).to(ctx.input_dtype) if ctx.needs_input_grad[0] else None
        if not any(ctx.needs_input_grad[3:]):  # frozen weights
            return grad_x, None, None, *([None] * 2 * len(ctx.rows))
        grad, x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        wide = torch.promote_types(weight.dtype, torch.float32)
        grad_weight = (grad.t() @ x).to(wide)  # one rounding of the GEMM's fp32 sums, as autocast's linear
        grad_bias = grad.sum(0, dtype=wide)
        return (grad_x, None, None, *grad_weight.split(ctx.rows), *grad_bias.split(ctx.rows))


def shared_linear(x, ready: tuple[torch.Tensor, torch.Tensor], linears: list[nn.Linear], rows=slice(None)):
    """The linears' outputs side by side, one GEMM over `ready`'s weight and bias (their rows `rows`)."""
    weight, bias = ready[0][rows], ready[1][rows]
    return SharedLinear.apply(x, weight, bias, *(m.weight for m in linears), *(m.bias for m in linears))


def ready_linears(linears: list[nn.Linear], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights and biases of `linears` stacked by rows, in `dtype`, detached (`SharedLinear` routes the
    gradient)."""
    with torch.no_grad():
        return (torch.cat([m.weight for m in linears]).to(dtype), torch.cat([m.bias for m in linears]).to(dtype))


def plain_linear(module) -> bool:
    """An nn.Linear as torch defines it: no adapter (PEFT), hook or replaced forward, no sharded (FSDP) weight."""
    return (
        type(module) is nn.Linear
        and module.bias is not None
        and not module._forward_hooks
        and not module._forward_pre_hooks
        and "forward" not in module.__dict__
        and type(module.weight) is nn.Parameter
    )


# Devices whose training forward under bf16 autocast keeps the residual stream in bf16 (`residual_dtype`).
LOW_PRECISION_RESIDUAL_DEVICES = ("cuda",)


def residual_dtype(hidden_states: torch.Tensor) -> torch.dtype | None:
    """The dtype of the residual stream between blocks: bf16 in a training forward (gradients on) under bf16 autocast
    on a GPU, where autocast's LayerNorm would give fp32: half the bytes for every block's add + LayerNorm to read and
    write, and no cast of a LayerNorm's output before each GEMM (the sum and the statistics stay fp32:
    `residual_layer_norm`). None elsewhere: the LayerNorm's output as autocast gives it (fp32 on a GPU, as
    transformers' ALBERT; on CPUs autocast already keeps LayerNorm in bf16). Not in fp16, whose range is too narrow
    for the residual sums."""
    device = hidden_states.device.type
    if (
        device in LOW_PRECISION_RESIDUAL_DEVICES
        and torch.is_grad_enabled()
        and torch.is_autocast_enabled(device)
        and torch.get_autocast_dtype(device) == torch.bfloat16
    ):
        return torch.bfloat16
    return None


def residual_layer_norm(norm: nn.LayerNorm, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """LayerNorm(x + residual), each post-LN block's residual connection. With a bf16 residual stream
    (`residual_dtype`): the sum and the statistics in fp32, the output rounded once to bf16; compiled, the add, the
    LayerNorm and the casts are one kernel."""
    stream = residual_dtype(residual)
    if stream is None:
        return norm(x + residual)
    return norm(torch.add(residual.float(), x)).to(stream)


class AlbertHFAttention(nn.Module):
    """Multi-head self-attention with its output projection, dropout and post-LN residual (`LayerNorm`)."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.config = config
        self.head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_size**-0.5
        self.is_causal = False
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.output_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        real_tokens: RealTokens | None = None,
        query_positions: torch.Tensor | None = None,
        ready=None,
        **kwargs,
    ):
        """`ready`: this attention's weights made ready for the forward (`AlbertHFTransformer.ready_weights`), as
        ((Q|K|V weight, bias), (output weight, bias)): Q, K and V are then one GEMM, or K and V one when
        `query_positions` keeps only some queries."""
        qkv, dense = ready if ready is not None else (None, None)
        if query_positions is None:
            query, key, value = self.project(
                hidden_states, qkv, slice(None), real_tokens, self.query, self.key, self.value
            )
        else:
            key, value = self.project(
                hidden_states, qkv, slice(self.config.hidden_size, None), real_tokens, self.key, self.value
            )
            # Only these positions of each row go on (see AlbertHFModel's `last_layer_positions`).
            if real_tokens is not None:
                hidden_states, real_tokens = real_tokens.scatter(hidden_states), None
            index = query_positions.unsqueeze(-1).expand(-1, -1, hidden_states.shape[-1])
            hidden_states = hidden_states.gather(1, index)
            if attention_mask is not None:
                attention_mask = attention_mask[:, :, :1]  # a bidirectional mask has the same row for every query
            (query,) = self.project(hidden_states, qkv, slice(0, self.config.hidden_size), None, self.query)
        batch = key.shape[0]
        query = query.view(batch, query.shape[1], -1, self.head_size).transpose(1, 2)
        key = key.view(batch, key.shape[1], -1, self.head_size).transpose(1, 2)
        value = value.view(batch, value.shape[1], -1, self.head_size).transpose(1, 2)

        attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        if use_matmul_attention(self.config, key, self.training):
            attention = eager_attention_forward
        context, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        context = context.flatten(2)
        if real_tokens is not None:
            context = real_tokens.gather(context)
        (output,) = self.project(context, dense, slice(None), None, self.dense)
        return residual_layer_norm(self.LayerNorm, self.output_dropout(output), hidden_states), weights

    @staticmethod
    def project(hidden_states, ready, rows: slice, real_tokens: RealTokens | None, *linears: nn.Linear):
        """The linears' outputs: one GEMM over the ready (weight, bias)'s `rows` when given, else each module's
        own; re-padded to (batch, seq, H) when `hidden_states` is a pack of `real_tokens` (one scatter for all)."""
        if ready is None:
            outputs = [linear(hidden_states) for linear in linears]
        else:
            outputs = [shared_linear(hidden_states, ready, list(linears), rows)]
        if real_tokens is not None:
            outputs = [real_tokens.scatter(output) for output in outputs]
        return [part for output in outputs for part in output.split(linears[0].out_features, dim=-1)]


class AlbertHFLayer(GradientCheckpointingLayer):
    """One transformer block: attention, then the FFN with dropout and post-LN residual (`full_layer_layer_norm`).

    With `borrow_attention_from` / `borrow_ffn_from` (sharing="attention" / "ffn") the block reuses another block's
    attention or FFN. The borrowed modules are plain attributes, not registered submodules, so their weights are
    stored once, under the owner.
    """

    def __init__(self, config: AlbertHFConfig, borrow_attention_from=None, borrow_ffn_from=None):
        super().__init__()
        if borrow_attention_from is None:
            self.attention = AlbertHFAttention(config)
        else:
            object.__setattr__(self, "attention", borrow_attention_from.attention)
        if borrow_ffn_from is None:
            self.ffn = nn.Linear(config.hidden_size, config.intermediate_size)
            self.ffn_output = nn.Linear(config.intermediate_size, config.hidden_size)
            self.full_layer_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        else:
            for name in ("ffn", "ffn_output", "full_layer_layer_norm"):
                object.__setattr__(self, name, getattr(borrow_ffn_from, name))
        self.activation = activation_function(config.hidden_act)
        # transformers defines this dropout but never applies it; the official code does.
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, attention_mask=None, real_tokens=None, query_positions=None, ready=None, **kwargs):
        """`ready`: (the attention's, the FFN's) weights made ready for the forward
        (`AlbertHFTransformer.ready_weights`), or None: each Linear then runs as a module."""
        attention_ready, ffn_ready = ready if ready is not None else (None, None)
        attention_output, _ = self.attention(
            hidden_states, attention_mask, real_tokens, query_positions, attention_ready, **kwargs
        )
        if ffn_ready is None:
            ffn_output = self.ffn_output(self.activation(self.ffn(attention_output)))
        else:
            intermediate = self.activation(shared_linear(attention_output, ffn_ready[0], [self.ffn]))
            ffn_output = shared_linear(intermediate, ffn_ready[1], [self.ffn_output])
        return residual_layer_norm(self.full_layer_layer_norm, self.dropout(ffn_output), attention_output)

    def ready_attention(self, dtype: torch.dtype):
        """This block's attention weights for `AlbertHFAttention.forward`'s `ready`."""
        attention = self.attention
        qkv = ready_linears([attention.query, attention.key, attention.value], dtype)
        return qkv, ready_linears([attention.dense], dtype)

    def ready_ffn(self, dtype: torch.dtype):
        return ready_linears([self.ffn], dtype), ready_linears([self.ffn_output], dtype)

    def linears(self) -> list[nn.Linear]:
        attention = self.attention
        return [attention.query, attention.key, attention.value, attention.dense, self.ffn, self.ffn_output]


class AlbertHFLayerGroup(nn.Module):
    """`inner_group_num` blocks with distinct parameters, run in order each time the group is applied."""

    def __init__(self, config: AlbertHFConfig, layers=None):
        super().__init__()
        self.albert_layers = nn.ModuleList(layers or [AlbertHFLayer(config) for _ in range(config.inner_group_num)])

    def forward(self, hidden_states, attention_mask=None, real_tokens=None, query_positions=None, ready=None, **kwargs):
        """`ready`: each block's ready weights, or None (`AlbertHFTransformer.ready_weights`)."""
        last = len(self.albert_layers) - 1
        for i, layer in enumerate(self.albert_layers):
            positions = query_positions if i == last else None
            layer_ready = ready[i] if ready is not None else None
            hidden_states = layer(hidden_states, attention_mask, real_tokens, positions, layer_ready, **kwargs)
        return hidden_states


class AlbertHFTransformer(nn.Module):
    """The E->H projection, then `num_hidden_layers` applications of a few shared layer groups (cross-layer sharing).

    - sharing="all" (ALBERT): layer l applies group int(l / L * G), the official formula; "none" (BERT): G = L.
    - sharing="attention" / "ffn": L groups of one block each, all borrowing block 0's attention / FFN.
    """

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.config = config
        if config.embedding_size != config.hidden_size or config.project_when_equal:
            self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)
        else:
            self.embedding_hidden_mapping_in = None

        if config.sharing in ("attention", "ffn"):
            first = AlbertHFLayer(config)
            borrow = {f"borrow_{config.sharing}_from": first}
            blocks = [first] + [AlbertHFLayer(config, **borrow) for _ in range(config.num_hidden_layers - 1)]
            self.albert_layer_groups = nn.ModuleList([AlbertHFLayerGroup(config, [block]) for block in blocks])
            self.group_order = list(range(config.num_hidden_layers))
        else:
            self.albert_layer_groups = nn.ModuleList(
                [AlbertHFLayerGroup(config) for _ in range(config.num_hidden_groups)]
            )
            self.group_order = config.layer_group_order()

    blocks_compiled = False  # set by `compile_blocks`

    def forward(self, hidden_states, attention_mask=None, real_tokens=None, query_positions=None, **kwargs):
        """`query_positions` (batch, Q): the last block computes only these positions (keys: all of them)."""
        if self.embedding_hidden_mapping_in is not None:
            hidden_states = self.embedding_hidden_mapping_in(hidden_states)
        if self.blocks_compiled and hidden_states._base is not None:
            # A (batch, seq) projection is a view of its GEMM's output, a block's output is not; a block compiled with
            # dynamic shapes guards on its input's base, so the first layer would compile graphs of its own.
            hidden_states = hidden_states.clone()
        ready = self.ready_weights(hidden_states)
        last = len(self.group_order) - 1
        for step, group_index in enumerate(self.group_order):
            positions = query_positions if step == last else None
            group = self.albert_layer_groups[group_index]
            group_ready = ready[group_index] if ready is not None else None
            hidden_states = group(hidden_states, attention_mask, real_tokens, positions, group_ready, **kwargs)
        return BaseModelOutput(last_hidden_state=hidden_states)

    @staticmethod
    def ready_weights_pay_on(device: torch.device) -> bool:
        """CUDA only: in eager autocast on a CPU the cast cache already casts once, and the fp32 sums of the shared
        weights' gradients cost 2-3% of a base step there (BENCHMARKS.md, "Weights made ready once per forward")."""
        return device.type == "cuda"

    def ready_weights(self, hidden_states: torch.Tensor):
        """The blocks' weights made ready once per training forward, for all the applications of each shared block:
        cast to the autocast dtype (autocast would cast them at each application inside a compiled graph, and
        every time Q, K and V are stacked), Q, K and V stacked for one GEMM. Per group, per block: (attention's,
        FFN's) pairs of (weight, bias), each distinct attention and FFN made ready once (`sharing`); their
        gradients reach the parameters through `SharedLinear`.

        None, and each Linear runs as a module, on a CPU (`ready_weights_pay_on`), without gradients (inference), or
        when a block or a Linear is not plain (`plain_linear`: an adapter, a hook; FSDP's units, which FSDP gathers
        and casts itself).
        """
        blocks = [layer for group in self.albert_layer_groups for layer in group.albert_layers]
        plain = all(type(layer) is AlbertHFLayer and all(plain_linear(m) for m in layer.linears()) for layer in blocks)
        if not self.ready_weights_pay_on(hidden_states.device) or not torch.is_grad_enabled() or not plain:
            return None  # (a block of another class: FSDP's unit)
        device = hidden_states.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else blocks[0].ffn.weight.dtype
        attention, ffn = {}, {}  # one per distinct module (a borrowed attention or FFN is the same object)
        for layer in blocks:
            attention.setdefault(id(layer.attention), layer.ready_attention(dtype))
            ffn.setdefault(id(layer.ffn), layer.ready_ffn(dtype))
        return [
            [(attention[id(layer.attention)], ffn[id(layer.ffn)]) for layer in group.albert_layers]
            for group in self.albert_layer_groups
        ]


class AlbertHFPreTrainedModel(PreTrainedModel):
    config_class = AlbertHFConfig
    config: AlbertHFConfig
    base_model_prefix = "albert"
    supports_gradient_checkpointing = True
    _no_split_modules = ["AlbertHFLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    # transformers' Trainer gives `num_items_in_batch` (the labelled tokens of a whole accumulated step) to models
    # that take it, and then no longer divides their loss by the accumulation steps. Heads whose loss is a mean
    # over examples (classification, multiple choice, question answering, pretraining) do not take it: for them
    # Trainer's division gives the batch's mean. The token-level heads (masked LM, token classification) take it.
    accepts_loss_kwargs = False
    # As transformers 5.x: one hidden state per block application (1 + L*K in all), attentions per block.
    _can_record_outputs = {"hidden_states": AlbertHFLayer, "attentions": AlbertHFAttention}
    # Old transformers checkpoints store the position_ids buffer.
    _keys_to_ignore_on_load_unexpected = [r"position_ids", r"token_type_ids"]

    @torch.no_grad()
    def _init_weights(self, module):
        """Official init: truncated normal cut at +-2 std WITHOUT rescaling (TF), zero biases, unit LayerNorm."""
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.trunc_normal_(module.weight, mean=0.0, std=std, a=-2 * std, b=2 * std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, AlbertHFMLMHead):
            init.zeros_(module.bias)
        if isinstance(module, AlbertHFEmbeddings):
            init.copy_(module.position_ids, torch.arange(module.position_ids.shape[-1]).expand((1, -1)))

    def compile_blocks(self, **compile_kwargs):
        """Regional `torch.compile`, in place: each transformer block (`AlbertHFLayer`) is compiled on its own.

        Each distinct block is compiled once, and every application of a shared block reuses its graphs;
        `AlbertHFForPreTraining`'s sparse MLM head with its loss is one more region (the SOP head is not compiled).
        Dynamic shapes by default, for CPUs, where padding removal changes the row count every batch; `dynamic=False`
        where every batch has one shape (a GPU with the collator's `static_shapes`). Why a raised recompile limit:
        BENCHMARKS.md, "What each optimisation bought".

        Args:
            **compile_kwargs: arguments of `torch.compile` (e.g. `mode`), over the defaults `dynamic=True` and
                `recompile_limit=32`. A torch without the per-function `recompile_limit` gets the global
                `torch._dynamo.config.cache_size_limit` raised to that value instead.

        Returns:
            The model itself.
        """
        compile_kwargs = {"dynamic": True, "recompile_limit": 32, **compile_kwargs}
        if "recompile_limit" not in (torch.compile.__kwdefaults__ or {}):  # torch < 2.13: only a global limit
            limit = compile_kwargs.pop("recompile_limit")
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
        for module in self.modules():
            if isinstance(module, AlbertHFLayer):
                module.compile(**compile_kwargs)
            elif isinstance(module, AlbertHFTransformer):
                module.blocks_compiled = True
        if hasattr(self, "mlm_logits_and_loss"):
            self.mlm_logits_and_loss = torch.compile(sparse_mlm_logits_and_loss, **compile_kwargs)
        return self

    # (Auto class, class path) when a checkpoint of this class must load through an Auto class whose default
    # albert_hf class is another one (the answerability QA head).
    _auto_map_entry = None

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers 5 writes into auto_map only the saved class (and AutoConfig), so other Auto classes could not
        # load the checkpoint as remote code; write every head.
        self.config.auto_map = dict(AUTO_MAP)
        if self._auto_map_entry:
            self.config.auto_map[self._auto_map_entry[0]] = self._auto_map_entry[1]
        return super().save_pretrained(save_directory, *args, **kwargs)


@dataclass
class AlbertHFForPreTrainingOutput(ModelOutput):
    """Output of `AlbertHFForPreTraining`.

    loss: mlm_loss + sop_loss (whichever labels were given).
    prediction_logits: (batch, seq, vocab) without labels; with `labels`, only the masked positions,
        (num_masked, vocab) in row-major order of `labels != -100` (the official sparse MLM head); with
        `masked_lm_positions` too, (batch * P, vocab), one row per position, those of weight 0 included.
    sop_logits: (batch, 2); label 0 = original order, 1 = swapped.
    """

    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None
    sop_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    mlm_loss: torch.Tensor | None = None
    sop_loss: torch.Tensor | None = None


class AlbertHFModel(AlbertHFPreTrainedModel):
    """The bare ALBERT encoder: embeddings, shared layers, and the tanh pooler over [CLS]."""

    # loading the backbone from a checkpoint with heads is expected to leave the heads out
    _keys_to_ignore_on_load_unexpected = [r"position_ids", r"token_type_ids", r"^predictions\.", r"^sop_classifier\."]

    def __init__(self, config: AlbertHFConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = AlbertHFEmbeddings(config)
        self.encoder = AlbertHFTransformer(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.pooler_activation = nn.Tanh() if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def is_plain_forward(self, attention_mask, kwargs) -> bool:
        """A plain forward, whose unread work may be skipped (padding removal, `last_layer_positions`): no
        per-layer outputs requested (their (batch, seq) shape is the API), a plain (batch, seq) mask or none, and
        an attention kernel we slice and re-pad for."""
        recording = any(
            kwargs.get(f"output_{name}", getattr(self.config, f"output_{name}", False))
            for name in ("hidden_states", "attentions")
        )
        return (
            not recording
            and (attention_mask is None or attention_mask.dim() == 2)
            and self.config._attn_implementation in ("sdpa", "eager")
        )

    def bidirectional_mask(self, embeddings, attention_mask, read_padding: bool):
        """The attention kernel's mask. transformers' reads from the device whether anything is padded (None when
        not, so SDPA can run its unmasked kernel): a host sync, free on a CPU and needed there to pack the real
        tokens, but one wait for the GPU per micro-batch elsewhere. Without `read_padding`, SDPA gets the boolean
        (batch, 1, 1, seq) mask as it is, without that read."""
        if (
            read_padding
            or attention_mask is None
            or attention_mask.dim() != 2
            or self.config._attn_implementation != "sdpa"
        ):
            return create_bidirectional_mask(
                config=self.config, inputs_embeds=embeddings, attention_mask=attention_mask
            )
        return attention_mask.bool()[:, None, None, :]

    @merge_with_config_defaults
    @capture_outputs
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        last_layer_positions=None,
        keep_padding=False,
        **kwargs,
    ) -> BaseModelOutputWithPooling:
        r"""The encoder's hidden states, and the pooled [CLS] output.

        Args:
            {inputs}
            last_layer_positions (`torch.LongTensor` of shape `(batch_size, Q)`, *optional*): compute the last block
                only at these positions of each row (keys and values still cover every token); `last_hidden_state` is
                then `(batch_size, Q, hidden_size)` and the pooler reads its first column, so put the [CLS] position
                0 first. The heads that read few positions (pretraining with labels, sequence classification,
                multiple choice) use it: the last block then costs a fraction of the others.
            keep_padding (`bool`, defaults to `False`): the caller uses the outputs at padded positions (the span QA
                head's softmax covers every position, as the official code's does), so the padding is not removed:
                its outputs are then the model's own values, the same whatever else is in the batch.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `BaseModelOutputWithPooling`: `last_hidden_state` of shape `(batch_size, sequence_length, hidden_size)`
            (zeros at padded positions where the padding was removed, see `unpad_inputs`); `pooler_output`
            `(batch_size, hidden_size)`, tanh(dense) of the first position, or None without the pooling layer;
            `hidden_states` (the projected embeddings, then the output of every block application:
            1 + num_hidden_layers * inner_group_num tensors) and `attentions` when asked for.

        Raises:
            ValueError: both or neither of `input_ids` and `inputs_embeds`; a sequence longer than
                `max_position_embeddings` without `position_ids`; `last_layer_positions` with per-layer outputs, a
                mask that is not `(batch_size, sequence_length)` or an attention kernel other than sdpa and eager.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds")
        if last_layer_positions is not None and not self.is_plain_forward(attention_mask, kwargs):
            raise ValueError(
                "last_layer_positions needs a (batch, seq) attention_mask, sdpa or eager attention and "
                "no output_hidden_states / output_attentions"
            )
        embeddings = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        # Padding removal (`unpad_inputs`); not when this forward itself is compiled, where the pack's
        # data-dependent size would break the graph (`compile_blocks` compiles only the blocks, and keeps it).
        unpad = (
            self.config.unpad_inputs
            and not keep_padding
            and RealTokens.pays_on(embeddings.device)
            and self.is_plain_forward(attention_mask, kwargs)
            and not torch.compiler.is_compiling()
        )
        mask = self.bidirectional_mask(embeddings, attention_mask, read_padding=unpad)
        real_tokens = RealTokens.pack_if_smaller(attention_mask) if unpad and mask is not None else None
        if real_tokens is not None:
            embeddings = real_tokens.gather(embeddings)
        sequence_output = self.encoder(embeddings, mask, real_tokens, last_layer_positions, **kwargs).last_hidden_state
        if real_tokens is not None and last_layer_positions is None:
            sequence_output = real_tokens.scatter(sequence_output)
        pooled_output = None
        if self.pooler is not None:
            pooled_output = self.pooler_activation(self.pooler(sequence_output[:, 0]))
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled_output)


class AlbertHFMLMHead(nn.Module):
    """dense H->E, activation, LayerNorm(E), then logits through the tied word table (E->V) plus `bias`."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.activation = activation_function(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_size, config.vocab_size)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))  # tied to decoder.bias by _tied_weights_keys

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.activation(self.dense(hidden_states))))


class AlbertHFSOPHead(nn.Module):
    """Sentence-order prediction: a 2-way linear layer on the pooled output, without dropout (official)."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled_output: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled_output)


def masked_positions(masked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[CLS] and each row's masked positions (`masked` = labels != -100, ascending), padded to the longest row,
    as `last_layer_positions` for the pretraining heads: (positions (batch, 1 + Q), valid (batch, Q))."""
    counts = masked.sum(1)
    width = int(counts.max()) if masked.numel() else 0
    order = torch.argsort((~masked).to(torch.uint8), dim=1, stable=True)[:, :width]  # masked first, in order
    valid = torch.arange(width, device=masked.device) < counts.unsqueeze(1)
    cls = torch.zeros(masked.shape[0], 1, dtype=order.dtype, device=masked.device)
    return torch.cat([cls, order], dim=1), valid


class SummedSoftmaxCrossEntropy(torch.autograd.Function):
    """sum_i -log softmax(logits_i)[target_i] in fp32, as F.cross_entropy(reduction="sum"), its backward from the
    kept softmax (`probs * g` minus g at the targets) in fewer passes (BENCHMARKS.md, "Where the time goes outside
    the matmuls")."""

    @staticmethod
    def forward(ctx, logits, targets, weights=None):
        """`weights` (rows,), optional: each row's loss is multiplied by its weight (0 drops a padding row)."""
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        picked = probs.gather(1, targets.unsqueeze(1)).squeeze(1)
        ctx.save_for_backward(probs, targets, weights)
        ctx.logits_dtype = logits.dtype
        # -log p: exact for p down to fp32's smallest normal number (a loss of 87 per token); below, capped there.
        losses = -picked.clamp_min(torch.finfo(torch.float32).tiny).log()
        return (losses if weights is None else losses * weights).sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss):
        probs, targets, weights = ctx.saved_tensors
        # In place: a fresh (masked tokens x vocabulary) fp32 tensor costs its page faults on every step. A second
        # backward through the same graph (retain_graph) then fails autograd's saved-tensor version check.
        grad = probs.mul_(grad_loss)
        grad.scatter_add_(1, targets.unsqueeze(1), (-grad_loss).expand(targets.shape[0], 1).contiguous())
        if weights is not None:
            grad.mul_(weights.unsqueeze(1))
        return grad.to(ctx.logits_dtype), None, None


def sparse_mlm_logits_and_loss(head, masked_hidden_states, targets, weights=None):
    """The MLM head only at the masked tokens (the official `masked_lm_positions` gather).

    Returns (logits of shape (num_masked, V), mean cross-entropy over the masked tokens of the whole batch).
    A batch without masked tokens gives loss 0, as the official `/ (sum(weights) + 1e-5)` does. With `weights`
    (rows,), the official fixed-size form: rows of weight 0 pad it, and the mean is over the weights' sum, a
    device tensor, so no count is read from the device.
    """
    logits = head(masked_hidden_states)
    if weights is None:
        return logits, SummedSoftmaxCrossEntropy.apply(logits, targets) / max(targets.numel(), 1)
    return logits, SummedSoftmaxCrossEntropy.apply(logits, targets, weights) / weights.sum().clamp(min=1)


_TIED_DECODER = {
    "predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
    "predictions.decoder.bias": "predictions.bias",
}


class AlbertHFForPreTraining(AlbertHFPreTrainedModel):
    """ALBERT with the MLM and SOP heads; loss = MLM loss + SOP loss, both also returned separately."""

    _tied_weights_keys = _TIED_DECODER

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.albert = AlbertHFModel(config)
        self.predictions = AlbertHFMLMHead(config)
        self.sop_classifier = AlbertHFSOPHead(config)
        self.mlm_logits_and_loss = sparse_mlm_logits_and_loss  # `compile_blocks` compiles it
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.predictions.decoder = new_embeddings
        self.predictions.bias = new_embeddings.bias

    def _last_layer_positions(self, labels, masked, masked_lm_positions, attention_mask, kwargs):
        """(positions, valid): with labels only [CLS] and the masked tokens are read, so the last block computes
        just those (not when this forward itself is compiled, where their data-dependent count would break the
        graph); (None, None) where it computes every position."""
        if labels is None or not self.albert.is_plain_forward(attention_mask, kwargs) or torch.compiler.is_compiling():
            return None, None
        if masked_lm_positions is not None:
            cls = masked_lm_positions.new_zeros(masked_lm_positions.shape[0], 1)
            return torch.cat([cls, masked_lm_positions], dim=1), None
        return masked_positions(masked)

    def _mlm(self, sequence_output, labels, masked, positions, valid, masked_lm_positions, masked_lm_weights):
        """(prediction logits, MLM loss or None): at the masked positions when there are labels (the official
        fixed-size form when `masked_lm_positions` is given), else at every position."""
        if labels is None:
            return self.predictions(sequence_output), None
        if masked_lm_positions is not None:
            if positions is None:  # the whole sequence was computed: take the positions from it
                index = masked_lm_positions.unsqueeze(-1).expand(-1, -1, sequence_output.shape[-1])
                states = sequence_output.gather(1, index)
            else:
                states = sequence_output[:, 1:]
            # padding rows (weight 0) may point at a position without a target: any id serves there
            targets = labels.gather(1, masked_lm_positions).clamp(min=0)
            return self.mlm_logits_and_loss(
                self.predictions, states.flatten(0, 1), targets.flatten(), masked_lm_weights.flatten().float()
            )
        # row-major order of `masked` either way: the positions are ascending within each row
        masked_states = sequence_output[:, 1:][valid] if positions is not None else sequence_output[masked]
        return self.mlm_logits_and_loss(self.predictions, masked_states, labels[masked])

    @can_return_tuple
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        sentence_order_label=None,
        masked_lm_positions=None,
        masked_lm_weights=None,
        **kwargs,
    ) -> AlbertHFForPreTrainingOutput:
        r"""The MLM and SOP logits, and their losses for the labels given.

        Args:
            {inputs}
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): MLM targets, -100
                where not predicted. When given, the MLM head runs only at the predicted positions (see
                `AlbertHFForPreTrainingOutput`).
            sentence_order_label (`torch.LongTensor` of shape `(batch_size,)`, *optional*): 0 = original order,
                1 = swapped.
            masked_lm_positions (`torch.LongTensor` of shape `(batch_size, P)`, *optional*), masked_lm_weights
                (`torch.FloatTensor` of shape `(batch_size, P)`): with `labels`, the same positions in the official
                fixed-size form (`DataCollatorForAlbertPretraining(masked_positions=True)`), weight 0 for padding;
                pass both. The head then runs at all batch * P positions, sized by their shape: nothing is read from
                the device to size it (on a GPU such reads stall the queue).
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `AlbertHFForPreTrainingOutput`: `loss` (mlm_loss + sop_loss, whichever labels were given; None with
            neither), `prediction_logits`, `sop_logits` `(batch_size, 2)`, `mlm_loss` (the mean over the batch's
            predicted tokens, weighted by `masked_lm_weights` when given), `sop_loss`, and `hidden_states` /
            `attentions` when asked for.
        """
        masked = labels != -100 if labels is not None and masked_lm_positions is None else None
        positions, valid = self._last_layer_positions(labels, masked, masked_lm_positions, attention_mask, kwargs)
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            last_layer_positions=positions,
            return_dict=True,
            **kwargs,
        )
        sop_logits = self.sop_classifier(outputs.pooler_output)
        prediction_logits, mlm_loss = self._mlm(
            outputs.last_hidden_state, labels, masked, positions, valid, masked_lm_positions, masked_lm_weights
        )
        loss, sop_loss = mlm_loss, None
        if sentence_order_label is not None:
            sop_loss = F.cross_entropy(sop_logits.float(), sentence_order_label.view(-1))
            loss = sop_loss if loss is None else loss + sop_loss
        return AlbertHFForPreTrainingOutput(
            loss=loss,
            prediction_logits=prediction_logits,
            sop_logits=sop_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            mlm_loss=mlm_loss,
            sop_loss=sop_loss,
        )


def token_cross_entropy(logits, labels, num_items_in_batch=None) -> torch.Tensor:
    """Cross-entropy over the labelled tokens (-100 ignored): their mean, or with Trainer's `num_items_in_batch`
    their sum over that count, so that the micro-batches of an accumulated step add up to the whole step's mean."""
    if num_items_in_batch is None:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
    summed = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), reduction="sum")
    return summed / num_items_in_batch


class AlbertHFForMaskedLM(AlbertHFPreTrainedModel):
    """ALBERT with the MLM head only; full (batch, seq, vocab) logits, as transformers' AlbertForMaskedLM."""

    accepts_loss_kwargs = True  # num_items_in_batch (see AlbertHFPreTrainedModel)

    _tied_weights_keys = _TIED_DECODER

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.albert = AlbertHFModel(config, add_pooling_layer=False)
        self.predictions = AlbertHFMLMHead(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.predictions.decoder

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.predictions.decoder = new_embeddings
        self.predictions.bias = new_embeddings.bias

    @can_return_tuple
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> MaskedLMOutput:
        r"""The MLM logits at every position, and the loss for `labels`.

        Args:
            {inputs}
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): MLM targets, -100
                where not predicted.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*): Trainer's count of the labelled tokens of the
                whole accumulated step; the loss is then the sum over this count instead of the batch's mean.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `MaskedLMOutput`: `loss` (cross-entropy over the labelled tokens; None without `labels`), `logits` of
            shape `(batch_size, sequence_length, vocab_size)`, and `hidden_states` / `attentions` when asked for.
        """
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.predictions(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, num_items_in_batch)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


def cls_only(model: AlbertHFModel, input_ids, inputs_embeds, attention_mask, kwargs) -> torch.Tensor | None:
    """`last_layer_positions` for heads that read only the pooled [CLS] output, when allowed."""
    if not model.is_plain_forward(attention_mask, kwargs):
        return None
    rows = input_ids if input_ids is not None else inputs_embeds
    return torch.zeros(rows.shape[0], 1, dtype=torch.long, device=rows.device)


class AlbertHFForSequenceClassification(AlbertHFPreTrainedModel):
    """Pooled output -> dropout -> linear. Regression (MSE) when num_labels == 1, as GLUE's STS-B needs."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.albert = AlbertHFModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        **kwargs,
    ) -> SequenceClassifierOutput:
        r"""Class logits (or a regression value) from the pooled [CLS] output.

        Args:
            {inputs}
            labels (`torch.Tensor`, *optional*): `(batch_size,)` class ids, `(batch_size,)` floats for regression
                (`num_labels == 1`), or `(batch_size, num_labels)` floats for multi-label classification. When
                `config.problem_type` is None, it is set from the first labels seen: regression when
                `num_labels == 1`, else single-label for integer labels and multi-label for float ones.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `SequenceClassifierOutput`: `loss` (MSE, cross-entropy or binary cross-entropy by the problem type; None
            without `labels`), `logits` of shape `(batch_size, num_labels)`, and `hidden_states` / `attentions` when
            asked for.
        """
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            last_layer_positions=cls_only(self.albert, input_ids, inputs_embeds, attention_mask, kwargs),
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:
            if self.config.problem_type is None:
                if self.num_labels == 1:
                    self.config.problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    self.config.problem_type = "single_label_classification"
                else:
                    self.config.problem_type = "multi_label_classification"
            if self.config.problem_type == "regression":
                loss = F.mse_loss(logits.float().view(labels.shape[0], -1).squeeze(-1), labels.float().squeeze(-1))
            elif self.config.problem_type == "single_label_classification":
                loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class AlbertHFForMultipleChoice(AlbertHFPreTrainedModel):
    """Each (context, choice) pair is encoded; pooled output -> dropout -> linear(H, 1); softmax over choices."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.albert = AlbertHFModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        **kwargs,
    ) -> MultipleChoiceModelOutput:
        r"""One score per choice, from the pooled output of each (context, choice) pair.

        Args:
            input_ids (`torch.LongTensor` of shape `(batch_size, num_choices, sequence_length)`): token ids; or
                `inputs_embeds`.
            attention_mask, token_type_ids, position_ids (`torch.Tensor` of shape `(batch_size, num_choices,
                sequence_length)`, *optional*): as in `AlbertHFModel.forward`, per choice.
            inputs_embeds (`torch.FloatTensor` of shape `(batch_size, num_choices, sequence_length, embedding_size)`,
                *optional*): word embeddings instead of `input_ids`.
            labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*): index of the correct choice.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `MultipleChoiceModelOutput`: `loss` (cross-entropy over the choices; None without `labels`), `logits` of
            shape `(batch_size, num_choices)`, and `hidden_states` / `attentions` (of the `batch_size * num_choices`
            encoded pairs) when asked for.
        """
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(tensor):
            return None if tensor is None else tensor.reshape(-1, *tensor.shape[2:])

        input_ids, attention_mask, inputs_embeds = flat(input_ids), flat(attention_mask), flat(inputs_embeds)
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=flat(token_type_ids),
            position_ids=flat(position_ids),
            inputs_embeds=inputs_embeds,
            last_layer_positions=cls_only(self.albert, input_ids, inputs_embeds, attention_mask, kwargs),
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output)).view(-1, num_choices)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class AlbertHFForQuestionAnswering(AlbertHFPreTrainedModel):
    """Extractive QA: a linear layer gives start and end logits at every position (SQuAD v1.1 head)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        # AutoModelForQuestionAnswering resolves to this class (and passes the config): a checkpoint saved from the
        # answerability head must come back as that head, not as this one with its weights dropped.
        config = kwargs.get("config")
        saved_as = getattr(config, "architectures", None) or ()
        if cls is AlbertHFForQuestionAnswering and "AlbertHFForQuestionAnsweringWithAnswerability" in saved_as:
            return AlbertHFForQuestionAnsweringWithAnswerability.from_pretrained(
                pretrained_model_name_or_path, *args, **kwargs
            )
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.albert = AlbertHFModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @can_return_tuple
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput:
        r"""Start and end logits of the answer span at every position (padding included).

        Args:
            {inputs}
            start_positions, end_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*): the answer's
                first and last token; positions past the end of the sequence are left out of the loss.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `QuestionAnsweringModelOutput`: `loss` (the mean of the start and end cross-entropies, when both positions
            are given), `start_logits` and `end_logits` of shape `(batch_size, sequence_length)`, and
            `hidden_states` / `attentions` when asked for.
        """
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            keep_padding=True,  # the softmax over positions includes the padding
            **kwargs,
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).unbind(dim=-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions outside the sequence are ignored, as in transformers.
            ignored = start_logits.shape[1]
            start_positions = start_positions.view(-1).clamp(0, ignored)
            end_positions = end_positions.view(-1).clamp(0, ignored)
            start_loss = F.cross_entropy(start_logits.float(), start_positions, ignore_index=ignored)
            end_loss = F.cross_entropy(end_logits.float(), end_positions, ignore_index=ignored)
            loss = (start_loss + end_loss) / 2
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits.contiguous(),
            end_logits=end_logits.contiguous(),
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class AlbertHFForTokenClassification(AlbertHFPreTrainedModel):
    """Sequence output -> dropout -> linear(H, num_labels) per token; labels -100 are ignored."""

    accepts_loss_kwargs = True  # num_items_in_batch (see AlbertHFPreTrainedModel)

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.albert = AlbertHFModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        num_items_in_batch=None,
        **kwargs,
    ) -> TokenClassifierOutput:
        r"""Label logits for every token.

        Args:
            {inputs}
            labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*): label ids, -100 where
                not scored.
            num_items_in_batch (`int` or `torch.Tensor`, *optional*): Trainer's count of the labelled tokens of the
                whole accumulated step; the loss is then the sum over this count instead of the batch's mean.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `TokenClassifierOutput`: `loss` (cross-entropy over the labelled tokens; None without `labels`), `logits`
            of shape `(batch_size, sequence_length, num_labels)`, and `hidden_states` / `attentions` when asked for.
        """
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, num_items_in_batch)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


# ----------------------------------------------------------------------------------------------------------------
# The official ALBERT SQuAD v2.0 head (XLNet-style): `create_v2_model` of google-research/albert's squad_utils.py.
# - start: dense H->1 per position, masked by p_mask (-1e30), log-softmax;
# - end: [hidden; hidden at the start] -> dense 2H->H, tanh, LayerNorm, dense H->1, p_mask, log-softmax; in
#   training the gold start is used, at inference a beam of `start_n_top` starts x `end_n_top` ends;
# - answerability: [start-probability-weighted hidden state; [CLS] hidden state] -> dense 2H->H, tanh, dropout,
#   dense H->1 without bias = `cls_logits` (higher = more likely unanswerable);
# - loss = (start NLL + end NLL) / 2 + BCE(cls_logits, is_impossible) / 2.

MASKED = 1e30  # the official p_mask penalty


@dataclass
class AlbertHFAnswerabilityOutput(ModelOutput):
    """Training (start_positions given): loss, start_log_probs, end_log_probs (end conditioned on the gold start),
    cls_logits. Inference: the beam, start_top_* (batch, start_n_top) and end_top_* (batch, start_n_top *
    end_n_top, index i * end_n_top + j = j-th end of the i-th start), and cls_logits (batch,)."""

    loss: torch.Tensor | None = None
    start_log_probs: torch.Tensor | None = None
    end_log_probs: torch.Tensor | None = None
    start_top_log_probs: torch.Tensor | None = None
    start_top_index: torch.Tensor | None = None
    end_top_log_probs: torch.Tensor | None = None
    end_top_index: torch.Tensor | None = None
    cls_logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


def masked_log_softmax(logits: torch.Tensor, p_mask: torch.Tensor) -> torch.Tensor:
    """Official masking: logits * (1 - p_mask) - 1e30 * p_mask, then log-softmax over positions (last dim)."""
    logits = logits.float() * (1 - p_mask) - MASKED * p_mask
    return F.log_softmax(logits, dim=-1)


class AlbertHFEndHead(nn.Module):
    """End logits from each position's hidden state joined with the hidden state at a chosen start."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.dense_0 = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dense_1 = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states: torch.Tensor, start_states: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dense_0(torch.cat([hidden_states, start_states], dim=-1)))
        return self.dense_1(self.LayerNorm(x)).squeeze(-1)


class AlbertHFAnswerClassHead(nn.Module):
    """Answerability logit from the start-weighted hidden state and the [CLS] one (no end dependency, so each
    window has one logit)."""

    def __init__(self, config: AlbertHFConfig):
        super().__init__()
        self.dense_0 = nn.Linear(2 * config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.dense_1 = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, hidden_states: torch.Tensor, start_probs: torch.Tensor) -> torch.Tensor:
        start_feature = torch.einsum("blh,bl->bh", hidden_states, start_probs.to(hidden_states.dtype))
        cls_feature = hidden_states[:, 0]
        x = torch.tanh(self.dense_0(torch.cat([start_feature, cls_feature], dim=-1)))
        return self.dense_1(self.dropout(x)).squeeze(-1)


def answerability_loss(start_log_probs, end_log_probs, cls_logits, start_positions, end_positions, is_impossible):
    """The official SQuAD v2.0 head's loss: (start NLL + end NLL) / 2, plus BCE(cls_logits, is_impossible) / 2 when
    the windows' answerability is given."""
    start_loss = -start_log_probs.gather(1, start_positions.view(-1, 1)).mean()
    end_loss = -end_log_probs.gather(1, end_positions.view(-1, 1)).mean()
    loss = (start_loss + end_loss) / 2
    if is_impossible is not None:
        loss = loss + F.binary_cross_entropy_with_logits(cls_logits.float(), is_impossible.view(-1).float()) / 2
    return loss


class AlbertHFForQuestionAnsweringWithAnswerability(AlbertHFPreTrainedModel):
    """ALBERT with the official SQuAD v2.0 head. `config.start_n_top` / `config.end_n_top` (default 5) size the
    inference beam. Inputs as AlbertHFForQuestionAnswering plus `p_mask` (1 = not a possible answer position)
    and, for training, `is_impossible` (1.0 when the window does not contain the answer)."""

    _auto_map_entry = (
        "AutoModelForQuestionAnswering",
        "modeling_albert_hf.AlbertHFForQuestionAnsweringWithAnswerability",
    )

    def __init__(self, config: AlbertHFConfig):
        super().__init__(config)
        self.start_n_top = getattr(config, "start_n_top", 5)
        self.end_n_top = getattr(config, "end_n_top", 5)
        self.albert = AlbertHFModel(config, add_pooling_layer=False)
        self.start_logits = nn.Linear(config.hidden_size, 1)
        self.end_logits = AlbertHFEndHead(config)
        self.answer_class = AlbertHFAnswerClassHead(config)
        self.post_init()

    @can_return_tuple
    @_document_inputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        p_mask=None,
        start_positions=None,
        end_positions=None,
        is_impossible=None,
        **kwargs,
    ) -> AlbertHFAnswerabilityOutput:
        r"""The official SQuAD v2.0 head: span log-probabilities and an answerability logit.

        Args:
            {inputs}
            p_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*): 1 where no answer may
                start or end (the question, [SEP], padding), 0 elsewhere ([CLS], the context); None allows every
                position.
            start_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*): the gold start; given, the end
                is conditioned on it (training), else the beam search runs (inference).
            end_positions (`torch.LongTensor` of shape `(batch_size,)`, *optional*): the gold end; with
                `start_positions` it gives the span loss.
            is_impossible (`torch.Tensor` of shape `(batch_size,)`, *optional*): 1.0 where the window holds no answer;
                with both positions it adds the answerability loss.
            **kwargs: `output_hidden_states`, `output_attentions` (eager attention only), `return_dict` (False: a
                tuple), and the attention kernel's own arguments.

        Returns:
            `AlbertHFAnswerabilityOutput`. With `start_positions`: `loss` ((start NLL + end NLL) / 2, plus
            BCE(cls_logits, is_impossible) / 2; None without `end_positions`), `start_log_probs` and `end_log_probs`
            of shape `(batch_size, sequence_length)`, and `cls_logits` `(batch_size,)`. Without: the beam,
            `start_top_log_probs` / `start_top_index` `(batch_size, start_n_top)` and `end_top_log_probs` /
            `end_top_index` `(batch_size, start_n_top * end_n_top)`, and `cls_logits`. Both: `hidden_states` /
            `attentions` when asked for.
        """
        outputs = self.albert(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        batch, length, width = hidden.shape
        p_mask = torch.zeros(batch, length, device=hidden.device) if p_mask is None else p_mask.float()
        start_log_probs = masked_log_softmax(self.start_logits(hidden).squeeze(-1), p_mask)
        cls_logits = self.answer_class(hidden, start_log_probs.exp())
        result = dict(cls_logits=cls_logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)

        if start_positions is not None:
            start_positions = start_positions.view(-1)
            start_states = hidden[torch.arange(batch, device=hidden.device), start_positions]
            end_logits = self.end_logits(hidden, start_states[:, None].expand(-1, length, -1))
            end_log_probs = masked_log_softmax(end_logits, p_mask)
            loss = None
            if end_positions is not None:
                loss = answerability_loss(
                    start_log_probs, end_log_probs, cls_logits, start_positions, end_positions, is_impossible
                )
            return AlbertHFAnswerabilityOutput(
                loss=loss, start_log_probs=start_log_probs, end_log_probs=end_log_probs, **result
            )

        # Inference: the beam. (batch, k) starts; for each, ends over all positions.
        start_top_log_probs, start_top_index = start_log_probs.topk(self.start_n_top, dim=-1)
        start_states = hidden.gather(1, start_top_index[:, :, None].expand(-1, -1, width))  # (batch, k, H)
        end_logits = self.end_logits(
            hidden[:, None].expand(-1, self.start_n_top, -1, -1), start_states[:, :, None].expand(-1, -1, length, -1)
        )  # (batch, k, length)
        end_log_probs = masked_log_softmax(end_logits, p_mask[:, None])
        end_top_log_probs, end_top_index = end_log_probs.topk(self.end_n_top, dim=-1)  # (batch, k, end_n_top)
        return AlbertHFAnswerabilityOutput(
            start_top_log_probs=start_top_log_probs,
            start_top_index=start_top_index,
            end_top_log_probs=end_top_log_probs.reshape(batch, -1),
            end_top_index=end_top_index.reshape(batch, -1),
            **result,
        )


__all__ = [
    "AUTO_MAP",
    "AlbertHFPreTrainedModel",
    "AlbertHFModel",
    "AlbertHFForPreTraining",
    "AlbertHFForPreTrainingOutput",
    "AlbertHFForMaskedLM",
    "AlbertHFForSequenceClassification",
    "AlbertHFForMultipleChoice",
    "AlbertHFForQuestionAnswering",
    "AlbertHFForTokenClassification",
    "AlbertHFForQuestionAnsweringWithAnswerability",
    "AlbertHFAnswerabilityOutput",
]
