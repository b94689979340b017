#!/usr/bin/env bash
# H200 stage 3: build the small fixture pair, then the lever sweep on it (closed loop, arms interleaved
# round by round, paired noise floor). Results under $OUT.
source "$(dirname "$0")/h200_common.sh"

stage fixture-small 300 python3 -m engine.fixture build --recipe small --device cuda --out /tmp/small
cp /tmp/small/manifest.json "$LOG/small-manifest.json" 2>/dev/null
stage sweep 270 python3 -m engine.bench sweep --target /tmp/small/target --drafter /tmp/small/drafter \
  --prompts /tmp/small/prompts.jsonl --out "$LOG/sweep" --concurrency 1 4 8 16 32 64 \
  --arms plain spec spec+trim=2 spec+trim=4 spec+trim=8 spec+gate=32 --noise-arm \
  --rounds 8 --new-tokens 128 --time-budget-s 250 --no-progress
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -40 "$LOG/sweep.log"
