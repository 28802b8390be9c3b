"""The decode-step profile of ``benchmarks/bench_decode_roofline.py --profile``
(``benchmarks/step_profile.py``): kernel names sorted into kinds, and per-step figures that
come from the difference of two calls (CPU: operators' self time)."""

from __future__ import annotations

import math

import pytest
import torch
from llama_family import SHAPES, tiny_causal_lm

from actions.engines.base import GenerationParams, SampleSpec
from actions.engines.torch_engine import TorchEngine
from benchmarks.step_profile import kind_of, report, step_profile


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", "gemm"),
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "gemm"),
    ("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128>>", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention"),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "triton"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "norm/reduce"),
    ("void at::native::index_elementwise_kernel<128, 4>", "copy/index"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("aten::addmm", "gemm"), ("aten::mm", "gemm"), ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("aten::index_copy_", "copy/index"), ("aten::mul", "elementwise"),
])
def test_kernels_are_sorted_into_kinds(name, kind):
    assert kind_of(name) == kind


def test_a_cpu_step_profile_counts_each_steps_operators():
    torch.set_num_threads(1)
    model, tok = tiny_causal_lm(SHAPES["llama"][0], **SHAPES["llama"][1])  # 2 layers: 15 GEMMs a step
    engine = TorchEngine(model, eos_id=-1, pad_id=tok.pad_token_id)
    specs = [SampleSpec(0, i, tuple(tok("abc 12")["input_ids"])) for i in range(4)]
    prof = step_profile(lambda n: engine.generate(specs, GenerationParams(seed=0, step=0, max_new_tokens=n,
                                                                           temperature=1.0)), 6, torch.device("cpu"))
    kinds = prof["kinds"]
    # times are a difference of two profiled calls' (the benchmark's median is what reads them):
    # on a loaded machine it may come out at or below 0, so only the counts are asserted exactly
    assert prof["unit"] == "operators" and math.isfinite(prof["total_ms"])
    assert sum(v["ms"] for v in kinds.values()) == pytest.approx(prof["total_ms"])
    gemms = kinds["gemm"]["kernels"]
    assert gemms >= 15 and gemms % 15 == 0, gemms  # whole steps: prefill and set-up cancel
    attention = kinds["attention"]["kernels"]
    assert attention >= 2 and attention % 2 == 0, attention  # per layer: the call and its CPU kernel
    # the report of this profile, with its GEMM time set (a measured one may be 0 under load)
    prof["kinds"]["gemm"]["ms"] = 0.5
    text = report(prof, weight_bytes=1e6, roof_ms=None, wall_ms=1.0)
    assert "gemm" in text and "self time" in text and "(weights at 2 GB/s)" in text
