"""The blocks' weights made ready once per forward (`AlbertHFTransformer.ready_weights`, a CUDA device's path)
against each Linear as a module (a CPU's), on this CPU: one base training step (forward with MLM and SOP labels,
backward) at 8 x 128 with some padding, each path's median over alternating runs, in bf16 autocast and in fp32.

    python benchmarks/bench_ready_weights.py [--preset base] [--steps 7]

Prints the CPU, torch's CPU capability and the two paths' seconds per step and ratio (ready / module).
"""

import argparse
import statistics
import time

import torch

from albert_hf import modeling_albert_hf as modeling
from albert_hf.configuration_albert_hf import AlbertHFConfig
from albert_hf.runtime.hardware import cpu_model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--steps", type=int, default=7, help="per path and precision; the first is left out")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    config = AlbertHFConfig.from_preset(args.preset)
    model = modeling.AlbertHFForPreTraining(config).train()
    ids = torch.randint(5, config.vocab_size, (8, 128))
    mask = torch.ones_like(ids)
    mask[2, 90:], mask[5, 60:] = 0, 0
    labels = torch.full_like(ids, -100)
    labels[:, 3::7] = ids[:, 3::7]
    labels[mask == 0] = -100
    batch = dict(input_ids=ids, attention_mask=mask, labels=labels, sentence_order_label=torch.randint(0, 2, (8,)))
    ready = {"ready": True}
    modeling.AlbertHFTransformer.ready_weights_pay_on = staticmethod(lambda device: ready["ready"])
    print(
        f"{cpu_model()}, torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{args.threads} threads, {args.preset} 8 x 128"
    )
    for bf16 in (True, False):
        times = {"ready": [], "module": []}
        for step in range(args.steps):
            for name in ("ready", "module") if step % 2 == 0 else ("module", "ready"):
                ready["ready"] = name == "ready"
                model.zero_grad(set_to_none=True)
                began = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(**batch).loss
                loss.backward()
                times[name].append(time.perf_counter() - began)
        median = {name: statistics.median(values[1:]) for name, values in times.items()}
        print(
            f"{'bf16' if bf16 else 'fp32'}: ready {median['ready']:.3f} s, module {median['module']:.3f} s, "
            f"ready / module {median['ready'] / median['module']:.3f}"
        )


if __name__ == "__main__":
    main()
