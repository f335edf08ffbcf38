"""The tuner and the decorator: search strategies, timing policies, per-call overhead, Triton's autotuner tests."""
