#!/usr/bin/env bash
# AG+GEMM checks and benchmarks on a lent 2-GPU machine, in phases that fit one device call each.
#   bash bench/ag_gemm/ag_gemm_device.sh small   # graph-replay stress, torch.compile + capture, decode and M<=1024 shapes
#   bash bench/ag_gemm/ag_gemm_device.sh large   # the three large anchor shapes, and GPU time before/after this change
#   bash bench/ag_gemm/ag_gemm_device.sh all     # both
# Results go to $OUT (or ./out). "before" needs the previous tree at .device/before (git archive of 37d9ad0).
set -uo pipefail
source "$(dirname "$0")/../common/device_env.sh"
phase=${1:-small}
case "$phase" in all) phases="small large" ;; final) phases="small-timings large" ;; *) phases=$phase ;; esac
for phase in $phases; do
case "$phase" in
  small)
    small=64x8192x8192,128x8192x8192,256x8192x8192,64x6144x4096,128x6144x4096,256x6144x4096,1024x8192x8192
    run 120 bench/ag_gemm/ag_gemm_host.py --shape 128x8192x8192 --out "$OUT/ag_gemm_host.json"
    # the same with repeat eager calls run directly (kernels/runtime/eager_graph.py off): what the replay saves at 2 ranks
    JOINTTUNE_EAGER_GRAPH=0 run 120 bench/ag_gemm/ag_gemm_host.py --shape 128x8192x8192 --out "$OUT/ag_gemm_host_direct.json"
    run 300 bench/ag_gemm/ag_gemm_modes.py --stress "${STRESS:-600}" --out "$OUT/ag_gemm_modes_small.json" --shapes $small
    ;;
  small-timings)  # the small shapes again, no stress or compile check
    small=64x8192x8192,128x8192x8192,256x8192x8192,64x6144x4096,128x6144x4096,256x6144x4096,1024x8192x8192
    run 200 bench/ag_gemm/ag_gemm_modes.py --stress 0 --skip-compile --out "$OUT/ag_gemm_modes_small.json" --shapes $small
    ;;
  large)
    run 300 bench/ag_gemm/ag_gemm_modes.py --stress 0 --skip-compile --out "$OUT/ag_gemm_modes_large.json" \
      --shapes 8192x4096x12288,8192x8192x28672,8192x3584x14336
    # GPU time of the previous kernels and of these, one script (the previous one's), back to back; one
    # process per shape, as that script needs (its second shape's first collective hangs otherwise)
    for s in 8192x4096x12288 8192x8192x28672 8192x3584x14336; do
      (cd .device/before && PYTHONPATH=$PWD run 100 bench/ag_gemm_bench.py --shapes $s --families push_cublas \
         --spin-up-s 1 --out "$OUT/before_$s.json")
      run 100 bench/ag_gemm/ag_gemm_bench.py --shapes $s --families push_cublas --spin-up-s 1 --out "$OUT/after_$s.json"
    done
    python3 - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
merged = {}
for path in sorted(glob.glob(f"{out}/before_*.json") + glob.glob(f"{out}/after_*.json")):
    merged[os.path.basename(path)[:-5]] = json.load(open(path))
    os.remove(path)
json.dump(merged, open(f"{out}/ag_gemm_before_after.json", "w"), indent=1)
PY
    ;;
esac
done
