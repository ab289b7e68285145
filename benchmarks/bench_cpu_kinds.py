"""The same benchmarks on this CPU as it is and as a CPU without bf16 units or AVX-512, side by side in one run.

    python benchmarks/bench_cpu_kinds.py --train_files CORPUS_DIR           # model, demo, data (~35 min on 2 cores)
    python benchmarks/bench_cpu_kinds.py --parts demo model --seqs 512

Most machines users try first (cloud VMs and CI runners with AMD Zen 2/3 or older Intel CPUs, laptops) have
AVX2 and neither AMX nor AVX-512 BF16, and there torch emulates bf16. The second kind stands in for such a CPU:
this same CPU with torch's own kernels capped at AVX2 (ATEN_CPU_CAPABILITY=avx2) and oneDNN's and MKL's matmuls
too (ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2), so no AMX, AVX-512 BF16 or AVX-512 runs. It has
this CPU's clock, caches and memory, so its times are those of a fast AVX2 CPU: compare ratios across machines,
not seconds. Each part runs in a fresh process per kind, the kinds one after the other:

- model: benchmarks/bench_model.py --only training, base: a training step of albert_hf against transformers'
  ALBERT on the same weights and batches, and MFU against the same process's fp32 (and bf16) matmul peak, in
  each kind's --mixed_precision auto precision and in fp32;
- demo: the `make pretrain` command (read from the Makefile) from an empty cache: wall time, the precision it
  chose, and its held-out numbers;
- data: benchmarks/bench_data.py on --train_files (1x and 4x copies, tokenizer trained once): the data path.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
KINDS = {"as it is": {}, "capped at AVX2": AVX2}


def run(command, env_extra, log: Path, cwd=REPO) -> tuple[float, str]:
    """Runs `command` with `env_extra`, its output into `log`; returns (wall seconds, output)."""
    env = {**os.environ, **env_extra}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    log.write_text(done.stdout)
    if done.returncode != 0:
        raise SystemExit(
            f"error: {shlex.join(map(str, command))} ({env_extra or 'as it is'}) exited with "
            f"{done.returncode}; its output is in {log}"
        )
    return seconds, done.stdout


def demo_command(output_dir: Path) -> list[str]:
    """The Makefile's `pretrain` recipe, as a command for this interpreter, writing into output_dir."""
    text = (REPO / "Makefile").read_text()
    recipe = re.search(r"^pretrain:.*\n((?:\t.*\n)+)", text, re.M).group(1)
    words = shlex.split(recipe.replace("\\\n", " ").replace("$(BIN)/python", sys.executable))
    return [*words, "--output_dir", str(output_dir)]


def bench_demo(env_extra, workdir: Path, name: str) -> dict:
    cache = Path(tempfile.mkdtemp(dir=workdir))  # nothing cached: the embedded corpus and tokenizer are built
    out = workdir / f"demo-{name}"
    seconds, output = run(
        demo_command(out),
        {**env_extra, "ALBERT_HF_CACHE": str(cache), "HF_HOME": str(cache / "hf")},
        workdir / f"demo-{name}.log",
    )
    start = next(line for line in output.splitlines() if "parameters; global batch" in line)
    results = json.loads((out / "all_results.json").read_text())
    return {"wall_s": seconds, "start_line": start.split(": ", 1)[1], **results}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", default=["model", "demo", "data"], choices=["model", "demo", "data"])
    parser.add_argument("--seqs", nargs="+", default=["128", "512"], help="model part: sequence lengths")
    parser.add_argument("--steps", default="3", help="model part: timed steps per row")
    parser.add_argument("--train_files", default=None, help="data part: a folder of .txt files")
    parser.add_argument("--workdir", default=None, help="where outputs and logs go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if "data" in args.parts and not args.train_files:
        raise SystemExit(
            "error: the data part needs --train_files (a folder of .txt files); or leave it out with --parts model demo"
        )
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_cpu_kinds_"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"outputs and logs in {workdir}", flush=True)
    results = {}
    for part in args.parts:
        for name, env_extra in KINDS.items():
            slug = name.replace(" ", "_")
            # torch.compile's kernel cache is not keyed on ATEN_CPU_CAPABILITY: each kind keeps its own
            env_extra = {**env_extra, "TORCHINDUCTOR_CACHE_DIR": str(workdir / f"inductor-{slug}")}
            caps = " ".join(f"{k}={v}" for k, v in KINDS[name].items())
            print(f"\n=== {part}, this CPU {name} {caps}", flush=True)
            if part == "model":
                json_path = workdir / f"model-{slug}.json"
                _, output = run(
                    [
                        sys.executable,
                        "benchmarks/bench_model.py",
                        "--only",
                        "training",
                        "--no-memory",
                        "--modes",
                        "auto",
                        "fp32",
                        "--seqs",
                        *args.seqs,
                        "--steps",
                        args.steps,
                        "--warmup",
                        "1",
                        "--json",
                        str(json_path),
                    ],
                    env_extra,
                    workdir / f"model-{slug}.log",
                )
                print(output, flush=True)
                results[f"model, {name}"] = json.loads(json_path.read_text())
            elif part == "demo":
                demo = bench_demo(env_extra, workdir, slug)
                print(f"wall {demo['wall_s']:.0f} s; {demo['start_line']}")
                print(", ".join(f"{k} {v:.4f}" for k, v in demo.items() if k.startswith("eval_")), flush=True)
                results[f"demo, {name}"] = demo
            else:
                json_path = workdir / f"data-{slug}.json"
                _, output = run(
                    [
                        sys.executable,
                        "benchmarks/bench_data.py",
                        "--train_files",
                        args.train_files,
                        "--copies",
                        "1",
                        "4",
                        "--workdir",
                        str(workdir / f"data-{slug}"),
                        "--json",
                        str(json_path),
                    ],
                    env_extra,
                    workdir / f"data-{slug}.log",
                )
                print(output, flush=True)
                results[f"data, {name}"] = json.loads(json_path.read_text())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
