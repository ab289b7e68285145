#!/usr/bin/env bash
# What a GPU lease runs first, as one command that ends within TOTAL_SECONDS (default 360), each part under its own
# time cap and writing its JSON as it goes:
# 1. bench_gpu.py at base 32 x 128, 128 x 128 and 32 x 512: transformers' ALBERT, albert_hf eager, and albert_hf's
#    default GPU step (the compiled blocks, the whole step one CUDA graph), on the same batches;
# 2. run_pretraining.py itself on real text ($BOOKS) at the same shapes: with no flag (the default step), then
#    --torch_compile_mode none (eager), their tokens/s and logged losses (benchmarks/check_step_graph.py);
# 3. profile_gpu.py's kernel profile of the default step (compiled, one CUDA graph) at base 128 x 128 (eager's is in
#    BENCHMARKS.md, "CUDA graphs");
# 4. the default step across epoch ends (the shorter last batch runs eagerly between replays) and a checkpoint
#    resume: 20 steps in one run, then the same from its step_10 checkpoint (benchmarks/compare_logs.py).
# The rest (signals, divergence, the recipes' plans, fp16, downstream GLUE) is benchmarks/gpu_extra.sh, for a second
# call. Results go to OUT_DIR: session.log, bench_gpu.json, check_step_graph.json, profile_gpu.json, resume.json.
#
#     bash benchmarks/gpu_session.sh OUT_DIR [TOTAL_SECONDS]
#
# Run from the repository root. Wheels in .whl/ (packages the GPU image lacks, e.g. datasets) are installed first
# into /tmp/site. The 2026-11 leases (an image with torch 2.11 and transformers 5.17) needed these, fetched for
# Python 3.12 with `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux_2_17_x86_64 -d .whl ...`: datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19
# sentencex==1.0.32 transformers==5.24.0. Parts 2 and 4 read a folder of plain-text books ($BOOKS, default books/),
# git-ignored here and carried to the GPU machine; without it part 2 is skipped and says so.
set -u
out=${1:?usage: gpu_session.sh OUT_DIR [TOTAL_SECONDS]}
total=${2:-360}
books=${BOOKS:-books}
source "$(dirname "$0")/gpu_setup.sh"

shapes="base:32x128 base:128x128 base:32x512"
echo "== bench_gpu.py: transformers, eager, and the default step (compiled blocks, one CUDA graph) ($(left) s left)"
timeout 140 python3 benchmarks/bench_gpu.py --out "$out/bench_gpu.json" --time_limit 100 --windows 3 \
    --shapes $shapes --compile_modes default --compile_shapes $shapes --graph_shapes $shapes \
    2>&1 | grep -v -E "Warning|warn\(|AUTOTUNE|triton_mm|^\s*$"

echo "== run_pretraining.py with no flag against eager, on $books ($(left) s left)"
if [ -d "$books" ]; then
    timeout $(( $(left) - 140 )) python3 benchmarks/check_step_graph.py --train_files "$books" \
        --shapes 32x128 128x128 32x512 --forms "default step" eager --steps 30 --logging_steps 5 --timeout 60 \
        --out "$out/check_step_graph.json"
else
    echo "skipped: $books is not a folder of text files (set BOOKS)"
fi

echo "== profile_gpu.py: the kernels of the default step at base 128 x 128 ($(left) s left)"
timeout 75 python3 benchmarks/profile_gpu.py --shapes base:128x128 --implementations "albert_hf default" \
    --out "$out/profile_gpu.json"

echo "== the default step across epoch ends and a checkpoint resume ($(left) s left)"
# the embedded corpus: an epoch ends every few steps at 32 x 128; the resumed run must log the same losses
common="--max_seq_length 128 --per_device_train_batch_size 32 --max_train_steps 20 --logging_steps 5
        --eval_steps 0 --checkpointing_steps 10 --seed 0"
rm -rf /tmp/resume_whole /tmp/resume_part
timeout 60 python3 run_pretraining.py $common --output_dir /tmp/resume_whole 2>&1 | grep -E "runs eagerly|rror"
cp -r /tmp/resume_whole /tmp/resume_part && rm -rf /tmp/resume_part/step_20 /tmp/resume_part/metrics.jsonl
timeout 60 python3 run_pretraining.py $common --output_dir /tmp/resume_part \
    --resume_from_checkpoint /tmp/resume_part/step_10 --overwrite_output_dir false 2>&1 | grep -E "Resumed|rror"
python3 benchmarks/compare_logs.py /tmp/resume_whole /tmp/resume_part --after 10 --out "$out/resume.json"
echo "== done in ${SECONDS} s"
