#!/usr/bin/env bash
# H200 stage 7: the small recipe as committed (built while the engine's GPU tests run), the step
# profile at c=1 and c=64 (with the gate), then the lever sweep on it. Results under $OUT.
source "$(dirname "$0")/h200_common.sh"

pair=/tmp/small
stage small 400 python3 -m engine.fixture build --recipe small --device cuda --out $pair &
stage gpu-tests 150 python3 -m pytest tests/test_engine_gpu.py tests/test_hedge_gpu.py tests/test_draft_context.py \
  tests/test_kernels_ops.py -q -rs -n 3 -p no:cacheprovider
wait
cp $pair/manifest.json "$LOG/small-manifest.json"
stage steps-c1 45 python3 -m engine.bench steps --target $pair/target --drafter $pair/drafter \
  --out "$LOG/steps-c1" --concurrency 1 --new-tokens 128 --arms plain spec
stage steps-c64 60 python3 -m engine.bench steps --target $pair/target --drafter $pair/drafter \
  --out "$LOG/steps-c64" --concurrency 64 --new-tokens 64 --arms plain spec spec+gate=16
stage sweep 140 python3 -m engine.bench sweep --target $pair/target --drafter $pair/drafter \
  --prompts $pair/prompts.jsonl --out "$LOG/sweep" --concurrency 1 4 8 16 32 64 \
  --arms plain spec spec+trim=2 spec+trim=4 spec+trim=8 spec+gate=16 --noise-arm \
  --rounds 8 --new-tokens 128 --time-budget-s 125 --no-progress
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -3 "$LOG/gpu-tests.log"
python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['eval'], m['build_seconds'])" "$LOG/small-manifest.json"
head -12 "$LOG/steps-c64/steps.md"
head -50 "$LOG/sweep/sweep.md" | tail -44
