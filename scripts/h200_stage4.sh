#!/usr/bin/env bash
# H200 stage 4: the GPU tests of the fused kernels and the engine, the kernel sweep that installs the
# tuned table (only when the kernel tests pass), then the decode bench on that table. Results under $OUT.
source "$(dirname "$0")/h200_common.sh"

write=""
stage gpu-tests 100 python3 -m pytest tests/test_kernels*.py tests/test_engine_gpu.py tests/test_hedge_gpu.py -q -rs -n 6 -p no:cacheprovider && write=--write-tuned
stage kernels-bench 90 python3 -m engine.bench.kernels --out "$LOG/kernels-bench" --skip invariant,attention --budget-s 60 $write
stage decode-bench 110 python3 -m engine.bench decode --out "$LOG/decode" --peer-concurrency 1 64 --peer-repeats 1
cp engine/kernels/tuned/nvidia-h200.json "$LOG/nvidia-h200.json" 2>/dev/null
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -3 "$LOG/gpu-tests.log"
tail -12 "$LOG/decode-bench.log"
