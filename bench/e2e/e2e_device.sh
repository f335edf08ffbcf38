#!/usr/bin/env bash
# The end-to-end benchmark on a lent 4-GPU machine (issue 35): tune a model's decoder-layer shapes at TP=4 or TP=2 into a
# bundle (`jointtune tune --model ... --export`), then run its decoder layers with that bundle against the standard
# torch TP layer and torch's async-TP (bench/e2e/README.md). Each phase is sized to about 6 minutes and stopped by a
# `timeout` before 10; $WORK is packed into $OUT/e2e.tgz after every step, so a call stopped at its limit still returns
# what finished. Tuning resumes: run a tune phase again until its log ends with "exported: ..." (the study store lives
# in $WORK, kept while the machine is; the bundle is copied to $OUT, commit it to bench/results/).
#
# Usage: bash bench/e2e/e2e_device.sh PHASE...
#   tune4 | tune2      jointtune tune --model $MODEL --tp 4|2 --tokens 1,8,32,4096 --kv-lens 4096, graph timing
#   decode4            decode steps at batch 1, 8, 32 with 4K of KV, TP=4 (4 layers, CUDA graphs)
#   prefill4           prefill of 4096 tokens, TP=4
#   bench2             TP=2: the decode cells on GPUs 0,1 and the prefill on GPUs 2,3, at once
#   compile4 | compile2  torch.compile(fullgraph=True) of the stack, a decode step in each layout
#   prefillcompiled4   prefilltuned4 with our stack also timed under torch.compile (path jointtune_compiled)
#   prefillkernels4    prefilltuned4's prefill cell with each path's step profiled kernel by kernel (--kernels), no
#                      breakdown
#   kernels4           decode cells at 4K KV, TP=4, from mini4's store (swept first where missing) or $BUNDLE, each
#                      path's step profiled kernel by kernel (--kernels: step_kernels.py), no breakdown; BATCHES and
#                      PATHS (decoder_layers.py's --batches, --paths) narrow it, LIMIT (s) bounds it
#   mini4              the standard layout's row-parallel shapes only (bench/e2e/decode_mini/MODEL_tpW.yaml, 8-12 trials a
#                      shape) at TP=4, then the decode cells at 4K KV with the per-op breakdown, from that store
#   mini2              the same at TP=2: Llama-3-70B on GPUs 0,1 and Qwen2.5-32B on GPUs 2,3, at once
#   rest2              2-GPU machine: $MODEL at TP=2 from its decode_mini store (swept first where missing): prefill of
#                      4096 tokens and decode at batch 1, 8, 32 with 32K of KV
#   decode2mini        2-GPU machine: mini2's decode cells for $MODEL alone, on GPUs 0,1
#   prefilltuned2|4    $MODEL's prefill shapes (4096 tokens, both layouts) tuned into its TP=2|4 decode_mini store
#                      (8 trials each; run again to resume), then the prefill cell from that store
#   compile2mini       2-GPU machine: torch.compile(fullgraph=True) of $MODEL's TP=2 stack, from the same store
# MODEL (default llama-3-70b), BUNDLE (default: the tune phase's, else bench/results/tuned_$MODEL_tp<W>_<gpu>.json).
# STORE (a database URL): the bench phases read that store instead of a bundle (the mini phases set it).
source "$(dirname "${BASH_SOURCE[0]}")/../common/device_env.sh"
MODEL=${MODEL:-llama-3-70b}
WORK=${WORK:-/tmp/e2e}
mkdir -p "$WORK"
GPU=$(python3 -c "import torch; n = torch.cuda.get_device_name().lower(); print(next((k for k in ('h200', 'h100') if k in n), 'gpu'))")
pack() { flock "$WORK/.lock" tar czf "$OUT/e2e.tgz" --exclude=.lock -C "$WORK" .; }
bundle() { # W: the bundle a bench phase reads
  local name="tuned_${MODEL}_tp$1_$GPU.json"
  if [ -n "$BUNDLE" ]; then echo "$BUNDLE"; elif [ -f "$WORK/$name" ]; then echo "$WORK/$name"; else echo "bench/results/$name"; fi
}
tune() { # W: every fused-op shape of one layer at TP=W (both layouts), 1-32 decode tokens and a 4096-token prefill
  local log="$WORK/tune_${MODEL}_tp$1.log"
  timeout 345 python3 -m jointtune.cli tune --model "$MODEL" --tp "$1" --tokens 1,8,32,4096 --kv-lens 4096 \
    --timing graph --trials 8 --time-budget 6 --db "sqlite:///$WORK/tune.db" \
    --export "$WORK/tuned_${MODEL}_tp$1_$GPU.json" > "$log" 2>&1
  echo "exit $? after: tune --model $MODEL --tp $1 (124: stopped at its limit; run the phase again, it resumes)"
  tail -n 70 "$log"
  cp -f "$WORK/tuned_${MODEL}_tp$1_$GPU.json" "$OUT/" 2>/dev/null
  pack
}
e2e() { # SECONDS W NAME PORT ARGS...: one run of decoder_layers.py (4 layers, CUDA graphs) with the bundle of TP=W, or
  # the store $STORE (a database URL) where it is set
  local from out="$WORK/e2e_${MODEL}_tp$2_$3_$GPU.json"
  if [ -n "$STORE" ]; then
    from=(--db "$STORE")
  else
    from=(--bundle "$(bundle "$2")")
    if [ ! -f "${from[1]}" ]; then echo "no bundle ${from[1]}: run tune$2 first (or set BUNDLE)"; return; fi
  fi
  timeout "$1" torchrun --nproc-per-node="$2" --master-port="$4" bench/e2e/decoder_layers.py --model "$MODEL" \
    "${from[@]}" --iters 20 --warmup 3 --out "$out" "${@:5}" > "$WORK/e2e_${MODEL}_tp$2_$3.log" 2>&1
  echo "exit $? after: e2e $MODEL tp$2 $3 (${from[*]})"
  grep -E '^\{"cell"|cells,|FAILED' "$WORK/e2e_${MODEL}_tp$2_$3.log" | cut -c1-400
  pack
}
mini() { # MODEL W GPUS PORT [NAME SECONDS CELL-ARGS...]: sweep bench/e2e/decode_mini/MODEL_tpW.yaml into its own store
  # (once: a store that has it is reused), then cells from it: by default the decode cells at 4K of KV
  local db="$WORK/mini_$1_tp$2.db" log="$WORK/mini_$1_tp$2.log"
  if [ ! -f "$db" ] || ! grep -q "exit 0" "$log.exit" 2>/dev/null; then
    CUDA_VISIBLE_DEVICES=$3 timeout 200 python3 -m jointtune.cli sweep "bench/e2e/decode_mini/$1_tp$2.yaml" --profile gpu \
      --db "sqlite:///$db" > "$log" 2>&1
    echo "exit $?" > "$log.exit"
    echo "$(cat "$log.exit") after: sweep decode_mini $1_tp$2"; tail -n 16 "$log"; pack
  fi
  local name=${5:-decode_mini} seconds=${6:-330} cells=("${@:7}")
  [ ${#cells[@]} = 0 ] && cells=(--prefill 0 --batches 1,8,32 --kv-lens 4096 --no-compile-check)
  CUDA_VISIBLE_DEVICES=$3 MODEL=$1 STORE="sqlite:///$db" e2e "$seconds" "$2" "$name" "$4" "${cells[@]}"
}
prefill_tuned() { # W GPUS PORT: tune $MODEL's prefill shapes (4096 tokens, both layouts: AG+GEMM / GEMM+RS and GEMM +
  # all-reduce, 8 trials each, graph timing) into its decode_mini store of TP=W (resumes), then the prefill cell from it
  local db="$WORK/mini_${MODEL}_tp$1.db" log="$WORK/prefill_tune_${MODEL}_tp$1.log"
  CUDA_VISIBLE_DEVICES=$2 timeout 300 python3 -m jointtune.cli tune --model "$MODEL" --tp "$1" --tokens 4096 \
    --kv-lens 4096 --timing graph --trials 8 --db "sqlite:///$db" > "$log" 2>&1
  echo "exit $? after: tune --model $MODEL --tp $1 --tokens 4096 (124: stopped at its limit; run the phase again, it resumes)"
  tail -n 30 "$log"; pack
  CUDA_VISIBLE_DEVICES=$2 STORE="sqlite:///$db" e2e 270 "$1" "${PREFILL_NAME:-prefill_tuned}" "$3" --prefill 4096 \
    --batches '' --no-compile-check ${PREFILL_PATHS:+--paths $PREFILL_PATHS} ${PREFILL_ARGS}
}
for phase in "$@"; do
  case $phase in
    tune4) tune 4 ;;
    tune2) tune 2 ;;
    decode4) e2e 345 4 decode_kv4k 29704 --prefill 0 --batches 1,8,32 --kv-lens 4096 --no-compile-check ;;
    prefill4) e2e 345 4 prefill4096 29705 --prefill 4096 --batches '' --no-compile-check ;;
    bench2)
      CUDA_VISIBLE_DEVICES=0,1 e2e 345 2 decode_kv4k 29702 --prefill 0 --batches 1,8,32 --kv-lens 4096 \
        --no-compile-check &
      CUDA_VISIBLE_DEVICES=2,3 e2e 345 2 prefill4096 29703 --prefill 4096 --batches '' --no-compile-check &
      wait ;;
    compile4) e2e 300 4 compile 29706 --prefill 0 --batches '' --paths jointtune ;;
    compile2) CUDA_VISIBLE_DEVICES=0,1 e2e 300 2 compile 29707 --prefill 0 --batches '' --paths jointtune ;;
    kernels4)  # from the decode_mini store of this tree's kernels (swept first where missing, as mini4), or $BUNDLE
      cells=(--prefill 0 --batches "${BATCHES:-1,8,32}" --kv-lens 4096 --no-compile-check --no-breakdown --kernels
        --paths "${PATHS:-jointtune,torch,async_tp}")
      if [ -n "$BUNDLE" ]; then e2e "${LIMIT:-345}" 4 decode_kernels 29716 "${cells[@]}"
      else mini llama-3-70b 4 0,1,2,3 29716 decode_kernels "${LIMIT:-345}" "${cells[@]}"; fi ;;
    mini4) mini llama-3-70b 4 0,1,2,3 29708 ;;
    mini2)
      mini llama-3-70b 2 0,1 29709 &
      mini qwen2.5-32b 2 2,3 29710 &
      wait ;;
    rest2)  # on a 2-GPU machine: $MODEL at TP=2 from its decode_mini store (made first where missing), the cells the
      # decode runs left out: the prefill of 4096 tokens and decode at batch 1, 8, 32 with 32K of KV
      mini "$MODEL" 2 0,1 29711 prefill_kv32k 380 --prefill 4096 --batches 1,8,32 --kv-lens 32768 \
        --no-compile-check ;;
    decode2mini)  # on a 2-GPU machine: $MODEL's decode cells at 4K of KV, TP=2, from its decode_mini store (made first)
      mini "$MODEL" 2 0,1 29713 ;;
    prefilltuned2) prefill_tuned 2 0,1 29714 ;;
    prefilltuned4) prefill_tuned 4 0,1,2,3 29715 ;;
    prefillcompiled4)  # the same, with our stack also under torch.compile (its elementwise work fused, as async-TP's
      # step is): does compiling close the prefill's 0.94x to async-TP?
      PREFILL_PATHS=jointtune,jointtune_compiled,torch,async_tp prefill_tuned 4 0,1,2,3 29717 ;;
    prefillkernels4)  # the prefill cell's steps kernel by kernel (--kernels, no breakdown): where our sequence-
      # parallel step spends the ~250 µs a layer the breakdown finds outside its timed ops (2026-11-27), beside the
      # torch layer's and async-TP's steps; the prefill shapes tuned into the TP=4 decode_mini store first, as
      # prefilltuned4 does (resumes; after kernels4 or mini4 in the same call the store is there)
      PREFILL_NAME=prefill_kernels PREFILL_PATHS=jointtune,torch,async_tp PREFILL_ARGS="--kernels --no-breakdown" \
        prefill_tuned 4 0,1,2,3 29718 ;;
    compile2mini)  # torch.compile(fullgraph=True) of $MODEL's TP=2 stack from its decode_mini store, on GPUs 0,1
      mini "$MODEL" 2 0,1 29712 compile 300 --prefill 0 --batches '' --paths jointtune
      ;;
    *) echo "unknown phase $phase (tune4 tune2 decode4 prefill4 bench2 compile4 compile2 kernels4 mini4 mini2 rest2 decode2mini prefilltuned2 prefilltuned4 prefillcompiled4 prefillkernels4 compile2mini)" ;;
  esac
done
