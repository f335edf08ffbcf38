#!/usr/bin/env bash
# AG+GEMM checks and benchmarks on a lent 2-GPU machine, in phases that fit one device call each.
#   bash bench/ag_gemm_device.sh small   # graph-replay stress, torch.compile + capture, decode and M<=1024 shapes
#   bash bench/ag_gemm_device.sh large   # the three large anchor shapes, and GPU time before/after this change
#   bash bench/ag_gemm_device.sh all     # both
# Results go to $OUT (or ./out). "before" needs the previous tree at .device/before (git archive of 37d9ad0).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${OUT:-out}")
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
run() { timeout "$1" torchrun --nproc-per-node=2 "${@:2}"; echo "exit $? after: ${*:2}"; }
phase=${1:-small}
case "$phase" in all) phases="small large" ;; *) phases=$phase ;; esac
for phase in $phases; do
case "$phase" in
  small)
    small=64x8192x8192,128x8192x8192,256x8192x8192,64x6144x4096,128x6144x4096,256x6144x4096,1024x8192x8192
    run 120 bench/ag_gemm_host.py --shape 128x8192x8192 --out "$OUT/ag_gemm_host.json"
    run 300 bench/ag_gemm_modes.py --stress "${STRESS:-600}" --out "$OUT/ag_gemm_modes_small.json" --shapes $small
    ;;
  large)
    run 300 bench/ag_gemm_modes.py --stress 0 --skip-compile --out "$OUT/ag_gemm_modes_large.json" \
      --shapes 8192x4096x12288,8192x8192x28672,8192x3584x14336
    big=8192x4096x12288,8192x8192x28672,8192x3584x14336
    # GPU time of the previous kernels and of these, one script (the previous one's), back to back
    (cd .device/before && PYTHONPATH=$PWD run 150 bench/ag_gemm_bench.py --shapes $big --families push_cublas \
       --out "$OUT/before.json")
    run 150 bench/ag_gemm_bench.py --shapes $big --families push_cublas --out "$OUT/after.json"
    ;;
esac
done
