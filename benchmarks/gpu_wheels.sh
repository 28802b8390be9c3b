#!/usr/bin/env bash
# Runs on a machine that reaches the package registry -- never on the GPU machine, which
# reaches no network. Fills .whl/ (ignored by git) with the wheels the GPU image's python3 lacks;
# that folder travels with the working tree to the GPU machine (kept small: with the tree under
# 64 MiB, which offline GPU hosts that take an upload often cap) and benchmarks/gpu_check.sh
# installs it there with --no-index --no-deps.
#
#   bash benchmarks/gpu_wheels.sh [SET] [PYTHON_VERSION]
#
# SET: all (the default: pydantic, boto3, minio, Prefect, fastapi, TRL and datasets: every part of
# gpu_check.sh, trl included; about 55 MiB for Python 3.12), or core (pydantic, boto3, minio:
# every part but trl). Versions follow pyproject's pins (datasets<5; python-dateutil<3, which
# botocore needs). PYTHON_VERSION: the GPU machine's python3 (device.txt of a gpu_check.sh run),
# default 3.12.
# SKIP: the distributions to leave out, those the image has; default the names in
# benchmarks/gpu_image_packages.txt (a run's device.txt ends in the image's `pip list`). Its
# NAME==VERSION lines (torch 2.11.0, transformers 5.17.0, ...) are also passed to pip as
# constraints, so that what pip picks works with the image's torch stack. The torch stack (torch,
# triton, nvidia-*, transformers, ...) is left out whatever SKIP says, though pip downloads it
# while resolving (a few GB, into a temporary folder).
# .whl/ is replaced only once the download has succeeded: a failed run leaves the old folder.
set -euo pipefail
cd "$(dirname "$0")/.."
SET="${1:-all}" PY="${2:-3.12}"
IMAGE=benchmarks/gpu_image_packages.txt
SKIP="${SKIP-$(grep -v '^#' "$IMAGE" | sed 's/==.*//')}"
# pyproject's specifier of each name (a dependency or the bench extra), so the pins stay in one place
spec() {
  python3 - "$@" <<'EOF'
import re
import sys
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
reqs = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
by_name = {norm(re.match(r"[A-Za-z0-9._-]+", r).group()): r for r in reqs}
print("\n".join(by_name.get(norm(n), n) for n in sys.argv[1:]))
EOF
}
case "$SET" in
  core) names=(pydantic boto3 minio) ;;
  all) names=(pydantic boto3 minio prefect fastapi trl datasets) ;;
  *) echo "gpu_wheels: unknown set '$SET' (all, core)" >&2; exit 2 ;;
esac
mapfile -t pkgs < <(spec "${names[@]}")
pkgs+=("python-dateutil>=2.8,<3")  # botocore's bound; the image's copy is used where it has one
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
grep '==' "$IMAGE" >"$tmp/constraints.txt" || true
platforms=()
for p in manylinux1 manylinux2010 manylinux2014 $(seq -f 'manylinux_2_%g' 5 39); do  # pip matches each exactly
  platforms+=(--platform "${p}_x86_64")
done
echo "gpu_wheels: downloading $SET for Python $PY: ${pkgs[*]}"
python3 -m pip download -q --only-binary=:all: --python-version "$PY" --implementation cp "${platforms[@]}" \
  -c "$tmp/constraints.txt" -d "$tmp/whl" "${pkgs[@]}"
norm() { local n="${1,,}"; n="${n//-/_}"; echo "${n//./_}"; }
declare -A skip=()
for s in $SKIP torch triton transformers tokenizers safetensors huggingface_hub hf_xet numpy; do skip[$(norm "$s")]=1; done
for f in "$tmp"/whl/*.whl; do
  name="$(basename "$f")"; name="$(norm "${name%%-*}")"
  if [[ -n "${skip[$name]:-}" || "$name" == nvidia_* || "$name" == cuda_* ]]; then rm -f "$f"; fi
done
rm -rf .whl && mv "$tmp/whl" .whl
ls .whl
wheels=$(du -cb .whl/*.whl 2>/dev/null | tail -1 | cut -f1)
tree=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$(( (wheels + tree) / 1048576 ))
echo "gpu_wheels: $(ls .whl | wc -l) wheels, $(( wheels / 1048576 )) MiB, with the working tree $total MiB of a call's 64"
(( total < 62 )) || { echo "gpu_wheels: over what one device call carries" >&2; exit 1; }
