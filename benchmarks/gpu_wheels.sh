#!/usr/bin/env bash
# Wheels a GPU machine's Python lacks, for benchmarks/gpu_check.sh: fills .whl/ (ignored by git;
# the device tool carries it, at most 64 MiB a call), leaving out the torch and transformers
# stack the GPU image already has.
#
#   bash benchmarks/gpu_wheels.sh [SET] [PYTHON_VERSION]
#
# SET: core (pydantic, boto3, minio: the tests and engine benchmarks; the default), campaign
# (core and Prefect: a campaign on the local warm pool), trl (TRL and datasets: the TRL side of
# bench_vs_trl.py). PYTHON_VERSION: the GPU machine's (python3 --version there; gpu_check.sh
# writes it to device.txt), default 3.12. SKIP: more distribution names to leave out, those the
# image has (python3 -m pip list there; gpu_check.sh writes it to device.txt). Prints the size:
# trl is about 73 MB for Python 3.12, over one call's 64 MiB unless the image has pandas or pyarrow.
set -eu
cd "$(dirname "$0")/.."
SET="${1:-core}"; PY="${2:-3.12}"
core=(pydantic boto3 "minio<8")
case "$SET" in
  core) pkgs=("${core[@]}") ;;
  campaign) pkgs=("${core[@]}" "prefect>=3.8,<3.9" "fastapi<0.151") ;;
  trl) pkgs=("trl>=1.16,<2" datasets) ;;
  *) echo "gpu_wheels: unknown set '$SET' (core, campaign, trl)" >&2; exit 2 ;;
esac
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version "$PY" --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 \
  -d .whl "${pkgs[@]}"
# what torch and transformers bring, present on the GPU image (matched by distribution name)
for f in .whl/*.whl; do
  name="$(basename "$f")"; name="${name%%-*}"; name="${name,,}"
  case "$name" in
    nvidia_*|torch|triton|numpy|sympy|mpmath|networkx|jinja2|markupsafe|filelock|fsspec|typing_extensions|\
    setuptools|transformers|tokenizers|huggingface_hub|hf_xet|safetensors|regex|pyyaml|requests|urllib3|idna|\
    certifi|charset_normalizer|tqdm|packaging) rm -f "$f" ;;
  esac
  for skip in ${SKIP:-}; do
    [[ "$name" == "${skip,,}" ]] && rm -f "$f"
  done
done
du -sh .whl
