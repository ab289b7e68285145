"""The first run on a GPU, in one command: what works there and how fast, written to one JSON file.

    python benchmarks/gpu_check.py                                  # the first CUDA device: base, seq 128, 200 steps
    python benchmarks/gpu_check.py --device cpu --preset tiny --steps 4 --out /tmp/check.json   # the suite's run

1. parity: every head in fp32 on the device against the same weights on the CPU (TF32 off), eval outputs, and the
   pretraining loss and gradients in training mode (dropout 0);
2. pretraining: run_pretraining.py on the embedded corpus at --preset and --seq for --steps in the precision auto
   picks (bf16 on GPUs that have it): its tokens/s, and MFU against the same-run `F.linear` rate at the model's
   own GEMM shapes in that dtype;
3. transformers' ALBERT against ours: training steps on the same inputs and weights, alternating, median tokens/s;
4. fine-tuning: run_glue.py on a small generated RTE-format task from the pretrained folder (Trainer, its
   precision flag as the device supports);
5. FSDP2 in one process: the model sharded with albert_hf's units over a one-process group trains --fsdp_steps
   steps to the unsharded model's losses.
A part that fails is recorded with its error and the others still run; the exit status is 1 if any failed.
"""

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]

from bench_model import albert_flops, gemm_peak, make_batch, timed  # noqa: E402


def describe_device(device: torch.device) -> dict:
    from albert_hf.runtime.hardware import detect

    found = detect()
    return {
        "device": str(device),
        "hardware": found.describe(),
        "fast_precisions": list(found.fast_precisions),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def head_classes():
    import albert_hf

    return [
        getattr(albert_hf, name)
        for name in (
            "AlbertHFModel",
            "AlbertHFForPreTraining",
            "AlbertHFForMaskedLM",
            "AlbertHFForSequenceClassification",
            "AlbertHFForTokenClassification",
            "AlbertHFForQuestionAnswering",
            "AlbertHFForQuestionAnsweringWithAnswerability",
            "AlbertHFForMultipleChoice",
        )
    ]


def first_tensor(output) -> torch.Tensor:
    return next(value for value in output.values() if isinstance(value, torch.Tensor))


def parity(device: torch.device, preset: str) -> dict:
    """Max |device - CPU| per head (eval, fp32, padded batch), and of the pretraining loss and gradients."""
    from albert_hf import AlbertHFConfig, AlbertHFForMultipleChoice, AlbertHFForPreTraining

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    config = AlbertHFConfig.from_preset(
        preset, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0, num_labels=3
    )
    generator = torch.Generator().manual_seed(0)
    batch = make_batch(config, 4, 64, generator, masked_per_seq=8)
    batch["attention_mask"][1, 40:] = 0  # one padded row: the masked path
    batch["labels"][1, 40:] = -100
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    result = {}
    for head in head_classes():
        torch.manual_seed(0)
        cpu_model = head(config).eval()
        on_device = copy.deepcopy(cpu_model).to(device)
        given = {k: v.unsqueeze(0) if head is AlbertHFForMultipleChoice else v for k, v in inputs.items()}
        with torch.no_grad():
            expected = first_tensor(cpu_model(**given))
            got = first_tensor(on_device(**{k: v.to(device) for k, v in given.items()})).cpu()
        real = given["attention_mask"].bool()
        if got.dim() == 3 and got.shape[:2] == real.shape:  # (batch, seq, ...): the real tokens only
            got, expected = got[real], expected[real]
        result[head.__name__] = float((got - expected).abs().max())
    torch.manual_seed(0)
    cpu_model = AlbertHFForPreTraining(config).train()
    on_device = copy.deepcopy(cpu_model).to(device)
    cpu_loss = cpu_model(**batch).loss
    device_loss = on_device(**{k: v.to(device) for k, v in batch.items()}).loss
    cpu_loss.backward()
    device_loss.backward()
    grads = dict(on_device.named_parameters())
    result["pretraining_loss"] = float((device_loss.detach().cpu() - cpu_loss.detach()).abs())
    result["pretraining_gradients"] = max(
        float((grads[name].grad.cpu() - param.grad).abs().max())
        for name, param in cpu_model.named_parameters()
        if param.grad is not None
    )
    result["passed"] = all(value < 1e-4 for name, value in result.items() if name != "passed")
    return result


def run(command, env=None, timeout=3600) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, command[:3]))} ... exited {done.returncode}: "
            f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
        )
    return done


def pretraining(device, preset, seq, steps, out: Path, env) -> dict:
    """run_pretraining.py on the embedded corpus; tokens/s from its log, MFU against the same-run GEMM peak."""
    from albert_hf import AlbertHFConfig
    from albert_hf.runtime.hardware import choose_precision, detect

    precision = choose_precision(detect()).mixed_precision
    batch = max(1, 4096 // seq) if device.type == "cuda" else 8
    logging_steps = max(1, steps // 4)
    start = time.perf_counter()
    run(
        [
            sys.executable,
            "run_pretraining.py",
            "--output_dir",
            str(out),
            "--overwrite_output_dir",
            "--model_config",
            preset,
            "--max_seq_length",
            str(seq),
            "--per_device_train_batch_size",
            str(batch),
            "--max_train_steps",
            str(steps),
            "--logging_steps",
            str(logging_steps),
            "--eval_steps",
            str(steps),
            "--max_eval_samples",
            "64",
            "--no_plots",
            "--vocab_size",
            "1000",
        ],
        env=env,
    )
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [row["tokens_per_second"] for row in rows if "tokens_per_second" in row][1:] or [
        row["tokens_per_second"] for row in rows if "tokens_per_second" in row
    ]
    results = json.loads((out / "all_results.json").read_text())
    config = AlbertHFConfig.from_pretrained(out)
    tokens_per_s = statistics.median(rates)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16 if precision == "fp16" else torch.float32
    peak = gemm_peak(config, dtype=dtype, device=device)["median"]  # the MFU denominator, on the device
    achieved = albert_flops(config, batch, seq) / (batch * seq) * tokens_per_s / 1e12
    return {
        "precision": results.get("precision"),
        "steps": steps,
        "batch": batch,
        "seq": seq,
        "tokens_per_s": tokens_per_s,
        "tflops": achieved,
        "gemm_peak_tflops": peak,
        "mfu": achieved / peak,
        "wall_s": wall,
        "eval_mlm_loss": results.get("eval_mlm_loss"),
        "eval_mlm_accuracy": results.get("eval_mlm_accuracy"),
        "eval_sop_accuracy": results.get("eval_sop_accuracy"),
    }


def against_transformers(device, preset, seq, steps) -> dict:
    """Training steps of both on the same inputs and weights, alternating; median tokens/s and the ratio."""
    import transformers

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from albert_hf.runtime.hardware import choose_precision, detect

    precision = choose_precision(detect()).mixed_precision
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    config = AlbertHFConfig.from_preset(preset, max_position_embeddings=max(512, seq))
    ours = AlbertHFForPreTraining(config)
    theirs = transformers.AlbertForPreTraining(config.to_albert_config())
    theirs.load_state_dict(ours.state_dict())
    batch_size = max(1, 4096 // seq) if device.type == "cuda" else 4
    generator = torch.Generator().manual_seed(0)
    batch = {k: v.to(device) for k, v in make_batch(config, batch_size, seq, generator).items()}
    runners = {}
    for name, model in (("transformers", theirs), ("albert_hf", ours)):
        model.to(device).train()
        runners[name] = (model, torch.optim.AdamW(model.parameters(), lr=1e-5))
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step(model, optimizer):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(**batch).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    times = {name: [] for name in runners}
    warmup = 2
    for i in range(warmup + steps):
        for name in list(runners) if i % 2 == 0 else list(reversed(runners)):
            seconds = timed(lambda: step(*runners[name]), device)
            if i >= warmup:
                times[name].append(seconds)
    rates = {name: batch_size * seq / statistics.median(t) for name, t in times.items()}
    return {
        "precision": precision,
        "batch": batch_size,
        "seq": seq,
        "tokens_per_s": rates,
        "ratio": rates["albert_hf"] / rates["transformers"],
    }


def write_rte(folder: Path, rows: int = 64):
    """An RTE-format task (index, sentence1, sentence2, label) from the embedded corpus: label 'entailment' when
    sentence2 follows sentence1 in the text, 'not_entailment' when it is drawn from elsewhere."""
    from albert_hf.pretraining.data.embedded_corpus import embedded_corpus
    from albert_hf.tokenization import split_sentences

    sentences = []
    for text in embedded_corpus()["text"][:2000]:
        sentences += [s for s in split_sentences(text) if 5 <= len(s.split()) <= 40 and "\t" not in s]
    folder.mkdir(parents=True, exist_ok=True)
    for split, offset in (("train", 0), ("dev", rows * 2)):
        lines = ["index\tsentence1\tsentence2\tlabel"]
        for i in range(rows):
            a = sentences[offset + 2 * i]
            follows = i % 2 == 0
            b = sentences[offset + 2 * i + 1] if follows else sentences[-1 - offset - i]
            lines.append(f"{i}\t{a}\t{b}\t{'entailment' if follows else 'not_entailment'}")
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")


def fine_tuning(device, model_dir: Path, out: Path, steps: int, env) -> dict:
    from albert_hf.runtime.hardware import choose_precision, detect

    precision = choose_precision(detect()).mixed_precision
    data = out.parent / "rte"
    write_rte(data)
    flags = {"bf16": ["--bf16"], "fp16": ["--fp16"]}.get(precision, []) if device.type == "cuda" else []
    start = time.perf_counter()
    run(
        [
            sys.executable,
            "run_glue.py",
            "--model_name_or_path",
            str(model_dir),
            "--task_name",
            "rte",
            "--data_dir",
            str(data),
            "--do_train",
            "--do_eval",
            "--max_steps",
            str(steps),
            "--learning_rate",
            "3e-5",
            "--per_device_train_batch_size",
            "16",
            "--output_dir",
            str(out),
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            *flags,
        ],
        env=env,
    )
    results = json.loads((out / "all_results.json").read_text())
    return {
        "precision_flags": flags,
        "steps": steps,
        "wall_s": time.perf_counter() - start,
        **{k: v for k, v in results.items() if k.startswith("eval_")},
    }


def fsdp2_one_process(device, preset, steps) -> dict:
    """albert_hf's FSDP2 units over a one-process group: the same losses as the unsharded model, step by step."""
    import torch.distributed as dist
    from accelerate.utils import FullyShardedDataParallelPlugin

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from albert_hf.optimization import Lamb, parameter_groups
    from albert_hf.runtime.distributed import shard_for_fsdp2

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        config = AlbertHFConfig.from_preset(preset, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        torch.manual_seed(0)
        plain = AlbertHFForPreTraining(config).to(device)
        sharded = copy.deepcopy(plain)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, reshard_after_forward=True)
        shard_for_fsdp2(sharded, plugin)
        generator = torch.Generator().manual_seed(1)
        losses = {"plain": [], "fsdp2": []}
        for name, model in (("plain", plain), ("fsdp2", sharded)):
            optimizer = Lamb(parameter_groups(model), lr=1e-3)
            generator.manual_seed(1)
            for _ in range(steps):
                batch = {k: v.to(device) for k, v in make_batch(config, 4, 64, generator, 8).items()}
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses[name].append(float(loss))
        gap = max(abs(a - b) for a, b in zip(losses["plain"], losses["fsdp2"]))
        return {"steps": steps, "losses": losses, "max_loss_gap": gap, "passed": gap < 1e-4}
    finally:
        dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (the first GPU), cuda:N, or cpu")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200, help="pretraining steps")
    parser.add_argument("--finetune_steps", type=int, default=None, help="default: --steps / 4")
    parser.add_argument("--fsdp_steps", type=int, default=3)
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check.py: --device cuda, but torch sees no CUDA device (use --device cpu to try it here)")
    env = {} if device.type == "cuda" else {"CUDA_VISIBLE_DEVICES": ""}
    report = {"machine": describe_device(device), "args": vars(args)}
    print(f"gpu_check on {report['machine']['hardware']}", flush=True)
    # the parts' folders, beside the report (where a run killed midway leaves them), removed at the end
    work = Path(tempfile.mkdtemp(prefix="gpu_check_", dir=Path(args.out).resolve().parent))
    parts = {
        "parity": lambda: parity(device, args.preset if args.preset == "tiny" else "small"),
        "pretraining": lambda: pretraining(device, args.preset, args.seq, args.steps, work / "pretrained", env),
        "against_transformers": lambda: against_transformers(
            device, args.preset, args.seq, 10 if args.steps >= 20 else 2
        ),
        "fine_tuning": lambda: fine_tuning(
            device, work / "pretrained", work / "rte_out", args.finetune_steps or max(2, args.steps // 4), env
        ),
        "fsdp2_one_process": lambda: fsdp2_one_process(device, args.preset, args.fsdp_steps),
    }
    failed = []
    for name, part in parts.items():
        start = time.perf_counter()
        try:
            report[name] = part()
            if report[name].get("passed") is False:
                failed.append(name)
        except Exception as error:  # noqa: BLE001 - recorded; the other parts still run
            traceback.print_exc()
            report[name] = {"error": f"{type(error).__name__}: {error}"}
            failed.append(name)
        report[name]["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{name}: {json.dumps(report[name])}", flush=True)
    report["failed"] = failed
    shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}; failed: {', '.join(failed) or 'none'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
