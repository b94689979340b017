#!/usr/bin/env bash
# H200 stage 8: the gate after the gated round became its own step: the small pair
# built while the gates run, then the step profile at c=64 and a sweep of plain / spec / gate.
source "$(dirname "$0")/h200_common.sh"

pair=/tmp/small
stage small 300 python3 -m engine.fixture build --recipe small --device cuda --out $pair &
stage gates 150 python3 -m pytest gates -n 4 -q -p no:cacheprovider --run-record="$LOG/levers-gate-h200.md"
wait
cp $pair/manifest.json "$LOG/small-manifest.json"
stage steps-c64 45 python3 -m engine.bench steps --target $pair/target --drafter $pair/drafter \
  --out "$LOG/steps-c64" --concurrency 64 --new-tokens 64 --arms plain spec+gate=16
stage sweep 100 python3 -m engine.bench sweep --target $pair/target --drafter $pair/drafter \
  --prompts $pair/prompts.jsonl --out "$LOG/sweep" --concurrency 1 16 32 64 \
  --arms plain spec spec+gate=16 --noise-arm --rounds 6 --new-tokens 128 --time-budget-s 85 --no-progress
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -3 "$LOG/gates.log"
head -12 "$LOG/steps-c64/steps.md"
head -30 "$LOG/sweep/sweep.md" | tail -22
