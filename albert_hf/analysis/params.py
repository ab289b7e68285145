"""Parameter counts of ALBERT and BERT configurations, side by side with the paper's Tables 1, 3 and 4.

    python -m albert_hf.analysis.params

Every count comes from building the real modules on the meta device and summing numel over model.parameters().
No formulas are used, so a wrong module gives a wrong count. The meta device allocates no memory, so a
2.5B-parameter not-shared xxlarge is as cheap to build as base. model.parameters() yields each shared or tied
tensor once. That means cross-layer sharing and the MLM decoder tied to the word table are counted once, as stored.

The paper rounds to the nearest million and mixes two counting conventions (see HEADER below).
Each row is therefore counted three ways, and the last column says which of them give the paper's number.
"""

import textwrap
from dataclasses import dataclass

import torch

from ..configuration_albert_hf import PRESETS, AlbertHFConfig
from ..modeling_albert_hf import AlbertHFForPreTraining, AlbertHFModel


def count_parameters(config: AlbertHFConfig, heads: bool = False, pooler: bool = True) -> int:
    """Stored parameters of the backbone (embeddings, E->H projection, encoder, plus the pooler if `pooler`).

    `pooler=True` gives the same count as transformers' `AlbertModel`. With `heads=True` the count is for the
    whole `AlbertHFForPreTraining`, i.e. the backbone plus the MLM head (decoder tied to the word table) and the
    SOP head. Shared and tied parameters are counted once.

    Args:
        config (`AlbertHFConfig`): the model to count; it is built on the meta device, without memory.
        heads (`bool`, defaults to `False`): count the whole `AlbertHFForPreTraining`.
        pooler (`bool`, defaults to `True`): include the pooler; `heads=True` needs it.

    Returns:
        The number of stored parameters (`int`).

    Raises:
        ValueError: `heads=True` with `pooler=False`.
    """
    if heads and not pooler:
        raise ValueError("heads=True needs pooler=True: the SOP head reads the pooled output")
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = AlbertHFForPreTraining(config) if heads else AlbertHFModel(config, add_pooling_layer=pooler)
    return sum(p.numel() for p in model.parameters())


# The three counting conventions. "incl. pooler" is transformers' AlbertModel.
CONVENTIONS = {"incl. pooler": dict(), "excl. pooler": dict(pooler=False), "+ MLM/SOP heads": dict(heads=True)}


@dataclass(frozen=True)
class PaperRow:
    """One row of a paper table: our configuration and the paper's count(s), in millions."""

    label: str
    preset: str  # dimensions from PRESETS; `overrides` change the rest
    overrides: dict
    paper: tuple  # ((millions, source), ...): the final paper's number first, then older arXiv versions
    unit: int = 1  # the paper's rounding, in millions (1270M for 1271.1M is 3 significant figures)

    def config(self, **extra) -> AlbertHFConfig:
        return AlbertHFConfig.from_preset(self.preset, **{**self.overrides, **extra})

    def counts(self, **extra) -> dict:
        """{convention: count}, for the conventions in CONVENTIONS."""
        config = self.config(**extra)
        return {name: count_parameters(config, **kwargs) for name, kwargs in CONVENTIONS.items()}

    def rounds_to_paper(self, count: int, value: float) -> bool:
        return round(count / 1e6 / self.unit) * self.unit == value

    def reproduced_by(self, counts: dict) -> str:
        """The conventions whose count rounds to the paper's number, e.g. "excl. pooler", or "none"."""
        parts = []
        for value, source in self.paper:
            hits = ", ".join(name for name, n in counts.items() if self.rounds_to_paper(n, value)) or "none"
            parts.append((f"{value:g}M ({source})" if source else f"{value:g}M", hits))
        if len(parts) == 1:
            return parts[0][1]
        return "; ".join(f"{paper}: {hits}" for paper, hits in parts)


def _bert(label, preset, paper, unit=1):
    # BERT is ALBERT with E = H, no sharing and no E->H projection. V stays 30000, as in the paper's counts.
    hidden = PRESETS[preset]["hidden_size"]
    overrides = dict(embedding_size=hidden, sharing="none", project_when_equal=False)
    return PaperRow(label, preset, overrides, ((paper, ""),), unit)


# project_when_equal=False everywhere: the official code (and the paper) project E->H only when E != H.
# With E != H the flag has no effect.
_SHARING = {"all-shared": "all", "shared-attention": "attention", "shared-FFN": "ffn", "not-shared": "none"}


def _ablation(embedding_size, strategy, paper):
    overrides = dict(embedding_size=embedding_size, sharing=_SHARING[strategy], project_when_equal=False)
    return PaperRow(f"E={embedding_size} {strategy}", "base", overrides, ((paper, ""),))


TABLES = {
    "Table 1: model sizes": [
        _bert("BERT-base", "base", 108),
        _bert("BERT-large", "large", 334),
        _bert("BERT-xlarge", "xlarge", 1270, unit=10),
        PaperRow("ALBERT-base", "base", {}, ((12, ""),)),
        PaperRow("ALBERT-large", "large", {}, ((18, ""),)),
        PaperRow("ALBERT-xlarge", "xlarge", {}, ((60, ""), (59, "arXiv v1"))),
        PaperRow("ALBERT-xxlarge", "xxlarge", {}, ((235, ""), (233, "arXiv v1"))),
    ],
    "Table 3: embedding size E (ALBERT-base dimensions)": [
        _ablation(e, strategy, paper)
        for strategy, papers in (("not-shared", (87, 89, 93, 108)), ("all-shared", (10, 12, 16, 31)))
        for e, paper in zip((64, 128, 256, 768), papers)
    ],
    "Table 4: cross-layer sharing (ALBERT-base dimensions)": [
        _ablation(e, strategy, paper)
        for e, papers in ((768, (31, 83, 57, 108)), (128, (12, 64, 38, 89)))
        for strategy, paper in zip(_SHARING, papers)
    ],
}

# (G, K) at base dimensions, E = 128. G distinct groups of K blocks, applied L = 12 times in total.
LAYER_GROUPS = [(1, 1), (2, 1), (3, 1), (4, 1), (6, 1), (12, 1), (1, 2)]


def layer_group_counts() -> list:
    """[(G, K, count incl. pooler)] for LAYER_GROUPS."""
    return [
        (g, k, count_parameters(AlbertHFConfig.from_preset("base", num_hidden_groups=g, inner_group_num=k)))
        for g, k in LAYER_GROUPS
    ]


def markdown_table(header, rows, right=()) -> str:
    """Aligned plain text that is also a valid markdown table. Columns whose index is in `right` align right."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]

    def line(cells):
        cells = [str(c).rjust(w) if i in right else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if i in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *map(line, rows)])


def paper_string(row: PaperRow) -> str:
    first, *older = row.paper
    return f"{first[0]:g}M" + "".join(f" ({value:g}M in {source})" for value, source in older)


HEADER = """\
Parameter counts: ours (modules built on the meta device) vs the ALBERT paper.
Conventions:
- incl. pooler    = embeddings + E->H projection + encoder + pooler = transformers' AlbertModel. No MLM/SOP heads.
- excl. pooler    = embeddings + E->H projection + encoder.
- + MLM/SOP heads = AlbertForPreTraining: incl. pooler + MLM head (decoder tied to the word table) + SOP head.
- The E->H projection exists only when E != H, as in the official code (project_when_equal=False). transformers
  always creates it. This matters for the E=768 and BERT rows.
- BERT = ALBERT with E = H, no sharing, no projection, and V = 30000 (see the notes for BERT's real V = 30522).
- A paper number is "reproduced" when our count rounds to it. The paper rounds to the nearest million.
The paper mixes conventions: all-shared / shared-attention / shared-FFN rows match incl. pooler;
not-shared / BERT rows match excl. pooler."""


def paper_table(rows) -> tuple:
    """The rendered table, and {label: counts} for the notes."""
    header = ["row", *CONVENTIONS, "paper", "reproduced by"]
    measured, lines = {}, []
    for row in rows:
        counts = measured[row.label] = row.counts()
        numbers = [f"{n:,}" for n in counts.values()]
        lines.append([row.label, *numbers, paper_string(row), row.reproduced_by(counts)])
    return markdown_table(header, lines, right={1, 2, 3, 4}), measured


def stored_size(module, exclude=()) -> int:
    """Parameters of `module`, skipping the tensors in `exclude` (e.g. the word table that the MLM decoder ties)."""
    skip = {id(p) for p in exclude}
    return sum(p.numel() for p in module.parameters() if id(p) not in skip)


def component_sizes(config: AlbertHFConfig) -> dict:
    """{component: stored parameters}, measured on the modules of an AlbertHFForPreTraining built on meta."""
    with torch.device("meta"):
        model = AlbertHFForPreTraining(config)
    backbone, block = model.albert, model.albert.encoder.albert_layer_groups[0].albert_layers[0]
    projection = backbone.encoder.embedding_hidden_mapping_in
    return {
        "embeddings": stored_size(backbone.embeddings),
        "E->H projection": stored_size(projection) if projection is not None else 0,
        "attention block": stored_size(block.attention),
        "FFN block": sum(stored_size(m) for m in (block.ffn, block.ffn_output, block.full_layer_layer_norm)),
        "pooler": stored_size(backbone.pooler),
        "MLM head": stored_size(model.predictions, exclude=backbone.parameters()),  # decoder tied: not counted
        "SOP head": stored_size(model.sop_classifier),
    }


def notes(measured: dict) -> str:
    """Why xlarge and xxlarge miss, and what BERT's real vocab and transformers' projection would change."""
    incl, excl, heads = CONVENTIONS
    xlarge, xxlarge = measured["ALBERT-xlarge"], measured["ALBERT-xxlarge"]
    hidden = PRESETS["xxlarge"]["hidden_size"]
    gap, gap_v1 = 235e6 - xxlarge[incl], 233e6 - xxlarge[incl]
    parts = component_sizes(AlbertHFConfig.from_preset("xxlarge"))

    bert_lines = []
    for row in TABLES["Table 1: model sizes"]:
        if row.label.startswith("BERT"):
            real, value = row.counts(vocab_size=30522), row.paper[0][0]
            verdict = "still rounds" if row.rounds_to_paper(real[excl], value) else "no longer rounds"
            bert_lines.append(
                f"    {row.label}: {real[incl]:,} incl. / {real[excl]:,} excl. pooler; "
                f"{verdict} to the paper's {value:g}M"
            )

    projected = count_parameters(AlbertHFConfig.from_preset("base", embedding_size=768, project_when_equal=True))

    return "\n".join(
        [
            "Notes",
            f"- ALBERT-xlarge is {xlarge[incl] / 1e6:.1f}M ({xlarge[heads] / 1e6:.1f}M with heads): "
            "the 59M of the first arXiv version.",
            "  The final paper's 60M is about 1M too high under every convention.",
            f"- ALBERT-xxlarge is {xxlarge[incl] / 1e6:.1f}M ({xxlarge[heads] / 1e6:.1f}M with heads), "
            "not the paper's 235M (233M in arXiv v1).",
            f"  The gap is +{gap / 1e6:.1f}M (+{gap_v1 / 1e6:.1f}M), about {gap / hidden**2:.2f}*H^2. "
            "No standard component has that size:",
            textwrap.fill(
                ", ".join(f"{name} {n / 1e6:.2f}M" for name, n in parts.items()) + ".",
                110,
                initial_indent="  ",
                subsequent_indent="  ",
            ),
            "  The released config cannot give 235M. transformers documents xxlarge as 223M; we report 223M and",
            "  footnote the paper's 235M.",
            f"- BERT-xlarge: {measured['BERT-xlarge'][excl] / 1e6:.1f}M is quoted as 1270M (3 significant figures), "
            "so that row is checked to 10M.",
            "- BERT's real WordPiece vocab has V = 30522, not 30000, which adds 522*H parameters:",
            *bert_lines,
            "  Only BERT-base tells the two apart, and it rounds to 108M only with V = 30000 (ALBERT's vocab).",
            f"- With transformers' always-on E->H projection, E=768 all-shared would be {projected:,}. That rounds",
            "  to 32M, not the paper's 31M, so the paper counted no projection when E = H.",
        ]
    )


def summary(all_measured: dict) -> str:
    """How many rows each convention reproduces, using the final paper's number."""
    rows = [row for table in TABLES.values() for row in table]
    hit = {
        (row.label, name): row.rounds_to_paper(all_measured[row.label][name], row.paper[0][0])
        for row in rows
        for name in CONVENTIONS
    }
    per_convention = ", ".join(
        f"{name} {sum(hit[row.label, name] for row in rows)}/{len(rows)}" for name in CONVENTIONS
    )
    misses = [row for row in rows if not any(hit[row.label, name] for name in CONVENTIONS)]
    text = (
        f"Table rows reproduced (final paper numbers): {per_convention}; "
        f"by one of them {len(rows) - len(misses)}/{len(rows)}. "
        "Missed: " + (", ".join(f"{row.label} (paper: {row.paper[0][0]:g}M)" for row in misses) or "none") + "."
    )
    return textwrap.fill(text, 110)


def main():
    print(HEADER)
    all_measured = {}
    for title, rows in TABLES.items():
        table, measured = paper_table(rows)
        all_measured.update(measured)  # Tables 3 and 4 share four rows: same label, same config, same counts
        print(f"\n{title}\n\n{table}")

    layers = PRESETS["base"]["num_hidden_layers"]
    print(f"\nLayer groups (num_hidden_groups G, inner_group_num K; ALBERT-base dimensions, E=128, L={layers})")
    print("G groups of K blocks: G*K distinct blocks, applied L*K times.")
    print("Parameters grow with G*K, compute with L*K.\n")
    group_rows = [[g, k, g * k, layers * k, f"{n:,}", f"{n / 1e6:.2f}M"] for g, k, n in layer_group_counts()]
    header = ["G", "K", "distinct blocks", "blocks applied", "incl. pooler", "millions"]
    print(markdown_table(header, group_rows, right={0, 1, 2, 3, 4, 5}))

    print()
    print(notes(all_measured))
    print()
    print(summary(all_measured))


if __name__ == "__main__":
    main()
