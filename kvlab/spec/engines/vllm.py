"""vLLM profiles: `vllm:OPTION` for each `--kv-cache-dtype` vLLM 0.33 ships for standard attention (see
kvlab.spec.engines). Read from the vllm 0.33.0 wheel (vllm-project/vllm@4ba787ec9); paths below are in it.

- fp8 / fp8_e4m3 / fp8_e5m2 (`vllm/model_executor/layers/quantization/kv_cache.py`, BaseKVCacheMethod):
  one fp32 k_scale and v_scale per layer from the checkpoint, else 1.0 (a model without KV scales, as
  SmolLM2); the store divides by the scale and converts with round-to-nearest-even, saturating to +-448
  (e4m3) / +-57344 (e5m2) (`csrc/quantization/fp8/nvidia/quant_utils.cuh`, `__NV_SATFINITE`). On an H200
  (SM90) the backend is FlashAttention-3 for e4m3 (`vllm/platforms/cuda.py` priorities, `fa_utils.py`), which
  takes a quantized query: `Attention.forward` rounds q * (1 / q_scale) to e4m3, clamped (q_scale = k_scale
  = 1.0) (`attention/attention.py`, `input_quant_fp8.py`). e5m2 goes to FlashInfer (FA3 rejects it), which
  reads the query as the model has it.
- int8_per_token_head / fp8_per_token_head (`vllm/v1/attention/ops/triton_reshape_and_cache_flash.py`): one
  fp32 scale per (token, kv head) over the whole head, |x|max / 127 (int8, x * (1 / scale), half away from
  zero) or / 448 (fp8); checkpoint scales ignored; the Triton backend reads the query unquantized.
- int4_per_token_head (`vllm/v1/attention/ops/int4_per_token_head.py`): K and V (and the query) rotated by
  a seeded random-sign Walsh-Hadamard transform over the largest power-of-two block of head_dim, rounded
  back to the model dtype; per (token, head) asymmetric 4-bit with an integer zero point, the zero point
  kept in the low 4 mantissa bits of the fp32 scale (codec `vllm_int4_zp`); the output rotated back.
- turboquant_k8v4 / 4bit_nc / k3v4_nc / 3bit_nc (`model_executor/layers/quantization/turboquant/`,
  `v1/attention/ops/triton_turboquant_store.py`, `triton_turboquant_decode.py`): keys as unit vectors times
  an fp16 norm, rotated by the orthonormal Sylvester Hadamard of the whole head, each coordinate a
  Lloyd-Max code for N(0, 1/D) (`_nc`: the code vector renormalized to unit length) (codec `turboquant_*`);
  k8v4 keys are a plain e4m3 cast; values per (token, head) asymmetric 3/4-bit with fp16 scale and min,
  floor(x + 0.5), no rotation; the first and last two attention layers stay at the model dtype
  (`engine/arg_utils.py`, `get_boundary_skip_layers`).
- nvfp4 (`v1/attention/backends/flashinfer.py`, `utils/torch_utils.py`): e2m1 codes in groups of 16 with
  e4m3 group scales under one fp32 per-layer scale, 1.0 without a checkpoint scale (codec `nvfp4_ts1`);
  nvfp4_4over6 picks per 16 values the better of |x|max / 6 and |x|max / 4 (`config/cache.py` docstring;
  its kernel was not read) (codec `nvfp4_4over6`).

Not modelled: FA3's handling of P for fp8 V (not read), the bf16 rounding of P * v_scale in the Triton
per-token-head kernels, turboquant's first prefill chunk (it attends the raw bf16 K/V: kvlab models decode,
where every token is read back from the cache).
"""
from __future__ import annotations

from .profile import EngineProfile

SOURCE = "vllm 0.33.0 (vllm-project/vllm@4ba787ec9)"
OPTIONS = {  # --kv-cache-dtype -> fields of the profile
    "fp8": dict(k_spec="fp8_e4m3", v_spec="fp8_e4m3", q_round="fp8_e4m3"),
    "fp8_e4m3": dict(k_spec="fp8_e4m3", v_spec="fp8_e4m3", q_round="fp8_e4m3"),
    "fp8_e5m2": dict(k_spec="fp8_e5m2", v_spec="fp8_e5m2"),
    "int8_per_token_head": dict(k_spec="int8:head:sym:s=f32:recip:rnd=away",
                                v_spec="int8:head:sym:s=f32:recip:rnd=away"),
    "fp8_per_token_head": dict(k_spec="fp8_e4m3:head:s=f32", v_spec="fp8_e4m3:head:s=f32"),
    "int4_per_token_head": dict(k_spec="int4:head:sym:s=f32", v_spec="int4:head:sym:s=f32", k_rot="rht",
                                v_rot="rht", k_codec="vllm_int4_zp", v_codec="vllm_int4_zp", exact=False),
    "turboquant_k8v4": dict(k_spec="fp8_e4m3", v_spec="int4:head:asym:recip:rnd=up", boundary=2, exact=False),
    "turboquant_4bit_nc": dict(k_spec="int4:head:sym", v_spec="int4:head:asym:recip:rnd=up",
                               k_codec="turboquant4_nc", boundary=2, exact=False),
    "turboquant_k3v4_nc": dict(k_spec="int3:head:sym", v_spec="int4:head:asym:recip:rnd=up",
                               k_codec="turboquant3_nc", boundary=2, exact=False),
    "turboquant_3bit_nc": dict(k_spec="int3:head:sym", v_spec="int3:head:asym:recip:rnd=up",
                               k_codec="turboquant3_nc", boundary=2, exact=False),
    "nvfp4": dict(k_spec="nvfp4", v_spec="nvfp4", k_codec="nvfp4_ts1", v_codec="nvfp4_ts1", exact=False),
    "nvfp4_4over6": dict(k_spec="nvfp4", v_spec="nvfp4", k_codec="nvfp4_4over6", v_codec="nvfp4_4over6",
                         exact=False),
}


def parse(rest: str, text: str) -> EngineProfile:
    if rest not in OPTIONS:
        raise ValueError(f"vLLM --kv-cache-dtype {rest!r} in {text!r} has no profile; allowed: {', '.join(OPTIONS)} "
                         "(auto / float16 / bfloat16 keep the model dtype: use bf16)")
    return EngineProfile("vllm", rest, **OPTIONS[rest], source=SOURCE)


def profiles() -> list[str]:
    return [f"vllm:{o}" for o in OPTIONS]
