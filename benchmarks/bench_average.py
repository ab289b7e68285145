"""What averaging checkpoints costs in memory: `python -m albert_hf.average` at base size.

    python benchmarks/bench_average.py [--preset base] [--counts 3 5]

K model folders of the preset (AlbertHFForPreTraining, random weights, fp32, the official 30k vocabulary) are
written, then averaged in a process of their own; its peak Pss_Anon (/proc/PID/smaps_rollup of the process tree,
read every 20 ms) is set against, in the same run:
- the same interpreter with the same imports and nothing averaged (the floor);
- one model's weights (the size of model.safetensors);
- the averaging a reader would write first: every checkpoint loaded as a model (`from_pretrained`), then the mean
  of their state dicts.
The streamed average holds one tensor's float32 sum and one source's tensor at a time: under one model above the
floor, whatever K.
"""

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from bench_mixing import peak_of_tree
from bench_model import cpu_description

FLOOR = "import albert_hf.average, safetensors.torch, torch, transformers; print('ready')"
NAIVE = """
import sys, torch, albert_hf.average, transformers
from safetensors.torch import save_file
from albert_hf import AlbertHFForPreTraining
states = [AlbertHFForPreTraining.from_pretrained(path).state_dict() for path in sys.argv[2:]]
save_file({name: sum(state[name] for state in states) / len(states) for name in states[0]}, sys.argv[1])
"""


def write_checkpoints(folder: Path, preset: str, count: int) -> tuple[list[Path], int, int]:
    """`count` model folders of `preset` (different random weights); returns them, one model's weight bytes and its
    largest tensor's bytes."""
    import torch

    import albert_hf
    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining

    config = AlbertHFConfig.from_preset(preset, vocab_size=30000)
    paths = []
    for index in range(count):
        torch.manual_seed(index)
        model = AlbertHFForPreTraining(config)
        path = folder / f"step_{(index + 1) * 100}"
        model.save_pretrained(path)
        for name in ("configuration_albert_hf.py", "modeling_albert_hf.py"):
            shutil.copyfile(Path(albert_hf.__file__).parent / name, path / name)
        paths.append(path)
    state = model.state_dict()
    largest = max(tensor.numel() * tensor.element_size() for tensor in state.values())
    return paths, (paths[0] / "model.safetensors").stat().st_size, largest


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--counts", type=int, nargs="+", default=[3, 5])
    args = parser.parse_args(argv)
    import torch

    print(f"{cpu_description()}; torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths, weights, largest = write_checkpoints(tmp, args.preset, max(args.counts))
        mib = 2**20
        floor, _, _ = peak_of_tree([sys.executable, "-c", FLOOR])
        print(
            f"{args.preset}: one model's weights {weights / mib:,.1f} MiB, its largest tensor {largest / mib:,.1f} MiB;"
            f" the floor (imports, nothing averaged) {floor / mib:,.0f} MiB",
            flush=True,
        )
        for count in args.counts:
            sources = [str(path) for path in paths[:count]]
            out = tmp / f"average_{count}"
            peak, seconds, done = peak_of_tree([sys.executable, "-m", "albert_hf.average", str(out), *sources])
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            naive, naive_seconds, done = peak_of_tree(
                [sys.executable, "-c", NAIVE, str(tmp / f"naive_{count}.safetensors"), *sources]
            )
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            print(
                f"  K={count}: albert_hf.average peak Pss_Anon {peak / mib:,.0f} MiB, {(peak - floor) / mib:,.0f} above"
                f" the floor = {(peak - floor) / weights:.2f} models ({seconds:.1f} s); loading all then the mean:"
                f" {naive / mib:,.0f} MiB, {(naive - floor) / mib:,.0f} above = {(naive - floor) / weights:.2f} models"
                f" ({naive_seconds:.1f} s)",
                flush=True,
            )
            shutil.rmtree(out)


if __name__ == "__main__":
    main()
