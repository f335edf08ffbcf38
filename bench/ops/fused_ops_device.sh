#!/usr/bin/env bash
# bench/ops/fused_ops.py on a lent 4-GPU machine: W=4 on all GPUs, then W=2 on GPUs 0,1 and 2,3 at once (two families side
# by side on disjoint pairs: their NVLink traffic never shares a GPU). Results land in $WORK and are packed into
# $OUT/fused_ops.tgz after every step, so a call stopped at its limit still returns what finished.
# Usage: bash bench/ops/fused_ops_device.sh PHASE...  (decode4 decode2 flash4 flash2 large4 large2 small4 small2 flashlong4
#   flashlong2 prefill4 probe arbarrier4 arbarrier2 rsbar4 rsbar2 agbar4 agbar2 arpush4 large36 cold4 l2probe sideprobe tune smoke archeck aranat ar4 arn4 ar4ll ar2 ar2o ar2dq arn2o artune arlong4 dtune2 fence4 fence2)
source "$(dirname "${BASH_SOURCE[0]}")/../common/device_env.sh"
WORK=${WORK:-/tmp/fused_ops}
mkdir -p "$WORK"
pack() { flock "$WORK/.lock" tar czf "$OUT/fused_ops.tgz" --exclude=.lock -C "$WORK" .; }
fo() { # SECONDS NPROC FAMILY SHAPES OUT [more args]
  timeout "$1" python3 bench/ops/fused_ops.py --ranks "$2" --family "$3" --shapes "$4" --out "$WORK/$5" "${@:6}" \
    > "$WORK/$5.log" 2>&1
  echo "exit $? after: fused_ops $3 w$2 $4"; grep -E "graph (cold )?best|^stress|^driver" "$WORK/$5.log"; pack
}
tn() { # SECONDS NAME KERNEL SHAPE W TRIALS DB [more args]: one `jointtune tune` (graph policy) into $WORK/DB, its log
  # $WORK/NAME.log; prints its exit and how the shape went, then packs
  timeout "$1" python3 -m jointtune.cli tune --kernel "$3" --shape "$4" --world-size "$5" --timing graph --trials "$6" \
    --db "sqlite:///$WORK/$7" "${@:8}" > "$WORK/$2.log" 2>&1
  echo "exit $? after: tune $3 w$5 $4 ($6 trials)"; grep -E "—|done in" "$WORK/$2.log" | tail -3; pack
}
DECODE=64x8192x8192,128x8192x8192,256x8192x8192,128x6144x4096,128x4096x14336
FLASH=1x64x8x32768x128,8x64x8x32768x128,32x64x8x8192x128,1x40x8x32768x128,8x56x8x8192x128
LARGE=1024x8192x8192,8192x4096x12288
# issue 36's "M in {16, 32} reported" at 8192 x 8192
RS_FEW=16x8192x8192,32x8192x8192
# the barrier launch's knobs: both transports at 32, 64 and 128 programs
RS_BARRIERS=$(python3 -c 'import json; print(json.dumps([{"mode": "barrier", "transport": t, "reduce_sms": n}
  for t in ("pull", "push") for n in (32, 64, 128)]))')
# GEMM + all-reduce: one-shot pushed before one meeting at 32, 64, 128 programs, and two-shot's barrier exchange
AR_PUSHES='[{"mode": "one_shot", "gemm": "cublas", "transport": "barrier_push", "comm_sms": 32}, {"mode": "one_shot", "gemm": "cublas", "transport": "barrier_push", "comm_sms": 64}, {"mode": "one_shot", "gemm": "cublas", "transport": "barrier_push", "comm_sms": 128}, {"mode": "two_shot", "gemm": "cublas", "transport": "barrier", "comm_sms": 64}]'
AR_FEW=8x8192x8192,32x8192x8192,64x8192x8192,128x8192x8192
# AG+GEMM's barrier launch: the direct landing at 64 programs, the inbox at 64 and 128
# and the landing as tagged words (LL, no meeting) at 32, 64 and 128 programs
AG_BARRIERS='[{"mode": "barrier", "landing": "direct", "barrier_sms": 64}, {"mode": "barrier", "landing": "inbox", "barrier_sms": 64}, {"mode": "barrier", "landing": "inbox", "barrier_sms": 128}, {"mode": "barrier", "landing": "ll", "barrier_sms": 32}, {"mode": "barrier", "landing": "ll", "barrier_sms": 64}, {"mode": "barrier", "landing": "ll", "barrier_sms": 128}]'
# issue 31's remaining GEMM cells (M 16, 32 and 1024 at the three (N, K)) and Flash-Decode's long caches with the user's
# SDPA path as an anchor (two 32K shapes again, to set that anchor beside the earlier runs)
SMALL=16x8192x8192,32x8192x8192,16x6144x4096,32x6144x4096,16x4096x14336,32x4096x14336,1024x6144x4096,1024x4096x14336
FLASH_LONG=1x64x8x524288x128,8x64x8x524288x128,32x64x8x131072x128,8x40x8x262144x128,32x56x8x131072x128,1x64x8x32768x128,8x64x8x32768x128
# GEMM + all-reduce (issue 33's targets): M in 1..128 and 1024 at (N, K per rank) = (8192, 2048), (8192, 7168),
# (5120, 6912): Llama-3-70B's o_proj and down at TP=4 and Qwen2.5-32B's down; K is global (W x K per rank)
# one fence per multi-rank flag release (`signals.release_ranks`), before/after in one call: ./before holds the earlier
# checkout's jointtune (release exchanges), run first, then this tree; every mode at one candidate each
FENCE_GEMM=16x8192x8192,64x8192x8192,128x8192x8192
FENCE_FLASH=1x64x8x32768x128,8x64x8x8192x128
fence_trees() { # W GPUS PORT: ag_gemm, gemm_rs and flash_decode on ./before, then on this tree
  local tree name
  for tree in before .; do
    [ -d "$tree/jointtune" ] || continue
    name=$([ "$tree" = . ] && echo after || echo before)
    PYTHONPATH=$PWD/$tree:$PYTHONPATH CUDA_VISIBLE_DEVICES=$2 fo 150 "$1" ag_gemm "$FENCE_GEMM" \
      ag_gemm_fence_${name}_w$1.json --per-mode 1 --stress 50 --item-timeout 60 --port "$3"
    PYTHONPATH=$PWD/$tree:$PYTHONPATH CUDA_VISIBLE_DEVICES=$2 fo 150 "$1" gemm_rs "$FENCE_GEMM" \
      gemm_rs_fence_${name}_w$1.json --per-mode 1 --stress 50 --item-timeout 60 --port "$3"
    PYTHONPATH=$PWD/$tree:$PYTHONPATH CUDA_VISIBLE_DEVICES=$2 fo 100 "$1" flash_decode "$FENCE_FLASH" \
      flash_decode_fence_${name}_w$1.json --per-mode 1 --stress 50 --item-timeout 60 --port "$3"
  done
}
ar_shapes() { local m out=""; for m in 1 8 32 64 128 1024; do out="$out,${m}x$1x$(($2 * $3))"; done; echo "${out#,}"; }
for phase in "$@"; do
  case $phase in
    decode4)
      fo 200 4 ag_gemm "$DECODE" ag_gemm_w4.json --per-mode 2 --stress 200
      fo 200 4 gemm_rs "$DECODE" gemm_rs_w4.json --per-mode 2 --stress 200 ;;
    flash4) fo 150 4 flash_decode "$FLASH" flash_decode_w4.json --per-mode 2 --stress 200 ;;
    decode2)  # side by side on GPUs 0,1 and 2,3; one after the other on 0,1 of a 2-GPU machine
      if [ "$(nvidia-smi -L | wc -l)" -ge 4 ]; then
        CUDA_VISIBLE_DEVICES=0,1 fo 200 2 ag_gemm "$DECODE" ag_gemm_w2.json --per-mode 2 --stress 200 --port 29511 &
        CUDA_VISIBLE_DEVICES=2,3 fo 200 2 gemm_rs "$DECODE" gemm_rs_w2.json --per-mode 2 --stress 200 --port 29512 &
        wait
      else
        CUDA_VISIBLE_DEVICES=0,1 fo 200 2 ag_gemm "$DECODE" ag_gemm_w2.json --per-mode 2 --stress 200 --port 29511
        CUDA_VISIBLE_DEVICES=0,1 fo 200 2 gemm_rs "$DECODE" gemm_rs_w2.json --per-mode 2 --stress 200 --port 29512
      fi ;;
    flash2) CUDA_VISIBLE_DEVICES=0,1 fo 150 2 flash_decode "$FLASH" flash_decode_w2.json --per-mode 2 --stress 200 ;;
    large4)
      fo 150 4 ag_gemm "$LARGE" ag_gemm_large_w4.json --per-mode 2 --stress 0 --item-timeout 40
      fo 150 4 gemm_rs "$LARGE" gemm_rs_large_w4.json --per-mode 2 --stress 0 --item-timeout 40 ;;
    prefill4)  # Llama-3-70B's sequence-parallel prefill shapes at TP=4 (4096 tokens: qkv and gate_up by AG+GEMM, o_proj
      # and down by GEMM+RS), every mode against the unfused paths and torch's fused ops, the pieces of async-TP's step
      # (bench/e2e/README.md: the prefill loses to async-TP, and gate_up's gather is barely hidden)
      fo 240 4 ag_gemm 4096x10240x8192,4096x57344x8192 ag_gemm_prefill_w4.json --per-mode 2 --stress 0 --item-timeout 60
      fo 240 4 gemm_rs 4096x8192x8192,4096x8192x28672 gemm_rs_prefill_w4.json --per-mode 2 --stress 0 --item-timeout 60 ;;
    probe)  # torch's in-place two-shot all-reduce written plainly in Triton, beside torch's own (two_shot_probe.py):
      # W=4, then W=2 on GPUs 0,1
      for w in 4 2; do
        CUDA_VISIBLE_DEVICES=$( [ $w = 4 ] && echo 0,1,2,3 || echo 0,1 ) timeout 150 torchrun --nproc-per-node=$w \
          --master-port=2954$w bench/ops/two_shot_probe.py --out "$WORK/two_shot_probe_w$w.json" > "$WORK/two_shot_probe_w$w.log" 2>&1
        echo "exit $? after: two_shot_probe w$w"; grep -E '^\{|Error|error' "$WORK/two_shot_probe_w$w.log" | head -12; pack
      done ;;
    arbarrier4)  # the barrier exchange at W=4: gemm_ar_check (its configs among the fused ones), then the RMSNorm form
      # at Llama-3-70B's o_proj shapes with a short stress (--per-mode 3: two-shot's first three seeds, the barrier
      # exchange first from 32 rows)
      CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 120 torchrun --nproc-per-node=4 --master-port=29534 bench/ops/gemm_ar_check.py \
        --shapes 32x8192x2048,9x5120x1728 --out "$WORK/gemm_ar_check_w4.json" > "$WORK/gemm_ar_check_w4.log" 2>&1
      echo "exit $? after: gemm_ar_check w4"; grep -E '^summary|"ok": false' "$WORK/gemm_ar_check_w4.log" | head -20; pack
      fo 200 4 gemm_ar_rmsnorm "$(ar_shapes 8192 2048 4)" gemm_ar_rmsnorm_w4_o.json --per-mode 3 --stress 25 ;;
    rsbar4)  # GEMM+RS's barrier launch (issue 36) at W=4: the decode shapes and 16, 32 rows, both transports at 32, 64
      # and 128 programs, against the fused push and the unfused paths, with a replay stress
      fo 270 4 gemm_rs "$DECODE,$RS_FEW" gemm_rs_barrier_w4.json --modes barrier,push,baseline --per-mode 2 \
        --configs "$RS_BARRIERS" --stress 100 --item-timeout 60 ;;
    rsbar2)  # the same at W=2 on GPUs 0,1, and beside it gemm_ar_check's barrier configs at W=2 on GPUs 2,3 (the meet
      # moved into the runtime: gemm_ar's kernel version changed)
      CUDA_VISIBLE_DEVICES=0,1 fo 270 2 gemm_rs "$DECODE,$RS_FEW" gemm_rs_barrier_w2.json --modes barrier,push,baseline \
        --per-mode 2 --configs "$RS_BARRIERS" --stress 100 --item-timeout 60 --port 29511 &
      CUDA_VISIBLE_DEVICES=2,3 timeout 120 torchrun --nproc-per-node=2 --master-port=29532 bench/ops/gemm_ar_check.py \
        --transports barrier --shapes 64x8192x2048,9x5120x1728 --out "$WORK/gemm_ar_check_w2.json" \
        > "$WORK/gemm_ar_check_w2.log" 2>&1
      echo "exit $? after: gemm_ar_check w2"; grep -E '^summary|"ok": false' "$WORK/gemm_ar_check_w2.log" | head -20; pack
      wait ;;
    agbar4)  # AG+GEMM's barrier launch (issue 36) at W=4: the decode shapes and 16, 32 rows, every landing, against
      # the unfused paths (`AG_MODES` adds modes: push_cublas,push ran beside it in the first such run), replay stress
      fo 260 4 ag_gemm "$DECODE,$RS_FEW" ag_gemm_barrier_w4.json --modes "barrier,baseline${AG_MODES:+,$AG_MODES}" \
        --per-mode 1 --configs "$AG_BARRIERS" --stress 100 --item-timeout 60 ;;
    agbar2)  # the same at W=2, the shapes split between GPUs 0,1 and 2,3 (side by side: their NVLink traffic never
      # shares a GPU)
      CUDA_VISIBLE_DEVICES=0,1 fo 150 2 ag_gemm 64x8192x8192,128x8192x8192,256x8192x8192,16x8192x8192 \
        ag_gemm_barrier_w2_a.json --modes "barrier,baseline${AG_MODES:+,$AG_MODES}" --per-mode 1 \
        --configs "$AG_BARRIERS" --stress 100 --item-timeout 60 --port 29511 &
      CUDA_VISIBLE_DEVICES=2,3 fo 150 2 ag_gemm 128x6144x4096,128x4096x14336,32x8192x8192 ag_gemm_barrier_w2_b.json \
        --modes "barrier,baseline${AG_MODES:+,$AG_MODES}" --per-mode 1 --configs "$AG_BARRIERS" --stress 100 \
        --item-timeout 60 --port 29512 &
      wait ;;
    arpush4)  # GEMM + all-reduce's one-shot pushed into inbox halves before one meeting (transport barrier_push), at
      # Llama-3-70B's o_proj shapes at W=4 (8-128 rows), plain then RMSNorm, beside two-shot's barrier exchange and the
      # seeds of each mode, against the user's unfused paths
      fo 170 4 gemm_ar "$AR_FEW" gemm_ar_push_w4_o.json --modes one_shot,two_shot,baseline --per-mode 1 \
        --configs "$AR_PUSHES" --stress 50 --item-timeout 40
      fo 170 4 gemm_ar_rmsnorm "$AR_FEW" gemm_ar_rmsnorm_push_w4_o.json --modes one_shot,two_shot,baseline \
        --per-mode 1 --configs "$AR_PUSHES" --stress 50 --item-timeout 40 ;;
    large36)  # issue 36's "large shapes unchanged": AG+GEMM and GEMM+RS at the large shapes (every mode, one candidate
      # each), on ./before (the tree before the barrier launches: `mkdir before && git archive 5c0295e jointtune |
      # tar -x -C before`, carried untracked) and then on this tree, W=4
      for tree in before .; do
        [ -d "$tree/jointtune" ] || continue
        name=$([ "$tree" = . ] && echo after || echo before)
        PYTHONPATH=$PWD/$tree:$PYTHONPATH fo 200 4 ag_gemm "$LARGE" ag_gemm_large36_${name}_w4.json --per-mode 1 \
          --stress 0 --item-timeout 40
        PYTHONPATH=$PWD/$tree:$PYTHONPATH fo 200 4 gemm_rs "$LARGE" gemm_rs_large36_${name}_w4.json --per-mode 1 \
          --stress 0 --item-timeout 40
      done ;;
    cold4)  # the weight cold (--cold: each call of a graph after a read of twice L2, that read's time taken off), as
      # a model's layer reads it, beside the usual warm graph: issue 36's decode cells (each mode's first seed and
      # default) and GEMM + all-reduce's RMSNorm form at o_proj rows, W=4
      fo 200 4 gemm_rs "$DECODE" gemm_rs_cold_w4.json --modes barrier,push,baseline --per-mode 1 --stress 0 \
        --item-timeout 60 --cold
      fo 170 4 ag_gemm "$DECODE" ag_gemm_cold_w4.json --modes barrier,baseline --per-mode 1 --stress 0 \
        --item-timeout 60 --cold
      fo 170 4 gemm_ar_rmsnorm "$AR_FEW" gemm_ar_rmsnorm_cold_w4_o.json --modes one_shot,two_shot,baseline \
        --per-mode 1 --stress 0 --item-timeout 40 --cold ;;
    l2probe)  # can the barrier gather's wait pull the GEMM's weight into L2 for the cuBLAS after it? (GPU 0)
      CUDA_VISIBLE_DEVICES=0 timeout 120 python3 bench/ops/l2_prefetch_probe.py --out "$WORK/l2_prefetch_probe.json" \
        > "$WORK/l2_prefetch_probe.log" 2>&1
      echo "exit $? after: l2_prefetch_probe"; cat "$WORK/l2_prefetch_probe.log"; pack ;;
    sideprobe)  # does cuBLAS finish beside a kernel that waits for a flag its stream sets after it? (GPU 0)
      CUDA_VISIBLE_DEVICES=0 timeout 120 python3 bench/ops/side_stream_probe.py --out "$WORK/side_stream_probe.json" \
        > "$WORK/side_stream_probe.log" 2>&1
      echo "exit $? after: side_stream_probe"; cat "$WORK/side_stream_probe.log"; pack ;;
    arbarrier2)  # the barrier exchange at W=2: gemm_ar_check of the barrier configs on GPUs 0,1, then both forms at
      # Llama-3-70B's o_proj shapes side by side (GPUs 0,1 and 2,3; --per-mode 3: one-shot's and two-shot's first
      # three seeds, the barrier exchange first from 32 rows)
      CUDA_VISIBLE_DEVICES=0,1 timeout 70 torchrun --nproc-per-node=2 --master-port=29532 bench/ops/gemm_ar_check.py \
        --transports barrier --shapes 64x8192x2048,9x5120x1728 --out "$WORK/gemm_ar_check_w2.json" \
        > "$WORK/gemm_ar_check_w2.log" 2>&1
      echo "exit $? after: gemm_ar_check w2"; grep -E '^summary|"ok": false' "$WORK/gemm_ar_check_w2.log" | head -20; pack
      CUDA_VISIBLE_DEVICES=0,1 fo 150 2 gemm_ar "$(ar_shapes 8192 2048 2)" gemm_ar_w2_o.json --per-mode 3 --stress 50 \
        --port 29521 &
      CUDA_VISIBLE_DEVICES=2,3 fo 150 2 gemm_ar_rmsnorm "$(ar_shapes 8192 2048 2)" gemm_ar_rmsnorm_w2_o.json --per-mode 3 \
        --stress 50 --port 29522 &
      wait ;;
    tune)  # the tuner on this machine, graph policy, at W=2 and W=4: the baseline in each variant first
      for w in 2 4; do tn 200 tune_w$w gemm_rs 128x8192x8192 $w 12 tune.db --report "$WORK/tune_w$w"; done ;;
    smoke)  # the user's paths (decorator, cache, graph, drop-in) at W=4 and W=2, and a process that exits cleanly after
      # the symmetric-window baseline (exit 0 expected)
      for w in 4 2; do
        timeout 150 torchrun --nproc-per-node=$w --master-port=2960$w bench/ops/gpu_smoke.py > "$WORK/gpu_smoke_w$w.log" 2>&1
        echo "exit $? after: gpu_smoke w$w"; grep -E "PASS|FAIL|pass|fail" "$WORK/gpu_smoke_w$w.log" | tail -12; pack
      done
      fo 120 4 ag_gemm 64x8192x8192 exit_check_w4.json --modes baseline --per-mode 1 --stress 0 ;;
    large2)
      CUDA_VISIBLE_DEVICES=0,1 fo 200 2 ag_gemm "$LARGE" ag_gemm_large_w2.json --per-mode 2 --stress 0 --item-timeout 40 --port 29511 &
      CUDA_VISIBLE_DEVICES=2,3 fo 200 2 gemm_rs "$LARGE" gemm_rs_large_w2.json --per-mode 2 --stress 0 --item-timeout 40 --port 29512 &
      wait ;;
    small4)
      fo 250 4 ag_gemm "$SMALL" ag_gemm_small_w4.json --per-mode 1 --stress 100 --item-timeout 60
      fo 210 4 gemm_rs "$SMALL" gemm_rs_small_w4.json --per-mode 1 --stress 100 --item-timeout 60 ;;
    small2)
      CUDA_VISIBLE_DEVICES=0,1 fo 250 2 ag_gemm "$SMALL" ag_gemm_small_w2.json --per-mode 1 --stress 100 --item-timeout 60 --port 29511 &
      CUDA_VISIBLE_DEVICES=2,3 fo 250 2 gemm_rs "$SMALL" gemm_rs_small_w2.json --per-mode 1 --stress 100 --item-timeout 60 --port 29512 &
      wait ;;
    flashlong4) fo 130 4 flash_decode "$FLASH_LONG" flash_decode_long_w4.json --per-mode 1 --stress 0 --item-timeout 60 ;;
    flashlong2) CUDA_VISIBLE_DEVICES=0,1 fo 150 2 flash_decode "$FLASH_LONG" flash_decode_long_w2.json --per-mode 1 --stress 0 --item-timeout 60 ;;
    aranat)  # GEMM + all-reduce's anatomy at 8, 64, 128 rows, W=4: this tree, then ./before (a checkout's jointtune) if any
      for tree in . before; do
        [ -d "$tree/jointtune" ] || continue
        name=$([ "$tree" = . ] && echo after || echo before)
        timeout 150 torchrun --nproc-per-node=4 --master-port=29541 bench/ops/gemm_ar_anatomy.py --tree "$tree" \
          --out "$WORK/gemm_ar_anatomy_$name.json" > "$WORK/gemm_ar_anatomy_$name.log" 2>&1
        echo "exit $? after: gemm_ar_anatomy $name"; grep -E '^\{|^wrote' "$WORK/gemm_ar_anatomy_$name.log"; pack
      done ;;
    archeck)  # GEMM + all-reduce on the GPUs: every mode and form right, the same bits on every rank, replays (W=4, W=2)
      for w in 4 2; do
        gpus=0,1,2,3; shapes=8x8192x2048,300x4096x1024; limit=330
        [ $w = 2 ] && gpus=0,1 && shapes=37x5120x1728 && limit=240
        CUDA_VISIBLE_DEVICES=$gpus timeout $limit torchrun --nproc-per-node=$w --master-port=2953$w \
          bench/ops/gemm_ar_check.py --shapes $shapes --out "$WORK/gemm_ar_check_w$w.json" > "$WORK/gemm_ar_check_w$w.log" 2>&1
        echo "exit $? after: gemm_ar_check w$w"; grep -E '^summary|"ok": false' "$WORK/gemm_ar_check_w$w.log" | head -20; pack
      done ;;
    artune)  # the tuner on gemm_ar, graph policy, W=4 then W=2: 8 and 64 rows of Llama-3-70B's o_proj
      for w in 4 2; do
        for m in 8 64; do
          tn 140 artune_w${w}_m$m gemm_ar ${m}x8192x$((2048 * w)) $w 12 artune.db --report "$WORK/artune_w${w}_m$m"
        done
      done ;;
    arlong4)  # the tuner on gemm_ar with a longer budget (40 trials, graph policy, W=4) where the short tunes found least:
      # 64 rows of Llama-3-70B's o_proj (0.90x in the anatomy) and 8 rows of its down (1.07x after 8 trials)
      for shape in 64x8192x8192 8x8192x28672; do tn 200 arlong_w4_$shape gemm_ar $shape 4 40 arlong.db; done
      python3 -m jointtune.cli db list --db "sqlite:///$WORK/arlong.db" > "$WORK/arlong_records.txt" 2>&1; pack ;;
    dtune2)  # issue 36 at W=2: the tuner (40 trials, graph policy) on AG+GEMM (GPUs 0,1) and GEMM+RS (GPUs 2,3) at once,
      # 64 and 128 rows of 8192x8192, where the seeds alone came within 1-10% of 1.15x (the decode anatomy)
      for fam in ag_gemm gemm_rs; do
        gpus=0,1; [ $fam = gemm_rs ] && gpus=2,3
        ( for m in 64 128; do
            CUDA_VISIBLE_DEVICES=$gpus tn 200 dtune2_${fam}_m$m $fam ${m}x8192x8192 2 40 dtune2_$fam.db
          done
          python3 -m jointtune.cli db list --db "sqlite:///$WORK/dtune2_$fam.db" > "$WORK/dtune2_${fam}_records.txt" 2>&1 ) &
      done
      wait; pack ;;
    ar4|arn4)  # gemm_ar (ar4) or its residual + RMSNorm form (arn4) at W=4, one fo per (N, K per rank)
      fam=gemm_ar; [ "$phase" = arn4 ] && fam=gemm_ar_rmsnorm
      fo 190 4 $fam "$(ar_shapes 8192 2048 4)" ${fam}_w4_o.json --per-mode 3 --stress 200
      fo 190 4 $fam "$(ar_shapes 8192 7168 4)" ${fam}_w4_d.json --per-mode 3 --stress 0
      fo 190 4 $fam "$(ar_shapes 5120 6912 4)" ${fam}_w4_q.json --per-mode 3 --stress 0 ;;
    ar2|ar2o|ar2dq)  # both forms at W=2, side by side on disjoint pairs (one after the other on a 2-GPU machine); ar2o:
      # only the o_proj shapes (8192, 2048 per rank), ar2dq: only the two down shapes
      two_pairs=$(( $(nvidia-smi -L | wc -l) >= 4 ))
      nks=("8192 2048 o" "8192 7168 d" "5120 6912 q"); [ "$phase" = ar2o ] && nks=("8192 2048 o")
      [ "$phase" = ar2dq ] && nks=("8192 7168 d" "5120 6912 q")
      for fam in gemm_ar gemm_ar_rmsnorm; do
        gpus=0,1; port=29521; [ $fam = gemm_ar_rmsnorm ] && [ $two_pairs = 1 ] && gpus=2,3 && port=29522
        # side by side: 190 s a run; one after the other (2 GPUs): the runs share one call's 10 minutes (a run takes
        # 50-60 s on 2x H100), so on such a machine call ar2o and ar2dq, not ar2
        limit=190; [ $two_pairs = 1 ] || limit=$(( 560 / (2 * ${#nks[@]}) < 190 ? 560 / (2 * ${#nks[@]}) : 190 ))
        run_pair() { for nk in "${nks[@]}"; do set -- $nk
            CUDA_VISIBLE_DEVICES=$gpus fo $limit 2 $fam "$(ar_shapes $1 $2 2)" ${fam}_w2_$3.json --per-mode 3 \
              --stress $([ $3 = o ] && echo 200 || echo 0) --port $port
          done; }
        if [ $two_pairs = 1 ]; then run_pair & else run_pair; fi
      done
      wait ;;
    arn2o)  # the residual + RMSNorm form alone at W=2, o_proj shapes, on GPUs 0,1; then what the unfused norm costs
      CUDA_VISIBLE_DEVICES=0,1 fo 190 2 gemm_ar_rmsnorm "$(ar_shapes 8192 2048 2)" gemm_ar_rmsnorm_w2_o.json --per-mode 3 \
        --stress 50 --port 29523
      CUDA_VISIBLE_DEVICES=0 timeout 100 python3 bench/ops/rms_norm_anchor.py --out "$WORK/rms_norm_anchor.json" \
        > "$WORK/rms_norm_anchor.log" 2>&1
      echo "exit $? after: rms_norm_anchor"; cat "$WORK/rms_norm_anchor.log"; pack ;;
    ar4ll)  # one call (4.5 minutes on 4x H100) for two-shot's LL words at W=4: gemm_ar_check first (two two-shot LL
      # configs among the fused ones), then both forms at Llama-3-70B's o_proj shapes (--per-mode 3 takes two-shot's
      # first three seeds: its LL words among them up to 32 rows), then the anatomy (two two-shot LL configs, 23 fused
      # configs a row); it writes the names archeck, ar4, arn4 and aranat write: run it in a call of its own
      CUDA_VISIBLE_DEVICES=0,1,2,3 timeout 120 torchrun --nproc-per-node=4 --master-port=29534 bench/ops/gemm_ar_check.py \
        --shapes 32x8192x2048 --out "$WORK/gemm_ar_check_w4.json" > "$WORK/gemm_ar_check_w4.log" 2>&1
      echo "exit $? after: gemm_ar_check w4"; grep -E '^summary|"ok": false' "$WORK/gemm_ar_check_w4.log" | head -20; pack
      fo 160 4 gemm_ar_rmsnorm "$(ar_shapes 8192 2048 4)" gemm_ar_rmsnorm_w4_o.json --per-mode 3 --stress 100
      fo 130 4 gemm_ar "$(ar_shapes 8192 2048 4)" gemm_ar_w4_o.json --per-mode 3 --stress 0
      timeout 140 torchrun --nproc-per-node=4 --master-port=29541 bench/ops/gemm_ar_anatomy.py \
        --out "$WORK/gemm_ar_anatomy_after.json" > "$WORK/gemm_ar_anatomy_after.log" 2>&1
      echo "exit $? after: gemm_ar_anatomy"; grep -E '^\{|^wrote' "$WORK/gemm_ar_anatomy_after.log"; pack ;;
    fence4) fence_trees 4 0,1,2,3 29561 ;;
    fence2) fence_trees 2 0,1 29562 ;;
    *) echo "unknown phase $phase"; exit 2 ;;
  esac
done
pack
