"""Per-layer fp8 k/v scales from a calibration pass, in the layouts vLLM and SGLang read.

Scale convention (vLLM/SGLang `k_scale`): the cache stores fp8(x / k_scale) and reads back
fp8 * k_scale, so k_scale = amax(|K of the layer|) / 448 for e4m3 (one scale per layer for
all heads and tokens; post-RoPE keys, which is what the cache holds). The amax comes from
`model.capture` on an offline calibration text, through kvlab's own calibration path
(`kvlab.eval.faithful.calibrate` with spec `fp8_e4m3:rule=absmax`), so the exported scales are the
ones kvlab's decode-faithful evaluation uses.

Files:
* `kv_cache_scales.json`: {"model_type", "kv_cache": {"dtype": "float8_e4m3fn",
  "scaling_factor": {"<tp rank>": {"<layer>": s}}}} (vLLM QuantParamSchema, read by
  `--quantization-param-path` in SGLang and older vLLM). That format has ONE factor per layer,
  applied to both K and V, so it holds max(k_scale, v_scale).
* `kv_scales.safetensors`: `model.layers.{i}.self_attn.k_scale` / `v_scale` float32 scalars, the
  checkpoint tensor names vLLM/SGLang remap to `...self_attn.attn.k_scale` when a checkpoint's
  quantization config declares a kv-cache scheme.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch

FP8_E4M3_MAX = 448.0
CALIB_SPEC = "fp8_e4m3:rule=absmax"
TEXTS = ("license", "pydoc")


def calibration_tokens(tokenizer, text: str = "license", n_tokens: int = 512) -> tuple[torch.Tensor, dict]:
    """The first `n_tokens` tokens (no BOS) of an offline text and its provenance."""
    from ..model.text import license_text, pydoc_topics_text, tokenize_text
    if text not in TEXTS:
        raise ValueError(f"unknown calibration text {text!r}; allowed: {', '.join(TEXTS)}")
    if tokenizer is None:
        raise ValueError("the model has no tokenizer, so it cannot be calibrated on text")
    raw = license_text() if text == "license" else pydoc_topics_text()
    ids = tokenize_text(tokenizer, raw, n_tokens)
    desc = ("license_text(): the largest licence file of the first installed of numpy/torch/safetensors/gguf "
            "(numpy's LICENSE.txt when numpy is installed)" if text == "license" else
            "pydoc_data.topics values joined in sorted key order")
    return ids, {"text": text, "description": desc, "tokens": int(ids.numel()), "bos": False,
                 "chars": len(raw), "sha256_12": hashlib.sha256(raw.encode()).hexdigest()[:12]}


@torch.no_grad()
def fp8_kv_scales(model, tokenizer, text: str = "license", n_tokens: int = 512) -> dict:
    """Per-layer e4m3 k/v scales: {"k_scale": [L], "v_scale": [L], "k_amax", "v_amax", "calibration"}."""
    from ..eval.faithful import calibrate
    ids, prov = calibration_tokens(tokenizer, text, n_tokens)
    cal = calibrate(model, ids[None], CALIB_SPEC)
    n = model.config.n_layers
    ks = [float(cal[i]["k"]["scale"]) for i in range(n)]
    vs = [float(cal[i]["v"]["scale"]) for i in range(n)]
    return {"k_scale": ks, "v_scale": vs, "k_amax": [s * FP8_E4M3_MAX for s in ks],
            "v_amax": [s * FP8_E4M3_MAX for s in vs], "n_layers": n, "dtype": "float8_e4m3fn",
            "rule": "scale = amax(|x|) / 448 per layer over all KV heads and tokens (post-RoPE K)",
            "calibration": prov}


@torch.no_grad()
def key_smoothing(model, tokenizer, sch, text: str = "license", n_tokens: int = 512) -> dict:
    """Smoothing factors of a scheme's `smooth` K specs, channel orders of its `perm` K specs and levels of its
    calibrated (`cal`) specs: {"layers": {i: float32 [Hk, D]}, "perms": {i: int64 [Hk, D]}, "levels": {i: {"k" / "v":
    float32 [2^bits]}}, "calibration": provenance} (`kvlab.eval.faithful.calibrate` on the offline text: per layer,
    past the scheme's sinks; key levels fitted to the smoothed, permuted keys as the cache stores them)."""
    from ..eval.faithful import calibrate
    ids, prov = calibration_tokens(tokenizer, text, n_tokens)
    cal = calibrate(model, ids[None], sch)
    layers = {i: c["k"]["smooth"][:, 0].contiguous() for i, c in cal.items() if "smooth" in c.get("k", {})}
    perms = {i: c["k"]["perm"][:, 0].contiguous() for i, c in cal.items() if "perm" in c.get("k", {})}
    levels = {i: {r: c[r]["codebook"].float().cpu() for r in ("k", "v") if "codebook" in c.get(r, {})}
              for i, c in cal.items()}
    return {"layers": layers, "perms": perms, "levels": {i: lv for i, lv in levels.items() if lv},
            "calibration": prov}


def write_smoothing(sm: dict, out_dir: str) -> str:
    """kv_smoothing.safetensors: model.layers.{i}.self_attn.k_smooth float32 [Hk, D] per smoothed layer and
    model.layers.{i}.self_attn.k_perm int64 [Hk, D] per permuted one (the provenance in the metadata). Returns the
    file name."""
    from safetensors.torch import save_file
    name = "kv_smoothing.safetensors"
    tensors = {f"model.layers.{i}.self_attn.k_smooth": t.float().cpu() for i, t in sm["layers"].items()}
    tensors.update({f"model.layers.{i}.self_attn.k_perm": t.long().cpu() for i, t in sm.get("perms", {}).items()})
    save_file(tensors, os.path.join(out_dir, name), metadata={
        "calibration": json.dumps(sm["calibration"]),
        "meaning": "stored keys = (k / k_smooth)[..., k_perm] per KV head (each factor 1 / the identity where a layer "
                   "has none); attention reads queries as (q * k_smooth)[..., k_perm] (kvlab smooth, perm)"})
    return name


def write_codebooks(sm: dict, out_dir: str) -> str:
    """kv_codebooks.safetensors: model.layers.{i}.self_attn.k_levels / v_levels float32 [2^bits] per calibrated
    (`cal`) layer tensor (the provenance in the metadata). Returns the file name."""
    from safetensors.torch import save_file
    name = "kv_codebooks.safetensors"
    tensors = {f"model.layers.{i}.self_attn.{r}_levels": t.float().cpu().contiguous()
               for i, lv in sm["levels"].items() for r, t in lv.items()}
    save_file(tensors, os.path.join(out_dir, name), metadata={
        "calibration": json.dumps(sm["calibration"]),
        "meaning": "a calibrated spec's (kvlab cal) levels per layer: a code u stores value scale * levels[u] (+ zero "
                   "for asymmetric ints); the writer picks the nearest level, argmin_j |scale * levels[j] - (x - "
                   "zero)| (kvlab.quant.fit_codebook; conformance.safetensors has the byte contract)"})
    return name


def scales_json(scales: dict, model_type: str = "llama", tp_size: int = 1) -> dict:
    """vLLM/SGLang QuantParamSchema dict: one factor per layer (max of K and V), per TP rank."""
    per_layer = {str(i): max(k, v) for i, (k, v) in enumerate(zip(scales["k_scale"], scales["v_scale"]))}
    return {"model_type": model_type,
            "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {str(r): dict(per_layer) for r in range(tp_size)}}}


def write_scales(scales: dict, out_dir: str, model_type: str = "llama", tp_size: int = 1) -> dict:
    """Write kv_cache_scales.json and kv_scales.safetensors; returns {"json": name, "safetensors": name}."""
    from safetensors.torch import save_file
    with open(os.path.join(out_dir, "kv_cache_scales.json"), "w") as f:
        json.dump(scales_json(scales, model_type, tp_size), f, indent=1)
        f.write("\n")
    tensors = {}
    for i, (k, v) in enumerate(zip(scales["k_scale"], scales["v_scale"])):
        tensors[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(k, dtype=torch.float32)
        tensors[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(v, dtype=torch.float32)
    meta = {"kvlab": json.dumps({"rule": scales["rule"], "calibration": scales["calibration"]})}
    save_file(tensors, os.path.join(out_dir, "kv_scales.safetensors"), metadata=meta)
    return {"json": "kv_cache_scales.json", "safetensors": "kv_scales.safetensors"}


# What a checkpoint's config.json needs for vLLM to create (and load) k_scale/v_scale parameters:
# compressed-tensors' kv-cache-only scheme (compressed-tensors PR #135), as llm-compressor saves it.
KV_CACHE_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}
