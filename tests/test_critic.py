"""The PPO critic reads hidden states only: an untied output head is neither trained, stored nor
given optimizer state, a tied one (the input embedding) still trains, and critics and critic
optimizer state stored with the untied head (before it was dropped) still load."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers

from actions.rl.critic import HEAD_PREFIX, build_critic, renumber_state
from actions.rl.optimizer import TrainOptimizer
from actions.rl.sequences import pack, response_hidden

PROMPTS, RESPONSES = [[3, 4, 5], [6, 7], [9, 3, 8, 2]], [[8, 9], [10, 11, 12], [5]]

pytestmark = pytest.mark.usefixtures("one_thread")  # as an action runs (conftest)


def _llama(tied: bool, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, tie_word_embeddings=tied)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()


def _value_step(module: torch.nn.Module, lm: torch.nn.Module, value_head: torch.nn.Module,
                opt: TrainOptimizer) -> None:
    """One optimizer step of ``module`` on a squared-value loss, as the critic pass makes."""
    batch = pack(PROMPTS, RESPONSES, 0)
    values = value_head(response_hidden(lm, batch)).squeeze(-1).float() * batch.response_mask
    ((values - 1.0) ** 2).sum().backward()
    opt.step(1.0)


def test_an_untied_output_head_is_neither_trained_nor_stored_nor_given_optimizer_state():
    lm = _llama(tied=False, dtype=torch.bfloat16)
    critic = build_critic(lm, None)
    critic.value_head.to(torch.bfloat16)  # as critic_store and init_critic cast it
    assert critic.head_keys == ["lm_head.weight"] and lm.get_output_embeddings() is None
    assert "lm_head.weight" not in critic.tensors() and "model.embed_tokens.weight" in critic.tensors()
    opt = TrainOptimizer(critic, 1e-3)
    _value_step(critic, critic.lm, critic.value_head, opt)
    state = opt.state_tensors()
    masters = {k.split(".")[0] for k in state if k.endswith(".master")}
    moments = {k.split(".")[0] for k in state if k.endswith(".exp_avg")}
    # every parameter the optimizer keeps an fp32 copy of is one it steps
    assert masters == moments and len(masters) == len(list(critic.parameters()))


def test_a_tied_output_head_is_the_embedding_and_still_trains():
    critic = build_critic(_llama(tied=True), None)
    torch.nn.init.normal_(critic.value_head.weight)
    assert critic.head_keys == [] and critic.lm.get_output_embeddings() is not None
    before = critic.tensors()["model.embed_tokens.weight"].clone()
    _value_step(critic, critic.lm, critic.value_head, TrainOptimizer(critic, 1e-3))
    assert not torch.equal(before, critic.tensors()["model.embed_tokens.weight"])
    assert critic.lm.lm_head.weight is critic.lm.model.embed_tokens.weight
    assert "lm_head.weight" not in critic.tensors()  # the embedding, stored once under its own name


def _store_base(tmp_path, lm: torch.nn.Module, key: str = "base/manifest.json"):
    from actions.models.modeling import base_files, build_char_tokenizer
    from actions.store import LocalStore, put_artifact

    store = LocalStore(tmp_path)
    put_artifact(store, key, base_files(lm, build_char_tokenizer()))
    return store


def test_critics_stored_with_or_without_the_untied_head_load_to_the_same_values(tmp_path):
    from actions.rl.critic_store import load_critic
    from actions.store.weights import publish_tensors

    lm = _llama(tied=False)
    head = lm.lm_head.weight.detach().clone()
    store = _store_base(tmp_path, lm)
    critic = build_critic(copy.deepcopy(lm), None)
    torch.nn.init.normal_(critic.value_head.weight)
    publish_tensors(store, "new/manifest.json", critic.tensors())
    publish_tensors(store, "old/manifest.json", {**critic.tensors(), "lm_head.weight": head})  # an earlier release's
    batch = pack(PROMPTS, RESPONSES, 0)
    with torch.no_grad():
        expected = critic(batch)
        for key, with_head in (("new/manifest.json", False), ("old/manifest.json", True)):
            loaded = load_critic(store.uri, "base/manifest.json", key, fresh=True, dtype_setting="float32")
            assert loaded.stored_with_head == with_head and "lm_head.weight" not in loaded.tensors()
            assert torch.equal(loaded(batch), expected), key


class _CriticWithHead(torch.nn.Module):
    """The critic as an earlier release built it: the same parameters in the same order, the
    untied output head included (it never had a gradient)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.value_head = torch.nn.Linear(lm.config.hidden_size, 1, dtype=torch.bfloat16)


def test_optimizer_state_stored_with_the_untied_head_resumes_on_the_critic_without_it():
    lm = _llama(tied=False, dtype=torch.bfloat16)
    old = _CriticWithHead(copy.deepcopy(lm))
    old_opt = TrainOptimizer(old, 1e-3)
    _value_step(old, old.lm, old.value_head, old_opt)
    stored = old_opt.state_tensors()
    head = len(list(lm.parameters())) - 1  # lm_head: the model's last parameter
    assert f"p{head}.master" in stored and f"p{head}.exp_avg" not in stored  # a master copy that never moves
    tensors = {**old.lm.state_dict(), **{HEAD_PREFIX + k: v for k, v in old.value_head.state_dict().items()}}
    critic = build_critic(copy.deepcopy(old.lm), tensors)
    assert critic.stored_with_head and critic.head_positions == [head]
    opt = TrainOptimizer(critic, 1e-3)
    with pytest.raises(ValueError):  # the old numbering does not fit the critic without it
        opt.load_state_tensors(stored, where="old")
    opt.load_state_tensors(critic.stored_optimizer_state(stored), where="old")
    got = opt.state_tensors()
    value_weight = head + 1  # the value head's weight: after lm_head then, first after the backbone now
    assert torch.equal(got[f"p{head}.exp_avg"], stored[f"p{value_weight}.exp_avg"])
    assert torch.equal(got[f"p{head}.master"], stored[f"p{value_weight}.master"])
    assert len(got) == len(stored) - 1  # the head's master dropped, nothing else


def test_renumber_state_drops_the_removed_parameters_and_shifts_the_rest():
    t = torch.zeros(1)
    stored = {"p0.exp_avg": t, "p1.master": t, "p2.exp_avg": t, "p3.step": t, "bogus": t}
    assert sorted(renumber_state(stored, [1])) == ["bogus", "p0.exp_avg", "p1.exp_avg", "p2.step"]
    assert renumber_state(stored, []) == stored


def test_renumber_state_renames_a_lazily_read_state_as_it_renumbers_a_loaded_one(tmp_path):
    """The sharded learner opens the critic's optimizer state lazily (``StoredTensors``):
    renumbering it renames without reading, to the names and values the loaded dict gets."""
    from actions.store import LocalStore
    from actions.store.weights import StoredTensors, load_tensors, publish_tensors

    g = torch.Generator().manual_seed(0)
    state = {f"p{i}.{f}": torch.randn(3, i + 1, generator=g) for i in range(12) for f in ("exp_avg", "master")}
    state.update({f"p{i}.step": torch.tensor(float(i)) for i in range(12)})
    store = LocalStore(str(tmp_path))
    publish_tensors(store, "opt/manifest.json", state, scalars_in_meta=True)
    loaded = load_tensors(store, "opt/manifest.json")[0]
    for removed in ([1], [0, 5], [11], []):
        want = renumber_state(loaded, removed)
        got = renumber_state(StoredTensors(store, "opt/manifest.json"), removed)
        assert isinstance(got, StoredTensors) and sorted(got) == sorted(want), removed
        for name in want:
            assert torch.equal(got[name], want[name]), (removed, name)


def test_the_warm_cache_keeps_only_a_runs_latest_critic(tmp_path, monkeypatch):
    """Each critic version scores one step: caching the next evicts the run's older ones (not
    another run's, nor other warm state)."""
    from collections import OrderedDict

    from actions.models import warm
    from actions.rl.critic_store import load_critic
    from actions.store.weights import publish_tensors

    monkeypatch.setattr(warm, "_cache", OrderedDict())
    lm = _llama(tied=True)
    store = _store_base(tmp_path, lm)
    tensors = build_critic(copy.deepcopy(lm), None).tensors()
    for v in range(3):
        publish_tensors(store, f"critic{v}/manifest.json", tensors)
    _store_base(tmp_path, lm, "other/base/manifest.json")  # another run's base in the same store
    other = load_critic(store.uri, "other/base/manifest.json", "critic0/manifest.json")
    warm.put(("tokenizer", "x"), object())
    for v in range(3):
        load_critic(store.uri, "base/manifest.json", f"critic{v}/manifest.json")
        critics = [k for k in warm._cache if k[0] == "critic"]
        assert [k[2:4] for k in critics] == [("other/base/manifest.json", "critic0/manifest.json"),
                                             ("base/manifest.json", f"critic{v}/manifest.json")]
    assert ("tokenizer", "x") in warm._cache
    assert load_critic(store.uri, "other/base/manifest.json", "critic0/manifest.json") is other  # still warm
