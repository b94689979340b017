"""Benchmarks: the decode bench (Qwen3-4B geometry vs the HF peer), the lever sweep (closed-loop
load, interleaved arms, paired ratios) and the verify/draft cost profile. `python -m engine.bench`."""
