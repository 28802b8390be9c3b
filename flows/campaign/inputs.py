"""The campaign's inputs into the store, and the PPO critic's first version: both actions.

``prepare`` (``actions/prepare.py``) reads ``model.path`` and ``data.*_path``, files of the
control plane's machine. The local pool and the in-process invoker run actions on this machine,
so it goes through them like any action: on the pool, torch stays out of the campaign's process,
and the worker that ran it has its libraries loaded for what follows. Actions on a cluster
(OpenWhisk) cannot see those files: there it runs in a child process of this machine
(``flows/invokers/child.py``), which exits with its memory.

``init_critic`` (``actions/init_critic.py``) reads only the store, so it goes wherever the other
actions go.
"""

from __future__ import annotations

from actions.contracts import CriticInitRequest, CriticInitResult, ModelRef, Prepared, PrepareRequest, parse_result
from flows.invokers.child import ChildProcessInvoker
from flows.invokers.factory import worker_log_dir
from flows.step.context import RunContext
from flows.step.invoke import invoke_action


def prepare_inputs(ctx: RunContext) -> Prepared:
    """Run ``prepare`` where the model and data files are; its result, validated."""
    cfg = ctx.config
    req = PrepareRequest(workload=cfg.workload(), store_uri=ctx.store.uri, run_prefix=ctx.prefix, steps=cfg.steps)
    payload = req.model_dump(mode="json")
    if ctx.invoker.sees_local_files:
        out = invoke_action(action="prepare", payload=payload, shard="prepare").result
    else:
        log = worker_log_dir(cfg)
        log.mkdir(parents=True, exist_ok=True)
        activation = ChildProcessInvoker(log / "prepare.log").invoke("prepare", payload,
                                                                     timeout_s=cfg.invoker.local_timeout_s())
        out = parse_result("prepare", activation.result)
    assert isinstance(out, Prepared), type(out)
    return out


def init_critic(ctx: RunContext, policy: ModelRef) -> str:
    """Publish the critic's first version from ``policy`` (v0); its manifest key."""
    req = CriticInitRequest(model=policy, output_key=f"{ctx.prefix}/critic/v000000/manifest.json")
    out = invoke_action(action="init_critic", payload=req.model_dump(mode="json"), shard="init-critic").result
    assert isinstance(out, CriticInitResult), type(out)
    return out.critic_key
