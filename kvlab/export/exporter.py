"""`export()`: one scheme -> one engine's flags/config, scheme.json, conformance vectors, tuned configs.

Errors: `ValueError` (bad scheme, engine, out dir, head_dim; the CLI exits 2), `Unsupported`
(the engine cannot run the scheme and no substitution was allowed; the CLI exits 3).
"""
from __future__ import annotations

import json
import os
import shlex

from ..spec import KVScheme, as_scheme
from . import calibrate as cal
from .conformance import FILENAME as VECTORS, describe_layout, rows_for, write_vectors
from .engines import SOURCES, Plan, flags, get_engine, plan
from .readme import readme
from .spec_json import write_scheme_json
from .quality import engine_profile, profile_cost
from .substitute import Substitution, model_cost, nearest
from .tuned import write_tuned

LAUNCH = {"llama.cpp": "llama-server -m MODEL.gguf", "vllm": "vllm serve MODEL",
          "sglang": "python -m sglang.launch_server --model-path MODEL", "freetoken": "ft serve --model MODEL"}


class Unsupported(Exception):
    """The engine cannot run the scheme; `.substitution` holds the nearest one it can and its cost."""

    def __init__(self, sub: Substitution):
        super().__init__(sub.message())
        self.substitution = sub


def check_out_dir(out: str) -> str:
    """Absolute path of a usable output directory (existing and writable, or creatable)."""
    if not out:
        raise ValueError("--out needs a directory path")
    out = os.path.abspath(os.path.expanduser(out))
    if os.path.exists(out):
        if not os.path.isdir(out):
            raise ValueError(f"output path {out!r} exists and is not a directory; give a new or existing directory")
        probe = os.path.join(out, ".kvlab_write_test")
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            raise ValueError(f"output directory {out!r} is not writable ({e.strerror}); choose another --out") from None
        return out
    parent = os.path.dirname(out)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"cannot create output directory {out!r}: {parent!r} is not a writable directory; "
                         "choose another --out")
    return out


def load(model: str):
    """(model, tokenizer, name) for a model name or path, or ValueError naming what is allowed."""
    from ..model import load_model
    try:
        m, tok = load_model(model)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    return m, tok, model


def _captured(m, tok, sch: KVScheme, rows: int, text: str, scales: dict | None,
              smoothing: dict | None = None) -> list[dict]:
    """Real K/V rows (head 0 of the first, middle and last layer) for the conformance vectors (a smoothed K spec's
    rows divided by the layer's factors, a permuted one's in the layer's channel order, as the cache stores them)."""
    ids, prov = cal.calibration_tokens(tok, text, rows_for(sch, rows))
    cap = m.capture(ids[None])
    L = m.config.n_layers
    out = []
    for layer in sorted({0, L // 2, L - 1}):
        for role, spec in (("k", sch.k), ("v", sch.v)):
            key = "k_pre" if (role == "k" and spec.pre_rope) else role
            kw = {}
            if scales and spec.static_scale and spec.fmt == "fp8_e4m3":
                kw = {"scale": scales[f"{role}_scale"][layer]}   # the engine's calibrated layer scale
            x, how = cap[key][layer][0, 0], key
            if role == "k" and spec.smooth:
                if not smoothing or layer not in smoothing["layers"]:
                    continue
                x, how = x / smoothing["layers"][layer][0], f"{key} / k_smooth"
            if role == "k" and spec.permute:
                if not smoothing or layer not in smoothing.get("perms", {}):
                    continue
                x, how = x[:, smoothing["perms"][layer][0]], f"({how})[..., k_perm]"
            own = sch.for_layer(layer, L)[0 if role == "k" else 1] == spec  # (an override's levels are its own)
            if spec.calibrated and own and smoothing and role in smoothing.get("levels", {}).get(layer, {}):
                kw = {**kw, "codebook": smoothing["levels"][layer][role]}  # the model's levels for the layer
            out.append({"role": role, "name": f"captured_L{layer}_h0", "x": x, "kwargs": kw,
                        "source": f"model.capture layer {layer} head 0, first tokens of {prov['text']} ({how})"})
    return out


def _dtype_info(d) -> dict | None:
    return None if d is None else {"engine_dtype": d.name, "spec": str(d.kv_spec), "byte_exact": d.exact,
                                   "note": d.note}


def export(scheme, engine: str, out: str, *, model: str | None = None, calib_tokens: int = 512,
           calib_text: str = "license", vectors: int = 64, substitute: bool = False, head_dim: int | None = None,
           seed: int = 0, eval_tokens: int = 256, eval_segments: int = 2, tp_size: int = 1,
           tuned_path: str | None = None, log=None) -> dict:
    """Export `scheme` for `engine` into `out`; returns the engine.json dict (see module doc for errors)."""
    log = log or (lambda msg: None)
    eng = get_engine(engine)
    sch = as_scheme(scheme)
    out = check_out_dir(out)
    for name, val, lo in (("--vectors", vectors, 1), ("--calib-tokens", calib_tokens, 1), ("--tp-size", tp_size, 1),
                          ("--eval-segments", eval_segments, 1), ("--eval-tokens", eval_tokens, 0)):
        if not isinstance(val, int) or val < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {val!r}")
    m = tok = model_name = None
    if model:
        log(f"loading model {model} ...")
        m, tok, model_name = load(model)
        if head_dim not in (None, m.config.head_dim):
            raise ValueError(f"--head-dim {head_dim} disagrees with the model's head_dim {m.config.head_dim}")
    D = m.config.head_dim if m else (head_dim or 128)
    n_layers = m.config.n_layers if m else None
    for spec in (sch.k, sch.v, *(s for *_, ks, vs in (*sch.overrides, *sch.head_overrides) for s in (ks, vs))):
        spec.check_head_dim(D)
    p: Plan = plan(eng, sch, n_layers)
    sub = None
    if not p.ok:
        log(f"{eng.name} cannot run {sch.name or sch}; measuring the nearest substitutes ...")
        sub = nearest(p, D, seed=seed)
        if m is not None and eval_tokens:
            log(f"scoring {sub.requested.name or sub.requested} and {sub.label} on {model_name} ...")
            model_cost(sub, m, tok, model_name, eval_tokens, eval_segments, calib_text=calib_text)
        if not substitute:
            raise Unsupported(sub)
        sch = sub.chosen
        p = plan(eng, sch, n_layers)
    os.makedirs(out, exist_ok=True)
    files = {"scheme": os.path.basename(write_scheme_json(sch, out, D))}
    scales = None
    if eng.name in ("vllm", "sglang") and p.k.name == "fp8_e4m3":
        if m is not None:
            log(f"calibrating fp8 k/v scales on {calib_tokens} tokens of {calib_text} ...")
            scales = cal.fp8_kv_scales(m, tok, calib_text, calib_tokens)
            f = cal.write_scales(scales, out, m.config.arch, tp_size)
            files.update(scales_json=f["json"], scales_safetensors=f["safetensors"])
        elif p.k.kv_spec.has_scale:
            log("warning: no --model, so no calibrated k/v scales: the engine will use 1.0 (kvlab fp8_e4m3)")
    smoothing = None
    layer_specs = (sch.k, sch.v, *(s for _, ks, vs in sch.overrides for s in (ks, vs)))
    if any(s.smooth or s.permute or s.calibrated for s in layer_specs):
        if m is not None:
            log(f"calibrating key smoothing factors / channel permutations / calibrated levels on {calib_tokens} "
                f"tokens of {calib_text} ...")
            smoothing = cal.key_smoothing(m, tok, sch, calib_text, calib_tokens)
            if smoothing["layers"] or smoothing["perms"]:
                files["smoothing"] = cal.write_smoothing(smoothing, out)
            if smoothing["levels"]:
                files["codebooks"] = cal.write_codebooks(smoothing, out)
        else:
            log("warning: no --model, so no key smoothing factors / channel permutations / calibrated levels: "
                "calibrate them with the model (kvlab.quant.fit_smoothing, fit_permutation, fit_codebook) or the keys "
                "are stored unsmoothed (factors 1) and in the model's channel order, and the conformance vectors' "
                "levels are fitted on synthetic rows")
    fl = flags(p, files.get("scales_json") and os.path.join(out, files["scales_json"]))
    fl["notes"] += _notes(p, scales)
    captured = _captured(m, tok, sch, vectors, calib_text, scales, smoothing) if m is not None else None
    log("writing conformance vectors ...")
    meta = write_vectors(out, sch, D, vectors, seed, captured)
    files["conformance"] = VECTORS
    tuned = write_tuned(sch, out, tuned_path)
    files["tuned_configs"] = tuned
    from .. import __version__
    info = {"kvlab_version": __version__, "engine": eng.name, "scheme": str(sch), "scheme_name": sch.name,
            "head_dim": D, "model": model_name,
            "bits_per_element": sch.bits_per_element(D),
            "runs": "any" if eng.any_scheme else ("byte-exact" if p.k.exact and p.v.exact else "format-compatible"),
            "k": _dtype_info(p.k), "v": _dtype_info(p.v), **fl, "files": files,
            "kv_scales": None, "substitution": sub.to_dict() if sub else None, "sources": SOURCES[eng.name]}
    if not eng.any_scheme:  # the option's cost under the engine's profile, from the committed table
        label = p.k.name if p.k.name == p.v.name else f"k={p.k.name},v={p.v.name}"
        prof = engine_profile(eng.name, label)
        info["quality"] = {"profile": prof, "cost": profile_cost(prof) if prof else None}
    if eng.name in LAUNCH:
        info["command"] = " ".join([LAUNCH[eng.name], *map(shlex.quote, fl["flags"])])
        files["flags_sh"] = _write_sh(out, eng.name, sch, fl)
    if scales:
        info["kv_scales"] = {**scales, "safetensors_names": "model.layers.{i}.self_attn.k_scale / v_scale (float32 [])",
                             "json_layout": "QuantParamSchema: one factor per layer = max(k_scale, v_scale)",
                             "checkpoint_kv_cache_scheme": cal.KV_CACHE_SCHEME}
    if eng.name == "freetoken" and p.k.name != "auto":
        info["freetoken_spec"] = {"kv_cache_dtype": p.k.name, "spec": str(sch.k), **describe_layout(sch.k, D),
                                  "engine_layout": "FreeToken's kv_quant keeps codes [.., D*bits/8] and fp16 scales "
                                                   "[.., D/32] in separate tensors; the .codes/.scales vectors are "
                                                   "that split"}
    files["readme"] = "README.md"
    files["engine"] = "engine.json"
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(readme(info, meta))
    with open(os.path.join(out, "engine.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    return info


def _notes(p: Plan, scales: dict | None) -> list[str]:
    """Caveats beyond the flags: format-compatible dtypes, uncalibrated fp8, FreeToken fork differences."""
    notes = [f"{role}: {d.note}" for role, d in (("K", p.k), ("V", p.v)) if d is not None and not d.exact]
    if scales and not p.k.kv_spec.has_scale:
        notes.append("the scheme fp8_e4m3 has scale 1.0 (what the engine stores without the scales); with the "
                     "calibrated scales it stores kvlab's fp8_e4m3:rule=absmax at each layer's scale")
    if p.engine.name == "freetoken" and p.k.name == "fp8_e4m3":
        notes.append("some FreeToken builds store fp8 with one fp32 scale per (token, kv head) row instead of an "
                     "fp16 scale per 32 elements; check the conformance vectors against yours")
    return notes


def _write_sh(out: str, engine: str, sch: KVScheme, fl: dict) -> str:
    var = "KVLAB_" + engine.replace(".", "_").upper() + "_FLAGS"
    name = f"{engine}.sh"
    lines = ["# kvlab export: KV-cache flags for " + engine,
             f"# scheme: {sch.name + ' = ' if sch.name else ''}{sch}",
             f"# use:    . ./{name} && {LAUNCH[engine]} ${var}",
             *(f"# note:   {n}" for n in fl["notes"])]
    if fl["legacy_flags"]:
        lines.append(f"# older releases also read calibrated scales: {' '.join(map(shlex.quote, fl['legacy_flags']))}")
    lines.append(f"{var}={shlex.quote(' '.join(fl['flags']))}")
    with open(os.path.join(out, name), "w") as f:
        f.write("\n".join(lines) + "\n")
    return name
