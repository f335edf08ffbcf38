"""The fused kernels (AG+GEMM, GEMM+RS, Flash-Decode, GEMM+AR) compile for Hopper in every mode, with this Triton and
the GPU image's.

The CPU interpreter never compiles, so a kernel that lowers on one Triton and not on another used
to surface only on a lent GPU. `aot_compile.py` lowers it to sm_90 PTX without a GPU; `make test`
installs the GPU image's Triton (3.6) beside the venv's so both versions are checked.
"""

from __future__ import annotations

from sm90 import gpu_image_triton, run_sm90

FD_TILE = dict(kv_split=1024, BLOCK_N=64, heads_per_program=8, num_warps=4, num_stages=2, items_per_flag=4)
TILE = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=6)
CONFIGS = [
    dict(mode="ce", ce_consumer="triton", ce_chunks=4, SPLIT_K=8, **TILE),
    dict(mode="pull", SPLIT_K=1, **dict(TILE, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=4)),
    dict(mode="push", comm_sms=32, chunk_m=128, SPLIT_K=2, **dict(TILE, BLOCK_K=128, num_warps=4, num_stages=4)),
    dict(mode="push", comm_sms=8, chunk_m=256, SPLIT_K=1, **dict(TILE, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64)),
    dict(mode="push_cublas", push_by="sm", gemm_order="local_first", comm_sms=16, chunk_m=128),
    dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=32),
    dict(mode="push_cublas", push_by="sm", gemm_order="gathered", comm_sms=8),
    # GEMM+RS: every fused epilogue, split-K, both ce consumers (and the reduce-only launch)
    dict(
        family="gemm_rs",
        mode="push",
        chunk_m=128,
        reduce_by="programs",
        reduce_sms=16,
        tile_order="peers_first",
        SPLIT_K=1,
        **dict(TILE, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3),
    ),
    dict(
        family="gemm_rs",
        mode="pull",
        chunk_m=64,
        reduce_by="programs",
        reduce_sms=8,
        tile_order="own_first",
        SPLIT_K=2,
        **TILE,
    ),
    dict(family="gemm_rs", mode="push", chunk_m=64, reduce_by="epilogue", SPLIT_K=2, **TILE),
    dict(family="gemm_rs", mode="push", reduce_by="tile", SPLIT_K=1, **TILE),
    dict(
        family="gemm_rs",
        mode="atomic",
        chunk_m=256,
        reduce_sms=32,
        tile_order="peers_first",
        SPLIT_K=1,
        **dict(TILE, num_warps=4, num_stages=4),
    ),
    dict(family="gemm_rs", mode="ce", ce_consumer="triton", ce_chunks=4, reduce_sms=16, SPLIT_K=4, **TILE),
    dict(family="gemm_rs", mode="ce", ce_consumer="cublas", ce_chunks=2, reduce_sms=4),
    dict(family="gemm_rs", mode="pull_cublas", reduce_sms=16),
    dict(family="gemm_rs", mode="barrier", transport="pull", reduce_sms=64),
    dict(family="ag_gemm", mode="barrier", landing="direct", barrier_sms=64),
    dict(family="ag_gemm", mode="barrier", landing="inbox", barrier_sms=32),
    dict(family="ag_gemm", mode="barrier", landing="ll", barrier_sms=64),
    dict(family="gemm_rs", mode="barrier", transport="push", reduce_sms=32),
    # Flash-Decode: every mode (its decode, combine and one-launch kernels, and the push of wait mode), GQA groups
    # of 8 and 1 head per program, both dtypes, head dims 64 and 128
    *[
        dict(family="flash_decode", shape=dict(B=4, H=64, H_KV=8, S=65536, D=128), mode=mode, **FD_TILE)
        for mode in ("fused", "pull", "baseline")
    ],
    dict(family="flash_decode", shape=dict(B=4, H=64, H_KV=8, S=65536, D=128), mode="wait", push_programs=8, **FD_TILE),
    dict(
        family="flash_decode",
        shape=dict(B=3, H=12, H_KV=4, S=1000, D=64),
        dtype="float16",
        mode="fused",
        kv_split=256,
        BLOCK_N=32,
        heads_per_program=1,
        num_warps=4,
        num_stages=3,
        items_per_flag=2,
    ),
]
AR_TILE = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)
CONFIGS += [
    # GEMM+AR: both exchanges, both transports, the tile GEMM (split-K, grouped) and cuBLAS's copied partial, with
    # and without the residual + RMSNorm epilogue, at W = 4 on a decode shape
    dict(family="gemm_ar", shape=dict(M=8, N=8192, K=8192), world_size=4, mode="one_shot", gemm="triton",
         transport="push", tiles_per_flag=1, comm_sms=0, SPLIT_K=4, **AR_TILE),
    dict(family="gemm_ar_rmsnorm", shape=dict(M=128, N=5120, K=27648), world_size=4, mode="two_shot", gemm="triton",
         transport="pull", tiles_per_flag=4, comm_sms=16, SPLIT_K=2, **dict(AR_TILE, BLOCK_M=64, GROUP_M=1)),
    dict(family="gemm_ar_rmsnorm", shape=dict(M=1, N=8192, K=8192), world_size=4, mode="one_shot", gemm="cublas",
         transport="pull", tiles_per_flag=2, comm_sms=32),
    dict(family="gemm_ar", shape=dict(M=1024, N=8192, K=8192), world_size=2, mode="two_shot", gemm="triton",
         transport="push", tiles_per_flag=8, comm_sms=0, SPLIT_K=1,
         **dict(AR_TILE, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8)),
]  # fmt: skip
SMALL_KERNELS = 6  # the shared wait, release (with and without its wait), open-call and IPC barrier kernels


def test_every_mode_compiles_for_sm90_with_this_triton():
    done = run_sm90("aot_compile.py", CONFIGS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\nok ") + done.stdout.startswith("ok ") == len(CONFIGS) + SMALL_KERNELS


def test_every_mode_compiles_for_sm90_with_the_gpu_images_triton():
    done = run_sm90("aot_compile.py", CONFIGS, gpu_image_triton())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "triton 3.6" in done.stdout
