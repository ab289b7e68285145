"""The pretraining data path at growing corpus sizes: wall time per stage, pairs per second, and peak memory.

    python benchmarks/bench_data.py --train_files BOOKS_DIR                        # 1x, 4x, 16x copies
    python benchmarks/bench_data.py --train_files BOOKS_DIR --copies 1 4 16 64 --tokenizer_name TOK_DIR

Each size is a folder of N copies of the --train_files text files (symbolic links, so no disk is used; each copy
is a distinct path, hence a distinct document). For each size and mode a fresh process runs
`run_pretraining.py --preprocess_only` (the whole data path: reading, tokenizer, splitting and tokenizing, pairs,
writing the shards) with an empty datasets cache, and this script samples the memory of its whole process tree
every 0.25 s from /proc/PID/smaps_rollup:
- Pss_Anon: proportional anonymous memory, what the processes really hold (workers included, shared pages split);
- Pss_File: file-backed pages, mostly the memory-mapped Arrow files, which the kernel can drop at any time.
Resident set size would count the second as the first. Stage times come from the log lines' timestamps.

Without --tokenizer_name the first size trains the tokenizer, and every size reuses that one (saved once), so the
rows measure the data path; --train_tokenizer trains it in every run instead (tokenizer training included).
With --streaming each size instead trains the tiny model with `run_pretraining.py --streaming` for a few steps:
seconds to the first logged step, and peak memory (nothing is prepared up front).
The first lines name the CPU and the corpus.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from bench_model import cpu_description  # noqa: E402

# Stage boundaries, from the log lines' timestamps (1 s resolution): everything up to the first "Pair building" line
# is reading, the tokenizer and splitting + tokenizing; then the training pairs; then the held-out pairs and writing.
PAIRS_START = re.compile(r"Pair building: ")
PAIRS_END = re.compile(r"Built \d+ \w+ pairs")


def tree_memory(pid: int) -> tuple[int, int]:
    """(Pss_Anon, Pss_File) in bytes, summed over `pid` and all its descendants."""
    import psutil

    anon = file = 0
    try:
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    for process in processes:
        try:
            text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key == "Pss_Anon":
                anon += int(value.split()[0]) * 1024
            elif key == "Pss_File":
                file += int(value.split()[0]) * 1024
    return anon, file


def copies_folder(source: Path, files: list[Path], copies: int, root: Path) -> Path:
    folder = root / f"x{copies}"
    if not folder.exists():
        for k in range(copies):
            for file in files:
                link = folder / f"copy{k:03d}" / file.relative_to(source)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(file.resolve())
    return folder


def run_once(command: list[str], env: dict, first_row: Path | None = None) -> dict:
    """Runs `command`, sampling its process tree's memory; returns peaks, wall time and the log, and with
    `first_row` (a metrics.jsonl) the seconds until its first line was written: the first logged step."""
    start = time.perf_counter()
    first_step = None
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, text=True)
        peak_anon = peak_file = 0
        while process.poll() is None:
            anon, file = tree_memory(process.pid)
            peak_anon, peak_file = max(peak_anon, anon), max(peak_file, file)
            if first_row is not None and first_step is None and first_row.exists() and first_row.stat().st_size:
                first_step = time.perf_counter() - start
            time.sleep(0.25)
        wall = time.perf_counter() - start
        log.seek(0)
        text = log.read()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} ... failed:\n{text[-3000:]}")
    result = {"wall_s": wall, "peak_pss_anon_gb": peak_anon / 2**30, "peak_pss_file_gb": peak_file / 2**30, "log": text}
    if first_row is not None:
        result["first_step_s"] = first_step
    return result


def stage_times(log: str, wall: float) -> dict:
    """Seconds spent in each stage: up to the pairs (reading, tokenizer, splitting and tokenizing), the training
    pairs, and the rest (held-out pairs, writing the shards). Counted from the process start (`wall` is its end)."""
    stamps = [(line, re.match(r"(\d\d):(\d\d):(\d\d) ", line)) for line in log.splitlines()]
    stamps = [(line, int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])) for line, m in stamps if m]
    start = next((t for line, t in stamps if PAIRS_START.search(line)), None)
    end = next((t for line, t in stamps if PAIRS_END.search(line)), None)
    if start is None or end is None:
        return {}
    last = stamps[-1][1]
    before = wall - (last - start) % 86400  # the process start is not logged: counted back from the last line
    return {"to_pairs": before, "pairs": (end - start) % 86400, "rest": wall - before - (end - start) % 86400}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--train_files", required=True, help="a folder of .txt files (e.g. the project's books)")
    parser.add_argument("--copies", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--tokenizer_name", default=None, help="a tokenizer folder; default: trained on 1x once")
    parser.add_argument("--train_tokenizer", action="store_true", help="train the tokenizer in every run")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--max_seq_length", type=int, default=128)
    parser.add_argument("--dupe_factor", type=int, default=5)
    parser.add_argument("--preprocessing_num_workers", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="where the copies and outputs go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the rows here")
    parser.add_argument(
        "--streaming",
        action="store_true",
        help="measure `run_pretraining.py --streaming` instead: "
        "seconds to the first step and peak memory over --steps steps of the tiny model (needs "
        "--tokenizer_name)",
    )
    parser.add_argument("--steps", type=int, default=50, help="with --streaming: training steps per run")
    args = parser.parse_args()
    if args.streaming and not args.tokenizer_name:
        raise SystemExit(
            "error: --streaming needs --tokenizer_name (a streaming run that trains its tokenizer "
            "reads the whole corpus first)"
        )

    files = sorted(p for p in Path(args.train_files).rglob("*") if p.is_file() and p.suffix == ".txt")
    if not files:
        raise SystemExit(f"error: --train_files {args.train_files}: no .txt files")
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    print(cpu_description())
    print(
        f"corpus: {len(files)} files, {size_mb:.1f} MB; max_seq_length {args.max_seq_length}, dupe_factor "
        f"{args.dupe_factor}, {args.preprocessing_num_workers} workers"
    )
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_data_"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer_name
    if args.streaming:
        return stream(args, files, size_mb, work)
    rows = []
    print(
        "| copies | MB | wall s | reading, tokenizer, tokenizing s | pairs s | rest s | pairs | pairs/s | "
        "peak Pss_Anon GB | peak Pss_File GB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for copies in args.copies:
        folder = copies_folder(Path(args.train_files), files, copies, work / "corpora")
        output = work / f"prepared_x{copies}"
        shutil.rmtree(output, ignore_errors=True)
        home = Path(tempfile.mkdtemp(prefix="hf_home_", dir=work))  # an empty datasets cache for every run
        env = {
            **os.environ,
            "HF_HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        command = [
            sys.executable,
            str(REPO / "run_pretraining.py"),
            "--preprocess_only",
            "--train_files",
            str(folder),
            "--output_dir",
            str(output),
            "--max_seq_length",
            str(args.max_seq_length),
            "--dupe_factor",
            str(args.dupe_factor),
            "--preprocessing_num_workers",
            str(args.preprocessing_num_workers),
        ]
        if tokenizer and not args.train_tokenizer:
            command += ["--tokenizer_name", tokenizer]
        else:
            command += ["--vocab_size", str(args.vocab_size)]
        result = run_once(command, env)
        manifest = json.loads((output / "prepared_data.json").read_text())
        if not tokenizer:  # keep the first run's tokenizer for the larger sizes
            tokenizer = str(work / "tokenizer")
            shutil.rmtree(tokenizer, ignore_errors=True)
            Path(tokenizer).mkdir()
            for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spiece.model"):
                if (output / name).exists():
                    shutil.copy(output / name, tokenizer)
        times = stage_times(result.pop("log"), result["wall_s"])
        pairs = manifest["train_pairs"] + manifest.get("validation_pairs", 0)
        row = {
            "copies": copies,
            "mb": size_mb * copies,
            **result,
            "stages_s": times,
            "pairs": pairs,
            "pairs_per_s": pairs / result["wall_s"],
        }
        rows.append(row)
        print(
            f"| {copies} | {row['mb']:.0f} | {row['wall_s']:.0f} | {times.get('to_pairs', 0):.0f} | "
            f"{times.get('pairs', 0):.0f} | {times.get('rest', 0):.0f} | {pairs:,} | "
            f"{row['pairs_per_s']:,.0f} | {row['peak_pss_anon_gb']:.2f} | {row['peak_pss_file_gb']:.2f} |",
            flush=True,
        )
        shutil.rmtree(output, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        growth = (last["peak_pss_anon_gb"] - first["peak_pss_anon_gb"]) / ((last["mb"] - first["mb"]) / 100)
        print(
            f"\npeak Pss_Anon grows by {growth:.3f} GB per 100 MB of text between {first['mb']:.0f} and "
            f"{last['mb']:.0f} MB"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


def stream(args, files: list[Path], size_mb: float, work: Path):
    """--streaming rows: each size trains the tiny model for --steps steps, 32 pairs a step, logging every step;
    the first step's time includes reading the held-out documents (5% x 20 = the first 100) and their pairs."""
    print(
        f"run_pretraining.py --streaming --model_config tiny --per_device_train_batch_size 32 --max_train_steps "
        f"{args.steps} --tokenizer_name {args.tokenizer_name}"
    )
    print(
        "| copies | MB | s to the first step | wall s | steps/s after the first | peak Pss_Anon GB | peak Pss_File GB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for copies in args.copies:
        folder = copies_folder(Path(args.train_files), files, copies, work / "corpora")
        output = work / f"streamed_x{copies}"
        shutil.rmtree(output, ignore_errors=True)
        home = Path(tempfile.mkdtemp(prefix="hf_home_", dir=work))
        env = {
            **os.environ,
            "HF_HOME": str(home),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        command = [
            sys.executable,
            str(REPO / "run_pretraining.py"),
            "--streaming",
            "--train_files",
            str(folder),
            "--output_dir",
            str(output),
            "--tokenizer_name",
            args.tokenizer_name,
            "--model_config",
            "tiny",
            "--max_seq_length",
            str(args.max_seq_length),
            "--dupe_factor",
            str(args.dupe_factor),
            "--per_device_train_batch_size",
            "32",
            "--max_train_steps",
            str(args.steps),
            "--logging_steps",
            "1",
            "--eval_steps",
            "0",
            "--mixed_precision",
            "no",
        ]
        result = run_once(command, env, first_row=output / "metrics.jsonl")
        result.pop("log")
        steps_per_s = (args.steps - 1) / (result["wall_s"] - result["first_step_s"])  # includes the final save
        row = {"copies": copies, "mb": size_mb * copies, "streaming": True, **result, "steps_per_s": steps_per_s}
        rows.append(row)
        print(
            f"| {copies} | {row['mb']:.0f} | {row['first_step_s']:.0f} | {row['wall_s']:.0f} | "
            f"{steps_per_s:.2f} | {row['peak_pss_anon_gb']:.2f} | {row['peak_pss_file_gb']:.2f} |",
            flush=True,
        )
        shutil.rmtree(output, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
