#!/usr/bin/env bash
# H200 stage 9: drafter ablation for the `small` floor (issue 4). One target and a 98304-sequence
# greedy pool, then drafter variants trained side by side against it, each measured at 64 and
# 128 new tokens (scripts/drafter_ablation.py).
source "$(dirname "$0")/h200_common.sh"

d=/tmp/abl
stage prepare 240 env PYTHONPATH=. python3 scripts/drafter_ablation.py prepare --dir $d --pool 98304
v() { local name=$1; shift; stage "v-$name" "$VT" env PYTHONPATH=. python3 scripts/drafter_ablation.py variant --dir $d \
  --name "$name" --out "$LOG" --set precompute_features=0 "$@"; }
VT=$((560 - SECONDS))
v ctrl24k --set greedy_sequences=24576 &
v pool98k --set greedy_sequences=98304 &
v pool98k-b256 --set greedy_sequences=98304 --set drafter_batch=256 &
v pool98k-5l --set greedy_sequences=98304 --set drafter_layers=5 &
wait
nvidia-smi --query-gpu=memory.used --format=csv >>"$LOG/env.txt"
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
grep -h "\[ablation\]" "$LOG"/*.log
