"""Layer transitions, the paper's Figure 1: how far each layer moves its input embedding.

For layer l with input x = hidden_states[l] and output y = hidden_states[l + 1], per token:
  L2 distance   ||y - x||_2
  cosine        x.y / (||x|| ||y||), also reported as an angle in degrees (the paper's y-axis)
averaged over the real (non-padding) tokens of all texts. ALBERT's all-shared layers give smooth curves,
BERT-style unshared layers oscillate (Lan et al. 2020, section 4.5 / Figure 1).

    python -m albert_hf.analysis.transitions --model out/all --model out/none --texts texts.txt --out fig1.png

writes fig1.png (two panels: L2 distance and angle per layer, one line per model) and fig1.csv.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from ..errors import InputError, first_line
from ..runtime.cli import run_entry_point

CSV_FIELDS = ("model", "layer", "l2", "cosine", "angle_degrees", "tokens")


def transition_sums(hidden_states, attention_mask=None) -> dict:
    """Per-layer sums over real tokens, to be added up over batches: {"l2", "cosine", "angle"} tensors of
    shape (num_layers,) and "tokens" (the count). `hidden_states`: 1 + num_layers tensors (batch, seq, H)."""
    if len(hidden_states) < 2:
        raise ValueError(f"Need at least 2 hidden states (input and output of a layer), got {len(hidden_states)}")
    states = torch.stack([h.float() for h in hidden_states])  # (layers + 1, batch, seq, H)
    x, y = states[:-1], states[1:]
    if attention_mask is None:
        attention_mask = torch.ones(states.shape[1:3], dtype=torch.bool, device=states.device)
    real = attention_mask.bool()
    l2 = (y - x).norm(dim=-1)  # (layers, batch, seq)
    cosine = torch.nn.functional.cosine_similarity(x, y, dim=-1, eps=1e-12).clamp(-1.0, 1.0)
    angle = torch.rad2deg(torch.arccos(cosine))
    return {
        "l2": l2[:, real].sum(-1).double(),
        "cosine": cosine[:, real].sum(-1).double(),
        "angle": angle[:, real].sum(-1).double(),
        "tokens": int(real.sum()),
    }


def layer_transitions(hidden_states, attention_mask=None) -> dict:
    """Mean over real tokens, per layer: {"l2", "cosine", "angle_degrees"} lists of num_layers floats.

    Args:
        hidden_states: 1 + num_layers tensors of shape `(batch_size, sequence_length, hidden_size)`, the first
            layer's input then every layer's output (a model's `hidden_states`).
        attention_mask (`torch.Tensor` of shape `(batch_size, sequence_length)`, *optional*): 1 at real tokens, 0 at
            padding; None counts every position.

    Returns:
        {"l2", "cosine", "angle_degrees"}: lists of num_layers floats, layer 1 first; "tokens": the number of real
        tokens averaged over.

    Raises:
        ValueError: fewer than 2 hidden states, or no real token.
    """
    return _means(transition_sums(hidden_states, attention_mask))


def _means(sums: dict) -> dict:
    if sums["tokens"] == 0:
        raise ValueError("No real token: every position is padding")
    n = sums["tokens"]
    return {
        "l2": (sums["l2"] / n).tolist(),
        "cosine": (sums["cosine"] / n).tolist(),
        "angle_degrees": (sums["angle"] / n).tolist(),
        "tokens": n,
    }


@torch.no_grad()
def model_transitions(model, tokenizer, texts, max_seq_length: int = 128, batch_size: int = 16) -> dict:
    """Layer transitions of `model` over `texts` (each text one sequence, cut at max_seq_length).

    Any model that returns `hidden_states` with output_hidden_states=True; for albert_hf, hidden_states[0] is
    the projected embedding (the first layer's input), then one entry per block application.

    Args:
        model: the model to measure, put in eval mode; the batches go to the device of its parameters.
        tokenizer: the model's tokenizer.
        texts: the texts, one sequence each; blank ones are skipped.
        max_seq_length (`int`, defaults to 128): the tokens kept of each text.
        batch_size (`int`, defaults to 16): texts per forward pass.

    Returns:
        The means over every real token of the texts, as `layer_transitions` gives them.

    Raises:
        ValueError: no non-blank text.
    """
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise ValueError("No non-empty text to measure the layer transitions on")
    model.eval()
    device = next(model.parameters()).device
    totals = None
    for start in range(0, len(texts), batch_size):
        batch = _encode(tokenizer, texts[start : start + batch_size], max_seq_length)
        batch = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        outputs = model(**batch, output_hidden_states=True)
        sums = transition_sums(outputs.hidden_states, batch["attention_mask"])
        totals = sums if totals is None else {k: totals[k] + sums[k] for k in totals}
    return _means(totals)


def _encode(tokenizer, texts, max_seq_length):
    """tokenizer(texts) padded and truncated, without leaving padding/truncation switched on in the Rust
    backend: fast tokenizers keep that state, and the pretraining pipeline (which calls the backend directly)
    would then pad every sentence."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    saved = (backend.truncation, backend.padding) if backend is not None else None
    try:
        return tokenizer(texts, truncation=True, max_length=max_seq_length, padding=True, return_tensors="pt")
    finally:
        if saved is not None:
            backend.no_truncation() if saved[0] is None else backend.enable_truncation(**saved[0])
            backend.no_padding() if saved[1] is None else backend.enable_padding(**saved[1])


# ----------------------------------------------------------------------------------------------------------------
# Command line


def read_texts(path) -> list[str]:
    """One text per line; blank lines are skipped. Errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--texts: {path} is not a file")
    texts = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError(f"--texts: {path} holds no non-empty line")
    return texts


def load_model_and_tokenizer(directory):
    """The encoder and tokenizer saved in `directory` (e.g. a run_pretraining.py output folder)."""
    from transformers import AutoModel, AutoTokenizer

    import albert_hf  # noqa: F401  (registers the albert_hf model type with the Auto classes)

    directory = Path(directory)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"--model: {directory} is not a saved model (no config.json in it)")
    return AutoModel.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


def write_csv(results: dict, path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for name, r in results.items():
            for layer, (l2, cos, angle) in enumerate(zip(r["l2"], r["cosine"], r["angle_degrees"]), start=1):
                writer.writerow(
                    {
                        "model": name,
                        "layer": layer,
                        "l2": f"{l2:.6g}",
                        "cosine": f"{cos:.6g}",
                        "angle_degrees": f"{angle:.6g}",
                        "tokens": r["tokens"],
                    }
                )


def plot(results: dict, path, title: str | None = None) -> None:
    """Figure 1 layout: L2 distance (left) and angle in degrees (right) against the layer, one line per model."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_l2, ax_angle) = plt.subplots(1, 2, figsize=(10, 4))
    for name, r in results.items():
        layers = range(1, len(r["l2"]) + 1)
        ax_l2.plot(layers, r["l2"], marker="o", label=name)
        ax_angle.plot(layers, r["angle_degrees"], marker="o", label=name)
    ax_l2.set(xlabel="layer", ylabel="L2 distance", title="L2 distance (input vs output embedding)")
    ax_angle.set(xlabel="layer", ylabel="angle (degrees)", title="cosine similarity, as an angle")
    for ax in (ax_l2, ax_angle):
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_table(results: dict) -> str:
    lines = [f"{'model':<24} {'layer':>5} {'L2':>10} {'cosine':>8} {'angle':>7}"]
    for name, r in results.items():
        for layer, (l2, cos, angle) in enumerate(zip(r["l2"], r["cosine"], r["angle_degrees"]), start=1):
            lines.append(f"{name[-24:]:<24} {layer:>5} {l2:>10.4f} {cos:>8.4f} {angle:>7.2f}")
    return "\n".join(lines)


def run(
    model_dirs, texts_path, out, csv_path=None, names=None, max_seq_length=128, batch_size=16, max_texts=None
) -> dict:
    """Measure every model on the same texts, write the PNG and CSV, return {name: transitions}."""
    texts = read_texts(texts_path)[:max_texts]
    names = names or [Path(d).name or str(d) for d in model_dirs]
    if len(names) != len(model_dirs):
        raise ValueError(f"{len(names)} --name values for {len(model_dirs)} --model values")
    if len(set(names)) != len(names):  # same folder names in different places: fall back to full paths
        names = [str(d) for d in model_dirs]
    results = {}
    for name, directory in zip(names, model_dirs):
        model, tokenizer = load_model_and_tokenizer(directory)
        results[name] = model_transitions(model, tokenizer, texts, max_seq_length, batch_size)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path = Path(csv_path) if csv_path else out.with_suffix(".csv")
    write_csv(results, csv_path)
    plot(results, out, title=f"Layer transitions over {len(texts)} texts")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Paper Figure 1: L2 distance and cosine similarity between the "
        "input and output embedding of every layer, one line per model."
    )
    parser.add_argument("--model", action="append", required=True, help="saved model folder (repeat for several)")
    parser.add_argument("--name", action="append", default=None, help="legend name per --model (default: folder)")
    parser.add_argument("--texts", required=True, help="text file, one text per line")
    parser.add_argument("--out", default="layer_transitions.png", help="the PNG; the CSV goes next to it")
    parser.add_argument("--csv", default=None, help="CSV path (default: --out with .csv)")
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--max_texts", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        results = run(
            args.model, args.texts, args.out, args.csv, args.name, args.max_seq_length, args.batch_size, args.max_texts
        )
    except (FileNotFoundError, ValueError) as error:
        raise InputError(first_line(error)) from None
    print(format_table(results))
    print(f"wrote {args.out} and {args.csv or Path(args.out).with_suffix('.csv')}")
    return results


if __name__ == "__main__":
    run_entry_point(main)
