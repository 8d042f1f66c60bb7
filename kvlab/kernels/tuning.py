"""Per-GPU tuned kernel configs: search space, JSON cache, `tune()` entry point.

A config is {"BLOCK_N", "num_warps", "num_stages", "num_splits", "asm", "layout"} (layout "operand",
the default, or "rowfirst"). The cache key is
op | K spec | V spec | B-bucket | Hq | Hk | D | page size (never the sequence length), stored
per GPU name in ~/.cache/kvlab/tuned_<gpu>.json (override: env KVLAB_TUNED_CONFIGS or
`set_cache_path`). On CPU / under TRITON_INTERPRET=1, `tune` returns the default without timing.
This module imports neither Triton nor the kernels at import time.
"""
from __future__ import annotations

import json
import math
import os
import re

import torch

_PATH: str | None = None
_MEM: dict[str, dict] | None = None
B_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def gpu_name(device=None) -> str:
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return torch.cuda.get_device_name(device)
    return "cpu"


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_").lower()


def cache_path(device=None) -> str:
    if _PATH:
        return _PATH
    env = os.environ.get("KVLAB_TUNED_CONFIGS")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "kvlab", f"tuned_{_slug(gpu_name(device))}.json")


def set_cache_path(path: str | None) -> None:
    """Use `path` as the tuned-config JSON file (None: back to the default)."""
    global _PATH, _MEM
    _PATH, _MEM = path, None


def _load() -> dict:
    global _MEM
    if _MEM is None:
        p = cache_path()
        try:
            with open(p) as f:
                _MEM = json.load(f).get("configs", {})
        except (OSError, ValueError):
            _MEM = {}
    return _MEM


def _save() -> None:
    p = cache_path()
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    tmp = p + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"gpu": gpu_name(), "configs": _load()}, f, indent=1, sort_keys=True)
    os.replace(tmp, p)


def b_bucket(B: int) -> int:
    return next((b for b in B_BUCKETS if B <= b), B_BUCKETS[-1])


def key(op: str, k_spec, v_spec, B: int, Hq: int, Hk: int, D: int, page_size: int) -> str:
    return f"{op}|k={k_spec}|v={v_spec}|B{b_bucket(B)}|Hq{Hq}|Hk{Hk}|D{D}|P{page_size}"


def num_sms(device=None) -> int:
    if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1":
        return torch.cuda.get_device_properties(device or 0).multi_processor_count
    return 4


def auto_splits(B: int, Hk: int, device=None, waves: int = 2, max_splits: int = 64) -> int:
    """Split count so that B * Hk * splits covers `waves` programs per SM (132 SMs on H200); where that
    gives fewer than 4 splits, up to 4 while the grid stays under 6 programs per SM. H200 run3, B=32 x 32K:
    2 -> 4 splits took q8_0 (3 CTAs/SM at 167 registers: 512 programs = 1.3 waves) from 1.353 to 1.258 ms;
    every other scheme moved <= 1% (noise); batch 1 keeps its 2-wave count (33 splits)."""
    n = max(1, B * Hk)
    s = math.ceil(waves * num_sms(device) / n)
    if s < 4:
        s = max(s, min(4, math.ceil(6 * num_sms(device) / n)))
    return max(1, min(max_splits, s))


def default_config(op: str, B: int, Hk: int, device=None) -> dict:
    return {"BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "num_splits": None, "asm": True}


def lookup(op: str, k_spec, v_spec, B, Hq, Hk, D, page_size, device=None) -> dict | None:
    """The cached best config for this shape and spec, or None."""
    return _load().get(key(op, k_spec, v_spec, B, Hq, Hk, D, page_size))


def record(op: str, k_spec, v_spec, B, Hq, Hk, D, page_size, config: dict, ms: float | None, save: bool = True):
    _load()[key(op, k_spec, v_spec, B, Hq, Hk, D, page_size)] = {**config, "ms": ms}
    if save:
        _save()


def export_configs(path: str) -> str:
    """Write every cached config (with the GPU name) to `path` as JSON; returns path."""
    with open(path, "w") as f:
        json.dump({"gpu": gpu_name(), "configs": _load()}, f, indent=1, sort_keys=True)
    return path


TILES = ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2))  # BLOCK_N, warps, stages
QUICK_TILES = ((64, 4, 2), (128, 4, 2))  # every H200 winner of the full space (tuned_configs.json, run4)


def search_space(op: str, B: int, Hk: int, k_spec, v_spec, device=None, asm_ok: bool = True,
                 quick: bool = False) -> list[dict]:
    """Pruned candidates: tile size x warps (stages fixed by tile), splits at the auto count; the
    fp16 fast paths (asm, rowfirst) where the spec has them. quick: the two tiles that won every
    scheme of the full search on H200 (2-4 candidates; what the sweep's speed stage uses)."""
    base = auto_splits(B, Hk, device)
    tiles = QUICK_TILES if quick else TILES
    cands = [{"BLOCK_N": bn, "num_warps": w, "num_stages": st, "num_splits": base, "asm": False} for bn, w, st in tiles]
    big = [c for c in cands if c["BLOCK_N"] >= 64][:3] if not quick else cands[-1:]
    quant4 = any(s.fmt == "int" and s.bits == 4 and s.axis != "chan" for s in (k_spec, v_spec))
    if asm_ok and quant4:
        cands += [{**c, "asm": True} for c in big]
    if asm_ok and any(rowfirst_ok(s) for s in (k_spec, v_spec)):
        # layout "rowfirst": dequantize in the load's row layout, 16-bit tile through smem + ldmatrix (run4)
        cands += [{**c, "asm": True, "layout": "rowfirst"} for c in cands[:len(tiles)] if c["BLOCK_N"] in
                  ((128,) if quick else (64, 128)) and c["num_warps"] == 4 and c["num_stages"] == 2]
    if asm_ok and quant4 and not quick:
        # orient "kv": scores^T = K q^T so the dequantized tiles are wgmma's M-side operands (offline SASS:
        # HGMMA, about half the per-tile smem traffic of rowfirst, 1,339 vs 1,058 instructions); unmeasured
        base128 = next(c for c in cands if c["BLOCK_N"] == 128 and c["num_warps"] == 4 and c["num_stages"] == 2)
        cands += [{**base128, "asm": True, "orient": "kv"}]
    return cands


def rowfirst_ok(spec) -> bool:
    """Specs whose rowfirst tile runs the fp16 fast path (offline SASS: no byte gathers, STS.128 + LDSM):
    8-bit ints and fp8 (byte rows) and 4-bit ints along D. Other specs compile under rowfirst but keep
    2-byte smem traffic (int2/int3/fp4: STS.U16), so the tuner does not try them."""
    return spec.axis != "chan" and not spec.is_float_storage and (
        (spec.fmt == "int" and spec.bits in (4, 8)) or spec.fmt in ("fp8_e4m3", "fp8_e5m2"))


def gluon_space(sch, B: int, Hq: int, Hk: int, D: int, P: int, has_fp: bool, device=None) -> list[dict]:
    """The Gluon MMA-fragment kernel (decode/gluon_mma.py) as candidates where it runs this call, on GPUs of
    a compute capability in `gluon_mma.GPU_VERIFIED` (or any with KVLAB_GLUON=1). With O^T accumulated
    (the default): 4 warps of 16 tokens at the compiler's registers or capped at 128 (4 CTAs of 4 warps per
    SM on sm_90), 4 warps of 32 tokens uncapped or at 168 (3 CTAs), 8 warps of 32; and O = P V at 16
    tokens capped at 168 (the best of the first H200 grid, runs/gluon-6abe433)."""
    try:
        from .decode import gluon_mma
    except ImportError:  # a Triton without the Gluon dialect
        return []
    if not (gluon_mma.gpu_verified(device or "cuda") or os.environ.get("KVLAB_GLUON") == "1"):
        return []
    if gluon_mma.why_not(sch.k, sch.v, D, P, Hq // Hk, has_fp, device) is not None:
        return []
    S = auto_splits(B, Hk, device)
    grid = ((4, 16, None, True), (4, 16, 128, True), (4, 32, None, True), (4, 32, 168, True), (8, 32, None, True),
            (4, 16, 168, False))
    return [{"kernel": "gluon", "num_warps": w, "tokens_per_warp": tw, "num_splits": S, **({"maxnreg": r} if r else {}),
             **({} if ot else {"ot": False})} for w, tw, r, ot in grid]


def split_space(best: dict, B: int, Hk: int, device=None) -> list[dict]:
    """Split counts around the best config's: half, three quarters, one and a half, double. The
    fractional steps let the grid (B * Hk * splits programs) end on a whole wave: at 3 programs per
    SM (q4_0's 168 registers), B=32 x Hk=8 x 4 splits is 2.59 waves on 132 SMs (ncu, H200), and 3
    or 6 splits is 1.94 or 3.88. The split count is a runtime argument of the decode kernel; only one
    split (no merge) and a new power of two of splits in the merge kernel compile again. Where B * Hk
    programs alone reach every SM, one split is tried too: no partial outputs and no merge launch."""
    base = best["num_splits"]
    outs = {max(1, base // 2), max(1, 3 * base // 4), min(128, -(-3 * base // 2)), min(128, base * 2)}
    if B * Hk >= num_sms(device):
        outs.add(1)
    outs = sorted(outs - {base})
    return [{**best, "num_splits": s} for s in outs]


# ---- search -----------------------------------------------------------------------------------------
def synthetic_cache(k_spec, v_spec, B: int, Hk: int, D: int, P: int, context: int, device="cuda", seed: int = 0):
    """A timing-only paged cache: random codes, constant finite scales, pages in random order.
    -> dict(k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_ts, v_ts)."""
    from ..cache.layout import PageLayout
    g = torch.Generator(device="cpu").manual_seed(seed)
    n = -(-context // P)
    out = {"kv_indptr": torch.arange(0, B * n + 1, n, dtype=torch.int32, device=device),
           "kv_indices": torch.randperm(B * n, generator=g).to(torch.int32).to(device),
           "kv_last_page_len": torch.full((B,), context - (n - 1) * P, dtype=torch.int32, device=device)}
    for name, spec in (("k", k_spec), ("v", v_spec)):
        pages = PageLayout(spec, D, P, Hk).allocate(B * n, device)
        c = pages["codes"]
        if c.dtype == torch.uint8:
            c.view(-1)[:] = torch.randint(0, 256, (c.numel(),), dtype=torch.uint8, device=device) & (
                0x77 if spec.fmt.startswith("fp8") else 0xFF)  # keep fp8 codes finite
        else:
            c.normal_()
        for key, val in (("scales", 0.01), ("zeros", -0.05)):
            t = pages.get(key)
            if t is not None:
                t.fill_(120) if t.dtype == torch.uint8 else t.copy_(torch.full(t.shape, val, device=device).to(t.dtype))
        out[f"{name}_pages"] = pages
        has_ts = spec.tensor_scale or (spec.axis == "tensor" and spec.has_scale and not spec.is_float_storage)
        out[f"{name}_ts"] = torch.ones(1, device=device) if has_ts else None
    return out


def tune(op: str, scheme, shape: dict, *, device="cuda", rep: int = 30, warmup: int = 5, save: bool = True,
         verbose: bool = False, candidates: list[dict] | None = None,
         search_splits: bool = True, quick: bool = False) -> tuple[dict, float | None]:
    """Best config for `op` ("decode") with `scheme` (name, text or KVScheme) at `shape`
    {"batch", "heads_q", "heads_kv", "head_dim", "page_size", "context" (timing only, not the key)}.

    Times a pruned space (tile x warps x stages [x asm], then splits around the best) with
    triton.testing.do_bench medians, records the winner in the JSON cache and returns (config, ms).
    On CPU / under TRITON_INTERPRET=1 returns (default config, None) without timing."""
    from ..spec import scheme as _scheme
    if op not in ("decode", "extend"):
        raise ValueError(f"op={op!r}; allowed: 'decode', 'extend'")
    sch = _scheme(scheme)
    B, Hq, Hk = int(shape["batch"]), int(shape["heads_q"]), int(shape["heads_kv"])
    D, P, ctx = int(shape["head_dim"]), int(shape["page_size"]), int(shape.get("context", 8192))
    if gpu_name() == "cpu" or op == "extend":
        cfg = default_config(op, B, Hk, device)
        if op == "decode":
            cfg["num_splits"] = auto_splits(B, Hk, device)
        return cfg, None
    import triton
    from .decode import decode
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, ctx, device)
    q = torch.randn(B, Hq, D, device=device, dtype=torch.bfloat16)
    fp = dict(k_fp=None, v_fp=None, fp_len=None)
    if sch.window or sch.sink or sch.k.axis == "chan":
        W = max(sch.window + sch.sink, 1)
        fp = dict(k_fp=torch.randn(B, Hk, W, D, device=device, dtype=torch.bfloat16), fp_len=torch.full(
            (B,), W, dtype=torch.int32, device=device))
        fp["v_fp"] = torch.randn_like(fp["k_fp"])

    def run(cfg):  # planned launcher: timing sees the kernels, not the Python checks
        return decode(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"],
                      sch.k, sch.v, P, **fp, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], config=cfg,
                      plan=True)

    def bench(cands):
        res = []
        for cfg in cands:
            try:
                ms = triton.testing.do_bench(run(cfg), warmup=warmup, rep=rep, return_mode="median")
            except Exception as e:  # a config that does not compile or fit is skipped
                if verbose:
                    print(f"tune: {cfg} failed: {type(e).__name__}: {str(e)[:200]}")
                continue
            if verbose:
                print(f"tune: {cfg} {ms:.4f} ms")
            res.append((ms, cfg))
        return res

    cands = candidates or search_space(op, B, Hk, sch.k, sch.v, device, quick=quick) + gluon_space(
        sch, B, Hq, Hk, D, P, fp["k_fp"] is not None, device)
    res = bench(cands)
    if not res:
        raise RuntimeError(f"no decode config ran for {sch} at {shape}")
    best_ms, best = min(res, key=lambda r: r[0])
    res2 = bench(split_space(best, B, Hk, device)) if search_splits else []
    if res2:
        ms2, cfg2 = min(res2, key=lambda r: r[0])
        if ms2 < best_ms:
            best_ms, best = ms2, cfg2
    prev = lookup(op, sch.k, sch.v, B, Hq, Hk, D, P, device)
    if not (quick and prev and prev.get("ms") is not None and prev["ms"] <= best_ms):
        record(op, sch.k, sch.v, B, Hq, Hk, D, P, best, best_ms, save=save)  # a quick search never replaces a faster entry
    return best, best_ms
