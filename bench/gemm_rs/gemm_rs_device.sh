#!/usr/bin/env bash
# GEMM+RS checks and benchmarks on a lent 2-GPU machine, in phases that fit one device call each.
#   bash bench/gemm_rs/gemm_rs_device.sh small    # stress (mixed modes, eager + graph replays), M <= 1024 shapes
#   bash bench/gemm_rs/gemm_rs_device.sh large    # the three large shapes
#   bash bench/gemm_rs/gemm_rs_device.sh all      # stress and the issue's six shapes in one run (bench/results)
#   bash bench/gemm_rs/gemm_rs_device.sh sweep    # one jointtune sweep of gemm_rs on the GPUs, then a decorator lookup
#   bash bench/gemm_rs/gemm_rs_device.sh handoff  # the handoff litmus over NVLink (bench/ops/handoff_litmus.py, every family's
#                                         # pattern: rank 0's programs write into rank 1, with its two controls)
# Carry .whl (../shared/tools/device-wheels.sh); results go to $OUT (or ./out).
set -uo pipefail
source "$(dirname "$0")/../common/device_env.sh"
for phase in "$@"; do
case "$phase" in
  small)
    run "${SMALL_S:-420}" bench/gemm_rs/gemm_rs_modes.py --stress "${STRESS:-600}" --out "$OUT/gemm_rs_modes_small.json" \
      --shapes 64x8192x8192,128x8192x8192,1024x8192x8192
    ;;
  large)
    run "${LARGE_S:-420}" bench/gemm_rs/gemm_rs_modes.py --stress 0 --out "$OUT/gemm_rs_modes_large.json" \
      --shapes 8192x4096x12288,8192x3584x14336,8192x8192x28672
    ;;
  all)  # the issue's six shapes and the stress run in one process: the committed run
    run "${ALL_S:-560}" bench/gemm_rs/gemm_rs_modes.py --stress "${STRESS:-600}" --out "$OUT/gemm_rs_modes.json"
    ;;
  handoff)
    for shape in "4 2048" "8 8192"; do
      read -r warps block <<< "$shape"
      run 200 bench/ops/handoff_litmus.py --warps "$warps" --block "$block" --rounds 20000 --launches 5 \
        --out "$OUT/handoff_litmus_2gpu_w${warps}_b$block.json"
    done
    ;;
  sweep)
    export JOINTTUNE_DB_URL="sqlite:///$OUT/gemm_rs_sweep.db"
    timeout "${SWEEP_S:-400}" python3 -m jointtune.cli sweep bench/gemm_rs/gemm_rs_sweep.yaml --profile gpu 2>&1 | tail -40
    run 120 bench/gemm_rs/gemm_rs_decorator.py --db "$JOINTTUNE_DB_URL" --out "$OUT/gemm_rs_decorator.json"
    ;;
esac
done
