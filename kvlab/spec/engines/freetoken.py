"""FreeToken profiles: `freetoken:OPTION` (see kvlab.spec.engines). FreeToken's forks disagree on the 4-bit
code encoding; these follow the pull request that introduced the 4-bit cache (FlashML-org/FreeToken#268,
"sub-byte Q4_0 and Q6_0 KV cache quantization"), whose content is pinned at
rodjjo/FreeToken@2c466dbc4e12b1ee4b2ba17fc61de192c17bb194 (`python/freetoken/kvcache/quant.py`, its store
kernel `python/freetoken/kernel/triton/kv_quant.py`, tests `tests/kvcache/test_subbyte_quant.py`, which
check the int32 arithmetic-shift sign extension of the packed codes: two's complement).

One fp16 scale per 32 elements of head_dim, |x|max / max_magnitude rounded to fp16 before dividing, round
half away from zero: q8_0 divides by 127; q4_0 by 8, clipping +8 to 7 (spec rule=full), codes two's
complement, element 2j in the low nibble of byte j; q6_0 by 31, a 16-byte low plane and an 8-byte plane of
top-2-bit pairs; fp8_e4m3 by 448, cast with round-to-nearest-even. No rotation, no query quantization, every
token read from the cache: the spec presets `freetoken:*` are the whole profile. Not modelled: the grouped
decode kernel casts dequantized tiles to the query dtype (bf16) before its dots.
"""
from __future__ import annotations

from .profile import EngineProfile

SOURCE = "FlashML-org/FreeToken#268 as in rodjjo/FreeToken@2c466dbc4e12b1ee4b2ba17fc61de192c17bb194"
OPTIONS = ("q8_0", "q6_0", "q4_0", "fp8_e4m3")


def parse(rest: str, text: str) -> EngineProfile:
    if rest not in OPTIONS:
        raise ValueError(f"FreeToken --kv-cache-dtype {rest!r} in {text!r} has no profile; allowed: "
                         f"{', '.join(OPTIONS)} (auto keeps the model dtype: use bf16)")
    spec = f"freetoken:{rest}"  # the spec preset (kvlab.spec.presets), byte-exact
    return EngineProfile("freetoken", rest, spec, spec, source=SOURCE)


def profiles() -> list[str]:
    return [f"freetoken:{o}" for o in OPTIONS]
