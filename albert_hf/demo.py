"""A one-minute tour: build an ALBERT preset, count its parameters, save it, reload it with AutoModel.

    python -m albert_hf.demo [--preset tiny|base|large|xlarge|xxlarge] [--out DIR]
"""

import argparse
import tempfile

import torch
from transformers import AutoModel

from . import AlbertHFConfig, AlbertHFForPreTraining
from .params import count_parameters


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base", help="model size (default: base, 12M parameters)")
    parser.add_argument("--out", default=None, help="where to save (default: a temporary directory)")
    args = parser.parse_args(argv)

    config = AlbertHFConfig.from_preset(args.preset)
    print(f"ALBERT-{args.preset}: V={config.vocab_size} E={config.embedding_size} H={config.hidden_size} "
          f"L={config.num_hidden_layers} heads={config.num_attention_heads} I={config.intermediate_size}")
    for sharing in ("all", "attention", "ffn", "none"):
        shared = AlbertHFConfig.from_preset(args.preset, sharing=sharing)
        print(f"  sharing={sharing:<10} {count_parameters(shared) / 1e6:8.2f}M parameters (backbone with pooler)")

    model = AlbertHFForPreTraining(config).eval()
    out = args.out or tempfile.mkdtemp(prefix="albert_hf_demo_")
    model.save_pretrained(out)
    reloaded = AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    ids = torch.randint(5, config.vocab_size, (1, 16))
    with torch.no_grad():
        same = torch.allclose(reloaded(ids).pooler_output, model.albert(ids).pooler_output, atol=1e-5)
    print(f"saved to {out}; AutoModel reloaded {type(reloaded).__name__}, same outputs: {same}")
    if not same:
        raise SystemExit("reloaded model differs from the saved one")


if __name__ == "__main__":
    main()
