# Sourced by gpu_session.sh and gpu_extra.sh after they set $out and $total: the log, the environment, the wheels
# in .whl/, `left` (seconds left of $total) and the machine's description.
mkdir -p "$out"
exec > >(tee -a "$out/session.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HOME=${HF_HOME:-/tmp/gpu_session_hf} HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
left() { echo $((total - SECONDS)); }

echo "== machine ($(date -u +%FT%TZ))"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, transformers, accelerate, datasets, pyarrow, tokenizers; print('torch', torch.__version__,
'cuda', torch.version.cuda, '| transformers', transformers.__version__, '| accelerate', accelerate.__version__,
'| datasets', datasets.__version__, '| pyarrow', pyarrow.__version__, '| tokenizers', tokenizers.__version__,
'| cores', __import__('os').cpu_count())"
