#!/usr/bin/env bash
# Device runs by named stage: `bash scripts/device.sh STAGE[:SECONDS][+STAGE...] ...`.
# Stages run in the order given; `a+b` runs a and b side by side (e.g. a build beside the GPU tests),
# `a,b` runs b after a inside one side-by-side lane, and `NAME@G` pins a stage to GPU G and its share of
# the host's cores (so two lanes on a two-GPU machine neither share a GPU nor contend for cores) and
# its output to logs/gG/ (its log to logs/NAME-gG.log), so `study@0+study@1` keeps both runs.
# Each stage is capped (its default below, or :SECONDS), logs to $OUT/logs/STAGE.log, and its exit code
# and seconds go to $OUT/logs/stages.txt; a failed stage never stops the next. `list` prints the stages.
# Nothing here writes into the tree: pairs are built under $PAIRS (default /tmp), results under $OUT.
#   bash scripts/device.sh gpu-tests+small-build sweep-small steps
#   bash scripts/device.sh study@0,suite@0+small-build@1,sweep-adaptive@1
#   PAIR=engine/fixture/data/tiny bash scripts/device.sh steps
# Adding a stage: one `stage NAME SECONDS "what it does"` line and a `run_NAME` function (- as _).
set -uo pipefail
export OUT=${OUT:-out} PAIRS=${PAIRS:-/tmp} PYTHONUNBUFFERED=1
export LOG=$OUT/logs PAIR=${PAIR:-${PAIRS:-/tmp}/small}

declare -A CAP HELP
ORDER=()
stage() { CAP[$1]=$2; HELP[$1]=$3; ORDER+=("$1"); }

# The small pair every later bench stage reads ($PAIR): BUILD_SET="k=v ..." overrides recipe fields.
needs_pair() { [ -f "$PAIR/manifest.json" ] || { echo "no pair at $PAIR: run small-build first (or set PAIR)"; return 3; }; }
sets() { for kv in ${BUILD_SET:-}; do printf -- '--set %s ' "$kv"; done; }

stage gpu-tests 240 "GPU tests: kernels, engine, hedging, drafter context, steps launched ahead, prefill (skips on CPU say why); GPU_TESTS=\"FILES\" runs those instead"
run_gpu_tests() {
  python3 -m pytest ${GPU_TESTS:-tests/test_kernels*.py tests/test_engine_gpu.py tests/test_hedge_gpu.py \
    tests/test_draft_context.py tests/test_decode_overlap.py tests/test_spec_overlap.py tests/test_prefill.py} \
    -q -rs -n 3 -p no:cacheprovider
}
stage suite 300 "the whole suite (CPU tests, GPU tests, gates) on the device; the gate's record in logs/levers-gate-h200.md"
run_suite() {
  PEGAINFER_REQUIRE_SPEC_GATE=1 python3 -m pytest tests gates -n 8 -q -rs -p no:cacheprovider \
    --run-record="$LOG/levers-gate-h200.md"
}
stage gates 210 "the levers gate (the shipped pair and the known-continuation 4B pair), its run record in logs/levers-gate-h200.md"
run_gates() { python3 -m pytest gates -n 4 -q -p no:cacheprovider --run-record="$LOG/levers-gate-h200.md"; }
stage gates-known 150 "the gate's known-continuation cases alone (4B geometry, modelled drafter); a partial record in logs/"
run_gates_known() {
  PEGAINFER_REQUIRE_SPEC_GATE=1 python3 -m pytest gates -k known -n 4 -q -p no:cacheprovider \
    --run-record="$LOG/levers-gate-known-h200.md"
}
stage tiny-build 270 "the tiny recipe into \$PAIRS/tiny, packed as \$OUT/tiny.tar (install it by hand)"
run_tiny_build() {
  python3 -m engine.fixture build --recipe tiny --device cuda --out "$PAIRS/tiny" --tar "$OUT/tiny.tar" $(sets)
}
stage small-build 400 "the small recipe into \$PAIR; its manifest to logs/small-manifest.json"
run_small_build() {
  python3 -m engine.fixture build --recipe small --device cuda --out "$PAIR" $(sets) &&
    cp "$PAIR/manifest.json" "$LOG/small-manifest.json"
}
stage eval64 40 "τ of \$PAIR at 64 new tokens (the reference loop)"
run_eval64() { needs_pair && python3 -m engine.fixture eval --pair "$PAIR" --max-new-tokens 64 --device cuda; }
stage kernels 90 "kernel micro-benchmark (linear, fused, norm); its tuned table stays in logs/kernels"
run_kernels() { python3 -m engine.bench kernels --out "$LOG/kernels" --skip invariant,attention --budget-s 60; }
stage decode 175 "Qwen3-4B-geometry decode against the transformers peer"
run_decode() { python3 -m engine.bench decode --out "$LOG/decode" --peer-repeats 2 --peer-concurrency ${PEER_C:-1}; }
stage profile 90 "verify/drafter cost grid at the 4B geometry"
run_profile() { python3 -m engine.bench profile --geometry 4b --out "$LOG/profile" --time-budget-s 75; }
stage ab 540 "two builds on one bench command, interleaved pairs (python -m scripts.ab; logs/ab): AB_BASE (required) and AB_HEAD (default .): a commit or a checkout directory; AB_CMD (default: the 4B decode at c=1 and 64, no peer), AB_METRIC (decode_summary.csv:tok_s), AB_KEY (concurrency), AB_REPEATS (4)"
run_ab() {  # AB_KEY= (empty) for a metric of one value a run, e.g. AB_METRIC=wall
  local key=${AB_KEY-concurrency} cmd="python3 -m engine.bench decode --out {out} --concurrency 1 64 --no-peer"
  [ -n "${AB_CMD:-}" ] && cmd=$AB_CMD
  python3 -m scripts.ab --base "${AB_BASE:?set AB_BASE to a commit or a checkout directory}" --head "${AB_HEAD:-.}" \
    --out "$LOG/ab" --repeats "${AB_REPEATS:-4}" --metric "${AB_METRIC:-decode_summary.csv:tok_s}" \
    ${key:+--key $key} -- $cmd
}
stage retune 300 "the kernel sweep's tuned table against the shipped one: the tree against a copy of its engine/ with the new table (\$PAIRS/retune), 4 interleaved pairs of the 4B decode (logs/kernels, logs/retune-ab); RETUNE_MS=\"32,64\" sweeps those row buckets alone (the others kept), RETUNE_C=\"32 64\" sets the decode's c; install it by hand if it wins"
run_retune() {
  local ms=${RETUNE_MS:+--ms $RETUNE_MS --budget-s 500 --skip invariant,attention,fused,norm} head=$PAIRS/retune
  python3 -m engine.bench kernels --out "$LOG/kernels" ${ms:---skip invariant,attention --budget-s 60} || return
  rm -rf "$head" && mkdir -p "$head" && cp -a engine "$head/" && cp "$LOG"/kernels/tuned/*.json "$head/engine/kernels/tuned/" ||
    return
  python3 -m scripts.ab --base . --head "$head" --out "$LOG/retune-ab" --repeats 4 --metric decode_summary.csv:tok_s \
    --key concurrency -- python3 -m engine.bench decode --out {out} --concurrency ${RETUNE_C:-1 8 16 64} --no-peer
}
stage attn-context 120 "paged attention at long context (decode and spans up to 32k, every split count) against the K+V read floor; logs/attn-context"
run_attn_context() {
  python3 -m engine.bench kernels --out "$LOG/attn-context" --skip linear,fused,norm,invariant --attn-cases \
    ${ATTN_CASES:-1:8192:1,16:8192:1,32:8192:1,16:2048:1,64:2048:1,128:2048:1,4:32768:1,16:32768:1,16:2048:16,16:8192:16,32:8192:16,4:32768:16}
}
stage steps 45 "where a c=1 step's time goes on \$PAIR (torch.profiler): plain vs spec"
run_steps() {
  needs_pair && python3 -m engine.bench steps --target "$PAIR/target" --drafter "$PAIR/drafter" \
    --out "$LOG/steps-c1" --concurrency 1 --new-tokens 128 --arms plain spec
}
stage steps-c64 60 "the same at c=64: plain, spec and the gate"
run_steps_c64() {
  needs_pair && python3 -m engine.bench steps --target "$PAIR/target" --drafter "$PAIR/drafter" \
    --out "$LOG/steps-c64" --concurrency 64 --new-tokens 64 --arms plain spec spec+gate=16
}
stage sweep-small 110 "lever sweep on \$PAIR at c=1 and c=8: plain vs spec, paired noise floor"
run_sweep_small() {
  needs_pair && python3 -m engine.bench sweep --target "$PAIR/target" --drafter "$PAIR/drafter" \
    --prompts "$PAIR/prompts.jsonl" --out "$LOG/sweep-small" --concurrency 1 8 --arms plain spec --noise-arm \
    --rounds 8 --new-tokens 128 --time-budget-s 100 --no-progress
}
stage sweep 290 "the full lever sweep on \$PAIR: c=1..64, trims and the gate"
run_sweep() {
  needs_pair && python3 -m engine.bench sweep --target "$PAIR/target" --drafter "$PAIR/drafter" \
    --prompts "$PAIR/prompts.jsonl" --out "$LOG/sweep" --concurrency 1 4 8 16 32 64 \
    --arms plain spec spec+trim=2 spec+trim=4 spec+trim=8 spec+gate=16 --noise-arm \
    --rounds 8 --new-tokens 128 --time-budget-s 270 --no-progress
}
stage sweep-adaptive 200 "the adaptive span against the static levers on \$PAIR: c=1..256, both noise arms (LENGTH_SPREAD=S: varied output lengths)"
run_sweep_adaptive() {
  needs_pair && python3 -m engine.bench sweep --target "$PAIR/target" --drafter "$PAIR/drafter" \
    --prompts "$PAIR/prompts.jsonl" --out "$LOG/sweep-adaptive" --concurrency 1 4 16 64 256 \
    --arms plain spec spec+trim=4 spec+gate=16 spec+policy=adaptive --noise-arm --spec-noise-arm \
    --rounds 4 --new-tokens 128 --length-spread "${LENGTH_SPREAD:-0}" --time-budget-s 180 --no-progress
}
stage small-spread 560 "the small recipe for SEEDS (default 0 1 2; REPEAT=1 adds the first seed again), builds spread over the GPUs; c=1 plain vs spec on each seed's pair; logs/spread"
run_small_spread() {
  local seeds=(${SEEDS:-0 1 2}) gpus i=0 t0=$SECONDS args=()
  gpus=$(nvidia-smi -L | wc -l)
  for name in "${seeds[@]/#/s}" ${REPEAT:+"s${seeds[0]}r"}; do
    local seed=${name//[sr]/} gpu=$((i % gpus))
    i=$((i + 1))
    CUDA_VISIBLE_DEVICES=$gpu python3 -m engine.fixture build --recipe small --device cuda --seed "$seed" \
      --out "$PAIRS/small-$name" $(sets) >"$LOG/spread-build-$name.log" 2>&1 &
  done
  wait
  echo "builds: $((SECONDS - t0))s on $gpus GPU(s)"
  for seed in "${seeds[@]}"; do
    local pair=$PAIRS/small-s$seed
    timeout 75 python3 -m engine.bench sweep --target "$pair/target" --drafter "$pair/drafter" --prompts "$pair/prompts.jsonl" \
      --out "$LOG/spread/sweep-s$seed" --concurrency 1 --arms plain spec --noise-arm --spec-noise-arm --rounds 6 \
      --new-tokens 128 --no-progress && args+=("$pair=$LOG/spread/sweep-s$seed")
  done
  python3 -m engine.bench spread --builds "${args[@]}" ${REPEAT:+"$PAIRS/small-s${seeds[0]}r"} --out "$LOG/spread"
}
stage determinism 200 "a shortened small recipe built twice on the last GPU: same seed, same weights? (manifests' sha256)"
run_determinism() {
  local short="target_steps=100 drafter_steps=100 greedy_sequences=4096" gpu
  gpu=$(($(nvidia-smi -L | wc -l) - 1))
  for name in a b; do
    CUDA_VISIBLE_DEVICES=$gpu python3 -m engine.fixture build --recipe small --device cuda --out "$PAIRS/det-$name" \
      $(BUILD_SET="$short" sets) >"$LOG/determinism-$name.log" 2>&1 || return
  done
  python3 -m engine.bench spread --builds "$PAIRS/det-a" "$PAIRS/det-b" --out "$LOG/determinism"
}
export TINY=engine/fixture/data/tiny
stage preempt 90 "KV pressure on the shipped tiny pair: preemption by recompute vs whole-budget reservation (c=64, 1,024 tokens)"
run_preempt() {
  python3 -m engine.bench preempt --target $TINY/target --drafter $TINY/drafter --prompts $TINY/prompts.jsonl \
    --out "$LOG/preempt" --concurrency 64 --new-tokens 1024 --pool-requests 16 --rounds 3
}
stage serve-load 120 "open-loop Poisson load on servers of the tiny pair (plain, spec, gate); needs starlette+uvicorn"
run_serve_load() {
  python3 -m engine.bench serve-load --target $TINY/target --drafter $TINY/drafter --out "$LOG/serve-load" \
    --rates 4 32 --arms plain spec spec+gate=16 --repeats 2 --duration-s 5 --max-tokens 128
}
stage serve-load-small 150 "open-loop load on servers of \$PAIR (plain, spec, trim 4, gate 8; its prompts.jsonl); needs starlette+uvicorn"
run_serve_load_small() {
  needs_pair && python3 -m engine.bench serve-load --target "$PAIR/target" --drafter "$PAIR/drafter" \
    --prompts "$PAIR/prompts.jsonl" --out "$LOG/serve-load-small" --rates 8 48 \
    --arms plain spec spec+trim=4 spec+gate=8 --repeats 2 --duration-s 2.5 --max-tokens 128 --warmup-requests 32
}
stage serve-load-4b 150 "open-loop load on bench-only known-continuation 4B servers, code profile (plain, spec, trim 4, gate 32); needs starlette+uvicorn"
run_serve_load_4b() {
  python3 -m engine.bench serve-load --geometry 4b --profile code --out "$LOG/serve-load-4b" --rates 16 64 \
    --arms plain spec spec+trim=4 spec+gate=32 --repeats 2 --duration-s 2 --max-tokens 64 --warmup-requests 64
}
stage study 480 "the 4B-geometry lever study (known-continuation target, modelled drafter, cost model)"
run_study() {  # STUDY_BUDGET: its wall budget (under the cap); STUDY_ARGS: more flags (later ones win)
  python3 -m engine.bench study --out "$LOG/study" --time-budget-s "${STUDY_BUDGET:-420}" --profile-budget-s 90 --rounds 3 ${STUDY_ARGS:-}
}
stage study-mixed 560 "the 4B study on mixed workloads: MIXED_PROFILES (default code+chat spread code) at c=MIXED_C (1 16 64 256), arms best static, uniform adaptive, per-request budget; pinned lanes split the profiles (study-mixed@0+study-mixed@1: lane G the profiles G, G+2, ..)"
run_study_mixed() {  # STUDY_BUDGET: its wall budget (under the cap); STUDY_ARGS: more flags (later ones win)
  local profiles=(${MIXED_PROFILES:-code+chat spread code}) lanes=$(nvidia-smi -L | wc -l) mine=() i
  if [[ $LOG == */g${CUDA_VISIBLE_DEVICES:-none} ]]; then  # pinned: this lane's share of the profiles
    for ((i = CUDA_VISIBLE_DEVICES; i < ${#profiles[@]}; i += lanes)); do mine+=("${profiles[i]}"); done
    profiles=("${mine[@]}")
  fi
  python3 -m engine.bench study --out "$LOG/study-mixed" --profiles "${profiles[@]}" --concurrency ${MIXED_C:-1 16 64 256} \
    --arms spec spec+trim=4 spec+gate=32 spec+policy=adaptive spec+policy=budget --time-budget-s "${STUDY_BUDGET:-500}" \
    --profile-budget-s 90 --graphs-budget-s 150 --rounds 5 ${STUDY_ARGS:-}
}
stage study-context 560 "the 4B-geometry study over batch x context: prompts of 2048 and 8192 tokens at c=1 8 32 64 (CONTEXT_C), one shared KV pool (a grid over --gpu-memory-utilization is refused, naming the bytes); logs/study-context/contexts.md"
run_study_context() {  # STUDY_BUDGET: its wall budget (under the cap); STUDY_ARGS: more flags (later ones win)
  python3 -m engine.bench study --out "$LOG/study-context" --prompt-lens 2048 8192 --concurrency ${CONTEXT_C:-1 8 32 64} \
    --time-budget-s "${STUDY_BUDGET:-480}" --profile-budget-s 60 --rounds 2 --new-tokens 64 ${STUDY_ARGS:-}
}
stage ablate 560 "drafter ablation: one target and pool, then VARIANTS (\"name:k=v,k=v ...\") side by side"
run_ablate() {
  local d=$PAIRS/ablate t0=$SECONDS
  python3 -m engine.fixture ablate prepare --dir "$d" $(sets) || return
  for v in ${VARIANTS:-ctrl:}; do
    local name=${v%%:*} kv=${v#*:} args=()
    for s in ${kv//,/ }; do args+=(--set "$s"); done
    python3 -m engine.fixture ablate variant --dir "$d" --name "$name" --out "$LOG/ablate" $(sets) "${args[@]}" \
      >"$LOG/ablate-$name.log" 2>&1 &
  done
  wait
  grep -h "\[ablation\]" "$LOG"/ablate-*.log
  echo "ablate: $((SECONDS - t0))s"
}

run_stage() {  # NAME[@GPU][:SECONDS]: capped, logged, recorded; never aborts the caller
  local spec=${1%%:*} secs=${1#*:} t0=$SECONDS rc pin=()
  local name=${spec%%@*} gpu=${spec#*@}
  [ "$secs" = "$1" ] && secs=${CAP[$name]:-}
  if [ -z "${HELP[$name]:-}" ]; then
    echo "$name unknown stage (bash scripts/device.sh list)" | tee -a "$LOG/stages.txt"
    return 2
  fi
  if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
    echo "$name bad cap '$secs' (whole seconds)" | tee -a "$LOG/stages.txt"
    return 2
  fi
  if [ "$gpu" != "$spec" ]; then
    local gpus cores share
    gpus=$(nvidia-smi -L | wc -l) cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    share=$((cores / gpus > 0 ? cores / gpus : 1))  # fewer cores than GPUs: the lanes share them
    [[ $gpu =~ ^[0-9]+$ ]] && [ "$gpu" -lt "$gpus" ] ||
      { echo "$name bad GPU '$gpu' ($gpus here)" | tee -a "$LOG/stages.txt"; return 2; }
    local first=$((gpu * share % cores))
    pin=(env CUDA_VISIBLE_DEVICES="$gpu" taskset -c "$first-$((first + share - 1))")
  fi
  local log=$LOG out=$LOG/$name.log  # a pinned stage writes under logs/gG/: the same stage may run on each GPU
  [ -n "${pin:-}" ] && log=$LOG/g$gpu out=$LOG/$name-g$gpu.log && mkdir -p "$log"
  LOG=$log timeout "$secs" "${pin[@]}" bash -c "$(declare -f); run_${name//-/_}" >"$out" 2>&1
  rc=$?
  echo "$name${pin:+@$gpu} rc=$rc $((SECONDS - t0))s (cap ${secs}s)" | tee -a "$LOG/stages.txt"
  return $rc
}

if [ $# -eq 0 ] || [ "$1" = list ]; then
  for name in "${ORDER[@]}"; do printf '%-12s %4ss  %s\n' "$name" "${CAP[$name]}" "${HELP[$name]}"; done
  exit 0
fi
mkdir -p "$LOG"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; echo "commit ${PEGASPEC_COMMIT:-?}"; } \
  >>"$LOG/env.txt" 2>&1
for group in "$@"; do
  for lane in ${group//+/ }; do (for part in ${lane//,/ }; do run_stage "$part"; done) & done
  wait
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
cat "$LOG/stages.txt"
for group in "$@"; do
  for part in ${group//[+,]/ }; do
    part=${part%%:*} && part=${part/@/-g}
    echo "== $part" && tail -n 4 "$LOG/$part.log" 2>/dev/null
  done
done
