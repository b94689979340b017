#!/usr/bin/env bash
# H200 stage 11: the small recipe with twice the drafter batch (256 sequences a step: at equal steps
# the ablation's drafter losses fell with samples seen), then the c=1 sweep on that pair.
source "$(dirname "$0")/h200_common.sh"

pair=/tmp/small
stage small 370 python3 -m engine.fixture build --recipe small --device cuda --out $pair --set drafter_batch=256
cp $pair/manifest.json "$LOG/small-manifest.json"
stage sweep 45 python3 -m engine.bench sweep --target $pair/target --drafter $pair/drafter \
  --prompts $pair/prompts.jsonl --out "$LOG/sweep" --concurrency 1 \
  --arms plain spec --noise-arm --rounds 6 --new-tokens 128 --time-budget-s 35 --no-progress
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
python3 -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['eval'], m['build_seconds'])" "$LOG/small-manifest.json"
head -12 "$LOG/sweep/sweep.md" | tail -6
