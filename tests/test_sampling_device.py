"""Sampling noise is built where the logits are, and equals the CPU's."""

from __future__ import annotations

import pytest
import torch

from actions.engines.sampling import _fmix64, _shr, gumbel_noise, sample_next, stream_key

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
