#!/usr/bin/env bash
# Issue 34's live checks on a lent 4-GPU machine (W=4 on all GPUs, W=2 on GPUs 0,1), graph timing, on shapes chosen
# for this check (none of the benchmark's listed ones): per family a prefill-sized and a decode-sized shape.
#   truth W [FAMILY...]  exhaustive studies of sub-spaces with every mode in them (32-69 configs each) -> the tables
#   tune W [FAMILY...]   per shape two fresh 24-trial tunes of the same sub-space, seed 0 (fresh-a, fresh-b), and a
#                        24-trial tune of the whole space (full), each into a database of its own
#   agree W              the picks of fresh-a, fresh-b, full and the exhaustive study re-timed side by side
#                        (bench/tuner/tuner_agreement.py): fresh tunes within 2%, picks within 3% of the exhaustive best
#   cold                 a cold 24-trial tune of one shape at W=2, whole space, empty Triton cache, fresh database:
#                        seconds from process start to the stored record (target <= 30 s on an H200), and where they
#                        went (bench/tuner/cold_phases.py on the run's $JOINTTUNE_PHASES log: imports, world set-up,
#                        compiles waited for, checks, measurements, the store; what compile workers did meanwhile)
#   cold-ab [N]          the same cold tune from .device/before (a `git archive` of the tree before the change; carry
#                        .device) and from this tree, alternating, N rounds (default 2): before/after in one call
#                        (JOINTTUNE_COMPILE_WORKERS=0 before either: this tree without compile workers, threads as before)
#   check W ITEM...      per ITEM (family:shape of SHAPES) in one lane: its exhaustive study, two fresh 24-trial tunes
#                        of the same sub-space (seed 0), the picks re-timed side by side, the table; databases and
#                        logs per item, so two W=2 lanes run at once (GPUS=0,1 and GPUS=2,3, LANE=a and LANE=b)
#   cold-pool [N]        the cold tune from this tree with the compile pool (JOINTTUNE_COMPILE_WORKERS=auto) and
#                        without it (=0), alternating, N rounds (default 2): the pool's before/after in one call
#   curves               replay tables (truth) -> best-so-far against trials, 3 seeds, per family and world size
# Results land in $WORK and are packed into $OUT/tuner_checks.tgz after every step, so a call stopped at its limit
# still returns what finished. truth and tune take one family per call to fit a 10-minute call; a study stopped by
# a limit resumes when the same call runs again.
# Usage (each line one call; W = 2, then 4):
#   bash bench/tuner/tuner_device.sh truth W FAMILY; bash bench/tuner/tuner_device.sh tune W FAMILY   (for each family)
#   bash bench/tuner/tuner_device.sh agree W; then once: bash bench/tuner/tuner_device.sh cold; bash bench/tuner/tuner_device.sh curves
#   bash bench/tuner/tuner_device.sh cold-ab 2     (before: mkdir -p .device/before && git archive OLD jointtune | tar -x -C .device/before)
source "$(dirname "${BASH_SOURCE[0]}")/../common/device_env.sh"
WORK=${WORK:-/tmp/tuner_checks}
mkdir -p "$WORK/tables"
pack() { tar czf "$OUT/tuner_checks${LANE:+_$LANE}.tgz" -C "$WORK" .; }

declare -A SHAPES=(
  [ag_gemm]="2048x5120x8192 256x14336x4096"
  [gemm_rs]="2048x8192x5120 256x4096x14336"
  [flash_decode]="4x48x8x65536x128 16x32x4x16384x128"
)
# the sub-space of each shape: every mode of the family (gemm_rs's non-deterministic atomic stays out, as by default)
declare -A RESTRICT=(
  [ag_gemm:2048x5120x8192]="mode=pull,push,push_cublas,ce,baseline BLOCK_M=64,128 BLOCK_N=128,256 BLOCK_K=64 GROUP_M=8 num_warps=8 num_stages=3,4 SPLIT_K=1 comm_sms=8,32 chunk_m=64,512,2048 ce_chunks=1,2 collective=nccl,nccl_symm"
  [ag_gemm:256x14336x4096]="mode=pull,push,push_cublas,ce,baseline BLOCK_M=32,64 BLOCK_N=64,128 BLOCK_K=128 GROUP_M=1 num_warps=4 num_stages=4 SPLIT_K=1,2 comm_sms=8,32 chunk_m=32,64 ce_chunks=1,2 collective=nccl,nccl_symm"
  [gemm_rs:2048x8192x5120]="mode=pull,push,pull_cublas,ce,baseline BLOCK_M=64,128 BLOCK_N=128,256 BLOCK_K=64 GROUP_M=8 num_warps=8 num_stages=3 SPLIT_K=1 reduce_by=programs,epilogue,tile chunk_m=256 reduce_sms=16,64,128 tile_order=peers_first ce_consumer=cublas ce_chunks=1,2 collective=nccl,nccl_symm"
  [gemm_rs:256x4096x14336]="mode=pull,push,pull_cublas,ce,baseline BLOCK_M=32,64 BLOCK_N=64,128 BLOCK_K=128 GROUP_M=1 num_warps=4 num_stages=4 SPLIT_K=1 reduce_by=programs,epilogue,tile chunk_m=64 reduce_sms=16,64 tile_order=peers_first ce_consumer=cublas ce_chunks=1,2 collective=nccl,nccl_symm"
  [flash_decode:4x48x8x65536x128]="kv_split=512,1024,2048 BLOCK_N=64,128 heads_per_program=6 num_warps=4 num_stages=3 items_per_flag=1,4 push_programs=8 collective=nccl,nccl_symm"
  [flash_decode:16x32x4x16384x128]="kv_split=256,512,1024 BLOCK_N=64,128 heads_per_program=8 num_warps=4 num_stages=3 items_per_flag=4,16 push_programs=8 collective=nccl,nccl_symm"
)

gpus() { if [ -n "${GPUS:-}" ]; then echo "$GPUS"; elif [ "$1" = 2 ]; then echo 0,1; else echo 0,1,2,3; fi; }
restrict_args() { for r in ${RESTRICT[$1]}; do printf -- "--restrict %s " "$r"; done; }
tune() { # SECONDS W DB NAME KERNEL SHAPE [more args]: one `jointtune tune`, one group of W ranks, graph timing
  CUDA_VISIBLE_DEVICES=$(gpus "$2") timeout "$1" python3 -m jointtune.cli tune --kernel "$5" --shape "$6" \
    --world-size "$2" --timing graph --groups 1 --db "sqlite:///$WORK/$3" "${@:7}" > "$WORK/$4.log" 2>&1
  echo "exit $? after: tune $5 $6 w$2 ($4)"; grep -E "how each shape went|—|done in" "$WORK/$4.log" | tail -4; pack
}
exhaustive() { # W DB NAME KERNEL SHAPE: the exhaustive study of the shape's sub-space (RESTRICT)
  # shellcheck disable=SC2046
  tune 280 "$1" "$2" "$3" "$4" "$5" --strategy exhaustive --trials 100 $(restrict_args "$4:$5")
}
fresh() { # W DB NAME KERNEL SHAPE: a fresh 24-trial tune of the shape's sub-space, seed 0
  # shellcheck disable=SC2046
  tune 200 "$1" "$2" "$3" "$4" "$5" --trials 24 --seed 0 $(restrict_args "$4:$5")
}
agreement() { # SECONDS W JOBS NAME LABEL=DB...: the picks of the databases re-timed side by side (tuner_agreement.py)
  local seconds=$1 w=$2 jobs=$3 name=$4 dbs=() label
  shift 4
  for label in "$@"; do dbs+=(--db "${label%%=*}=sqlite:///$WORK/${label#*=}"); done
  CUDA_VISIBLE_DEVICES=$(gpus "$w") timeout "$seconds" torchrun --standalone --nproc-per-node="$w" \
    bench/tuner/tuner_agreement.py --jobs "$jobs" "${dbs[@]}" --out "$WORK/tuner_agreement_$name.json" \
    > "$WORK/agree_$name.log" 2>&1
  echo "exit $? after: agree $name"; grep -E "^\[" "$WORK/agree_$name.log"
}
tables() { # W DB TAG COMMAND: the exhaustive studies of DB as replay tables in $WORK/tables
  python3 bench/tuner/tuner_experiments.py tables "$WORK/$2" --out "$WORK/tables" --tag "$3" \
    --device "$(nvidia-smi -L | head -1 | sed 's/ (UUID.*//'), world size $1, graph timing" --command "$4"
}
families() { if [ $# -gt 0 ]; then echo "$@"; else echo ag_gemm gemm_rs flash_decode; fi; }
ROOT=$PWD
cold_run() { # TREE NAME: the cold tune from TREE's jointtune: empty Triton cache, fresh database, the shell's clock around
  local tree=$1 name=$2 cache rc start end
  cache=$(mktemp -d)
  rm -f "$WORK/$name.db" "$WORK/$name.phases.jsonl"
  start=$(date +%s.%N)
  (cd "$tree" && CUDA_VISIBLE_DEVICES=$(gpus 2) TRITON_CACHE_DIR=$cache JOINTTUNE_PHASES="$WORK/$name.phases.jsonl" \
    PYTHONPATH="$tree${SITE:+:$SITE}" timeout 300 python3 -m jointtune.cli tune --kernel ag_gemm --shape 2048x5120x8192 \
    --world-size 2 --timing graph --groups 1 --trials 24 --seed 0 --db "sqlite:///$WORK/$name.db") > "$WORK/$name.log" 2>&1
  rc=$?
  end=$(date +%s.%N)
  (cd "$tree" && PYTHONPATH="$tree${SITE:+:$SITE}" python3 -m jointtune.cli db list --db "sqlite:///$WORK/$name.db") \
    >> "$WORK/$name.log" 2>&1
  echo "cold 24-trial tune, ag_gemm 2048x5120x8192 W=2, empty Triton cache ($name, exit $rc):" \
    "$(python3 -c "print(f'{$end - $start:.1f}')") s from process start to stored record" | tee -a "$WORK/$name.log"
  grep "│" "$WORK/$name.log" | grep ag_gemm | tail -2  # the tuned table's row and the stored record
  if [ -s "$WORK/$name.phases.jsonl" ]; then
    python3 "$ROOT/bench/tuner/cold_phases.py" "$WORK/$name.phases.jsonl" --start "$start" --end "$end" \
      --out "$WORK/$name.phases.json" | tee -a "$WORK/$name.log"
  fi
  rm -rf "$cache"
  pack
}

phase=$1; shift
case $phase in
  truth)
    w=$1; shift
    for k in $(families "$@"); do for s in ${SHAPES[$k]}; do
      exhaustive "$w" "truth_w$w.db" "truth_${k}_${s}_w$w" "$k" "$s"
    done; done
    tables "$w" "truth_w$w.db" "w${w}_4xH200" "bash bench/tuner/tuner_device.sh truth $w"
    pack ;;
  tune)
    w=$1; shift
    for k in $(families "$@"); do for s in ${SHAPES[$k]}; do
      for run in fresh-a fresh-b; do fresh "$w" "${run}_w$w.db" "${run}_${k}_${s}_w$w" "$k" "$s"; done
      tune 200 "$w" "full_w$w.db" "full_${k}_${s}_w$w" "$k" "$s" --trials 24 --seed 0
    done; done ;;
  agree)
    w=$1; jobs=""
    for k in ag_gemm gemm_rs flash_decode; do for s in ${SHAPES[$k]}; do jobs="$jobs${jobs:+,}$k:$s"; done; done
    agreement 560 "$w" "$jobs" "w$w" "fresh-a=fresh-a_w$w.db" "fresh-b=fresh-b_w$w.db" "full=full_w$w.db" \
      "exhaustive=truth_w$w.db"
    pack ;;
  check)
    w=$1; shift
    for item in "$@"; do
      k=${item%%:*}; s=${item#*:}; tag="${k}_${s}_w$w"
      [ -n "${RESTRICT[$k:$s]:-}" ] || { echo "check: unknown item $item (family:shape of SHAPES)"; exit 2; }
      exhaustive "$w" "truth_$tag.db" "truth_$tag" "$k" "$s"
      for run in fresh-a fresh-b; do fresh "$w" "${run}_$tag.db" "${run}_$tag" "$k" "$s"; done
      agreement 300 "$w" "$k:$s" "$tag" "fresh-a=fresh-a_$tag.db" "fresh-b=fresh-b_$tag.db" "exhaustive=truth_$tag.db"
      tables "$w" "truth_$tag.db" "w$w" "bash bench/tuner/tuner_device.sh check $w $item"
      pack
    done ;;
  cold) cold_run "$ROOT" cold_ag_gemm_w2 ;;
  cold-pool)
    python3 -c "import torch, triton, optuna, sqlalchemy" # a warm file cache for every run
    for round in $(seq "${1:-2}"); do
      JOINTTUNE_COMPILE_WORKERS=auto cold_run "$ROOT" "cold_pool_$round"
      JOINTTUNE_COMPILE_WORKERS=0 cold_run "$ROOT" "cold_nopool_$round"
    done
    grep -h "^cold 24-trial" "$WORK"/cold_pool_*.log "$WORK"/cold_nopool_*.log ;;
  cold-ab)
    [ -d .device/before/jointtune ] || { echo "cold-ab: .device/before holds no jointtune (carry .device)"; exit 2; }
    python3 -c "import torch, triton, optuna, sqlalchemy" # the same warm file cache for both trees
    for round in $(seq "${1:-2}"); do
      cold_run "$ROOT/.device/before" "cold_before_$round"
      cold_run "$ROOT" "cold_after_$round"
    done
    grep -h "^cold 24-trial" "$WORK"/cold_before_*.log "$WORK"/cold_after_*.log ;;
  curves)
    python3 bench/tuner/tuner_experiments.py curves "$WORK"/tables/ground_truth_*.json --out "$WORK/tuner_curves_4xH200.json"
    pack ;;
  *) echo "unknown phase $phase (truth W, tune W, agree W, check W ITEM..., cold, cold-ab [N], cold-pool [N], curves)"; exit 2 ;;
esac
