#!/usr/bin/env bash
# H200 stage 2: rebuild the tiny fixture pair, run the levers gate on it, the Qwen3-4B-geometry decode
# bench against the transformers peer, and the verify/drafter cost profile. Results under $OUT.
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
