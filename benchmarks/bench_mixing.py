"""What mixing sources costs: a step's speed, and the memory of --preprocess_only.

    python benchmarks/bench_mixing.py [--rounds 3 --steps 150] [--skip_speed] [--skip_memory] [--memory_corpus books/]

1. Speed. The demo recipe (recipes/demo.yaml: small, 32 pairs of 64 tokens, bf16 where the CPU has bf16 units) on
   the embedded corpus, as one source (`--train_files corpus.jsonl`) and as the same corpus split in two halves mixed
   by size (`--sources name=a,weight=size,... name=b,weight=size,...`), alternating A B A B, each run in its own
   process with the same tokenizer. Per run: the median tokens/s and data_wait of its logging windows after the
   first (metrics.jsonl). The ratio of the medians, run pair by run pair.
2. Memory. `--preprocess_only` of the same corpus (the embedded one, or --memory_corpus's text files) as 1 source
   and as 4 sources of a quarter each (the same total):
   the peak Pss_Anon of the process tree (/proc/PID/smaps_rollup, the process and its children, read every 20 ms),
   the tokenizer trained on the mix's sample as a user's run trains it.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench_model import cpu_description

REPO = Path(__file__).resolve().parent.parent
SCRIPT = str(REPO / "run_pretraining.py")


def pss_anon(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def peak_of_tree(command: list[str]) -> tuple[int, float, subprocess.CompletedProcess]:
    """(the peak Pss_Anon of the command's process tree, its wall seconds, the finished process)."""
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, done = 0, threading.Event()

    def sample():
        nonlocal peak
        while not done.wait(0.02):
            try:
                tree = [process.pid] + [child.pid for child in psutil.Process(process.pid).children(recursive=True)]
            except psutil.Error:
                continue
            peak = max(peak, sum(pss_anon(pid) for pid in tree))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    out, err = process.communicate()
    done.set()
    thread.join()
    return peak, time.perf_counter() - began, subprocess.CompletedProcess(command, process.returncode, out, err)


def write_corpus(folder: Path, parts: int) -> list[Path]:
    """The embedded corpus's documents as `parts` jsonl files of about equal size."""
    from albert_hf.pretraining.data.embedded_corpus import embedded_corpus

    texts = embedded_corpus()["text"]
    files = [folder / f"part{i}of{parts}.jsonl" for i in range(parts)]
    for i, file in enumerate(files):
        with open(file, "w") as f:
            for text in texts[i::parts]:
                f.write(json.dumps({"text": text}) + "\n")
    return files


def sources_args(files) -> list[str]:
    return ["--sources", *[f"name=s{i},weight=size,train_files={file}" for i, file in enumerate(files)]]


def speed(args, workdir: Path):
    whole = write_corpus(workdir, 1)
    halves = write_corpus(workdir, 2)
    tokenizer = workdir / "tokenizer"
    from albert_hf.pretraining.data.embedded_corpus import embedded_corpus
    from albert_hf.tokenization import train_tokenizer

    train_tokenizer(embedded_corpus(), vocab_size=4000).save_pretrained(tokenizer)
    common = [
        str(REPO / "recipes" / "demo.yaml"),
        "--tokenizer_name",
        str(tokenizer),
        "--max_train_steps",
        str(args.steps),
        "--logging_steps",
        "25",
        "--eval_steps",
        "0",
        "--validation_split_percentage",
        "0",
        "--no_plots",
    ]
    runs = {"one source": ["--train_files", str(whole[0])], "two sources by size": sources_args(halves)}
    found = {name: [] for name in runs}
    for round_number in range(args.rounds):
        for name, extra in runs.items():
            out = workdir / f"run-{round_number}-{name.split()[0]}"
            done = subprocess.run(
                [sys.executable, SCRIPT, *common, "--output_dir", str(out), *extra], capture_output=True, text=True
            )
            if done.returncode:
                raise SystemExit(f"{name}: run_pretraining.py failed:\n{done.stderr[-3000:]}")
            rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            windows = [row for row in rows if "tokens_per_second" in row][1:]
            found[name].append(
                (
                    statistics.median(row["tokens_per_second"] for row in windows),
                    statistics.median(row["data_wait"] for row in windows),
                )
            )
            print(
                f"  round {round_number + 1}, {name}: {found[name][-1][0]:,.0f} tokens/s, data_wait "
                f"{found[name][-1][1]:.4f}",
                flush=True,
            )
    one, two = found["one source"], found["two sources by size"]
    ratios = [b[0] / a[0] for a, b in zip(one, two)]
    print(f"speed, {args.steps} steps of the demo recipe, {args.rounds} rounds A B:")
    for name, values in found.items():
        print(
            f"  {name}: median {statistics.median(v[0] for v in values):,.0f} tokens/s (runs "
            + ", ".join(f"{v[0]:,.0f}" for v in values)
            + f"); data_wait median "
            f"{statistics.median(v[1] for v in values):.4f}"
        )
    print(f"  two / one, pair by pair: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}")


def split_folder(folder: Path, workdir: Path, parts: int) -> list[Path]:
    """A folder of text files as `parts` folders of about equal bytes (links to its files, largest first)."""
    files = sorted((p for p in folder.rglob("*.txt")), key=lambda p: p.stat().st_size, reverse=True)
    groups = [workdir / f"{folder.name}-{i}of{parts}" for i in range(parts)]
    sizes = [0] * parts
    for group in groups:
        group.mkdir()
    for file in files:
        smallest = sizes.index(min(sizes))
        (groups[smallest] / file.name).symlink_to(file.resolve())
        sizes[smallest] += file.stat().st_size
    return groups


def memory(args, workdir: Path):
    results = {}
    for parts in (1, 4):
        if args.memory_corpus:
            files = [Path(args.memory_corpus)] if parts == 1 else split_folder(Path(args.memory_corpus), workdir, parts)
        else:
            files = write_corpus(workdir, parts)
        extra = ["--train_files", str(files[0])] if parts == 1 else sources_args(files)
        command = [
            sys.executable,
            SCRIPT,
            "--preprocess_only",
            "--output_dir",
            str(workdir / f"prepared{parts}"),
            "--max_seq_length",
            "64",
            "--vocab_size",
            "4000",
            "--validation_split_percentage",
            "0",
            *extra,
        ]
        peak, seconds, done = peak_of_tree(command)
        if done.returncode:
            raise SystemExit(f"--preprocess_only with {parts} source(s) failed:\n{done.stderr[-3000:]}")
        results[parts] = peak
        print(
            f"  --preprocess_only, {parts} source(s): peak Pss_Anon {peak / 2**20:,.0f} MiB, {seconds:.1f} s",
            flush=True,
        )
    print(f"  4 sources / 1: {results[4] / results[1]:.3f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--skip_speed", action="store_true")
    parser.add_argument("--skip_memory", action="store_true")
    parser.add_argument(
        "--memory_corpus",
        help="a folder of .txt files for the memory part (default: the embedded "
        "corpus), split into 4 sources of about equal bytes",
    )
    args = parser.parse_args(argv)
    import torch

    print(cpu_description())
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}")
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_speed:
            speed(args, Path(tmp))
        if not args.skip_memory:
            memory(args, Path(tmp))


if __name__ == "__main__":
    main()
