"""albert_hf against transformers' ALBERT, same configs, same weights, same inputs, in one process.

    python benchmarks/bench_model.py                       # base, seq 128 and 512, the precision auto picks
    python benchmarks/bench_model.py --modes fp32 bf16     # both (~15 min on 2 cores)
    python benchmarks/bench_model.py --presets base large --seqs 512 --modes bf16 --steps 5

For every (preset, seq, mode):
- training step of the pretraining model (forward with MLM + SOP labels, backward, LAMB update): tokens/s of each
  implementation, alternating runs, warm-up excluded, median of --steps;
- achieved TFLOP/s from ALBERT's FLOPs (matmuls including attention's, sparse MLM head as the official code) and
  that as a fraction of the peak measured in the same process: the median `F.linear` rate at the preset's own GEMM
  shapes (4096 x H -> I, 4096 x I -> H, 4096 x H -> H) in the same dtype (MFU);
- peak tensor memory of a training step (parameters, gradients, optimizer moments and the activations saved
  for backward, at the forward/backward boundary where they all coexist);
- sequence-classification inference (no grad) on full-length unpadded batches: sequences/s.
Then the smaller step (batch 8 at seq 128, 4 at seq 512, 15% of positions labelled, AdamW). Then, with
`--glue_dir` naming a GLUE download (the original `glue_data` folder: SST-2/, MRPC/, RTE/, QNLI/, ...),
sequence-classification inference on real dev batches padded as Trainer pads them (to the longest row of
each batch of 32), per preset and mode. The first lines name the CPU, whether it has AMX, and the peaks.
Ratios are albert_hf / transformers (higher is better; for memory lower is better). `--only` runs one part.
"""

import argparse
import copy
import json
import os
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BATCH_TOKENS = 4096  # batch 32 at seq 128, batch 8 at seq 512
MASKED_PER_SEQ = 20  # the official max_predictions_per_seq


def cpu_description() -> str:
    """The CPU model, core count, torch's capability, the bf16 units albert_hf found (what decides bf16 matmul
    speed) and the instruction-set flags behind them, as albert_hf.runtime.hardware reads them."""
    from albert_hf.runtime.hardware import cpu_flags, detect

    found, flags = detect(), cpu_flags()
    listed = [f for f in ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2") if f in flags]
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    return (
        f"CPU: {found.cpu_model}, {os.cpu_count()} logical cores, torch capability {found.cpu_capability}, "
        f"bf16 units: {found.cpu_bf16_units or 'none'} (flags: {' '.join(listed) or 'none of interest'}"
        f"{f'; ONEDNN_MAX_CPU_ISA={cap}' if cap else ''})"
    )


def auto_mode() -> str:
    """The precision run_pretraining.py's --mixed_precision auto picks on this machine: bf16 or fp32."""
    from albert_hf.runtime.hardware import choose_precision, detect

    return "bf16" if choose_precision(detect()).mixed_precision == "bf16" else "fp32"


def _rates(fn, flops, repeat, warmup=3, device=None) -> list[float]:
    """TFLOP/s of each of `repeat` timed calls of `fn` (which does `flops`), after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    return [flops / timed(fn, device) / 1e12 for _ in range(repeat)]


def gemm_peak(config, tokens=4096, dtype=torch.bfloat16, repeat=10, device="cpu") -> dict:
    """The MFU denominator: `F.linear` TFLOP/s at the model's own GEMM shapes (tokens x H -> I, tokens x I -> H,
    tokens x H -> H), measured in this process. "median" is the median over all timed calls of the three shapes;
    the per-shape medians are kept too. A square 2048^3 matmul (`matmul_peak`) can run at another rate than the
    shapes the model actually multiplies."""
    h, i = config.hidden_size, config.intermediate_size
    result, samples = {}, []
    for inputs, outputs in ((h, i), (i, h), (h, h)):
        made = dict(dtype=dtype, device=device)
        x, w = torch.randn(tokens, inputs, **made), torch.randn(outputs, inputs, **made)
        b = torch.randn(outputs, **made)
        rates = _rates(lambda: F.linear(x, w, b), 2 * tokens * inputs * outputs, repeat, device=device)
        result[f"{tokens}x{inputs}->{outputs}"] = statistics.median(rates)
        samples += rates
    result["median"] = statistics.median(samples)
    return result


def matmul_peak(dtype, size=2048, repeat=10) -> float:
    """Square `size`^3 matmul throughput (TFLOP/s), best of `repeat`: the MFU denominator of earlier runs."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    return max(_rates(lambda: a @ b, 2 * size**3, repeat))


def albert_flops(
    config, batch, seq, masked_per_seq=MASKED_PER_SEQ, last_layer_queries=None, mlm_rows_per_seq=None
) -> float:
    """FLOPs of one training step of `batch` sequences: albert_hf's count (albert_hf/flops.py). MFU counts the
    model's FLOPs (`last_layer_queries` and `mlm_rows_per_seq` None); what an implementation executes differs:
    albert_hf's `last_layer_queries=masked_per_seq + 1`, transformers' MLM head at every position
    (`mlm_rows_per_seq=seq`)."""
    from albert_hf.flops import training_flops_per_token

    return (
        training_flops_per_token(
            config, seq, masked_per_seq, last_layer_queries=last_layer_queries, mlm_rows=mlm_rows_per_seq
        )
        * batch
        * seq
    )


def make_models(preset, seq, with_transformers=True):
    import transformers

    import albert_hf

    config = albert_hf.AlbertHFConfig.from_preset(preset, max_position_embeddings=max(512, seq))
    ours = albert_hf.AlbertHFForPreTraining(config)
    if not with_transformers:
        return config, ours, None
    theirs = transformers.AlbertForPreTraining(config.to_albert_config())
    theirs.load_state_dict(ours.state_dict())
    return config, ours, theirs


def make_batch(config, batch, seq, generator, masked_per_seq=MASKED_PER_SEQ):
    """A random batch of `batch` x `seq` tokens with `masked_per_seq` masked positions a row, on the CPU (the plan's
    synthetic batch: `--dry_run` measures the same kind)."""
    from albert_hf.pretraining.plan import synthetic_batch

    return synthetic_batch(config.vocab_size, batch, seq, masked_per_seq, "cpu", generator)


def autocast(mode, model):
    """bf16 autocast on the device the model is on (these benchmarks keep it on the CPU), or nothing for fp32."""
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16) if mode == "bf16" else nullcontext()


def train_step(model, optimizer, batch, mode):
    with autocast(mode, model):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def timed(fn, device=None) -> float:
    """Seconds of `fn()`; on a CUDA device, until its queued kernels are done."""
    synchronize = torch.cuda.synchronize if device is not None and torch.device(device).type == "cuda" else None
    if synchronize:
        synchronize(device)
    start = time.perf_counter()
    fn()
    if synchronize:
        synchronize(device)
    return time.perf_counter() - start


EAGER_BASELINE = True  # --no-eager turns it off


def contenders(theirs, ours, compile_ours):
    """{name: model} to time: transformers and albert_hf, compiled as `--compile` asks (the whole model or its
    blocks); when compiled, the eager albert_hf runs too (unless --no-eager), so the gain is measured in the
    same run."""
    if compile_ours is None:
        return {"transformers": theirs, "albert_hf": ours}
    models = {"transformers": theirs}
    if EAGER_BASELINE:
        models["albert_hf eager"] = copy.deepcopy(ours)
    models["albert_hf"] = torch.compile(ours) if compile_ours == "model" else ours.compile_blocks()
    return models


def bench_training(
    preset, seq, mode, steps, warmup, compile_ours, batch_size=None, masked_per_seq=MASKED_PER_SEQ, optimizer="lamb"
):
    """Training steps of both implementations, alternating who goes first: tokens/s, step seconds and TFLOP/s
    from the median step. Default: BATCH_TOKENS per step, 20 masked tokens per sequence, LAMB."""
    from albert_hf.optimization import Lamb, parameter_groups

    batch_size = batch_size or BATCH_TOKENS // seq
    config, ours, theirs = make_models(preset, seq)
    generator = torch.Generator().manual_seed(0)
    batches = [make_batch(config, batch_size, seq, generator, masked_per_seq) for _ in range(2)]
    make_optimizer = {"lamb": Lamb, "adamw": torch.optim.AdamW}[optimizer]
    runners = {}
    for name, model in contenders(theirs, ours, compile_ours).items():
        model.train()
        runners[name] = (model, make_optimizer(parameter_groups(model), lr=1e-4))
    times = {name: [] for name in runners}
    for step in range(warmup + steps):
        order = list(runners) if step % 2 == 0 else list(reversed(runners))  # alternate who goes first
        for name in order:
            call, optimizer_ = runners[name]
            seconds = timed(lambda: train_step(call, optimizer_, batches[step % 2], mode))
            if step >= warmup:
                times[name].append(seconds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    flops = albert_flops(config, batch_size, seq, masked_per_seq)
    return {
        name: {"tokens_per_s": batch_size * seq / s, "step_s": s, "tflops": flops / s / 1e12}
        for name, s in medians.items()
    }


# The smaller step users run on one machine: batch 8 at seq 128, batch 4 at seq 512, 15% of the positions labelled
# (the collator's default), AdamW, the config's dropout.
SMALL_BATCH = {128: 8, 512: 4}
SMALL_MASKED_SHARE = 0.15


def bench_small_training(preset, seq, mode, steps, warmup, compile_ours):
    batch_size = SMALL_BATCH.get(seq, max(1, 1024 // seq))
    return batch_size, bench_training(
        preset,
        seq,
        mode,
        steps,
        warmup,
        compile_ours,
        batch_size=batch_size,
        masked_per_seq=round(SMALL_MASKED_SHARE * seq),
        optimizer="adamw",
    )


def bench_classification_inference(preset, mode, batches, steps, warmup, compile_ours=None, **config_overrides):
    """Sequence classification without grad: each implementation runs all `batches` once per step, alternating
    who goes first, warm-up excluded; sequences/s from the median step."""
    import transformers

    import albert_hf

    config = albert_hf.AlbertHFConfig.from_preset(preset, num_labels=2, **config_overrides)
    ours = albert_hf.AlbertHFForSequenceClassification(config).eval()
    theirs = transformers.AlbertForSequenceClassification(config.to_albert_config()).eval()
    theirs.load_state_dict(ours.state_dict())
    models = contenders(theirs, ours, compile_ours)
    times = {name: [] for name in models}
    with torch.no_grad():
        for step in range(warmup + steps):
            for name, model in list(models.items())[:: 1 if step % 2 == 0 else -1]:
                with autocast(mode, model):
                    seconds = timed(lambda: [model(**batch) for batch in batches])
                if step >= warmup:
                    times[name].append(seconds)
    sequences = sum(len(b["input_ids"]) for b in batches)
    return {name: {"sequences_per_s": sequences / statistics.median(t)} for name, t in times.items()}


def bench_inference(preset, seq, mode, steps, warmup, compile_ours=None):
    """On one full-length, unpadded batch of BATCH_TOKENS tokens."""
    import albert_hf

    config = albert_hf.AlbertHFConfig.from_preset(preset)
    inputs = make_batch(config, BATCH_TOKENS // seq, seq, torch.Generator().manual_seed(1))
    inputs = {k: inputs[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    return bench_classification_inference(
        preset, mode, [inputs], steps, warmup, compile_ours, max_position_embeddings=max(512, seq)
    )


GLUE_EVAL_TASKS = ("sst2", "mrpc", "rte", "qnli")


def glue_eval_batches(glue_dir, tokenizer_path, batch_size=32, max_seq_length=128, batches_per_task=6):
    """Evaluation batches as Trainer makes them for GLUE dev sets: file order, padded to the longest row of each
    batch (DataCollatorWithPadding), truncated at `max_seq_length`. The first `batches_per_task` batches of
    SST-2, MRPC, RTE and QNLI. Tokenizer: `tokenizer_path`, else a SentencePiece unigram (8k pieces) trained on
    those dev texts, a stand-in for albert-base-v2's (not downloadable here)."""
    import datasets
    from transformers import AutoTokenizer, DataCollatorWithPadding

    from albert_hf.tasks.glue.definition import get_task
    from albert_hf.tasks.glue.features import tokenize_function
    from albert_hf.tasks.glue.files import read_glue_tsv
    from albert_hf.tokenization import train_tokenizer

    datasets.disable_progress_bars()
    tasks = {name: get_task(name) for name in GLUE_EVAL_TASKS}
    dev = {
        name: read_glue_tsv(Path(glue_dir) / task.folder / task.tsv_files["validation"], task)
        for name, task in tasks.items()
    }
    if tokenizer_path:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    else:
        texts = [row[column] for name, task in tasks.items() for row in dev[name] for column in task.text_columns]
        tokenizer = train_tokenizer(texts, vocab_size=8000)
    pad = DataCollatorWithPadding(tokenizer, return_tensors="pt")
    batches = []
    for name, task in tasks.items():
        rows = dev[name].select(range(min(len(dev[name]), batch_size * batches_per_task)))
        encoded = rows.map(
            tokenize_function(tokenizer, task, max_seq_length, False), batched=True, remove_columns=rows.column_names
        )
        for start in range(0, len(encoded), batch_size):
            batch = pad([encoded[i] for i in range(start, min(start + batch_size, len(encoded)))])
            batches.append({k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return batches


def bench_padded_inference(preset, mode, batches, steps, warmup, compile_ours=None):
    """Sequence classification over real padded batches, and the share of padded positions in them."""
    import albert_hf

    real = sum(int(b["attention_mask"].sum()) for b in batches)
    positions = sum(b["attention_mask"].numel() for b in batches)
    # the tokenizer may have more pieces than a small preset's vocabulary (tiny: 1000)
    vocab_size = max(
        albert_hf.AlbertHFConfig.from_preset(preset).vocab_size, 1 + max(int(b["input_ids"].max()) for b in batches)
    )
    return {
        "padding_share": 1 - real / positions,
        "batches": len(batches),
        **bench_classification_inference(preset, mode, batches, steps, warmup, compile_ours, vocab_size=vocab_size),
    }


def step_tensor_memory(model, batch, mode) -> dict:
    """Tensor memory of a training step at its peak, the forward/backward boundary: parameters + gradients +
    the two LAMB moments (4 x parameters, fp32) + every tensor saved for backward (unique storages, so shared
    or viewed activations count once). Exact and repeatable; the process's resident memory is not, on CPU, where
    the allocator keeps freed blocks (it ranked the two implementations the wrong way round)."""
    saved = {}
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}  # counted below already

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameter_storages:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with autocast(mode, model):
            loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    activations = sum(saved.values())
    return {"activations_mb": activations / 2**20, "step_mb": (4 * parameters + activations) / 2**20}


def bench_memory(preset, seq, mode):
    config, ours, theirs = make_models(preset, seq)
    batch = make_batch(config, BATCH_TOKENS // seq, seq, torch.Generator().manual_seed(0))
    return {
        "transformers": step_tensor_memory(theirs.train(), batch, mode),
        "albert_hf": step_tensor_memory(ours.train(), batch, mode),
    }


def print_eager_line(what, result, unit):
    """Under --compile, the eager albert_hf timed in the same run: its ratio, and what compiling bought."""
    if result and "albert_hf eager" in result:
        hf, eager, fast = (result[k][unit] for k in ("transformers", "albert_hf eager", "albert_hf"))
        print(
            f"{'':17}(same run, {what}, albert_hf eager: {eager:.1f}, ratio {eager / hf:.2f}; "
            f"compiled / eager {fast / eager:.2f})",
            flush=True,
        )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["base"])
    parser.add_argument("--seqs", nargs="+", type=int, default=[128, 512])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["auto"],
        choices=["auto", "fp32", "bf16"],
        help="auto: the precision run_pretraining.py picks here (bf16 with bf16 units, else fp32)",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--compile",
        choices=["model", "blocks"],
        default=None,
        help="torch.compile albert_hf (not transformers): the whole model, or each block "
        "(compile_blocks, which keeps padding removal and the last-block selection)",
    )
    parser.add_argument(
        "--no-eager",
        action="store_true",
        help="under --compile, do not also time the eager albert_hf: only two models in the "
        "process (a third one slowed transformers' step, see BENCHMARKS.md)",
    )
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument(
        "--glue_dir",
        default=None,
        help="GLUE download (the original glue_data folder) for the padded-inference rows (skipped without it)",
    )
    parser.add_argument("--glue_tokenizer", default=None, help="tokenizer for those rows (default: trained on them)")
    parser.add_argument(
        "--only", choices=["training", "inference", "small", "glue"], default=None, help="run one part only"
    )
    args = parser.parse_args(argv)
    args.modes = list(dict.fromkeys(auto_mode() if mode == "auto" else mode for mode in args.modes))
    global EAGER_BASELINE
    EAGER_BASELINE = not args.no_eager

    torch.manual_seed(0)
    import albert_hf

    print(cpu_description())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    gemm = {}  # the MFU denominators, per (preset, mode): F.linear at the preset's GEMM shapes
    for preset in args.presets:
        config = albert_hf.AlbertHFConfig.from_preset(preset)
        for mode in args.modes:
            gemm[preset, mode] = gemm_peak(config, BATCH_TOKENS, DTYPES[mode])
            square = matmul_peak(DTYPES[mode])
            print(
                f"measured peak, {preset} {mode}: F.linear at its GEMM shapes, median "
                f"{gemm[preset, mode]['median']:.2f} TFLOP/s ("
                + ", ".join(f"{k} {v:.2f}" for k, v in gemm[preset, mode].items() if k != "median")
                + f"); 2048^3 matmul, best of 10: {square:.2f}",
                flush=True,
            )
    rows = []
    header = (
        f"{'preset':7} {'seq':>4} {'mode':5} | {'train tok/s HF':>14} {'ours':>8} {'ratio':>6} | "
        f"{'MFU HF':>6} {'ours':>6} | {'mem MB HF':>9} {'ours':>7} {'ratio':>6} | "
        f"{'infer seq/s HF':>14} {'ours':>8} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    dash = f"{'-':>6}"
    for preset in args.presets:
        for seq in args.seqs if args.only in (None, "training", "inference") else ():
            for mode in args.modes:
                train = infer = memory = None
                if args.only in (None, "training"):
                    train = bench_training(preset, seq, mode, args.steps, args.warmup, args.compile)
                    memory = None if args.no_memory else bench_memory(preset, seq, mode)
                if args.only in (None, "inference"):
                    infer = bench_inference(preset, seq, mode, args.steps, args.warmup, args.compile)
                peak = gemm[preset, mode]["median"]
                rows.append(
                    dict(
                        preset=preset, seq=seq, mode=mode, train=train, inference=infer, memory=memory, peak_tflops=peak
                    )
                )
                cells = [f"{preset:7} {seq:>4} {mode:5}"]
                if train:
                    hf, us = train["transformers"], train["albert_hf"]
                    cells.append(
                        f"{hf['tokens_per_s']:14.0f} {us['tokens_per_s']:8.0f} "
                        f"{us['tokens_per_s'] / hf['tokens_per_s']:6.2f}"
                    )
                    cells.append(f"{hf['tflops'] / peak:6.1%} {us['tflops'] / peak:6.1%}")
                else:
                    cells += [f"{'-':>14} {'-':>8} {dash}", f"{dash} {dash}"]
                if memory:
                    theirs_mb, ours_mb = memory["transformers"]["step_mb"], memory["albert_hf"]["step_mb"]
                    cells.append(f"{theirs_mb:9.0f} {ours_mb:7.0f} {ours_mb / theirs_mb:6.2f}")
                else:
                    cells.append(f"{'-':>9} {'-':>7} {dash}")
                if infer:
                    ihf, ius = infer["transformers"]["sequences_per_s"], infer["albert_hf"]["sequences_per_s"]
                    cells.append(f"{ihf:14.1f} {ius:8.1f} {ius / ihf:6.2f}")
                else:
                    cells.append(f"{'-':>14} {'-':>8} {dash}")
                print(" | ".join(cells), flush=True)
                print_eager_line("training", train, "tokens_per_s")
                print_eager_line("inference", infer, "sequences_per_s")

    if args.only in (None, "small"):
        print(
            f"\nThe smaller step: batch {SMALL_BATCH[128]} at seq 128, {SMALL_BATCH[512]} at seq 512, "
            f"{SMALL_MASKED_SHARE:.0%} of positions labelled, AdamW"
        )
        for preset in args.presets:
            for seq in args.seqs:
                for mode in args.modes:
                    batch_size, small = bench_small_training(preset, seq, mode, args.steps, args.warmup, args.compile)
                    peak = gemm[preset, mode]["median"]
                    rows.append(
                        dict(preset=preset, seq=seq, mode=mode, batch=batch_size, small_train=small, peak_tflops=peak)
                    )
                    hf, us = small["transformers"], small["albert_hf"]
                    print(
                        f"{preset:7} {seq:>4} {mode:5} batch {batch_size:2} | tok/s HF {hf['tokens_per_s']:.0f}, "
                        f"ours "
                        f"{us['tokens_per_s']:.0f}, ratio {us['tokens_per_s'] / hf['tokens_per_s']:.2f} | MFU HF "
                        f"{hf['tflops'] / peak:.1%}, ours {us['tflops'] / peak:.1%}",
                        flush=True,
                    )
                    print_eager_line("smaller step", small, "tokens_per_s")

    if args.only in (None, "glue") and args.glue_dir and Path(args.glue_dir).is_dir():
        batches = glue_eval_batches(args.glue_dir, args.glue_tokenizer)
        print(
            f"\nSequence-classification inference on GLUE dev batches as Trainer pads them ({len(batches)} "
            f"batches of 32 from {', '.join(GLUE_EVAL_TASKS)}, max_seq_length 128)"
        )
        for preset in args.presets:
            for mode in args.modes:
                glue = bench_padded_inference(preset, mode, batches, args.steps, args.warmup, args.compile)
                rows.append(dict(preset=preset, mode=mode, glue_inference=glue))
                ihf, ius = glue["transformers"]["sequences_per_s"], glue["albert_hf"]["sequences_per_s"]
                print(
                    f"{preset:7} {mode:5} | padding {glue['padding_share']:.0%} of positions | seq/s HF {ihf:.1f}, "
                    f"ours {ius:.1f}, ratio {ius / ihf:.2f}",
                    flush=True,
                )
                print_eager_line("inference", glue, "sequences_per_s")
    elif args.only == "glue":
        raise SystemExit(f"error: --only glue needs --glue_dir naming a GLUE download (got {args.glue_dir})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"cpu": cpu_description(), "gemm_peaks": {f"{k[0]} {k[1]}": v for k, v in gemm.items()}, "rows": rows},
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
