#!/usr/bin/env bash
# What one GPU can check, run on the lent single-GPU machine (nvidia-h200) from the repository root:
#   bash bench/ops/single_gpu_device.sh tune19 [kernel-ab] [kernel-grid] [kernel-defaults] [kernel-merge] [atomic-fix]
#   [stress-w1] [fix-ab] [kernel-floors] [rs-epilogue] [tile-small-m] [tile-rate] [rs-tile] [tile-anatomy] [ag-small-m]
#   [handoff] [handoff-ab]
# tune19:      issue 19's before/after tuning run: the same exhaustive `jointtune tune` (world size 1) from a
#              checkout before the autotune/ restructure (.old19, `git archive 0777b74`) and after it (.new19,
#              `git archive 8b94e6c`), each on its own SQLite store, for flash_decode and ag_gemm.
# kernel-ab:   bench/flash_decode/flash_decode_kernel.py on flash_decode_modes' tile, .old19's kernel then this tree's.
# kernel-grid: bench/flash_decode/flash_decode_kernel.py --grid full on this tree's kernel.
# kernel-defaults: --grid defaults (the space default against revision 2's and its neighbours, 14 layer shapes).
# kernel-merge: --grid defaults at three shapes with a chunk merge of 4096 and of 16384 floats per step.
# atomic-fix:  issue 15: bench/gemm_rs/gemm_rs_atomic.py --any-tile on the kernels before the ordering fix (.variants/base),
#              with only its acquire (.variants/acquire), with only its barriers (.variants/barrier), then this tree
#              with more calls and push beside it. .variants/* hold a `jointtune` each (made with git archive).
# stress-w1:   every family's modes benchmark with its graph-replay stress run at world size 1.
# shared2:     two ranks on this one GPU (gloo group, peers through CUDA IPC: `jointtune/kernels/runtime/ipc.py`): gpu_smoke,
#              ag_gemm_stress, every family's modes stress and compile checks (--no-timing), and the handoff litmus
#              between the two processes. It checks the multi-rank paths where no 2-GPU machine is lent; the GPU
#              time-slices the two processes, so nothing here is timed.
# eager-graph: repeat eager calls replayed from their own CUDA graph: gpu_smoke and every family's stress at 2 ranks
#              on this GPU, then ag_gemm_host.py at world size 1 with the graph off and on (twice), then gpu_smoke at 1.
# smoke:       bench/ops/gpu_smoke.py at world size 1: every family through the decorator (eager, cached, in a graph),
#              a raw-length flash_decode key finding its bucket's record, the triton.autotune drop-in on a compiled
#              kernel, and inputs that require grad refused.
# fix-ab:      what the ordering fix costs: the Flash-Decode and GEMM+RS modes benchmarks (no stress) on the kernels
#              before it (.variants/base) and on this tree, alternating, twice.
# kernel-floors: --grid floors: the space default against what any kernel needs to read the same KV bytes once
#              (bench/flash_decode/read_floor.py: best streaming read over program counts and steps, and an empty launch).
# rs-epilogue: GEMM+RS push and pull with reduce programs beside the GEMM against `reduce_by=epilogue` (every SM on
#              the GEMM, the own rows summed in the epilogue), at world size 1 on the per-rank GEMMs of the issue's
#              2-rank shapes, with cuBLAS (baseline) and the tile GEMM alone (ce_triton); then the stress run.
# tile-small-m: bench/gemm_rs/tile_gemm_small_m.py: the fused kernels' tile GEMM alone at 32-128 rows, over a grid of
#              tiles, against cuBLAS and the bound of reading A and B once. tile-anatomy: its --anatomy (the
#              reduce_by=tile launch against the tile GEMM alone: opening the call, reading its epoch only, no epoch).
# tile-rate:   bench/ops/tile_gemm_rate.py: the families' K loop against an ordered split-K merge and tensor-descriptor
#              (TMA) loads, and cuBLAS, with the weight warm in L2 and cold (copies cycled), one rank's GEMM at decode rows.
# rs-tile:     GEMM+RS `reduce_by=tile` (tiles over every rank's rows) against the other fused launches and cuBLAS at
#              decode rows, world size 1; then the stress run.
# ag-small-m:  AG+GEMM's Triton modes at decode rows (their candidates, one row tile over M among them) against
#              cuBLAS, world size 1.
# handoff:     bench/ops/handoff_litmus.py: one thread's release and acquire handing a program's data to another SM
#              (the kernels' pattern, the old per-thread atomics, and two controls that drop the acquire or barrier).
# handoff-ab:  what dropping the per-thread atomics gains: the tile anatomy and the GEMM+RS, AG+GEMM and Flash-Decode
#              modes benchmarks at decode sizes (no stress) on the kernels before (.variants/base) and on this tree,
#              one round each; name it twice to alternate twice. handoff-large: the same at large shapes (GEMM+RS,
#              AG+GEMM), before/after/before/after in one call.
# Needs .whl (../shared/tools/device-wheels.sh) and, for tune19 and kernel-ab, .old19/.new19, for atomic-fix,
# fix-ab and handoff-ab .variants; carry them all.
set -uo pipefail
source "$(dirname "$0")/../common/device_env.sh"
[ -n "$SITE" ] || { echo "single_gpu_device.sh: carry .whl (the tuner's and the service's wheels)"; exit 1; }
NPROC=1
ROOT=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.csv"

cli() {  # cli TREE DB ARGS...: the jointtune CLI of one checkout, on its own store
  local tree=$1 db=$2
  shift 2
  (cd "$tree" && PYTHONPATH="$SITE:$tree" JOINTTUNE_DB_URL="sqlite:///$db" \
    timeout 140 python3 -m jointtune.cli "$@")
}

tune19() {
  local fd=(tune --kernel flash_decode --shape 1x64x8x16384x128 --world-size 1 --strategy exhaustive --trials 40
            --restrict mode=baseline --restrict heads_per_program=8 --restrict BLOCK_N=32,64 --restrict num_warps=4
            --restrict num_stages=2 --restrict kv_split=64,256,1024,4096)
  local ag=(tune --kernel ag_gemm --shape 4096x8192x8192 --world-size 1 --strategy exhaustive --trials 40
            --restrict mode=push --restrict BLOCK_M=128 --restrict BLOCK_N=64,128,256 --restrict BLOCK_K=64
            --restrict GROUP_M=8 --restrict num_warps=4,8 --restrict num_stages=3 --restrict SPLIT_K=1
            --restrict comm_sms=4 --restrict chunk_m=512)
  for tree in old19 new19; do
    for job in fd ag; do
      local -n argv=$job
      echo "== tune19 $tree $job: jointtune ${argv[*]}"
      cli "$ROOT/.$tree" "$OUT/tune19_$tree.db" "${argv[@]}" --report "$OUT/tune19_${tree}_$job" \
        > "$OUT/tune19_${tree}_$job.log" 2>&1
      echo "rc $?"
      grep -A4 "tuned configs" "$OUT/tune19_${tree}_$job.log" | tail -1
    done
  done
}

kernel_ab() {
  for tree in old19 main; do
    local t=$ROOT
    [ "$tree" = old19 ] && t=$ROOT/.old19
    echo "== kernel-ab $tree"
    run 280 bench/flash_decode/flash_decode_kernel.py --tree "$t" --label "$tree" --out "$OUT/flash_decode_kernel_ab_$tree.json" \
      > "$OUT/flash_decode_kernel_ab_$tree.log" 2>&1
    tail -1 "$OUT/flash_decode_kernel_ab_$tree.log"
    grep "^\[" "$OUT/flash_decode_kernel_ab_$tree.log"
  done
}

kernel() {  # kernel NAME SECONDS ARGS...: bench/flash_decode/flash_decode_kernel.py on this tree into $OUT/flash_decode_kernel_NAME.*
  local name=$1 seconds=$2
  shift 2
  echo "== kernel $name: $*"
  run "$seconds" bench/flash_decode/flash_decode_kernel.py --label "$name" --out "$OUT/flash_decode_kernel_$name.json" "$@" \
    > "$OUT/flash_decode_kernel_$name.log" 2>&1
  tail -1 "$OUT/flash_decode_kernel_$name.log"
  grep "^\[" "$OUT/flash_decode_kernel_$name.log"
}

atomic_fix() {
  local shapes=1024x8192x8192,256x4096x4096
  for v in base acquire barrier; do
    echo "== atomic-fix $v"
    run 150 bench/gemm_rs/gemm_rs_atomic.py --tree "$ROOT/.variants/$v" --any-tile --modes atomic --tiles 2,3,4 \
      --shapes $shapes --calls 6 --replays 6 --out "$OUT/atomic_fix_$v.json" > "$OUT/atomic_fix_$v.log" 2>&1
    grep -E "^[0-9]+x|^exit" "$OUT/atomic_fix_$v.log"
  done
  echo "== atomic-fix both (this tree)"
  run 280 bench/gemm_rs/gemm_rs_atomic.py --any-tile --calls 24 --replays 24 --out "$OUT/atomic_fix_both.json" \
    > "$OUT/atomic_fix_both.log" 2>&1
  grep -E "^[0-9]+x|^exit" "$OUT/atomic_fix_both.log"
}

smoke() {  # bench/ops/gpu_smoke.py: the user's paths (decorator, drop-in, bucketed keys, forward-only refusal) on CUDA
  run 300 bench/ops/gpu_smoke.py --out "$OUT/gpu_smoke_w1.json" > "$OUT/gpu_smoke_w1.log" 2>&1
  grep -E "^\[rank|^exit|Error" "$OUT/gpu_smoke_w1.log" | cut -c1-300
}

modes_stress_shared2() {  # NAME REPLAYS: every family's modes stress (and compile check) at 2 ranks on this GPU
  local NPROC=2 fam extra
  for fam in ag_gemm gemm_rs flash_decode; do
    extra=()
    [ "$fam" = flash_decode ] && extra=(--compile-check)
    run 300 "bench/${fam}/${fam}_modes.py" --no-timing "${extra[@]}" --stress "$2" --out "$OUT/${fam}_modes_$1.json" \
      > "$OUT/${fam}_modes_$1.log" 2>&1
    grep -E "^stress|^compiled|^exit|Error" "$OUT/${fam}_modes_$1.log" | cut -c1-600
  done
}

shared2() {  # every multi-rank path on this one GPU: two ranks over gloo and CUDA IPC (checks; timings mean nothing)
  local NPROC=2 n=${SHARED_STRESS:-200}
  run 300 bench/ops/gpu_smoke.py --out "$OUT/gpu_smoke_shared2.json" > "$OUT/gpu_smoke_shared2.log" 2>&1
  grep -E "^\[rank|^exit|Error" "$OUT/gpu_smoke_shared2.log" | cut -c1-300
  run 240 bench/ag_gemm/ag_gemm_stress.py --reps 6 --out "$OUT/ag_gemm_stress_shared2.json" > "$OUT/ag_gemm_stress_shared2.log" 2>&1
  grep -E "wrong|^exit|Error" "$OUT/ag_gemm_stress_shared2.log" | cut -c1-200
  modes_stress_shared2 shared2 "$n"
  run 200 bench/ops/handoff_litmus.py --warps 4 --block 2048 --rounds 300 --launches 2 \
    --out "$OUT/handoff_litmus_shared2.json" > "$OUT/handoff_litmus_shared2.log" 2>&1
  grep -E "^\[|^exit|Error" "$OUT/handoff_litmus_shared2.log" | cut -c1-300
}

eager_graph() {  # repeat eager calls replayed from their own graph (kernels/runtime/eager_graph.py): right at 2 ranks on this
  # GPU (gpu_smoke's eager_replay check, every family's stress with its eager calls), and what it saves the host at
  # world size 1 (ag_gemm_host.py with JOINTTUNE_EAGER_GRAPH=0, then on, then 0 and on again)
  local NPROC=2 g round
  run 300 bench/ops/gpu_smoke.py --out "$OUT/gpu_smoke_eager_shared2.json" > "$OUT/gpu_smoke_eager_shared2.log" 2>&1
  grep -E "^\[rank 0\]|^exit|Error" "$OUT/gpu_smoke_eager_shared2.log" | cut -c1-400
  modes_stress_shared2 eager_shared2 "${SHARED_STRESS:-300}"
  NPROC=1
  for round in 1 2; do
    for g in 0 1; do
      JOINTTUNE_EAGER_GRAPH=$g run 200 bench/ag_gemm/ag_gemm_host.py --shape 128x8192x8192 \
        --out "$OUT/ag_gemm_host_w1_graph${g}_$round.json" > "$OUT/ag_gemm_host_w1_graph${g}_$round.log" 2>&1
      echo "== eager graph $g, round $round"
      grep -E "^\[host|^exit|Error" "$OUT/ag_gemm_host_w1_graph${g}_$round.log" | cut -c1-200
    done
  done
  run 200 bench/ops/gpu_smoke.py --out "$OUT/gpu_smoke_eager_w1.json" > "$OUT/gpu_smoke_eager_w1.log" 2>&1
  grep -E "^\[rank 0\] eager|^exit|Error" "$OUT/gpu_smoke_eager_w1.log" | cut -c1-400
}

stress_w1() {
  run 200 bench/flash_decode/flash_decode_modes.py --compile-check --stress 600 --shapes 1x64x8x16384x128 \
    --out "$OUT/flash_decode_modes_w1.json" > "$OUT/flash_decode_modes_w1.log" 2>&1
  tail -4 "$OUT/flash_decode_modes_w1.log"
  run 300 bench/gemm_rs/gemm_rs_modes.py --stress 600 --shapes 64x8192x8192,1024x8192x8192,8192x4096x12288 \
    --out "$OUT/gemm_rs_modes_w1.json" > "$OUT/gemm_rs_modes_w1.log" 2>&1
  tail -4 "$OUT/gemm_rs_modes_w1.log"
  run 150 bench/ag_gemm/ag_gemm_modes.py --stress 600 --shapes 128x8192x8192 \
    --out "$OUT/ag_gemm_modes_w1.json" > "$OUT/ag_gemm_modes_w1.log" 2>&1
  tail -4 "$OUT/ag_gemm_modes_w1.log"
}

fix_ab() {
  for round in 1 2; do
    for tree in base this; do
      local t=()
      [ "$tree" = base ] && t=(--tree "$ROOT/.variants/base")
      echo "== fix-ab round $round: $tree"
      run 150 bench/flash_decode/flash_decode_modes.py "${t[@]}" --stress 0 --shapes 1x64x8x4096x128,1x64x8x16384x128 \
        --out "$OUT/fix_ab_fd_${tree}_$round.json" > "$OUT/fix_ab_fd_${tree}_$round.log" 2>&1
      grep -E "^\[|^exit" "$OUT/fix_ab_fd_${tree}_$round.log" | cut -c1-400
      run 150 bench/gemm_rs/gemm_rs_modes.py "${t[@]}" --stress 0 --modes push,pull --shapes 64x8192x8192,1024x8192x8192 \
        --out "$OUT/fix_ab_rs_${tree}_$round.json" > "$OUT/fix_ab_rs_${tree}_$round.log" 2>&1
      grep -E "^\[|^exit" "$OUT/fix_ab_rs_${tree}_$round.log" | cut -c1-400
    done
  done
}

rs_epilogue() {
  run 420 bench/gemm_rs/gemm_rs_modes.py --stress 600 --modes push,push_epilogue,pull,pull_epilogue,ce_triton,baseline \
    --shapes 8192x4096x6144,8192x3584x7168,8192x8192x14336,1024x8192x4096,128x8192x4096 \
    --out "$OUT/gemm_rs_epilogue_w1.json" > "$OUT/gemm_rs_epilogue_w1.log" 2>&1
  grep -E "^\[|^stress|^exit|Error" "$OUT/gemm_rs_epilogue_w1.log" | cut -c1-600
}

tile_small_m() {
  run 540 bench/gemm_rs/tile_gemm_small_m.py --out "$OUT/tile_gemm_small_m.json" > "$OUT/tile_gemm_small_m.log" 2>&1
  grep -E "^\[|^exit|Error" "$OUT/tile_gemm_small_m.log" | cut -c1-600
}

tile_rate() {  # TILE_RATE_ARGS: more arguments (--shapes, --loops)
  run 540 bench/ops/tile_gemm_rate.py --out "$OUT/tile_gemm_rate.json" ${TILE_RATE_ARGS:-} > "$OUT/tile_gemm_rate.log" 2>&1
  grep -E "^\[|^exit|Error" "$OUT/tile_gemm_rate.log" | cut -c1-700
}

tile_anatomy() {
  run 200 bench/gemm_rs/tile_gemm_small_m.py --anatomy --out "$OUT/tile_anatomy.json" > "$OUT/tile_anatomy.log" 2>&1
  grep -E "^\[|^exit|Error" "$OUT/tile_anatomy.log" | cut -c1-600
}

rs_tile() {
  run 300 bench/gemm_rs/gemm_rs_modes.py --stress 600 --modes push,push_epilogue,push_tile,pull_tile,ce_triton,baseline \
    --shapes 32x8192x4096,64x8192x4096,128x8192x4096,256x8192x4096 \
    --out "$OUT/gemm_rs_tile_w1.json" > "$OUT/gemm_rs_tile_w1.log" 2>&1
  grep -E "^\[|^stress|^exit|Error" "$OUT/gemm_rs_tile_w1.log" | cut -c1-700
}

ag_small_m() {
  run 300 bench/ag_gemm/ag_gemm_modes.py --stress 0 --modes push,pull,ce_triton,baseline \
    --shapes 64x8192x8192,128x8192x8192,64x6144x4096,128x6144x4096 \
    --out "$OUT/ag_gemm_small_m_w1.json" > "$OUT/ag_gemm_small_m_w1.log" 2>&1
  grep -E "^\[|^exit|Error" "$OUT/ag_gemm_small_m_w1.log" | cut -c1-700
}

handoff() {
  local shape warps block
  for shape in "4 2048" "8 8192"; do
    read -r warps block <<< "$shape"
    echo "== handoff: $warps warps, $block ints per message"
    timeout 240 python3 bench/ops/handoff_litmus.py --warps "$warps" --block "$block" --rounds 50000 --launches 5 \
      --out "$OUT/handoff_litmus_w${warps}_b$block.json" > "$OUT/handoff_litmus_w${warps}_b$block.log" 2>&1
    echo "exit $?"
    grep -E "^\[|Error" "$OUT/handoff_litmus_w${warps}_b$block.log" | cut -c1-300
  done
}

AB_ROUND=${AB_ROUND:-0}  # the round before the first of this call (AB_ROUND=1: this call runs round 2)
handoff_ab() {  # one round (base, then this tree) per call: `handoff-ab handoff-ab` alternates twice
  AB_ROUND=$((AB_ROUND + 1))
  local round
  for round in $AB_ROUND; do
    for tree in base this; do
      local t=()
      [ "$tree" = base ] && t=(--tree "$ROOT/.variants/base")
      echo "== handoff-ab round $round: $tree"
      run 100 bench/gemm_rs/tile_gemm_small_m.py --anatomy "${t[@]}" --out "$OUT/handoff_ab_anatomy_${tree}_$round.json" \
        > "$OUT/handoff_ab_anatomy_${tree}_$round.log" 2>&1
      grep -E "^\[|^exit" "$OUT/handoff_ab_anatomy_${tree}_$round.log" | cut -c1-400
      run 200 bench/gemm_rs/gemm_rs_modes.py "${t[@]}" --stress 0 --modes push,push_epilogue,push_tile,pull_tile,baseline \
        --shapes 64x8192x4096,128x8192x4096,1024x8192x4096 --out "$OUT/handoff_ab_rs_${tree}_$round.json" \
        > "$OUT/handoff_ab_rs_${tree}_$round.log" 2>&1
      grep -E "^\[|^exit" "$OUT/handoff_ab_rs_${tree}_$round.log" | cut -c1-500
      run 150 bench/ag_gemm/ag_gemm_modes.py "${t[@]}" --stress 0 --modes push,pull,baseline \
        --shapes 64x8192x8192,128x8192x8192 --out "$OUT/handoff_ab_ag_${tree}_$round.json" \
        > "$OUT/handoff_ab_ag_${tree}_$round.log" 2>&1
      grep -E "^\[|^exit" "$OUT/handoff_ab_ag_${tree}_$round.log" | cut -c1-500
      run 150 bench/flash_decode/flash_decode_modes.py "${t[@]}" --stress 0 --shapes 1x64x8x4096x128,1x64x8x16384x128 \
        --out "$OUT/handoff_ab_fd_${tree}_$round.json" > "$OUT/handoff_ab_fd_${tree}_$round.log" 2>&1
      grep -E "^\[|^exit" "$OUT/handoff_ab_fd_${tree}_$round.log" | cut -c1-500
    done
  done
}

handoff_large() {  # the same before/after at large shapes (world size 1): the change must cost nothing there
  local tree t n=0
  for tree in base this base this; do
    n=$((n + 1))
    t=()
    [ "$tree" = base ] && t=(--tree "$ROOT/.variants/base")
    echo "== handoff-large: $tree"
    run 150 bench/gemm_rs/gemm_rs_modes.py "${t[@]}" --stress 0 --modes push,push_epilogue,pull_epilogue,atomic,ce_triton,baseline \
      --shapes 8192x4096x6144,1024x8192x4096 --out "$OUT/handoff_large_rs_${tree}_$n.json" > "$OUT/handoff_large_rs_${tree}_$n.log" 2>&1
    grep -E "^\[|^exit" "$OUT/handoff_large_rs_${tree}_$n.log" | cut -c1-500
    run 150 bench/ag_gemm/ag_gemm_modes.py "${t[@]}" --stress 0 --modes push,ce_triton,baseline \
      --shapes 8192x4096x12288,1024x8192x8192 --out "$OUT/handoff_large_ag_${tree}_$n.json" > "$OUT/handoff_large_ag_${tree}_$n.log" 2>&1
    grep -E "^\[|^exit" "$OUT/handoff_large_ag_${tree}_$n.log" | cut -c1-500
  done
}

for step in "$@"; do
  case $step in
    tune19) tune19 ;;
    kernel-ab) kernel_ab ;;
    kernel-grid) kernel grid 560 --grid full ;;
    kernel-defaults) kernel defaults 420 --grid defaults ;;
    kernel-floors) kernel floors 300 --grid floors ;;
    kernel-merge)
      for m in 4096 16384; do
        kernel "merge$m" 150 --grid defaults --merge-elements "$m" \
          --shapes 1x64x8x4096x128,1x64x8x16384x128,8x64x8x16384x128
      done ;;
    atomic-fix) atomic_fix ;;
    stress-w1) stress_w1 ;;
    smoke) smoke ;;
    shared2) shared2 ;;
    eager-graph) eager_graph ;;
    fix-ab) fix_ab ;;
    rs-epilogue) rs_epilogue ;;
    tile-small-m) tile_small_m ;;
    tile-anatomy) tile_anatomy ;;
    tile-rate) tile_rate ;;
    ag-small-m) ag_small_m ;;
    rs-tile) rs_tile ;;
    handoff) handoff ;;
    handoff-ab) handoff_ab ;;
    handoff-large) handoff_large ;;
    *) echo "unknown step: $step (tune19, kernel-ab, kernel-grid, kernel-defaults, kernel-merge, atomic-fix,"\
         "stress-w1, fix-ab, kernel-floors, rs-epilogue, tile-small-m, tile-rate, rs-tile, tile-anatomy, ag-small-m, handoff,"\
         "handoff-ab, handoff-large, smoke, shared2, eager-graph)"; exit 2 ;;
  esac
done
