#!/usr/bin/env bash
# H200 stage 6 (after stage 5 on the same warm machine): the lever sweep and the step profile on the
# best complete small build (rebuilt when /tmp holds none), then the gates on the GPU. Results under $OUT.
source "$(dirname "$0")/h200_common.sh"

pair=""
for v in b a; do
  [ -f /tmp/small-$v/drafter/model.safetensors ] && [ -f /tmp/small-$v/target/config.json ] && { pair=/tmp/small-$v; break; }
done
if [ -z "$pair" ]; then
  pair=/tmp/small-b
  stage small-b 420 python3 -m engine.fixture build --recipe small --device cuda --out $pair --set greedy_sequences=24576
fi
echo "pair $pair" | tee -a "$LOG/stages.txt"
cp $pair/manifest.json "$LOG/small-manifest.json"
stage steps-small 60 python3 -m engine.bench steps --target $pair/target --drafter $pair/drafter \
  --out "$LOG/steps-small" --concurrency 1 --new-tokens 128
stage sweep 290 python3 -m engine.bench sweep --target $pair/target --drafter $pair/drafter \
  --prompts $pair/prompts.jsonl --out "$LOG/sweep" --concurrency 1 4 8 16 32 64 \
  --arms plain spec spec+trim=2 spec+trim=4 spec+trim=8 spec+gate=16 --noise-arm \
  --rounds 8 --new-tokens 128 --time-budget-s 270 --no-progress
stage gates 150 python3 -m pytest gates -n 4 -q -p no:cacheprovider --run-record="$LOG/levers-gate-h200.md"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -4 "$LOG/gates.log"
head -12 "$LOG/steps-small/steps.md"
tail -30 "$LOG/sweep.log"
