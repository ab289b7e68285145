"""The model FLOPs of an ALBERT training step: what throughput in TFLOP/s and MFU are counted in.

Per token of a step, from the config alone (no model is built):

    forward = 2 E H                                    the E -> H projection (when the model has one)
            + A (8 H^2 + 4 H I + 4 S H)                each of the A = num_hidden_layers x inner_group_num layer
                                                       applications: Q, K, V and output (four H x H matmuls), the
                                                       FFN (H x I and I x H), attention's scores and context (two
                                                       S x H products: the length term)
            + (2 H^2 + 2 H C) / S                      once a sequence: the pooler and the sentence head (SOP or
                                                       NSP, C = 2 classes)
            + 2 P (H E + E V) / S                      the MLM head (H -> E, then E -> V) at the P predicted
                                                       positions of a sequence only, as the official code
    step    = 3 forward                                the backward does twice the forward's matmuls

with E, H, I, V the embedding, hidden, intermediate and vocabulary sizes and S the sequence length; a multiply-add
is 2 FLOPs (an M x K by K x N matmul: 2 M K N). Cross-layer sharing changes the parameters, not the compute: a
shared layer counts at every use. Embedding lookups, LayerNorm, GELU, softmax and the optimizer are not matmuls and
are left out, as in the MFU of PaLM's appendix B and of nanoGPT.

These are the model's FLOPs, the same whatever an implementation skips: albert_hf's last layer computes only the
positions read after it (`last_layer_queries`: the predicted ones and [CLS]), and transformers' MLM head runs at
every position (`mlm_rows`); those two arguments give the FLOPs such an implementation executes.

Fine-tuning (`finetuning_flops_per_token`) has the same encoder and a task head instead of the pretraining heads:

    sequence classification      2 H^2 + 2 H C   once a sequence: the pooler and the C-way classifier
    multiple choice              2 H^2 + 2 H     once a sequence (a choice): the pooler and the choice's score
    question answering           4 H             at every position: the start and end logits
    token classification         2 H C           at every position: the C-way tag logits
"""

SENTENCE_CLASSES = 2  # SOP and NSP are both binary
HEADS = ("sequence_classification", "multiple_choice", "question_answering", "token_classification")


def encoder_forward_flops(config, seq_length: int, last_layer_queries: int | None = None) -> float:
    """Forward FLOPs of one sequence through the embedding projection and every layer application (see the module
    docstring); `last_layer_queries`: the rows the last layer computes its queries, attention output and FFN for
    (None: every position)."""
    h, e, i = config.hidden_size, config.embedding_size, config.intermediate_size
    layers = config.num_hidden_layers * config.inner_group_num
    s = seq_length

    def layer(queries: float) -> float:  # projections and FFN at `queries` rows, K and V at all
        return 2 * queries * (2 * h * h + 2 * h * i) + 2 * s * 2 * h * h + 2 * 2 * queries * s * h

    projection = e != h or getattr(config, "project_when_equal", False)
    forward = 2 * s * e * h if projection else 0
    return forward + (layers - 1) * layer(s) + layer(last_layer_queries if last_layer_queries is not None else s)


def training_flops_per_token(
    config,
    seq_length: int,
    predicted_per_sequence: float,
    last_layer_queries: int | None = None,
    mlm_rows: float | None = None,
) -> float:
    """FLOPs of one pretraining step (forward and backward) per token, for sequences of `seq_length` tokens with
    `predicted_per_sequence` masked positions on average (see the module docstring).

    Args:
        config: an AlbertHFConfig (or transformers' AlbertConfig: the same fields).
        seq_length: the tokens of a sequence, padding included (what the model computes).
        predicted_per_sequence: the positions the MLM head predicts in a sequence.
        last_layer_queries: the rows of a sequence the last layer computes its queries, attention output and FFN
            for (keys and values stay at every position); None: every position (the model's FLOPs).
        mlm_rows: the rows of a sequence the MLM head runs at; None: the predicted ones (the model's FLOPs).
    """
    h, e, v = config.hidden_size, config.embedding_size, config.vocab_size
    forward = encoder_forward_flops(config, seq_length, last_layer_queries)  # per sequence from here on
    forward += 2 * h * h + 2 * h * SENTENCE_CLASSES
    forward += 2 * (mlm_rows if mlm_rows is not None else predicted_per_sequence) * (h * e + e * v)
    return 3 * forward / seq_length


def finetuning_flops_per_token(
    config, seq_length: int, head: str, num_labels: int = 2, last_layer_queries: int | None = None
) -> float:
    """FLOPs of one fine-tuning step (forward and backward) per token, for sequences of `seq_length` tokens through
    the encoder and `head` (one of HEADS, with `num_labels` classes where it has them; see the module docstring).
    `last_layer_queries` as in `training_flops_per_token` (albert_hf's pooled heads compute [CLS] only: 1)."""
    if head not in HEADS:
        raise ValueError(f"head must be one of {', '.join(HEADS)}, not {head!r}")
    h, s = config.hidden_size, seq_length
    head_flops = {
        "sequence_classification": 2 * h * h + 2 * h * num_labels,
        "multiple_choice": 2 * h * h + 2 * h,
        "question_answering": 2 * s * h * 2,
        "token_classification": 2 * s * h * num_labels,
    }[head]
    return 3 * (encoder_forward_flops(config, s, last_layer_queries) + head_flops) / s
