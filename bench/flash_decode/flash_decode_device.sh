#!/usr/bin/env bash
# Flash-Decode checks and benchmarks on a lent 2-GPU machine, in phases that fit one device call each.
#   bash bench/flash_decode/flash_decode_device.sh check    # torch.compile + capture through the op, the stress run, batch 1
#   bash bench/flash_decode/flash_decode_device.sh b8 b32   # batch 8, batch 32 (S 8K..512K each)
#   bash bench/flash_decode/flash_decode_device.sh sweep    # one jointtune sweep of flash_decode on the GPUs, then a decorator lookup
# Carry .whl (../shared/tools/device-wheels.sh); results go to $OUT (or ./out).
set -uo pipefail
source "$(dirname "$0")/../common/device_env.sh"
B1=1x64x8x8192x128,1x64x8x32768x128,1x64x8x131072x128,1x64x8x524288x128
B8=8x64x8x8192x128,8x64x8x32768x128,8x64x8x131072x128,8x64x8x524288x128
B32=32x64x8x8192x128,32x64x8x32768x128,32x64x8x131072x128,32x64x8x524288x128
for phase in "$@"; do
case "$phase" in
  check)
    run "${CHECK_S:-480}" bench/flash_decode/flash_decode_modes.py --compile-check --stress "${STRESS:-600}" --shapes "$B1" \
      --out "$OUT/flash_decode_check_b1.json"
    ;;
  b8)
    run "${B8_S:-420}" bench/flash_decode/flash_decode_modes.py --stress 0 --shapes "$B8" --out "$OUT/flash_decode_b8.json"
    ;;
  b32)
    run "${B32_S:-420}" bench/flash_decode/flash_decode_modes.py --stress 0 --shapes "$B32" --out "$OUT/flash_decode_b32.json"
    ;;
  sweep)
    export JOINTTUNE_DB_URL="sqlite:///$OUT/flash_decode_sweep.db"
    timeout "${SWEEP_S:-300}" python3 -m jointtune.cli sweep bench/flash_decode/flash_decode_sweep.yaml --profile gpu 2>&1 | tail -40
    run 120 bench/flash_decode/flash_decode_decorator.py --db "$JOINTTUNE_DB_URL" --out "$OUT/flash_decode_decorator.json"
    ;;
esac
done
