#!/usr/bin/env bash
# The second call of a GPU lease, after benchmarks/gpu_session.sh, within TOTAL_SECONDS (default 560): the
# whole-step graph of a DDP model (benchmarks/check_ddp_graph.py, NCCL over one process); a diverging
# run in the default step (skipped on the device, stopped by --max_consecutive_skips); a group SIGTERM while the
# default step's graph is captured, then while training; the base and xxlarge recipes' plans on this GPU; the demo
# recipe in fp16 with loss scaling; with DOWNSTREAM=1 pretraining's downstream gain on GLUE
# (examples/reproduce_downstream.py --gpu, about 6 minutes, run alone: docs/downstream.md). Results go to OUT_DIR:
# session.log, ddp_graph.json, plan_base.txt, plan_xxlarge.txt, demo_fp16.json, downstream.json.
#
#     bash benchmarks/gpu_extra.sh OUT_DIR [TOTAL_SECONDS]
#
# As gpu_session.sh: from the repository root, wheels from .whl/, $BOOKS; and the original GLUE download
# ($GLUE_DIR, default glue_data/) for the downstream part.
set -u
out=${1:?usage: gpu_extra.sh OUT_DIR [TOTAL_SECONDS]}
total=${2:-560}
books=${BOOKS:-books}
glue=${GLUE_DIR:-glue_data}
source "$(dirname "$0")/gpu_setup.sh"

echo "== the whole-step graph of a DDP model: its own all-reduce captured (NCCL, one process) ($(left) s left)"
# the losses of the DDP graph and the one-process graph against DDP's eager step, and the three step times
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node 1 benchmarks/check_ddp_graph.py \
    --out "$out/ddp_graph.json" 2>&1 | grep -v -E "Warning|warn\(|^\s*$" | tail -6

echo "== a diverging run on the GPU: --learning_rate 1e4 in the default step (the whole-step graph) ($(left) s left)"
# every step after the first is skipped on the device (update gate 0); the skip count is read one step late, so
# the 8-step limit stops the run one step after the CPU's step (the line names the first skipped step)
timeout 60 python3 run_pretraining.py --learning_rate 1e4 --max_seq_length 128 \
    --per_device_train_batch_size 32 --max_train_steps 60 --logging_steps 10 --eval_steps 0 \
    --max_consecutive_skips 8 --output_dir /tmp/diverge --overwrite_output_dir 2>&1 | grep -v -E "^\s*$|it/s\]$" | tail -3

echo "== a group SIGTERM while the whole-step graph is captured, then while training ($(left) s left)"
# as `timeout` or SLURM deliver it: to the whole process group, the 2 DataLoader workers included; no flag, so the
# default step (the whole-step graph on a CUDA device). The first: status
# 75 and the line "Stopped by SIGTERM while capturing the whole-step graph (the first step), ..."; the second (after
# 25 s): "Stopped by SIGTERM after step N ...", status 75, step_N written. No traceback in either.
for after in 3 25; do
    rm -rf /tmp/group_signal
    setsid python3 run_pretraining.py --max_seq_length 128 \
        --per_device_train_batch_size 32 --max_train_steps 100000 --logging_steps 10 --eval_steps 0 \
        --output_dir /tmp/group_signal > /tmp/group_signal.log 2>&1 &
    leader=$!
    sleep $after
    kill -TERM -- -$leader
    wait $leader
    echo "after $after s: status $? (75 expected); tracebacks: $(grep -c Traceback /tmp/group_signal.log)"
    grep -v -E "^\s*$|it/s\]$" /tmp/group_signal.log | tail -2
    ls /tmp/group_signal 2>/dev/null | grep step_ | tr '\n' ' '; echo
done

echo "== the plans of the base and xxlarge recipes on this GPU ($(left) s left)"
# offline, the recipes' tokenizers are out of reach: the plans take the configs' vocabularies and say so
for recipe in base xxlarge; do
    if [ "$(left)" -lt 150 ]; then echo "skipped $recipe: $(left) s left"; continue; fi
    timeout 100 python3 run_pretraining.py recipes/$recipe.yaml --dry_run --output_dir /tmp/plan_$recipe 2>&1 \
        | grep -E "^(Plan|  )" | tee "$out/plan_$recipe.txt"
done

echo "== demo recipe in fp16 with loss scaling ($(left) s left)"
if [ "$(left)" -lt 80 ]; then echo "skipped: $(left) s left, the demo needs about 75"; else
rm -rf /tmp/demo_fp16
# the demo recipe as it is, with only the precision and the folder changed
{ cat recipes/demo.yaml; printf 'mixed_precision: fp16\noutput_dir: /tmp/demo_fp16\n'; } > /tmp/demo_fp16.yaml
timeout $(( $(left) - 15 )) python3 run_pretraining.py /tmp/demo_fp16.yaml 2>&1 | grep -v -E "^\s*$|it/s\]$" | tail -25
python3 - "$out/demo_fp16.json" <<'EOF'
import json, math, sys
from pathlib import Path
from safetensors.torch import load_file
run = Path("/tmp/demo_fp16")
rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()] if run.exists() else []
weights = load_file(run / "model.safetensors") if (run / "model.safetensors").exists() else {}
summary = {"results": json.loads((run / "all_results.json").read_text()) if (run / "all_results.json").exists() else None,
           "eval_curve": [r for r in rows if "eval_mlm_accuracy" in r],
           "skipped_steps": sum(r.get("skipped_steps", 0) for r in rows),  # each window's count
           "tensors": len(weights), "non_finite_tensors": [k for k, v in weights.items() if not v.isfinite().all()]}
Path(sys.argv[1]).write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps({k: v for k, v in summary.items() if k != "eval_curve"}))
EOF
fi

echo "== downstream: pretrained against random init on GLUE ($(left) s left)"
if [ "${DOWNSTREAM:-0}" != 1 ]; then
    echo "skipped (DOWNSTREAM=1 runs it, about 6 minutes)"
elif [ -d "$books" ] && [ -d "$glue" ]; then
    minutes=$(python3 -c "print(max(1.0, ($(left) - 25) / 60))")
    timeout $(( $(left) - 10 )) python3 examples/reproduce_downstream.py --gpu --train_files "$books" \
        --glue_dir "$glue" --output_dir /tmp/downstream --deadline_minutes "$minutes"
    cp /tmp/downstream/gpu_results.json "$out/downstream.json"
else
    echo "downstream skipped: $books or $glue is not a folder (set BOOKS and GLUE_DIR)"
fi
echo "== done in ${SECONDS} s"
