#!/bin/bash
# Pretraining on a SLURM cluster, preemption-safe: `sbatch examples/slurm_pretraining.sh` from the repository.
# 120 s before the time limit SLURM sends SIGTERM to this script, which passes it on (srun -> the launcher on each
# machine -> every process). The run finishes its step, writes a complete step_N checkpoint and exits with status
# 75. A preemption, or `--signal` without `B:`, signals every process of the step instead: the run stops the same
# way (the DataLoader workers leave the decision to their process). Either way the job then queues itself again
# if the run has no final model yet and wrote a newer checkpoint, and the next start continues with
# --resume_from_checkpoint latest (docs/distributed.md, "Preemption").
# Not run here (the project's CI machine has no SLURM); the pieces it relies on are tested (README, "Preemption").
#SBATCH --job-name=albert-pretraining
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one launcher per machine; it starts that machine's processes
#SBATCH --gpus-per-node=8
#SBATCH --time=24:00:00
#SBATCH --signal=B:TERM@120          # B: to this script, which forwards it below
#SBATCH --requeue
#SBATCH --open-mode=append           # a requeued job continues the same log
#SBATCH --output=albert-pretraining-%j.log

export GPUS_PER_NODE=8
export OUTPUT_DIR=${OUTPUT_DIR:-$PWD/outputs/albert-base}   # on storage every machine sees
export TRAIN_FILES=${TRAIN_FILES:-$PWD/corpus}
export MAIN_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# After passing a signal on, the launcher waits this long for its processes (a step and a checkpoint), then kills
# them (torch's default: 30 s).
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=110

newest() { ls -d "$OUTPUT_DIR"/step_* 2>/dev/null | sed 's/.*step_//' | sort -n | tail -n 1; }
before=$(newest)

srun bash -c 'accelerate launch --config_file examples/accelerate_configs/multi_node.yaml \
    --num_machines "$SLURM_NNODES" --num_processes "$((SLURM_NNODES * GPUS_PER_NODE))" \
    --machine_rank "$SLURM_NODEID" --main_process_ip "$MAIN_NODE" --main_process_port 29500 \
    run_pretraining.py --model_config base --train_files "$TRAIN_FILES" --max_seq_length 512 \
    --per_device_train_batch_size 32 --gradient_accumulation_steps 8 --mixed_precision bf16 \
    --checkpointing_steps 1000 --resume_from_checkpoint latest --output_dir "$OUTPUT_DIR"' &
pid=$!
trap 'kill -TERM "$pid"' TERM
wait "$pid"
wait "$pid"                              # after a signal the first wait returns at once: wait for the checkpoint
# The launcher exits with 1 after a stop as after a failure, so the folder decides: not finished, and progress made
# (a failing run writes no newer checkpoint, so it is not queued again and again).
if [ ! -f "$OUTPUT_DIR/model.safetensors" ] && [ "$(newest)" != "$before" ]; then
    scontrol requeue "$SLURM_JOB_ID"
fi
