#!/usr/bin/env bash
# The issue-19 device run in one call (repository root; OLD=<tree of the baseline commit>):
# GPU kernel tests (bf16), the decode bench with the compiled and eager peers, the kernels before
# and after (kernel_ab in one process; the baseline tree's decode bench), then the cost profile.
# Every step is capped so the whole fits BUDGET seconds; results are tarred into $OUT.
set -u
T0=$(date +%s)
BUDGET=${BUDGET:-400}
R=$(mktemp -d)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
left() { echo $((BUDGET - ($(date +%s) - T0))); }
step() {  # name cap_s command...: run with min(cap, time left - 8 s), log to $R/name.log
  local name=$1 cap=$2 t s rc
  shift 2
  t=$(($(left) - 8))
  [ "$cap" -lt "$t" ] && t=$cap
  if [ "$t" -lt 15 ]; then echo "$name: skipped, $(left) s left" | tee -a "$R/steps.log"; return; fi
  s=$(date +%s)
  timeout -k 5 "$t" "$@" >"$R/$name.log" 2>&1
  rc=$?
  echo "$name: rc=$rc, $(($(date +%s) - s)) s of a $t s cap" | tee -a "$R/steps.log"
  tail -n 25 "$R/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$R/device.txt"
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$R/device.txt"
step tests 70 python -m pytest -q -p no:cacheprovider -k "gpu or dtype2" tests/test_kernels_pdl.py \
  tests/test_kernels_linear.py tests/test_kernels_fused_linear.py tests/test_kernels_attention.py \
  tests/test_kernels_norm_rope.py tests/test_kernels_ops.py tests/test_kernels_tuning.py tests/test_bench_kernel_ab.py
# PDL off for the benches if its GPU test failed (graph capture or results), so the figures still come
PDL=True
grep -q "FAILED tests/test_kernels_pdl" "$R/tests.log" && PDL=False && echo "PDL off" | tee -a "$R/steps.log"
printf '%s\n' "import sys" "import engine.kernels._triton as t" "t.PDL = sys.argv[1] == 'True'" \
  "from engine.bench.__main__ import main" "sys.exit(main(sys.argv[2:]))" >"$R/bench.py"
step decode 215 python "$R/bench.py" $PDL decode --out "$R/decode" --concurrency 1 8 16 32 64 --repeats 3 \
  --peer-concurrency 1 64 --peer-repeats 2 --peer-warmup-cap-s 60
step kernel_ab 40 python -m engine.bench.kernel_ab --out "$R/kernel_ab" --ms 1 8 16 64
step decode_before 45 bash -c "cd '$OLD' && PYTHONPATH='$OLD' PEGASPEC_COMMIT=$OLD_COMMIT python -m engine.bench decode \
  --out '$R/decode_before' --concurrency 1 8 16 32 64 --repeats 3 --no-peer"
step profile 60 python "$R/bench.py" $PDL profile --geometry 4b --batches 1 16 64 128 --spans 1 4 16 \
  --out "$R/profile" --repeats 3 --time-budget-s 25
step profile_before 60 bash -c "cd '$OLD' && PYTHONPATH='$OLD' PEGASPEC_COMMIT=$OLD_COMMIT python -m engine.bench profile \
  --geometry 4b --batches 1 16 64 128 --spans 1 4 16 --out '$R/profile_before' --repeats 3 --time-budget-s 25"
tar -czf "$OUT/results.tgz" -C "$R" .
cp "$R/steps.log" "$OUT/steps.log"
echo "=== summary ($(($(date +%s) - T0)) s)"
cat "$R/steps.log"
for d in decode decode_before; do
  echo "--- $d"
  grep -A8 "^| c |" "$R/$d/decode.md" 2>/dev/null
done
grep -A40 "^| op |" "$R/kernel_ab.log" 2>/dev/null | head -45
