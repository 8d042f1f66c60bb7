"""Spec text shared by the parser (`dsl.py`) and the printer: token aliases, keyed options, flags,
each format's defaults, and `format_spec`, the canonical text. Pure Python."""
from __future__ import annotations

from .vocab import FORMAT_BITS, PACKINGS, ROTATIONS, ROUNDINGS, SCALE_DTYPES, SCALE_RULES

ALIASES = {"fp8": "fp8_e4m3", "fp4": "fp4_e2m1", "e4m3": "fp8_e4m3", "e5m2": "fp8_e5m2"}
KEYED = {"s": ("scale_dtype", SCALE_DTYPES), "rule": ("rule", SCALE_RULES),
         "rnd": ("rounding", ROUNDINGS), "rot": ("rotation", ROTATIONS), "pack": ("pack", PACKINGS)}
SMOOTH_TIES = ("chan", "pair")  # smooth=chan is the bare flag; smooth=pair ties factors within RoPE pairs
FLAGS = {"recip": "recip", "ts": "tensor_scale", "prerope": "pre_rope", "twos": "twos", "cal": "calibrated",
         "smooth": "smooth", "perm": "permute"}


def clean_text(text, what: str, example: str) -> str:
    """`text` stripped; ValueError unless it is a non-empty string (what: "spec" / "scheme")."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a {what} must be a non-empty string like {example}, got {text!r}")
    return text.strip()


def format_defaults(fmt: str, axis: str | None = None) -> dict:
    """Field defaults for a format (and axis), used both to fill parsed specs and to print them."""
    dense = fmt in ("bf16", "fp16")
    fp8 = fmt.startswith("fp8")
    if axis is None:
        axis = "tensor" if (dense or fp8) else "tok"
    group = {"nf4": 64, "lm2": 64, "lm3": 64, "lm4": 64}.get(fmt, 32) if axis in ("tok", "chan") else 0
    return {
        "fmt": fmt, "bits": FORMAT_BITS.get(fmt, 4), "axis": axis, "group": group, "sym": True,
        "scale_dtype": "e8m0" if fmt == "fp4_e2m1" else ("f32" if axis == "tensor" else "f16"),
        "rule": "unit" if (dense or (fp8 and axis == "tensor")) else ("rms" if fmt.startswith("lm") else "absmax"),
        "recip": False, "rounding": "even", "rotation": "none", "pack": "seq",
        "tensor_scale": False, "pre_rope": False, "twos": False, "calibrated": False,
        "smooth": False, "smooth_pairs": False, "permute": False, "outliers": 0,
    }


def format_spec(spec) -> str:
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
    for key, (field, _) in KEYED.items():
        if getattr(spec, field) != d[field]:
            out.append(f"{key}={getattr(spec, field)}")
    for tok, field in FLAGS.items():
        if getattr(spec, field):
            out.append("smooth=pair" if field == "smooth" and spec.smooth_pairs else tok)
    if spec.outliers:
        out.append(f"out={spec.outliers}")
    return ":".join(out)
