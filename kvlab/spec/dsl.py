"""The one-line spec DSL: parse `int4:g32:asym:rot=had` into a `KVQuantSpec` and print it back.

Grammar (tokens joined by ':'; order free except the format comes first):

    FORMAT        int2..int8 | fp8_e4m3 (fp8) | fp8_e5m2 | fp4_e2m1 (fp4) | nf4 | iq4nl | lm2 | lm3 | lm4 | bf16 | fp16
    g<N>          group size (8..256); implies axis tok unless an axis token is given
    tok|chan|head|tensor   axis
    sym|asym      symmetric or asymmetric (int only)
    s=<dtype>     scale dtype: f16 bf16 f32 e8m0 e4m3
    rule=<r>      absmax | signed | mse | unit | full | rms (the group's RMS: Lloyd-Max lm2..lm4, their default)
    recip         GGML arithmetic (codes from the fp32 reciprocal of the unrounded scale)
    rnd=<r>       even | away | up
    rot=<r>       none | had
    pack=<p>      seq | ggml
    ts            two-level scaling: an fp32 tensor scale above e4m3 group scales (NVFP4)
    prerope       keys quantized before RoPE
    twos          two's-complement sub-byte codes (FreeToken) instead of offset binary
    cal           calibrated levels per layer and tensor: lm2..lm4 (RMS units), or int2..int4 (code units, the
                  int's scale and zero; each value takes the nearest level: a non-uniform int)
    smooth        keys only: calibrated per-channel smoothing folded into the queries (kvlab.quant.smoothing);
                  smooth=pair ties the factors within RoPE pairs (c, c + D/2): position-independent, for long contexts
    perm          keys only: a calibrated permutation of the channels before grouping, followed by the queries
                  (kvlab.quant.permutation); per-token groups
    out=<N>       N outlier slots per token vector (1..8): its N largest-magnitude values kept as fp16 with their
                  channel index (dense-and-sparse, as KVQuant; kvlab.quant.outliers), 24 bits a slot

A spec preset name (`q4_0`, `mxfp4`, `freetoken:q6_0`, ...) is accepted wherever a spec is.
`format_spec` (kvlab.spec.text) prints the canonical text: format, group/axis, sym/asym (ints), then every
field that differs from the format's default, in a fixed order.
"""
from __future__ import annotations

import re

from .quant_spec import KVQuantSpec
from .text import ALIASES, FLAGS, KEYED, SMOOTH_TIES, clean_text, format_defaults, format_spec
from .vocab import AXES, FORMATS

def _parse_format(tok: str) -> tuple[str, int | None]:
    tok = ALIASES.get(tok, tok)
    m = re.fullmatch(r"int(\d+)", tok)
    if m:
        return "int", int(m.group(1))
    if tok in FORMATS and tok != "int":
        return tok, None
    raise ValueError(f"unknown format {tok!r}; allowed: int2..int8, {', '.join(f for f in FORMATS if f != 'int')}"
                     f" (aliases {', '.join(ALIASES)}), or a spec preset name")


def as_spec(spec) -> KVQuantSpec:
    """`spec` as a KVQuantSpec: a spec is returned as is, text (or a spec preset name) is parsed."""
    if isinstance(spec, KVQuantSpec):
        return spec
    if isinstance(spec, str):
        return parse_spec(spec)
    raise ValueError(f"spec must be a KVQuantSpec or spec text, not {type(spec).__name__}")


def parse_spec(text: str) -> KVQuantSpec:
    """Parse one tensor's spec text (or a spec preset name) into a `KVQuantSpec`."""
    from .presets import SPEC_PRESETS
    text = clean_text(text, "spec", "'int4:g32:asym'")
    if SPEC_PRESETS.get(text, text) != text:
        return parse_spec(SPEC_PRESETS[text])
    tokens = text.split(":")
    fmt, bits = _parse_format(tokens[0])
    given: dict = {}
    for tok in tokens[1:]:
        if not tok:
            raise ValueError(f"empty token in spec {text!r}")
        if re.fullmatch(r"g\d+", tok):
            given["group"] = int(tok[1:])
        elif tok in AXES:
            given["axis"] = tok
        elif tok in ("sym", "asym"):
            given["sym"] = tok == "sym"
        elif tok in FLAGS:
            given[FLAGS[tok]] = True
        elif tok.startswith("smooth="):
            val = tok.partition("=")[2]
            if val not in SMOOTH_TIES:
                raise ValueError(f"smooth={val!r} in spec {text!r} is not allowed; allowed: smooth (per channel), "
                                 f"{', '.join('smooth=' + v for v in SMOOTH_TIES)}")
            given["smooth"], given["smooth_pairs"] = True, val == "pair"
        elif tok.startswith("out="):
            val = tok.partition("=")[2]
            if not re.fullmatch(r"[1-9]\d*", val):
                raise ValueError(f"out={val!r} in spec {text!r} is not allowed; allowed: out=1..8 (outlier slots "
                                 "per token vector)")
            given["outliers"] = int(val)
        elif "=" in tok:
            key, _, val = tok.partition("=")
            if key not in KEYED:
                raise ValueError(f"unknown option {key!r} in spec {text!r}; allowed keys: {', '.join(KEYED)}")
            field, allowed = KEYED[key]
            if val not in allowed:
                raise ValueError(f"{key}={val!r} in spec {text!r} is not allowed; allowed: {', '.join(allowed)}")
            given[field] = val
        else:
            raise ValueError(f"unknown token {tok!r} in spec {text!r}; allowed: g<N>, {'|'.join(AXES)}, sym|asym, "
                             f"{', '.join(k + '=' for k in KEYED)}, out=, {', '.join(FLAGS)}")
    axis = given.get("axis")
    if axis is None and "group" in given:
        axis = "tok"
    fields = format_defaults(fmt, axis)
    if bits is not None:
        fields["bits"] = bits
    fields.update(given)
    if fields["axis"] in ("head", "tensor") and "group" in given:
        raise ValueError(f"spec {text!r}: a group size cannot go with axis {fields['axis']}")
    return KVQuantSpec(**fields)


__all__ = ["as_spec", "parse_spec", "format_spec", "format_defaults"]
