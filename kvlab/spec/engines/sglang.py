"""SGLang profiles: `sglang:OPTION` for SGLang 0.5.23's `--kv-cache-dtype` (see kvlab.spec.engines). Read from
the sglang 0.5.23 wheel (no commit id in it); paths below are in it.

- fp8_e4m3 / fp8_e5m2 (`srt/layers/quantization/kv_cache.py`, `srt/mem_cache/memory_pool.py`
  `set_kv_buffer`): per-layer k/v scales from the checkpoint, else none (1.0); the store is PyTorch's eager
  cast, round-to-nearest-even (codec `torch_fp8_e4m3` / `torch_fp8_e5m2`: on the GPU PyTorch 2.11 does
  not saturate, |x| > 464 becomes NaN in e4m3, measured on the H200, where vLLM saturates to 448). On an H200 the default attention backend for MHA models is fa3
  (`srt/arg_groups/model_override_base.py`), which casts the query to the cache dtype the same way
  (`srt/layers/attention/flashattention_backend.py`).
- nvfp4 (`srt/layers/quantization/fp4_kv_cache_quant_method.py`): e2m1 in groups of 16 with e4m3 group
  scales (FlashInfer's quantizer, not read) under a per-layer fp32 scale, 1.0 without a checkpoint scale
  (codec `nvfp4_ts1`).
- fp4_mx_block16 (`srt/layers/quantization/kvfp4_tensor.py`, FP4MXBlock16KVQuantizeUtil): e2m1 in groups
  of 16 with a power-of-two scale 2^ceil(log2(|x|max / 6)) stored as a biased exponent byte, magnitudes
  rounded up at ties, element 2j in the low nibble (codec `sglang_mxfp4_16`).
No rotation for any dtype. Not modelled: the query's handling for nvfp4 / fp4 (read as the model has it).
"""
from __future__ import annotations

from .profile import EngineProfile

SOURCE = "sglang 0.5.23 (PyPI wheel)"
OPTIONS = {
    "fp8_e4m3": dict(k_spec="fp8_e4m3", v_spec="fp8_e4m3", k_codec="torch_fp8_e4m3", v_codec="torch_fp8_e4m3",
                     q_round="torch_fp8_e4m3"),
    "fp8_e5m2": dict(k_spec="fp8_e5m2", v_spec="fp8_e5m2", k_codec="torch_fp8_e5m2", v_codec="torch_fp8_e5m2",
                     q_round="torch_fp8_e5m2"),
    "nvfp4": dict(k_spec="nvfp4", v_spec="nvfp4", k_codec="nvfp4_ts1", v_codec="nvfp4_ts1", exact=False),
    "fp4_mx_block16": dict(k_spec="fp4_e2m1:g16:s=e8m0", v_spec="fp4_e2m1:g16:s=e8m0", k_codec="sglang_mxfp4_16",
                           v_codec="sglang_mxfp4_16", exact=False),
}


def parse(rest: str, text: str) -> EngineProfile:
    if rest not in OPTIONS:
        raise ValueError(f"SGLang --kv-cache-dtype {rest!r} in {text!r} has no profile; allowed: "
                         f"{', '.join(OPTIONS)} (auto / bf16 keep the model dtype: use bf16)")
    return EngineProfile("sglang", rest, **OPTIONS[rest], source=SOURCE)


def profiles() -> list[str]:
    return [f"sglang:{o}" for o in OPTIONS]
