"""Flash-Decode benchmarks: modes, the per-rank decode kernel and its read floor, the decorator (bench/README.md)."""
