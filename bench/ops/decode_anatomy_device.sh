#!/usr/bin/env bash
# bench/ops/decode_anatomy.py on a lent 4-GPU machine (issue 36, "Measure the floor"): W=4 on all GPUs (`w4`), then W=2
# on GPUs 0,1 (`w2`), each under a time limit. Results (JSON with the page of text, and each run's log) land in $WORK
# and are packed into $OUT/decode_anatomy.tgz after every step, so a call stopped at its limit still returns what
# finished (the JSON is saved after every item).
# Usage: bash bench/ops/decode_anatomy_device.sh PHASE...  (w4 w2); extra arguments for the script in $ANATOMY_ARGS
# (e.g. ANATOMY_ARGS="--rows 64,128 --tree before").
source "$(dirname "${BASH_SOURCE[0]}")/../common/device_env.sh"
WORK=${WORK:-/tmp/decode_anatomy}
mkdir -p "$WORK"
pack() { tar czf "$OUT/decode_anatomy.tgz" -C "$WORK" .; }
anatomy() { # W GPUS PORT SECONDS
  CUDA_VISIBLE_DEVICES=$2 timeout "$4" torchrun --nproc-per-node="$1" --master-port="$3" bench/ops/decode_anatomy.py \
    --out "$WORK/decode_anatomy_w$1.json" $ANATOMY_ARGS > "$WORK/decode_anatomy_w$1.log" 2>&1
  echo "exit $? after: decode_anatomy w$1"
  grep -E "^flags |^(ag_gemm|gemm_rs) M=|did not finish|Error|^wrote" "$WORK/decode_anatomy_w$1.log" | head -40
  pack
}
for phase in "$@"; do
  case $phase in
    w4) anatomy 4 0,1,2,3 29581 180 ;;
    w2) anatomy 2 0,1 29582 150 ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
# the page of each finished run (the JSON's "page")
for w in 4 2; do
  f="$WORK/decode_anatomy_w$w.json"
  [ -f "$f" ] && python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('page', ''))" "$f"
done
pack
