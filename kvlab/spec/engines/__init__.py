"""Engine profiles: what an engine does around its KV-cache bytes, beside the bytes themselves.

A block-format preset (`q4_0`) is byte-exact with a block; an engine profile (`llama.cpp:q4_0`,
`vllm:int4_per_token_head`, `sglang:fp8_e4m3`, `freetoken:q4_0`) also models the arithmetic the engine wraps
around it: the channel order it stores K in, the rotations it applies, the scale granularity and dtype, how
scales are defaulted, how the query is rounded before Q.K, which layers stay at the model's dtype. Each
engine's facts live in its own module, each fact beside the source file it was read from:

    llama_cpp.py   llama.cpp:TYPE[:norot], llama.cpp:K/V[:norot]
    vllm.py        vllm:OPTION (vLLM 0.33 --kv-cache-dtype)
    sglang.py      sglang:OPTION (SGLang 0.5.23 --kv-cache-dtype)
    freetoken.py   freetoken:OPTION (the pull request that added FreeToken's 4-bit cache)

Every profile is a scheme (`kvlab.scheme("vllm:fp8")`). Its `k_spec` / `v_spec` are kvlab specs with the
engine's byte count per element; where kvlab's own arithmetic is the engine's, they are also its
arithmetic (`exact`), else a named engine codec (`k_codec`, `v_codec`, kvlab.quant.engine_codecs) computes
the engine's values. Pure Python (no torch): the evaluation (kvlab.eval.engine_space) applies them.
"""
from __future__ import annotations

from . import freetoken, llama_cpp, sglang, vllm
from .llama_cpp import LLAMA_CPP_TYPES, llama_cpp_profiles
from .profile import ROTATIONS, EngineProfile


def parse_profile(text: str) -> EngineProfile | None:
    """The profile named by `text`, None if `text` names no engine profile; ValueError (naming what is
    allowed) for an engine prefix with an unknown option."""
    if "," in text or "=" in text:
        return None  # scheme items (k=..., window=...): a profile is a whole scheme; spec presets named
        # like an engine (freetoken:q4_0) still combine there as plain specs
    engine, sep, rest = text.partition(":")
    parsers = {"llama.cpp": llama_cpp.parse, "vllm": vllm.parse, "sglang": sglang.parse, "freetoken": freetoken.parse}
    if not sep or engine not in parsers:
        return None
    return parsers[engine](rest, text)


def all_profiles() -> list[str]:
    """Every profile name: each engine's options (llama.cpp: same type for K and V, rotation on and off)."""
    return [*llama_cpp.profiles(), *vllm.profiles(), *sglang.profiles(), *freetoken.profiles()]


__all__ = ["EngineProfile", "ROTATIONS", "parse_profile", "all_profiles", "LLAMA_CPP_TYPES", "llama_cpp_profiles"]
