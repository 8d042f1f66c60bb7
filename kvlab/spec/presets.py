"""Named presets. Engine-named presets are byte-exact with that engine's format.

`SPEC_PRESETS`: one tensor's layout (usable for K, V or both). `SCHEME_PRESETS`: whole
schemes (different K and V, windows). Both resolve through `kvlab.scheme(name)`.
"""
from __future__ import annotations

SPEC_PRESETS: dict[str, str] = {
    # unquantized
    "bf16": "bf16",
    "fp16": "fp16",
    # GGML (llama.cpp) blocks: byte-exact with gguf.quants.quantize
    "q8_0": "int8:g32:sym:recip:rnd=away:pack=ggml",
    "q4_0": "int4:g32:sym:rule=signed:recip:rnd=up:pack=ggml",
    "q4_1": "int4:g32:asym:recip:rnd=up:pack=ggml",
    "q5_0": "int5:g32:sym:rule=signed:recip:rnd=up:pack=ggml",
    "q5_1": "int5:g32:asym:recip:rnd=up:pack=ggml",
    "mxfp4": "fp4_e2m1:g32:s=e8m0:pack=ggml",
    # NVIDIA NVFP4: e2m1 in groups of 16, e4m3 group scales under one fp32 tensor scale
    "nvfp4": "fp4_e2m1:g16:s=e4m3:ts",
    # fp8 casts (vLLM/SGLang --kv-cache-dtype fp8*): per-tensor scale, 1.0 unless calibrated
    "fp8_e4m3": "fp8_e4m3",
    "fp8_e5m2": "fp8_e5m2",
    # FreeToken (the pull request that added its 4-bit cache, FlashML-org/FreeToken#268; content pinned at
    # rodjjo/FreeToken@2c466dbc python/freetoken/kvcache/quant.py): one fp16 scale per 32 elements, rounded to
    # fp16 before dividing, half away from zero, two's-complement codes, element 2j in the low nibble of
    # byte j; q4_0 divides |x|max by 8 and clips +8 to 7, q6_0 divides by 31. (FreeToken stores scale 1.0
    # for an all-zero block where kvlab stores 0: the values agree, those scale bytes do not.)
    "freetoken:q4_0": "int4:g32:sym:rule=full:twos:rnd=away",
    "freetoken:q6_0": "int6:g32:sym:twos:rnd=away",
    "freetoken:q8_0": "int8:g32:sym:rnd=away",
    "freetoken:fp8_e4m3": "fp8_e4m3:g32:s=f16",
    # non-uniform 4-bit codebooks
    "nf4": "nf4:g64",
    "iq4nl": "iq4nl:g32:rule=signed",
    # Hadamard-rotated asymmetric int4 (QuaRot/SpinQuant style rotation, no calibration)
    "int4_had": "int4:g32:asym:rot=had",
}

SCHEME_PRESETS: dict[str, str] = {
    # KIVI: keys per channel, values per token, asymmetric, 128 recent tokens in full precision
    "kivi4": "k=int4:g32:chan:asym,v=int4:g32:asym,window=128",
    "kivi2": "k=int2:g32:chan:asym,v=int2:g32:asym,window=128",
}

ALL_PRESETS = (*SPEC_PRESETS, *SCHEME_PRESETS)
