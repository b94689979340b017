#!/usr/bin/env bash
# H200 stage 2: rebuild the tiny fixture pair, run the levers gate on it, the Qwen3-4B-geometry decode
# bench against the transformers peer, and the verify/drafter cost profile. Results under $OUT.
source "$(dirname "$0")/h200_common.sh"

stage fixture-tiny 240 python3 -m engine.fixture build --recipe tiny --device cuda --out /tmp/tiny --tar "$OUT/tiny.tar"
if [ -f /tmp/tiny/target/config.json ]; then
  rm -rf engine/fixture/data/tiny && cp -r /tmp/tiny engine/fixture/data/tiny
  stage gates-gpu 75 python3 -m pytest gates -n 4 -q -p no:cacheprovider --run-record="$LOG/levers-gate-h200.md"
fi
stage decode-bench 175 python3 -m engine.bench decode --out "$LOG/decode" --peer-repeats 2
stage profile-4b 90 python3 -m engine.bench profile --geometry 4b --out "$LOG/profile-4b" --time-budget-s 75
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -25 "$LOG/decode-bench.log"
