"""Every family at once: the fused ops against the best unfused path, the collectives, the users' own unfused paths,
the GPU smoke run and the handoff litmus (bench/README.md)."""
