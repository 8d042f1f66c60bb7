"""llama.cpp profiles (see kvlab.spec.engines). Text forms:

    llama.cpp:TYPE              -ctk TYPE -ctv TYPE, with llama.cpp's default Hadamard rotation
    llama.cpp:TYPE:norot        the same with LLAMA_ATTN_ROT_DISABLE=1
    llama.cpp:K/V[:norot]       -ctk K -ctv V (e.g. llama.cpp:q8_0/q4_0)

TYPE: f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl (llama.cpp's `--cache-type-k/-v` list). The facts,
read from llama.cpp at ggml-org/llama.cpp@0c1e57098 (the copy vendored by llama-cpp-python 0.3.36):

- K is stored in the GGUF file's channel order: convert_hf_to_gguf permutes the q/k rows of llama-arch
  models for llama.cpp's interleaved RoPE (`conversion/llama.py`, `permute`), so GGUF channel 2j is HF
  channel j and 2j+1 is j + D/2, and a 32-channel block groups HF channels {16b..16b+15, D/2+16b..}.
- With a quantized K (V), Q and K (V) are rotated by a normalized Walsh-Hadamard matrix whenever
  head_dim % 64 == 0, unless LLAMA_ATTN_ROT_DISABLE is a nonzero integer (`src/llama-kv-cache.cpp`,
  constructor; `src/llama-graph.cpp`, `build_attn`): K over blocks of the largest power of two dividing
  head_dim, V over blocks of 64; after RoPE, before the cache write; the output is rotated back.
- On the CPU the query is quantized to K's dot type before the Q.K product
  (`ggml/src/ggml-cpu/ops.cpp`, flash-attention kernel; `ggml-cpu.c` type traits): q8_0 blocks of 32
  for q4_0 / q5_0 / q8_0 / iq4_nl keys, q8_1 for q4_1 / q5_1 (q8_0 plus an fp16 sum used by the key's
  min term, not modelled here: its rounding is below the others'), fp16 / bf16 for f16 / bf16 keys.
- Every token, the current one and the whole prompt included, is read from the quantized cache; no
  full-precision window or sinks (decode-faithful, as kvlab's evaluation).
- q8_0 keys: the x86 CPU write path rounds to nearest even (AVX2 `_mm256_round_ps`), not GGML's reference
  half away from zero (`ggml/src/ggml-cpu/arch/x86/quants.c`, `quantize_row_q8_0`).
- iq4_nl: llama.cpp's quantizer (`ggml/src/ggml-quants.c`, `quantize_row_iq4_nl_impl`, ntry = -1) picks
  codes at scale max/-127 and stores the weighted least-squares scale (weights x^2) without re-picking them;
  kvlab's iq4nl spec is the same block format with nearest-value codes at its own scale, so the profile
  computes llama.cpp's values with the engine codec `ggml_iq4_nl`.
Not modelled: f16 accumulation of P.V when V is f16 (fp32 for quantized V), K-shift, GPU backends.
"""

from __future__ import annotations

from .profile import EngineProfile

LLAMA_CPP_TYPES = {  # --cache-type -> (kvlab spec of the stored block, spec the CPU quantizes Q to before Q.K)
    "f16": ("fp16", "fp16"),
    "bf16": ("bf16", "bf16"),
    "q8_0": ("int8:g32:sym:recip:pack=ggml", "int8:g32:sym:recip"),  # the x86 write rounds to nearest even
    "q4_0": ("q4_0", "int8:g32:sym:recip"),
    "q4_1": ("q4_1", "int8:g32:sym:recip"),
    "q5_0": ("q5_0", "int8:g32:sym:recip"),
    "q5_1": ("q5_1", "int8:g32:sym:recip"),
    "iq4_nl": ("iq4nl:g32:rule=signed:pack=ggml", "int8:g32:sym:recip"),
}
SOURCE = "ggml-org/llama.cpp@0c1e57098 (vendored by llama-cpp-python 0.3.36)"
NOTES = ("not modelled: f16 accumulation of P.V when V is f16 (fp32 for quantized V), q8_1's fp16 block sum "
         "(q4_1 / q5_1 keys), K-shift, GPU backends")


def _quantized(t: str) -> bool:
    return t not in ("f16", "bf16", "f32")


def parse(rest: str, text: str) -> EngineProfile:
    """The llama.cpp profile `text` (= "llama.cpp:" + rest)."""
    rotate = not rest.endswith(":norot")
    types = rest[: -len(":norot")] if not rotate else rest
    ck, _, cv = types.partition("/")
    cv = cv or ck
    for t in (ck, cv):
        if t not in LLAMA_CPP_TYPES:
            raise ValueError(f"llama.cpp cache type {t!r} in {text!r}; allowed: {', '.join(LLAMA_CPP_TYPES)} "
                             "(llama.cpp:TYPE, llama.cpp:K/V, each optionally :norot)")
    return EngineProfile("llama.cpp", ck if ck == cv else f"{ck}/{cv}", LLAMA_CPP_TYPES[ck][0], LLAMA_CPP_TYPES[cv][0],
                         q_round=LLAMA_CPP_TYPES[ck][1],
                         k_rot="ggml" if rotate and _quantized(ck) else None,
                         v_rot="ggml64" if rotate and _quantized(cv) else None,
                         k_codec="ggml_iq4_nl" if ck == "iq4_nl" else None,
                         v_codec="ggml_iq4_nl" if cv == "iq4_nl" else None,
                         gguf_k_order=True, exact=ck != "iq4_nl" and cv != "iq4_nl",
                         suffix="" if rotate else ":norot", source=SOURCE, notes=NOTES)


def profiles() -> list[str]:
    """Every llama.cpp profile with the same type for K and V, rotation on and off (f16 / bf16 never rotate,
    so they have one profile each)."""
    return [f"llama.cpp:{t}{s}" for t in LLAMA_CPP_TYPES for s in ("", ":norot") if _quantized(t) or not s]


llama_cpp_profiles = profiles
