# Sourced by the bench/*/*_device.sh scripts, never run on its own: what every call on a lent GPU machine needs first.
# It moves to the repository root; makes $OUT (default ./out); installs the carried .whl wheels
# (../shared/tools/device-wheels.sh) into a temporary site $SITE on PYTHONPATH when there are any; sets what the lent
# machines need (no NVLink multicast); puts this checkout on PYTHONPATH; prints the GPUs and versions; and defines
# `run SECONDS SCRIPT ARGS...`: torchrun over $NPROC ranks (default 2) under a time limit, then its exit code.
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT"
SITE=""
if [ -d .whl ]; then
  SITE=$(mktemp -d)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
run() { timeout "$1" torchrun --nproc-per-node="${NPROC:-2}" "${@:2}"; echo "exit $? after: ${*:2}"; }
