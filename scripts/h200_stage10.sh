#!/usr/bin/env bash
# H200 stage 10: staged step inputs + context stored by the target forward + accept in the verify
# graph. The small pair (49152-sequence pool, eval at 128 tokens) builds (with WITH_TESTS=1 while the
# GPU tests and the gates run); then its τ at 64 tokens (for the earlier builds), the c=1 / c=8
# sweep and the c=1 step profile.
source "$(dirname "$0")/h200_common.sh"

pair=/tmp/small
if [ "${WITH_TESTS:-0}" = 1 ]; then  # the first run (2e95050); its build ran out of GPU memory
  stage gpu-tests 150 python3 -m pytest tests/test_engine_gpu.py tests/test_hedge_gpu.py tests/test_draft_context.py \
    tests/test_kernels_ops.py -q -rs -n 2 -p no:cacheprovider &
  stage gates 150 python3 -m pytest gates -n 3 -q -p no:cacheprovider --run-record="$LOG/levers-gate-h200.md" &
fi
stage small 330 python3 -m engine.fixture build --recipe small --device cuda --out $pair
wait
cp $pair/manifest.json "$LOG/small-manifest.json"
stage eval64 40 python3 -m engine.fixture eval --pair $pair --max-new-tokens 64 --device cuda
stage sweep 110 python3 -m engine.bench sweep --target $pair/target --drafter $pair/drafter \
  --prompts $pair/prompts.jsonl --out "$LOG/sweep" --concurrency 1 8 \
  --arms plain spec --noise-arm --rounds 8 --new-tokens 128 --time-budget-s 100 --no-progress
stage steps-c1 40 python3 -m engine.bench steps --target $pair/target --drafter $pair/drafter \
  --out "$LOG/steps-c1" --concurrency 1 --new-tokens 128 --arms plain spec
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['eval'], m['build_seconds'])" "$LOG/small-manifest.json"
tail -4 "$LOG/eval64.log"
head -16 "$LOG/sweep/sweep.md" | tail -10
head -12 "$LOG/steps-c1/steps.md" | tail -4
