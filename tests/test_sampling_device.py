"""Sampling noise is built where the logits are, and equals the CPU's; fused draws equal unfused ones."""

from __future__ import annotations

import pytest
import torch
from test_sampling_fused import cancelling_logits

from actions.engines.sampling import (
    _fmix64,
    _noise,
    _shr,
    _vocab_term,
    fused_draw,
    gumbel_noise,
    sample_next,
    stream_key,
)

V = 151_936  # Qwen2.5's vocabulary


def _keys(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    keys = torch.tensor([stream_key(7, 3, p, s) for p in range(4) for s in range(2)], device=device)
    positions = torch.arange(8, device=device) * 5
    return keys, positions


def test_noise_lives_on_the_keys_device_and_is_standard_gumbel():
    keys, positions = _keys("cpu")
    noise = gumbel_noise(keys, positions, V)
    assert noise.device == keys.device and noise.shape == (8, V) and noise.dtype == torch.float32
    # Gumbel(0, 1): mean is the Euler-Mascheroni constant, variance pi^2 / 6
    assert abs(noise.mean().item() - 0.5772) < 0.01 and abs(noise.var().item() - 1.6449) < 0.02


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_noise_matches_cpu_noise_and_samples():
    keys, positions = _keys("cpu")
    vocab = torch.arange(V, dtype=torch.int64)
    # the integer hash is exact on both devices
    cpu_bits = _shr(_fmix64(keys[:, None] ^ (vocab[None, :] + 1)), 11)
    gpu_bits = _shr(_fmix64(keys.cuda()[:, None] ^ (vocab.cuda()[None, :] + 1)), 11)
    assert torch.equal(cpu_bits, gpu_bits.cpu())
    cpu = gumbel_noise(keys, positions, V)
    gpu = gumbel_noise(keys.cuda(), positions.cuda(), V)
    assert gpu.device.type == "cuda"
    diff = (cpu - gpu.cpu()).abs()
    # float64 log may differ in its last bit between libraries; after rounding to float32 at
    # most a few entries in a million move, by one float32 ulp
    assert (diff > 0).float().mean().item() < 1e-4
    assert diff.max().item() <= 2 * torch.finfo(torch.float32).eps * cpu.abs().max().item()
    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sample_next(logits, keys, positions, 1.0),
                       sample_next(logits.cuda(), keys.cuda(), positions.cuda(), 1.0).cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_top_k_top_p_samples_match_cpu():
    keys, positions = _keys("cpu")
    logits = torch.randn(8, V, generator=torch.Generator().manual_seed(1)) * 4
    for top_k, top_p in [(50, None), (None, 0.9), (200, 0.95)]:
        cpu = sample_next(logits, keys, positions, 0.8, top_k, top_p)
        gpu = sample_next(logits.cuda(), keys.cuda(), positions.cuda(), 0.8, top_k, top_p)
        assert torch.equal(cpu, gpu.cpu()), (top_k, top_p)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fused_draws_equal_unfused_draws():
    """The fused draw (one compiled kernel) against the unfused operations on the same GPU:
    the noise it compiles, bit for bit, and the tokens over batches and filters."""
    keys, positions = _keys("cuda")
    compiled = torch.compile(_noise, dynamic=True, fullgraph=True)
    want = gumbel_noise(keys, positions, V)
    got = compiled(keys, positions, _vocab_term(V, keys.device))
    differ = (want.view(torch.int32) != got.view(torch.int32)).sum().item()
    assert differ == 0, f"{differ} of {want.numel()} noise entries differ from the unfused noise"
    for rows in (1, 8, 64):
        logits = (torch.randn(rows, V, generator=torch.Generator().manual_seed(rows)) * 3).cuda()
        k = torch.tensor([stream_key(7, 3, r, 0) for r in range(rows)], device="cuda")
        pos = torch.arange(rows, device="cuda") * 3
        for temperature, top_k, top_p in ((1.0, None, None), (0.8, 50, None), (1.0, None, 0.9)):
            assert torch.equal(sample_next(logits, k, pos, temperature, top_k, top_p),
                               sample_next(logits, k, pos, temperature, top_k, top_p, fused=True)), rows
        # the real fused kernel against logits that cancel the unfused noise: one bit of
        # difference, larger anywhere or smaller at a probed entry, changes the draw
        zeros = torch.zeros(rows, dtype=torch.long, device="cuda")
        assert torch.equal(sample_next(cancelling_logits(k, pos, V), k, pos, 1.0, fused=True), zeros)
        probe = torch.randint(1, V, (rows,), generator=torch.Generator().manual_seed(rows)).cuda()
        probed = cancelling_logits(k, pos, V, probe)
        assert torch.equal(sample_next(probed, k, pos, 1.0, fused=True), probe)
    assert fused_draw.error is None
