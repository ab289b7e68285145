"""What the record of a checkpoint's files (each file's size and sha256, runtime/checkpoint_files.py) costs a save,
and what checking it costs a resume, at real sizes.

    python benchmarks/bench_checkpoint_record.py                   # base and xxlarge, 3 saves each way
    python benchmarks/bench_checkpoint_record.py --sizes base --repeats 5

Per size: the pretraining model (30,000-piece vocabulary) with LAMB's two moments filled by one step, saved by
`StepCheckpoints.save` (accelerate's save_state, the schedule, the rename) into a folder on the disk of --folder,
alternately with the record and without it: the median seconds the save keeps training waiting, the seconds the
record then takes in its background thread (hashing every file, files fresh in the page cache as in a run), and the
seconds `StepCheckpoints.damage` takes to check the checkpoint at resume (also from the cache here). Each save
starts after an `os.sync()`, so that the previous one's writeback does not slow it.
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

from bench_model import cpu_description


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["base", "xxlarge"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", default=None, help="where the checkpoints are written (default: a temp folder)")
    args = parser.parse_args()

    from accelerate import Accelerator

    from albert_hf import AlbertHFConfig, AlbertHFForPreTraining
    from albert_hf.optimization import Lamb, get_official_schedule
    from albert_hf.pretraining.output import checkpoints

    print(cpu_description())
    accelerator = Accelerator(cpu=True)
    results = {}
    for size in args.sizes:
        torch.manual_seed(0)
        model = AlbertHFForPreTraining(AlbertHFConfig.from_preset(size, vocab_size=30000))
        optimizer = Lamb(model.parameters(), lr=1e-4)
        for parameter in model.parameters():
            parameter.grad = torch.randn_like(parameter) * 1e-3
        optimizer.step()  # the moments exist and hold numbers, as in a checkpoint of a run
        model, optimizer = accelerator.prepare(model, optimizer)
        root = Path(tempfile.mkdtemp(prefix="albert_hf_bench_record_", dir=args.folder))
        saver = checkpoints.StepCheckpoints(root, accelerator, schedule=get_official_schedule(optimizer, 10, 100))
        ways = ("without the record", "with the record")
        seconds = {way: [] for way in (*ways, "record in the background", "check at resume")}
        step = 0
        for _ in range(args.repeats):
            for way in ways:
                step += 1
                os.sync()  # the previous save's dirty pages are on disk: each save starts alike
                patch = mock.patch.object(saver, "_record_in_background") if way == "without the record" else None
                with patch or contextlib.nullcontext():
                    start = time.perf_counter()
                    path = saver.save(step, {"step": step, "epoch": 0, "batches_in_epoch": step})
                    seconds[way].append(time.perf_counter() - start)
                    saver.wait_for_record()  # right after: the hashing a run overlaps with its next steps
                    if way == "with the record":
                        seconds["record in the background"].append(time.perf_counter() - start - seconds[way][-1])
                if way == "with the record":
                    start = time.perf_counter()
                    assert saver.damage(path) is None
                    seconds["check at resume"].append(time.perf_counter() - start)
                written = sum(file.stat().st_size for file in path.rglob("*") if file.is_file())
                shutil.rmtree(path)
        shutil.rmtree(root)
        median = {way: statistics.median(values) for way, values in seconds.items()}
        results[size] = {way: [round(s, 3) for s in values] for way, values in seconds.items()}
        print(
            f"{size} ({written / 1e9:.2f} GB a checkpoint): a save blocks training {median[ways[0]]:.2f} s without "
            f"the record, {median[ways[1]]:.2f} s with it ({median[ways[1]] / median[ways[0]]:.2f}x); the record "
            f"takes {median['record in the background']:.2f} s in the background; the check at resume "
            f"{median['check at resume']:.2f} s",
            flush=True,
        )
        del model, optimizer, saver
        accelerator.free_memory()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
