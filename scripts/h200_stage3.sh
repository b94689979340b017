#!/usr/bin/env bash
# H200 stage 3: build the small fixture pair, then the lever sweep on it (closed loop, arms interleaved
# round by round, paired noise floor). Results under $OUT.
set -uo pipefail
OUT=${OUT:-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
stage() {  # stage NAME SECONDS CMD...: run with a time cap, log, never abort the script
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS rc
  timeout "$secs" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$LOG/stages.txt"
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; echo "commit ${PEGASPEC_COMMIT:-?}"; } >"$LOG/env.txt" 2>&1

stage fixture-small 300 python3 -m engine.fixture build --recipe small --device cuda --out /tmp/small
cp /tmp/small/manifest.json "$LOG/small-manifest.json" 2>/dev/null
stage sweep 270 python3 -m engine.bench sweep --target /tmp/small/target --drafter /tmp/small/drafter \
  --prompts /tmp/small/prompts.jsonl --out "$LOG/sweep" --concurrency 1 4 8 16 32 64 \
  --arms plain spec spec+trim=2 spec+trim=4 spec+trim=8 spec+gate=32 --noise-arm \
  --rounds 8 --new-tokens 128 --time-budget-s 250 --no-progress
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
tail -40 "$LOG/sweep.log"
