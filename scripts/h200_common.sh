# Sourced by scripts/h200_stage*.sh: output folders, unbuffered Python, and `stage`, which runs one
# step with a time cap, logs it under $LOG and records its exit code and duration without aborting.
set -uo pipefail
OUT=${OUT:-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1

stage() {  # stage NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS rc
  timeout "$secs" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$LOG/stages.txt"
  return $rc
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; echo "commit ${PEGASPEC_COMMIT:-?}"; } \
  >"$LOG/env.txt" 2>&1
