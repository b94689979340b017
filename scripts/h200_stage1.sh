#!/usr/bin/env bash
# H200 stage 1: build the tiny fixture pair on the GPU, run the GPU tests (kernels, engine) and the
# gates on the new pair, and the kernel micro-benchmark. Results under $OUT (logs.tgz, tiny.tar).
source "$(dirname "$0")/h200_common.sh"

stage fixture-tiny 270 python3 -m engine.fixture build --recipe tiny --device cuda --out /tmp/tiny --tar "$OUT/tiny.tar"
stage kernel-tests 80 python3 -m pytest tests/test_kernels*.py -q -rs -p no:cacheprovider
stage engine-gpu-tests 70 python3 -m pytest tests/test_engine_gpu.py -q -rs -p no:cacheprovider
if [ -f /tmp/tiny/target/config.json ]; then
  rm -rf engine/fixture/data/tiny && cp -r /tmp/tiny engine/fixture/data/tiny
  stage gates-gpu 80 python3 -m pytest gates -n 4 -q -p no:cacheprovider --run-record="$LOG/levers-gate-h200.md"
fi
stage kernels-bench 60 python3 -m engine.bench.kernels --quick --out "$LOG/kernels-bench"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
