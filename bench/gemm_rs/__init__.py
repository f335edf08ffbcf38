"""GEMM+RS benchmarks: modes, the atomic mode's checks, the decorator, the tile GEMM at small M (bench/README.md)."""
