#!/usr/bin/env bash
# The GPU checks in one run: `make test-gpu`'s tests, then the parts PARTS names, in order
# (default "spec prefill roofline versions sampling"): speculation on graphs, the prefill buckets,
# the decode roofline of the Qwen2.5-0.5B and -7B shapes at batch 8 and 64, context 512, bf16 (at
# 64 with a profile of the step's kernels by kind, PROFILE="graphs,static"), a new policy version
# copied into the warm model against one built afresh, fused draws against unfused ones;
# "compiled" adds the torch.compile'd step (its GPU test, which compiles for minutes, then the
# roofline rows), "trl" the GRPO step against TRL. docs/gpu.md records the
# figures. A GPU machine whose Python lacks the project's lighter dependencies gets them from
# wheels in .whl/ (benchmarks/gpu_wheels.sh fills it), installed into /tmp/site first.
# Figures go to $OUT (default runs/gpu), with the Python version and `pip list` of the machine.
set -u -o pipefail  # a part's status is its command's, not tee's (a timeout shows as 124)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:$PWD"
fi
OUT="${OUT:-runs/gpu}"; mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 --version
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  git log --oneline -1 2>/dev/null; } | tee "$OUT/device.txt"
python3 -m pip list 2>/dev/null > "$OUT/pip-list.txt"  # what the image has (gpu_wheels.sh SKIP)
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -k "not compiled_step" tests/test_gpu.py \
  tests/test_sampling_device.py tests/test_generation_slot.py 2>&1 | grep -v "Warning\|forward_call\|deprecated" | tail -40 | tee "$OUT/pytest.txt"
# PARTS picks and orders what runs (the most wanted first: a device lease is short).
for part in ${PARTS:-spec prefill roofline versions sampling}; do
  case "$part" in
    spec)  # speculative rounds on graphs against plain graphed decoding, history drafts at epoch 2
      echo "== speculation, qwen2.5-0.5b" | tee -a "$OUT/bench.txt"
      timeout "${SPEC_TIMEOUT:-240}" python3 benchmarks/bench_speculation.py --device cuda --no-sweep \
        --model-config benchmarks/configs/qwen2.5-0.5b.json --new-tokens 64 --calls 2 --repeats 2 2>&1 \
        | grep -v "Warning\|forward_call\|deprecated" | tail -60 | tee -a "$OUT/spec.txt" ;;
    prefill)  # per-length-bucket prefill calls and the last-column output head
      echo "== prefill, qwen2.5-0.5b" | tee -a "$OUT/bench.txt"
      timeout "${PREFILL_TIMEOUT:-120}" python3 benchmarks/bench_prefill_calls.py --device cuda --prompts 24 \
        --model-config benchmarks/configs/qwen2.5-0.5b.json 2>&1 | grep -v "Warning\|forward_call\|deprecated" \
        | tail -40 | tee -a "$OUT/prefill.txt" ;;
    roofline)
      for shape in ${SHAPES:-7b 0.5b}; do  # the 7B profile first: the 1.5x bar is open there
        for batch in ${BATCHES:-64 8}; do
          echo "== qwen2.5-$shape batch $batch" | tee -a "$OUT/bench.txt"
          prof=(); [ "$batch" = 64 ] && prof=(--profile "${PROFILE:-graphs,static}")  # kernels by kind
          timeout "${BENCH_TIMEOUT:-150}" python3 benchmarks/bench_decode_roofline.py --device cuda \
            --model-config "benchmarks/configs/qwen2.5-$shape.json" --batch "$batch" --context 512 --compare \
            ${prof[@]+"${prof[@]}"} --json "$OUT/roofline.jsonl" 2>&1 | grep -v "Warning\|forward_call\|deprecated" | tee -a "$OUT/bench.txt"
          echo "== qwen2.5-$shape batch $batch exit status ${PIPESTATUS[0]}" | tee -a "$OUT/bench.txt"
        done
      done ;;
    compiled)  # the step through torch.compile (fused kernels), batch 64: compiling takes minutes
      echo "== compiled step on graphs, tiny Qwen2: compilations and tokens" | tee -a "$OUT/bench.txt"
      timeout "${COMPILE_TEST_TIMEOUT:-240}" python3 -m pytest -q -m gpu -p no:cacheprovider -k compiled_step \
        tests/test_gpu.py 2>&1 | grep -v "Warning\|forward_call\|deprecated" | tail -15 | tee -a "$OUT/pytest.txt"
      for shape in ${COMPILED_SHAPES:-0.5b 7b}; do
        echo "== qwen2.5-$shape batch 64, compiled" | tee -a "$OUT/bench.txt"
        timeout "${COMPILE_TIMEOUT:-200}" python3 benchmarks/bench_decode_roofline.py --device cuda --paths compiled \
          --profile compiled \
          --model-config "benchmarks/configs/qwen2.5-$shape.json" --batch 64 --context 512 \
          --json "$OUT/roofline.jsonl" 2>&1 | grep -v "Warning\|forward_call\|deprecated" | tail -30 | tee -a "$OUT/bench.txt"
        echo "== qwen2.5-$shape compiled exit status ${PIPESTATUS[0]}" | tee -a "$OUT/bench.txt"
      done ;;
    versions)  # a new policy version copied into the warm model against a model built afresh
      echo "== version swap, qwen2.5-0.5b" | tee -a "$OUT/bench.txt"
      timeout "${VERSIONS_TIMEOUT:-120}" python3 benchmarks/bench_version_swap.py --device cuda \
        --model-config benchmarks/configs/qwen2.5-0.5b.json --json "$OUT/versions.jsonl" 2>&1 \
        | grep -v "Warning\|forward_call\|deprecated" | tail -8 | tee -a "$OUT/bench.txt" ;;
    sampling)  # the draw fused into one compiled kernel against the unfused tensor operations
      echo "== fused sampling, qwen2.5-0.5b" | tee -a "$OUT/bench.txt"
      timeout "${SAMPLING_TIMEOUT:-150}" python3 benchmarks/bench_sampling_noise.py --device cuda \
        --variants fused,unfused --batches 8,64 --steps 16 --repeats 3 2>&1 \
        | grep -v "Warning\|forward_call\|deprecated" | tail -45 | tee -a "$OUT/sampling.txt" ;;
    trl)  # one GRPO step of the 0.5B shape, the campaign against TRL (needs Prefect, TRL: gpu_wheels.sh)
      echo "== GRPO step against TRL, qwen2.5-0.5b" | tee -a "$OUT/bench.txt"
      timeout "${TRL_TIMEOUT:-480}" python3 benchmarks/bench_vs_trl.py --size gpu --device cuda --pairs 1 --steps 3 \
        --model-config benchmarks/configs/qwen2.5-0.5b.json 2>&1 | grep -v "Warning\|forward_call\|deprecated" \
        | tail -20 | tee -a "$OUT/trl.txt" ;;
    *) echo "gpu_check: unknown part '$part' (spec, prefill, roofline, versions, sampling, compiled, trl)" >&2; exit 2 ;;
  esac
  echo "== part $part exit status $?" | tee -a "$OUT/bench.txt"
done
