"""The whole-step graph of a DDP model, as `run_pretraining.py` runs it under `accelerate launch --multi_gpu` on GPUs:
the step averaging its own gradients in one all-reduce that the CUDA graph holds (`step.accumulate_and_update`).

    torchrun --nproc_per_node 1 benchmarks/check_ddp_graph.py --out ddp_graph.json    # one GPU: NCCL, world size 1
    torchrun --nproc_per_node 2 benchmarks/check_ddp_graph.py --device cpu --preset tiny --shape 4x32 \
        --steps 3 --out /tmp/ddp_graph.json                                             # the suite's run (gloo)

One GPU cannot hold a 2-process NCCL group (NCCL refuses two ranks on one device), and accelerate wraps no DDP for
one process; so the model is wrapped in DDP here, over a process group of one: the graph then captures the NCCL
all-reduce, which is what a multi-GPU run adds to the one-process graph. Three copies of the same weights, compiled
as run_pretraining.py compiles them on a GPU (`compile_blocks(dynamic=False)`), train on the same batches in bf16:
- "ddp eager": the eager step through DDP's reducer (`training_step`);
- "ddp graph": the DDP model's step captured (`StepGraph`, its own all-reduce);
- "graph": the plain model's step captured, as one process runs it.
Reported: each step's MLM loss per form (the graphs' against DDP eager's, relative), and each form's step time
(CUDA events, median of `--windows` windows of `--window_steps` steps after the capture). On a CPU (`--device cpu`,
gloo, fp32) the graph is a stand-in that runs its step eagerly: the code path, not the capture.
"""

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from accelerate import Accelerator
from accelerate.utils import AutocastKwargs
from torch.nn.parallel import DistributedDataParallel

import albert_hf
from albert_hf.optimization import Lamb, parameter_groups
from albert_hf.pretraining.training.step import training_step
from albert_hf.pretraining.training.step_graph import RunsEagerly, StepGraph
from bench_gpu import batches_for


def mlm_loss(counts: torch.Tensor) -> float:
    return float(counts[0] / counts[2])  # the step's summed MLM loss over its masked tokens


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--shape", default="32x128", help="BATCHxSEQ")
    parser.add_argument("--steps", type=int, default=8, help="steps whose losses are compared")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window_steps", type=int, default=10)
    parser.add_argument("--out", default="ddp_graph.json")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    accelerator = Accelerator(
        cpu=not cuda, mixed_precision="bf16" if cuda else "no", kwargs_handlers=[AutocastKwargs(cache_enabled=False)]
    )
    if not torch.distributed.is_initialized():  # one process: accelerate sets up no group
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
    device, rank = accelerator.device, torch.distributed.get_rank()
    batch, seq = (int(n) for n in args.shape.split("x"))
    config = albert_hf.AlbertHFConfig.from_preset(
        args.preset, max_position_embeddings=max(512, seq), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    torch.manual_seed(0)
    reference = albert_hf.AlbertHFForPreTraining(config).to(device).train()
    forms = {}
    for name in ("ddp eager", "ddp graph", "graph"):
        model = copy.deepcopy(reference)
        if cuda:
            model.compile_blocks(dynamic=False)
        optimizer = Lamb(parameter_groups(model), lr=1e-4)
        wrapped = (
            DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
            if name.startswith("ddp")
            else model
        )
        step = (
            StepGraph(
                wrapped, optimizer, accelerator, 1.0, "global", **({} if cuda else {"graph_factory": RunsEagerly})
            )
            if name.endswith("graph")
            else None
        )
        forms[name] = (wrapped, optimizer, step)
    batches = [[b] for b in batches_for(config, batch, seq, device)]  # the same in every process
    scheduler = SimpleNamespace(step=lambda: None)  # a constant learning rate

    def run(name: str, micro_batches) -> torch.Tensor:
        model, optimizer, step = forms[name]
        if step is None:
            return training_step(model, micro_batches, optimizer, scheduler, accelerator, 1.0)
        return step(micro_batches)

    report = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "world_size": torch.distributed.get_world_size(),
        "args": vars(args),
        "losses": {},
        "step_ms": {},
    }
    for name in forms:  # the same batches in the same order: the losses compare step by step
        began = time.perf_counter()
        report["losses"][name] = [mlm_loss(run(name, batches[i % 2])) for i in range(args.steps)]
        print(
            f"{name}: {args.steps} steps in {time.perf_counter() - began:.1f} s (capture and compile included)",
            flush=True,
        )
    eager = report["losses"]["ddp eager"]
    report["largest_relative_difference"] = {
        name: max(abs(a - b) / abs(b) for a, b in zip(report["losses"][name], eager)) for name in ("ddp graph", "graph")
    }
    for name in forms:
        times = []
        for _ in range(args.windows):
            if cuda:
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            for i in range(args.window_steps):
                run(name, batches[i % 2])
            if cuda:
                torch.cuda.synchronize(device)
            times.append((time.perf_counter() - began) * 1000 / args.window_steps)
        report["step_ms"][name] = statistics.median(times)
    report["tokens_per_second"] = {name: batch * seq * 1000 / ms for name, ms in report["step_ms"].items()}
    if rank == 0:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps({k: report[k] for k in ("largest_relative_difference", "step_ms", "tokens_per_second")}))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
