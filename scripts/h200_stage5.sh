#!/usr/bin/env bash
# H200 stage 5: where a c=1 step's time goes on the shipped tiny pair, then two `small` builds side by
# side (the recipe, and the recipe with 3x the drafter's greedy pool) while the engine's GPU tests run.
# The builds stay in /tmp/small-{a,b} for stage 6 on the same (warm) machine. Results under $OUT.
source "$(dirname "$0")/h200_common.sh"

tiny=engine/fixture/data/tiny
stage steps-tiny 60 python3 -m engine.bench steps --target $tiny/target --drafter $tiny/drafter \
  --out "$LOG/steps-tiny" --concurrency 1 --new-tokens 64
stage small-a 420 python3 -m engine.fixture build --recipe small --device cuda --out /tmp/small-a &
stage small-b 420 python3 -m engine.fixture build --recipe small --device cuda --out /tmp/small-b \
  --set greedy_sequences=24576 &
stage gpu-tests 150 python3 -m pytest tests/test_engine_gpu.py tests/test_hedge_gpu.py tests/test_draft_context.py \
  -q -rs -n 3 -p no:cacheprovider
wait
for v in a b; do cp /tmp/small-$v/manifest.json "$LOG/small-$v-manifest.json" 2>/dev/null; done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -3 "$LOG/gpu-tests.log"
head -30 "$LOG/steps-tiny/steps.md" 2>/dev/null
for v in a b; do python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[1], m['eval'], m['build_seconds'])" "$LOG/small-$v-manifest.json"; done
