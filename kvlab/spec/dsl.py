"""The one-line spec DSL: parse `int4:g32:asym:rot=had` into a `KVQuantSpec` and print it back.

Grammar (tokens joined by ':'; order free except the format comes first):

    FORMAT        int2..int8 | fp8_e4m3 (fp8) | fp8_e5m2 | fp4_e2m1 (fp4) | nf4 | iq4nl | bf16 | fp16
    g<N>          group size (8..256); implies axis tok unless an axis token is given
    tok|chan|head|tensor   axis
    sym|asym      symmetric or asymmetric (int only)
    s=<dtype>     scale dtype: f16 bf16 f32 e8m0 e4m3
    rule=<r>      absmax | signed | mse | unit
    recip         GGML arithmetic (codes from the fp32 reciprocal of the unrounded scale)
    rnd=<r>       even | away | up
    rot=<r>       none | had
    pack=<p>      seq | ggml
    ts            two-level scaling: an fp32 tensor scale above e4m3 group scales (NVFP4)
    prerope       keys quantized before RoPE

A spec preset name (`q4_0`, `mxfp4`, `freetoken:q6_0`, ...) is accepted wherever a spec is.
`format_spec` prints the canonical text: format, group/axis, sym/asym (ints), then every
field that differs from the format's default, in a fixed order.
"""
from __future__ import annotations

import re

from .quant_spec import (AXES, FORMATS, PACKINGS, ROTATIONS, ROUNDINGS, SCALE_DTYPES, SCALE_RULES,
                         FORMAT_BITS, KVQuantSpec)

_ALIASES = {"fp8": "fp8_e4m3", "fp4": "fp4_e2m1", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}
_KEYED = {"s": ("scale_dtype", SCALE_DTYPES), "rule": ("rule", SCALE_RULES),
          "rnd": ("rounding", ROUNDINGS), "rot": ("rotation", ROTATIONS), "pack": ("pack", PACKINGS)}
_FLAGS = {"recip": "recip", "ts": "tensor_scale", "prerope": "pre_rope"}


def format_defaults(fmt: str, axis: str | None = None) -> dict:
    """Field defaults for a format (and axis), used both to fill parsed specs and to print them."""
    dense = fmt in ("bf16", "fp16")
    fp8 = fmt.startswith("fp8")
    if axis is None:
        axis = "tensor" if (dense or fp8) else "tok"
    group = {"nf4": 64}.get(fmt, 32) if axis in ("tok", "chan") else 0
    return {
        "fmt": fmt, "bits": FORMAT_BITS.get(fmt, 4), "axis": axis, "group": group, "sym": True,
        "scale_dtype": "e8m0" if fmt == "fp4_e2m1" else ("f32" if axis == "tensor" else "f16"),
        "rule": "unit" if (dense or (fp8 and axis == "tensor")) else "absmax",
        "recip": False, "rounding": "even", "rotation": "none", "pack": "seq",
        "tensor_scale": False, "pre_rope": False,
    }


def _parse_format(tok: str) -> tuple[str, int | None]:
    tok = _ALIASES.get(tok, tok)
    m = re.fullmatch(r"int(\d+)", tok)
    if m:
        return "int", int(m.group(1))
    if tok in FORMATS and tok != "int":
        return tok, None
    raise ValueError(f"unknown format {tok!r}; allowed: int2..int8, {', '.join(f for f in FORMATS if f != 'int')}"
                     f" (aliases {', '.join(_ALIASES)}), or a spec preset name")


def parse_spec(text: str) -> KVQuantSpec:
    """Parse one tensor's spec text (or a spec preset name) into a `KVQuantSpec`."""
    from .presets import SPEC_PRESETS
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a spec must be a non-empty string like 'int4:g32:asym', got {text!r}")
    text = text.strip()
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
        elif tok in _FLAGS:
            given[_FLAGS[tok]] = True
        elif "=" in tok:
            key, _, val = tok.partition("=")
            if key not in _KEYED:
                raise ValueError(f"unknown option {key!r} in spec {text!r}; allowed keys: {', '.join(_KEYED)}")
            field, allowed = _KEYED[key]
            if val not in allowed:
                raise ValueError(f"{key}={val!r} in spec {text!r} is not allowed; allowed: {', '.join(allowed)}")
            given[field] = val
        else:
            raise ValueError(f"unknown token {tok!r} in spec {text!r}; allowed: g<N>, {'|'.join(AXES)}, sym|asym, "
                             f"{', '.join(k + '=' for k in _KEYED)}, {', '.join(_FLAGS)}")
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


def format_spec(spec: KVQuantSpec) -> str:
    """Canonical text of a spec: `parse_spec(format_spec(s)) == s` for every valid spec."""
    fmt = f"int{spec.bits}" if spec.fmt == "int" else spec.fmt
    d = format_defaults(spec.fmt, spec.axis)
    out = [fmt]
    if spec.axis in ("tok", "chan"):
        out.append(f"g{spec.group}")
        if spec.axis == "chan":
            out.append("chan")
    elif spec.axis != format_defaults(spec.fmt)["axis"]:
        out.append(spec.axis)
    if spec.fmt == "int":
        out.append("sym" if spec.sym else "asym")
    for key, (field, _) in _KEYED.items():
        if getattr(spec, field) != d[field]:
            out.append(f"{key}={getattr(spec, field)}")
    for tok, field in _FLAGS.items():
        if getattr(spec, field):
            out.append(tok)
    return ":".join(out)
