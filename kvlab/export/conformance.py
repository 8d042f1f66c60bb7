"""Conformance vectors: inputs, the bytes an engine must store for them, and the values they mean.

`write_vectors` writes `conformance.safetensors` (safetensors, so any language can read it):

    {role}.{case}.input     float32 [T, D]    values exact in fp32, fp16 and bf16
    {role}.{case}.bytes     uint8 [T, R]      kvlab.encode(input, spec): blocks [scale][zero][code planes]
                                              ([T/G, R] for axis chan, one row per token group)
    {role}.{case}.decoded   float32 [T, D]    kvlab.decode_bytes(bytes, spec, shape)
    {role}.{case}.codes     uint8 [A, P]      payload only (packed code planes, blocks concatenated)
    {role}.{case}.scales    float32 [A, B]    per-group scale values (and .zeros for asym specs)
    {role}.{case}.scale     float32 []        a static per-tensor scale that lives outside the rows
    {role}.{case}.tensor_scale  float32 []    NVFP4's second-level scale
    {role}.{case}.codebook  float32 [2^b]     a calibrated spec's (`cal`) levels, which live beside the cache

role is k, v, or L<i> for a per-layer override spec; the file's metadata key "kvlab" is JSON with the specs, cases, shapes, seeds
and a layout description. `check_conformance(dir, encode_fn)` compares an engine's encoder
with the stored bytes.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

from ..quant.formats import CODEBOOKS, FP8_MAX, scale_value
from ..quant.smoothing import unsmoothed
from ..spec import KVQuantSpec, KVScheme

FILENAME = "conformance.safetensors"
FORMAT_VERSION = 1
SYNTHETIC = ("student_t4", "outlier_channels", "sink_tokens", "edges")


def representable(x: torch.Tensor) -> torch.Tensor:
    """x rounded so every value is exact in fp32, fp16 and bf16 (bf16 rounding, |x| < 2^-14 -> 0,
    clamped to +-60000): an engine fed any of those dtypes sees the same numbers."""
    y = x.float().to(torch.bfloat16).float().clamp(-60000.0, 60000.0)
    return torch.where(y.abs() < 2.0 ** -14, torch.zeros_like(y), y)


def edge_rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    """Rows that stress rounding and scale corner cases; rows beyond the special ones are Gaussian."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    m = min(d, 32)
    special = [
        torch.zeros(d),                                               # all-zero blocks
        torch.tensor([-3.0, 3.0] * (d // 2)),                         # |max| tie between signs
        -torch.rand(d, generator=g),                                  # all-negative rows
        (torch.arange(d) % m - m / 2).float(),                        # exact .5 ties after scaling
        ((torch.arange(d) % m - m / 2) / 2 + 0.25).float(),           # quarter steps
        1e-3 * torch.randn(d, generator=g),                           # small values
        3e4 * torch.rand(d, generator=g),                             # near the fp16 range
        torch.tensor([0.5, 1.5, 2.5, 3.5] * (d // 4)) * torch.tensor([1.0, -1.0]).repeat(d // 2),
    ]
    for i, row in enumerate(special[:n]):
        x[i] = row
    return x


def synthetic(case: str, n: int, d: int, seed: int) -> torch.Tensor:
    from ..eval import sample
    return edge_rows(n, d, seed) if case == "edges" else sample(case, n, d, seed)


def rows_for(sch: KVScheme, n: int) -> int:
    """n rounded up to whole channel groups (axis chan quantizes whole groups of G tokens)."""
    g = max([s.group for s in spec_roles(sch).values() if s.axis == "chan"] or [1])
    return -(-n // g) * g


def role_levels(spec: KVQuantSpec, n: int, d: int, seed: int) -> torch.Tensor:
    """A calibrated spec's levels for the synthetic cases: fitted (`kvlab.quant.fit_codebook`) on a student-t sample
    of n rows of its own (not the scored rows), float32 [2^bits]."""
    from ..quant import fit_codebook
    return fit_codebook(representable(synthetic("student_t4", n, d, seed)), unsmoothed(spec))


def _case_tensors(x: torch.Tensor, spec: KVQuantSpec, kw: dict) -> tuple[dict, dict]:
    """Tensors and metadata of one case: x [T, D] float32 (representable)."""
    from ..quant import block_bytes, decode_bytes, encode, quantize
    q = quantize(x, spec, **kw)
    static = {}
    if q.scales is not None and q.scales.dim() == 0:
        static["scale"] = float(q.scales.float())
    if q.tensor_scale is not None:
        static["tensor_scale"] = float(q.tensor_scale)
    b = encode(x, spec, **kw)
    y = decode_bytes(b, spec, tuple(x.shape), codebook=kw.get("codebook"), **static)
    t = {"input": x.contiguous(), "bytes": torch.from_numpy(np.ascontiguousarray(b)), "decoded": y.float().contiguous()}
    if not spec.is_float_storage:
        A = q.codes.shape[-3] if q.codes.dim() >= 3 else 1
        t["codes"] = q.codes.reshape(A, -1).contiguous()
        for name in ("scales", "zeros"):
            s = getattr(q, name)
            if s is not None and s.dim() > 0:
                t[name] = scale_value(s, spec.scale_dtype).float().reshape(A, -1).contiguous()
    for name, val in static.items():
        t[name] = torch.tensor(val, dtype=torch.float32)
    meta = {"shape": list(x.shape), "bytes_shape": list(b.shape), "block_bytes": block_bytes(spec, x.shape[-1]),
            **static}
    return t, meta


def spec_roles(sch: KVScheme) -> dict[str, KVQuantSpec]:
    """{"k": K spec, "v": V spec, "L<i>": each per-layer override spec (used for K and V of that layer), "L<i>.h<j>":
    each per-head one (".k" / ".v" suffixes where K and V differ)}."""
    roles = {"k": sch.k, "v": sch.v}
    for layer, ks, vs in sch.overrides:
        roles.update({f"L{layer}": ks} if ks == vs else {f"L{layer}.k": ks, f"L{layer}.v": vs})
    for layer, head, ks, vs in sch.head_overrides:  # per-head specs: KV head `head` of that layer
        roles.update({f"L{layer}.h{head}": ks} if ks == vs else {f"L{layer}.h{head}.k": ks, f"L{layer}.h{head}.v": vs})
    return roles


def write_vectors(out_dir: str, sch: KVScheme, head_dim: int = 128, rows: int = 64, seed: int = 0,
                  captured: list[dict] | None = None) -> dict:
    """Write conformance.safetensors for the K and V specs of `sch`; returns the metadata dict.

    captured: optional real rows, each {"role": "k"|"v", "name": str, "x": float [T, D],
    "kwargs": quantize kwargs (a calibrated static scale, a calibrated spec's levels `codebook`), "source": str}.

    A calibrated role (`cal`) needs levels beside the rows: its synthetic cases use levels fitted on a synthetic
    sample of their own (`role_levels`); each case names its levels ("codebook" in its metadata, and the
    `<role>.<case>.codebook` tensor), which an engine loads as it loads the model's (kv_codebooks.safetensors).
    """
    from safetensors.torch import save_file

    from .. import __version__
    T = rows_for(sch, rows)
    tensors, cases = {}, []
    todo = []
    specs = spec_roles(sch)
    levels = {role: role_levels(spec, T, head_dim, seed + 100 * r + 99) for r, (role, spec) in enumerate(specs.items())
              if spec.calibrated}
    for r, role in enumerate(specs):
        kw = {"codebook": levels[role]} if role in levels else {}
        for c, case in enumerate(SYNTHETIC):
            s = seed + 100 * r + c
            todo.append((role, case, synthetic(case, T, head_dim, s), kw, {"source": case, "seed": s}))
    for cap in captured or []:
        x = cap["x"].float()[:T]
        x = x[: x.shape[0] // rows_for(sch, 1) * rows_for(sch, 1)]  # whole channel groups
        kw = dict(cap.get("kwargs", {}))
        if cap["role"] in levels and "codebook" not in kw:
            kw["codebook"] = levels[cap["role"]]
        todo.append((cap["role"], cap["name"], x, kw, {"source": cap.get("source", "captured")}))
    for role, case, x, kw, info in todo:
        spec = specs[role]
        x = representable(x)
        t, meta = _case_tensors(x, unsmoothed(spec), kw)  # smoothed keys: the rows are the stored keys k / s
        if "codebook" in kw:
            t["codebook"] = torch.as_tensor(kw["codebook"], dtype=torch.float32).reshape(-1)[:2 ** spec.bits].clone()
            meta["codebook"] = t["codebook"].tolist()
        for name, val in t.items():
            tensors[f"{role}.{case}.{name}"] = val
        cases.append({"role": role, "case": case, "spec": str(spec), **info, **meta})
    meta = {"format": "kvlab-conformance", "format_version": FORMAT_VERSION, "kvlab_version": __version__,
            "scheme": str(sch), "k_spec": str(sch.k), "v_spec": str(sch.v), "k_spec_dict": sch.k.to_dict(),
            "v_spec_dict": sch.v.to_dict(), "head_dim": head_dim, "rows": T, "seed": seed,
            "k_layout": describe_layout(sch.k, head_dim), "v_layout": describe_layout(sch.v, head_dim),
            "roles": {role: str(spec) for role, spec in specs.items()},
            "override_layouts": {role: describe_layout(spec, head_dim) for role, spec in specs.items()
                                 if role not in ("k", "v")},
            "cases": cases}
    save_file(tensors, os.path.join(out_dir, FILENAME), metadata={"kvlab": json.dumps(meta)})
    return meta


def read_vectors(path: str) -> tuple[dict, dict]:
    """(tensors as numpy arrays, metadata dict) of a conformance.safetensors (file or its directory)."""
    from safetensors import safe_open
    if os.path.isdir(path):
        path = os.path.join(path, FILENAME)
    with safe_open(path, framework="numpy") as f:
        meta = json.loads(f.metadata()["kvlab"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, meta


def check_conformance(path: str, encode_fn, decode_fn=None, roles=None) -> dict:
    """Compare an engine's encoder (and optionally decoder) with stored conformance vectors.

    encode_fn(x, info) -> uint8 array of the stored bytes' size: x is float32 [T, D] numpy; info is
    {"role", "case", "spec", "head_dim", "scale" (static per-tensor scale or None), "tensor_scale", "codebook" (a
    calibrated spec's levels, a list, or None)}.
    decode_fn(bytes, info) -> float values [T, D], compared exactly (NaN == NaN).
    roles: check only these roles (default: all, k, v and L<i> overrides).
    Returns {"ok": bool, "cases": [{"role", "case", "ok", "bad_bytes", "first_bad", "decode_bad"}]}.
    """
    tensors, meta = read_vectors(path)
    rows = []
    for c in meta["cases"]:
        if roles is not None and c["role"] not in roles:
            continue
        key = f"{c['role']}.{c['case']}"
        info = {"role": c["role"], "case": c["case"], "spec": c["spec"], "head_dim": meta["head_dim"],
                "scale": c.get("scale"), "tensor_scale": c.get("tensor_scale"), "codebook": c.get("codebook")}
        want = tensors[key + ".bytes"]
        got = np.asarray(encode_fn(tensors[key + ".input"], info), dtype=np.uint8)
        row = {"role": c["role"], "case": c["case"], "ok": True, "bad_bytes": 0, "first_bad": None, "decode_bad": None}
        if got.size != want.size:
            row.update(ok=False, bad_bytes=-1, first_bad=f"size {got.size} != {want.size} bytes")
        else:
            bad = np.argwhere(got.reshape(want.shape) != want)
            if bad.size:
                row.update(ok=False, bad_bytes=int(len(bad)), first_bad=bad[0].tolist())
        if decode_fn is not None:
            y = np.asarray(decode_fn(want, info), dtype=np.float32).reshape(tensors[key + ".decoded"].shape)
            ref = tensors[key + ".decoded"]
            nbad = int((~((y == ref) | (np.isnan(y) & np.isnan(ref)))).sum())
            row["decode_bad"] = nbad
            row["ok"] = row["ok"] and nbad == 0
        rows.append(row)
    return {"ok": all(r["ok"] for r in rows), "cases": rows}


def kvlab_encode_fn(x: np.ndarray, info: dict) -> np.ndarray:
    """`encode_fn` backed by kvlab itself (what a re-check of the vectors runs)."""
    from ..quant import encode
    kw = {} if info.get("scale") is None else {"scale": info["scale"]}
    if info.get("tensor_scale") is not None:
        kw["tensor_scale"] = info["tensor_scale"]
    if info.get("codebook") is not None:
        kw["codebook"] = info["codebook"]
    from ..spec import as_spec
    # a smoothed spec's rows are stored keys (already divided by the factors): the plain format's bytes
    return encode(torch.from_numpy(np.ascontiguousarray(x)), unsmoothed(as_spec(info["spec"])), **kw)


def describe_layout(spec: KVQuantSpec, head_dim: int) -> dict:
    """Plain-words byte layout of a spec for an engine implementer."""
    from ..quant import block_bytes
    if spec.is_float_storage:
        return {"format": spec.fmt, "bytes_per_row": 2 * head_dim,
                "layout": f"raw little-endian {spec.fmt} values, no scale"}
    G = spec.group_size(head_dim)
    b = spec.bits
    d = {"format": spec.fmt if spec.fmt != "int" else f"int{b}", "bits": b, "axis": spec.axis}
    if spec.axis == "tensor":
        d.update(bytes_per_row=head_dim * b // 8, bits_per_element=spec.bits_per_element_at(head_dim),
                 blocks="codes only, element order; " + (
                     "one static scale per tensor outside the rows (the .scale tensor; an engine's calibrated "
                     "k_scale / v_scale)" if spec.has_scale else "no scale (an engine's k_scale = v_scale = 1.0)"))
        d["scale_rule"], d["codes"] = _rule(spec), _codes(spec)
        return d
    d.update(group=G, block_bytes=block_bytes(spec, head_dim), bits_per_element=spec.bits_per_element_at(head_dim))
    if spec.axis == "chan":
        d["blocks"] = f"one block per (group of {G} tokens, channel); rows are token groups, blocks in channel order"
    else:
        d["blocks"] = f"one block per {G} consecutive elements of a token's head_dim, blocks in row order"
    parts = []
    if spec.has_scale and spec.axis != "tensor":
        parts.append(f"scale ({spec.scale_dtype}, little-endian)")
        if not spec.sym:
            parts.append(f"zero = group min ({spec.scale_dtype})")
    parts.append(f"{G * b // 8} payload bytes")
    d["block"] = " | ".join(parts)
    d["scale_rule"] = _rule(spec)
    d["codes"] = _codes(spec)
    if spec.fmt == "int" and not spec.calibrated:  # (a calibrated int takes the nearest level: see codes)
        d["rounding"] = {"even": "round half to even", "away": "round half away from zero",
                         "up": "GGML: trunc(v + offset + 0.5)"}[spec.rounding] + (
            "; v = x * (1/scale) with the fp32 reciprocal of the unrounded scale (GGML)" if spec.recip else
            "; v = x / scale with the scale as stored") + f"; codes clamp to [0, {2 ** b - 1}] (unsigned)"
    if b < 8:
        d["packing"] = (f"bit planes {list(spec.planes)} (lowest bits first); " +
                        ("GGML order: highest plane first; a 4-bit plane puts element j in the low nibble and "
                         f"element j+{G // 2} in the high nibble of byte j; 1-bit planes are little-endian masks"
                         if spec.pack == "ggml" else
                         "lowest plane first; a w-bit plane puts element i in byte i*w//8 at bit (i*w)%8 "
                         "(4-bit: element 2j in the low nibble of byte j, element 2j+1 in the high nibble)"))
    if spec.smooth:
        d["smoothing"] = ("the rows are the keys as stored: the model's (post-RoPE) keys divided per channel by the "
                          "layer's smoothing factors s [KV heads, head_dim] (kv_smoothing.safetensors, "
                          "model.layers.{i}.self_attn.k_smooth); attention multiplies each query head by its KV "
                          "head's s, so q . k is unchanged (kvlab.quant.smoothing)")
    if spec.permute:
        d["permutation"] = ("the rows are the keys as stored: in the layer's channel order k_perm [KV heads, head_dim] "
                            "(kv_smoothing.safetensors, model.layers.{i}.self_attn.k_perm; after smoothing), stored "
                            "channel j = the model's channel k_perm[h, j]; attention reads each query head in its KV "
                            "head's order, so q . k is unchanged (kvlab.quant.permutation)")
    if spec.outliers:
        n = spec.outliers
        d["outlier_slots"] = (f"each token vector keeps its {n} values of largest magnitude (of the stored row: after "
                              "smoothing and rotation; NaN and inf first, then |x| descending, the lower channel on "
                              "ties) in full precision; before grouping each of them is replaced by the mean of the "
                              "other elements of its scale group (0 if none), so it widens no scale; the row's bytes "
                              f"end with {n} fp16 values (little-endian) then {n} uint8 channel indices per token "
                              "(an axis-chan row: its tokens' slots in token order); dequantization writes the values "
                              "over their channels (kvlab.quant.outliers)")
    if spec.rotation == "had":
        d["rotation"] = ("rows are rotated before grouping: x @ H with H the orthonormal Sylvester Hadamard matrix "
                         "(block-diagonal in blocks of the largest power of two dividing head_dim, at most 256), "
                         "computed in float32 exactly as kvlab.quant.rotation.rotate does for the stored bytes to "
                         "match: per block, log2(block) stages of y = [x_even + x_odd, x_even - x_odd] (even / odd "
                         "elements of the previous stage), then one multiply by 1/sqrt(block) rounded to float32; "
                         "decode returns y @ H.T")
    return d


def _rule(spec: KVQuantSpec) -> str:
    b = spec.bits
    if spec.rule == "unit":
        return "no scale (values cast directly, saturating)"
    if spec.rule == "signed":
        lo = -(2 ** (b - 1)) if spec.fmt == "int" else f"{min(CODEBOOKS[spec.fmt]):g} (the codebook's minimum)"
        return f"scale = x_ext / {lo} (x_ext: the group's element of largest magnitude, sign kept)"
    if spec.rule == "mse":
        return "clipping ratio searched in 1.0..0.5 (step 0.025) for the least squared error"
    if spec.rule == "rms":
        return "scale = sqrt(mean of x^2 over the group) (the group's RMS; the squares summed in float64, rounded once)"
    if spec.fmt == "int" and not spec.sym:
        return f"scale = (max - min) / {2 ** b - 1}, zero = min"
    if spec.fmt == "int":
        return f"scale = absmax / {2 ** (b - 1) - 1}"
    if spec.scale_dtype == "e8m0":
        return "scale = 2^(floor(log2 absmax) - emax) as an e8m0 biased exponent (OCP MX)"
    top = FP8_MAX.get(spec.fmt, "the largest codebook magnitude")
    two_level = " (e4m3 group scales under an fp32 tensor scale)" if spec.tensor_scale else ""
    return f"scale = absmax / {top}{two_level}"


def _codes(spec: KVQuantSpec) -> str:
    b = spec.bits
    if spec.fmt == "int" and spec.sym and not spec.calibrated:
        if b == 8:
            return "two's complement int8 c; value = scale * c"
        return f"offset binary u = c + {2 ** (b - 1)}; value = scale * (u - {2 ** (b - 1)})"
    if spec.fmt == "int" and not spec.calibrated:
        return "unsigned u; value = scale * u + zero"
    if spec.fmt.startswith("fp8"):
        return f"{spec.fmt} bits (OCP, saturating cast, round to nearest even); value = fp8 * scale"
    if spec.calibrated:
        zero = " + zero" if not spec.sym else ""
        sub = " - zero" if not spec.sym else ""
        return (f"{b}-bit index u into the layer's calibrated levels t (float32 [{2 ** b}], ascending; each case's "
                f"`codebook`, the model's in kv_codebooks.safetensors); value = scale * t[u]{zero}; u = the nearest "
                f"level: argmin_j |scale * t_j - (x{sub})| in float32, the first on ties")
    return f"{b}-bit index into the {spec.fmt} codebook (kvlab.quant.formats); value = scale * codebook[i]"
