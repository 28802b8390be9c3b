#!/usr/bin/env bash
# The GPU checks in one command on a GPU machine (docs/gpu.md's run book says how to call it
# there). That machine reaches no network: this script downloads nothing. It installs only the
# wheels already in .whl/ (benchmarks/gpu_wheels.sh fills that folder on a machine with registry
# access), with --no-index --no-deps into /tmp/site, and never installs the project itself:
# pyproject asks for torch>=2.13 while a GPU image may hold another torch (2.11 on the one seen so
# far), and pip would then try to fetch one. The tree runs from PYTHONPATH, on the image's torch.
#
# PARTS picks and orders what runs (the most wanted first: a device lease is short). Default:
#   "tests roofline=64 spec roofline=8 prefill sampling versions"
#   tests        pytest -m gpu (tests/test_gpu.py, test_sampling_device.py, test_generation_slot.py),
#                all but the compiled step; graph-vs-eager fp32 equality among them
#   roofline     the decode step of the Qwen2.5-7B and -0.5B shapes (SHAPES) against the HBM roofline,
#                bf16, context 512, at each batch of BATCHES (default "64 8"; batch 64 with a profile of
#                the step's kernels by kind, PROFILE="graphs,static"); roofline=N[,M] runs those batches;
#                ROOF_PATHS narrows the paths (default graphs,static,dynamic,hf-loop; "graphs,compiled,static"
#                measures the compiled step on the same model build)
#   spec         speculative rounds on graphs against plain graphed decoding, 0.5B shape: the selector
#                alone, then with the engine's whole-call comparison as actions run (--guard)
#   prefill      per-length-bucket prefill calls and the last-column output head, 0.5B shape
#   sampling     fused draws against unfused ones, 0.5B shape
#   versions     a policy version copied into the warm model against a model built afresh
#   compiled     the torch.compile'd step: its GPU tests (sdpa and flex attention; they compile for
#                minutes; COMPILED_TEST=0 skips them), then roofline rows at batch 64 for COMPILED_SHAPES
#                (default "7b 0.5b") of COMPILED_PATHS (default "compiled,compiled-flex": the compiled
#                step on cuDNN's attention over the whole window, then on flex attention's Triton
#                kernel over the written blocks), each with its kernel profile
#   trl          one GRPO step of the 0.5B shape, the campaign against TRL (needs gpu_wheels.sh all);
#                TRL_SET="KEY=VALUE ..." adds RLHFless settings (e.g. generation.compile_decode=true)
#
# Time: the whole run ends by DEADLINE seconds after it starts (default 540, for a device command
# limit of 600 s). Each part runs under min(its own timeout, the time left - MARGIN) and is
# skipped when less than MIN_PART seconds (MIN_TRL for trl) would be left. Every benchmark
# prints its figures as it measures them, so a part stopped at its limit keeps what it measured.
#
# Outputs in $OUT (default runs/gpu), at most these four files whatever PARTS says (a remote
# GPU host may hand back only a few):
#   device.txt     date, GPU, Python, torch and transformers, commit, the wheels' install, the
#                  imports the parts need, then `pip list` (what the image has: gpu_wheels.sh SKIP)
#   pytest.txt     the tests' whole output, failure tracebacks included
#   bench.txt      every part's log, ending in one "== NAME: ok | exit status N | timed out after
#                  N s | skipped ..." line per part and a summary
#   results.jsonl  the figures, one JSON line per measurement ("bench" names the benchmark)
set -u -o pipefail
START=$SECONDS
cd "$(dirname "$0")/.."
DEADLINE="${DEADLINE:-540}" MARGIN="${MARGIN:-15}" MIN_PART="${MIN_PART:-20}" MIN_TRL="${MIN_TRL:-120}"
PARTS="${PARTS:-tests roofline=64 spec roofline=8 prefill sampling versions}"
for p in $PARTS; do  # a misspelt part fails here, before a minute of device time goes by
  case "${p%%=*}" in
    tests|roofline|spec|prefill|sampling|versions|compiled|trl) ;;
    *) echo "gpu_check: unknown part '$p' (tests, roofline[=BATCHES], spec, prefill, sampling, versions," \
         "compiled, trl)" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH="$PWD"  # a crash prints its Python stacks
OUT="${OUT:-runs/gpu}"; mkdir -p "$OUT"
DEV="$OUT/device.txt" LOG="$OUT/bench.txt" JSON="$OUT/results.jsonl" TESTLOG="$OUT/pytest.txt"
SUMMARY=()

left() { echo $(( DEADLINE - (SECONDS - START) )); }
# budget OWN [MIN]: the seconds a part may run now, its own timeout or less near DEADLINE; 0 when
# less than MIN (default MIN_PART) would be left
budget() {
  local t=$(( $(left) - MARGIN )) min="${2:-$MIN_PART}"
  (( t > $1 )) && t=$1
  (( t < min )) && t=0
  echo "$t"
}
note() { echo "== $1: $2" | tee -a "$LOG"; SUMMARY+=("$1: $2"); }
verdict() {  # verdict STATUS SECONDS
  case "$1" in
    0) echo ok ;;
    124) echo "timed out after $2 s" ;;
    137) echo "killed after $2 s (it did not stop on SIGTERM)" ;;
    *) echo "exit status $1" ;;
  esac
}
quiet() { grep --line-buffered -v "Warning\|forward_call\|deprecated\|warnings.warn"; }
# run_part LABEL OWN_TIMEOUT [MIN] -- CMD...: CMD under its budget, its output (warnings left out) in
# bench.txt and on stdout; records CMD's own status, not the pipeline's
run_part() {
  local label=$1 own=$2 min=$MIN_PART; shift 2
  [ "$1" != -- ] && { min=$1; shift; }
  shift
  local t; t=$(budget "$own" "$min")
  if (( t == 0 )); then note "$label" "skipped: $(left) s left of DEADLINE=$DEADLINE"; return; fi
  echo "== $label (at $(( SECONDS - START )) s, up to $t s)" | tee -a "$LOG"
  timeout -k 10 "$t" "$@" 2>&1 | quiet | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  note "$label" "$(verdict "$rc" "$t")"
}
# run_tests LABEL OWN_TIMEOUT PYTEST_ARGS...: pytest -m gpu, its whole output in pytest.txt
run_tests() {
  local label=$1 own=$2; shift 2
  local t; t=$(budget "$own")
  if (( t == 0 )); then note "$label" "skipped: $(left) s left of DEADLINE=$DEADLINE"; return; fi
  local per_test=()  # a hung test gets its stack dumped by pytest-timeout before the part's limit
  python3 -c "import pytest_timeout" 2>/dev/null && per_test=(--timeout "$(( t > 60 ? t - 20 : t ))")
  echo "== $label (at $(( SECONDS - START )) s, up to $t s)" | tee -a "$LOG" "$TESTLOG"
  timeout -k 10 "$t" python3 -m pytest -v -m gpu -p no:cacheprovider --durations=10 ${per_test[@]+"${per_test[@]}"} \
    "$@" 2>&1 | tee -a "$TESTLOG" | quiet | grep --line-buffered -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|error|no tests"
  local rc=${PIPESTATUS[0]}
  tail -n 1 "$TESTLOG" >>"$LOG"
  note "$label" "$(verdict "$rc" "$t")$( (( rc == 1 )) && echo ' (tests failed: pytest.txt)')"
}

{ date -u
  echo "PARTS=$PARTS DEADLINE=$DEADLINE"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: none"
  python3 --version
  git log --oneline -1 2>/dev/null || echo "commit: no git"; } 2>&1 | tee "$DEV"
if compgen -G ".whl/*.whl" >/dev/null; then
  t0=$SECONDS
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl >>"$DEV" 2>&1; then
    export PYTHONPATH="/tmp/site:$PWD"
    msg="wheels: $(compgen -G '.whl/*.whl' | wc -l) from .whl/ into /tmp/site in $(( SECONDS - t0 )) s"
  else
    msg="wheels: the install from .whl/ FAILED (above); running without them"
  fi
  echo "$msg" | tee -a "$DEV"
fi
# what the parts import, and that torch is still the image's (the wheels never bring one)
mods="torch transformers pydantic boto3 minio actions.engines.torch_engine flows.config"
[[ " $PARTS " == *" trl "* ]] && mods="$mods prefect trl datasets"
python3 - $mods <<'EOF' 2>&1 | tee -a "$DEV"
import importlib
import sys

for name in sys.argv[1:]:
    try:
        mod = importlib.import_module(name)
        print(f"import {name}: {getattr(mod, '__version__', 'ok')} ({getattr(mod, '__file__', '')})")
    except Exception as exc:  # noqa: BLE001 -- a missing package is a line of the report, not an abort
        print(f"import {name}: FAILED {type(exc).__name__}: {exc}"[:300])
import torch

print("cuda:", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
echo "== pip list" >>"$DEV"
PYTHONPATH= python3 -m pip list 2>/dev/null >>"$DEV"  # the image alone, without /tmp/site

q05=benchmarks/configs/qwen2.5-0.5b.json
for p in $PARTS; do
  name=${p%%=*} arg=""; [ "$name" != "$p" ] && arg=${p#*=}
  [ "$name" = roofline ] && arg=${arg:-${BATCHES:-64 8}}
  case "$name" in
    tests)
      run_tests "tests" "${TEST_TIMEOUT:-240}" -k "not compiled_step" tests/test_gpu.py tests/test_sampling_device.py \
        tests/test_generation_slot.py ;;
    roofline)  # batch-major: the batch-64 rows of both shapes first (the 7B one: the 1.5x bar is open there)
      for batch in ${arg//,/ }; do
        for shape in ${SHAPES:-7b 0.5b}; do
          prof=(); [ "$batch" = 64 ] && prof=(--profile "${PROFILE:-graphs,static}")  # kernels by kind
          paths=(--compare)  # ROOF_PATHS without dynamic: no row comparison (it is against dynamic's rows)
          [ -n "${ROOF_PATHS:-}" ] && { paths=(--paths "$ROOF_PATHS"); [[ ",$ROOF_PATHS," == *,dynamic,* ]] && paths+=(--compare); }
          run_part "roofline qwen2.5-$shape batch $batch" "${BENCH_TIMEOUT:-150}" -- python3 benchmarks/bench_decode_roofline.py \
            --device cuda --model-config "benchmarks/configs/qwen2.5-$shape.json" --batch "$batch" --context 512 \
            "${paths[@]}" ${prof[@]+"${prof[@]}"} --json "$JSON"
        done
      done ;;
    spec)  # history drafts at epoch 2 first: the 1.5x bar; the selector alone, then as actions run (--guard)
      run_part "spec qwen2.5-0.5b" "${SPEC_TIMEOUT:-300}" -- python3 benchmarks/bench_speculation.py --device cuda --no-sweep \
        --model-config "$q05" --new-tokens 64 --calls 2 --repeats 2 --json "$JSON"
      run_part "spec qwen2.5-0.5b --guard" "${SPEC_TIMEOUT:-300}" -- python3 benchmarks/bench_speculation.py --device cuda \
        --no-sweep --guard --model-config "$q05" --new-tokens 64 --calls 2 --repeats 2 --json "$JSON" ;;
    prefill)
      run_part "prefill qwen2.5-0.5b" "${PREFILL_TIMEOUT:-120}" -- python3 benchmarks/bench_prefill_calls.py --device cuda \
        --prompts 24 --model-config "$q05" --json "$JSON" ;;
    sampling)
      run_part "sampling qwen2.5-0.5b" "${SAMPLING_TIMEOUT:-150}" -- python3 benchmarks/bench_sampling_noise.py --device cuda \
        --model-config "$q05" --variants fused,unfused --batches 64,8 --steps 16 --repeats 3 --json "$JSON" ;;
    versions)
      run_part "versions qwen2.5-0.5b" "${VERSIONS_TIMEOUT:-120}" -- python3 benchmarks/bench_version_swap.py --device cuda \
        --model-config "$q05" --json "$JSON" ;;
    compiled)
      [ "${COMPILED_TEST:-1}" != 0 ] && run_tests "tests compiled_step" "${COMPILE_TEST_TIMEOUT:-400}" -k compiled_step tests/test_gpu.py
      cpaths="${COMPILED_PATHS:-compiled,compiled-flex}"
      for shape in ${COMPILED_SHAPES:-7b 0.5b}; do
        run_part "roofline qwen2.5-$shape batch 64 $cpaths" "${COMPILE_TIMEOUT:-320}" -- python3 benchmarks/bench_decode_roofline.py \
          --device cuda --paths "$cpaths" --profile "$cpaths" --model-config "benchmarks/configs/qwen2.5-$shape.json" \
          --batch 64 --context 512 --json "$JSON"
      done ;;
    trl)
      trl_set=(); for kv in ${TRL_SET:-}; do trl_set+=(--set "$kv"); done
      run_part "trl qwen2.5-0.5b${TRL_SET:+ $TRL_SET}" "${TRL_TIMEOUT:-480}" "$MIN_TRL" -- python3 benchmarks/bench_vs_trl.py \
        --size gpu --device cuda --pairs 1 --steps 3 --model-config "$q05" ${trl_set[@]+"${trl_set[@]}"} --json "$JSON" ;;
  esac
done
{ echo "== summary: $(( SECONDS - START )) s of DEADLINE=$DEADLINE; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  printf '  %s\n' "${SUMMARY[@]}"; } | tee -a "$LOG"
printf '%s\n' "${SUMMARY[@]}" | grep -qv ": ok$" && exit 1
exit 0
