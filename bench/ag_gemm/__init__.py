"""AG+GEMM benchmarks: anchors and modes, host costs, anatomy and stress runs (bench/README.md)."""
