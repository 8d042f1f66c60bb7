"""The autotune driver: search spaces, a synthetic timing cache, and `tune()`, which times candidates
through the public ops and records the winner in the tuned-config store (`tuned.py`).

It sits above the ops' `api.py` (it launches through them, with explicit configs) and asks the
backends only what their spaces are. On the CPU / under TRITON_INTERPRET=1 `tune` times nothing and
returns the default config.
"""
from __future__ import annotations

import os

import torch

from ..cache.layout import PageLayout
from ..spec import as_scheme
from .configs import ExtendConfig, GluonDecodeConfig, StoreConfig, TritonDecodeConfig, auto_splits
from .env import gpu_name, num_sms
from .tuned import attention_key, lookup, measured_ms, record, store_key

OPS = ("decode", "extend", "store")
TILES = ((32, 4, 2), (64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2))  # block_n, warps, stages
QUICK_TILES = ((64, 4, 2), (128, 4, 2))  # the two tiles that won every scheme of the full space measured


def rowfirst_ok(spec) -> bool:
    """Specs whose rowfirst tile runs the fp16 fast path (8-bit ints and fp8 byte rows, 4-bit ints along
    D). Other specs compile under rowfirst but keep 2-byte shared-memory traffic, so the tuner skips them."""
    return spec.axis != "chan" and not spec.is_float_storage and not spec.calibrated and (
        (spec.fmt == "int" and spec.bits in (4, 8)) or spec.fmt in ("fp8_e4m3", "fp8_e5m2"))


def triton_space(B: int, Hk: int, k_spec, v_spec, device=None, quick: bool = False) -> list[TritonDecodeConfig]:
    """Triton decode candidates: tile x warps (stages fixed by tile) at the auto split count; the fp16
    asm fast paths and the rowfirst layout where the spec has them; the KV-major orientation for 4-bit
    ints (full space only). quick: the two tiles of QUICK_TILES (2-4 candidates)."""
    S = auto_splits(B, Hk, device)
    tiles = QUICK_TILES if quick else TILES
    base = [TritonDecodeConfig(block_n=bn, num_warps=w, num_stages=st, num_splits=S, asm=False) for bn, w, st in tiles]
    cands = list(base)
    quant4 = any(s.fmt == "int" and s.bits == 4 and s.axis != "chan" and not s.calibrated for s in (k_spec, v_spec))
    if quant4:
        big = base[-1:] if quick else [c for c in base if c.block_n >= 64][:3]
        cands += [c.replace(asm=True) for c in big]
    if any(rowfirst_ok(s) for s in (k_spec, v_spec)):
        cands += [c.replace(asm=True, layout="rowfirst") for c in base if c.block_n in ((128,) if quick else (64, 128))
                  and c.num_warps == 4 and c.num_stages == 2]
    if quant4 and not quick:
        cands.append(TritonDecodeConfig(block_n=128, num_splits=S, asm=True, orient="kv"))
    return cands


def gluon_space(sch, B: int, Hq: int, Hk: int, D: int, P: int, device=None) -> list[GluonDecodeConfig]:
    """Gluon MMA-fragment candidates where that kernel runs this call, on GPUs whose compute capability it
    was verified on (or any with KVLAB_GLUON=1): O^T accumulated with 4 warps of 16 tokens (compiler's
    registers or capped at 128), 4 warps of 32 (uncapped, capped at 168, or at 128 without the register prefetch:
    offline on sm_90 the leanest loop that fits 128 registers for the 4-bit and 2-bit ints, q4_0 333 loop
    instructions a 16 tokens against 370 at 16-token tiles, benchmarks/NOTES_decode.md session 28), 8 warps of 32;
    and O = P V at 16 tokens capped at 168."""
    try:
        from .decode import gluon
    except ImportError:  # a Triton without the Gluon dialect
        return []
    if not (gluon.gpu_verified(device or "cuda", sch.k, sch.v) or os.environ.get("KVLAB_GLUON") == "1"):
        return []
    if gluon.unsupported(sch.k, sch.v, D, P, Hq // Hk, device or "cuda") is not None:
        return []
    S = auto_splits(B, Hk, device)
    grid = ((4, 16, None, True, None), (4, 16, 128, True, None), (4, 32, None, True, None), (4, 32, 168, True, None),
            (4, 32, 128, True, False), (8, 32, None, True, None), (4, 16, 168, False, None))
    return [GluonDecodeConfig(num_warps=w, tokens_per_warp=tw, num_splits=S, maxnreg=r, transpose_o=ot, prefetch=pf)
            for w, tw, r, ot, pf in grid
            if gluon.unsupported(sch.k, sch.v, D, P, Hq // Hk, device or "cuda", tw) is None]  # (channel-axis keys: 32)


def split_space(best, B: int, Hk: int, device=None) -> list:
    """Split counts around the best config's: half, three quarters, one and a half, double (the fractional
    steps let B * Hk * splits programs end on a whole wave); one split (no merge) too where B * Hk
    programs alone reach every SM. For the Gluon kernel with splits, also the best config with the split merge
    fused into its last program (one launch; it wins at few splits and short contexts, loses at many:
    sweeps/results/h200/runs/fused-f257f7d)."""
    base = best.num_splits
    outs = {max(1, base // 2), max(1, 3 * base // 4), min(128, -(-3 * base // 2)), min(128, base * 2)}
    if B * Hk >= num_sms(device):
        outs.add(1)
    cands = [best.replace(num_splits=s) for s in sorted(outs - {base})]
    if isinstance(best, GluonDecodeConfig) and base > 1:
        cands.append(best.replace(fused_merge=not best.fused_merge))
    return cands


def synthetic_cache(k_spec, v_spec, B: int, Hk: int, D: int, P: int, context: int, device="cuda", seed: int = 0):
    """A timing-only paged cache: random codes, constant finite scales, pages in random order.
    -> dict(k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_ts, v_ts)."""
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
        if pages.get("smooth") is not None:  # key smoothing factors (finite; their values do not change the time)
            pages["smooth"].fill_(1.0)
        out[f"{name}_pages"] = pages
        out[f"{name}_ts"] = torch.ones(1, device=device) if spec.needs_tensor_scale else None
    return out


def _bench(fn_of, cands, rep, warmup, verbose, graph=False):
    """[(median ms, config)] of the candidates that ran; fn_of(config) -> a zero-argument launcher."""
    import triton.testing
    res = []
    for cfg in cands:
        try:
            fn = fn_of(cfg)
            ms = (triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median") if graph else
                  triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
        except Exception as e:  # noqa: BLE001 - a config that does not compile or fit is skipped
            if verbose:
                print(f"tune: {cfg} failed: {type(e).__name__}: {str(e)[:200]}")
            continue
        if verbose:
            print(f"tune: {cfg} {ms:.4f} ms")
        res.append((ms, cfg))
    return res


def _default(op: str, B: int, Hk: int, device):
    if op == "decode":
        return TritonDecodeConfig(num_splits=auto_splits(B, Hk, device))
    return ExtendConfig() if op == "extend" else StoreConfig()


def tune(op: str, scheme, shape: dict, *, device="cuda", rep: int = 30, warmup: int = 5, save: bool = True,
         verbose: bool = False, candidates: list | None = None, search_splits: bool = True,
         quick: bool = False, graph: bool = True) -> tuple:
    """Best config for `op` ("decode", "extend" or "store") with `scheme` (name, text or KVScheme) at `shape`
    {"batch", "heads_q", "heads_kv", "head_dim", "page_size", "context" (timing only, not the key)}.

    decode: times the Triton space (and the Gluon one where verified), then splits around the best, by
    CUDA-graph replay as an engine runs a decode step (triton.testing.do_bench_cudagraph medians; graph=False:
    eager do_bench, which counts the launch and at small batches picks configs that lose under replay,
    sweeps/results/h200/README.md). store: the store kernel's candidates on a `context`-token write (K's
    spec), CUDA-graph replayed. The winner goes to the tuned-config store (a quick search never replaces a
    faster entry). extend keeps its default (no search yet). Returns (config, ms); on the CPU / under
    TRITON_INTERPRET=1 returns (default config, None) without timing."""
    if op not in OPS:
        raise ValueError(f"op={op!r}; allowed: {', '.join(map(repr, OPS))}")
    sch = as_scheme(scheme)
    B, Hq, Hk = int(shape["batch"]), int(shape["heads_q"]), int(shape["heads_kv"])
    D, P, ctx = int(shape["head_dim"]), int(shape["page_size"]), int(shape.get("context", 8192))
    if gpu_name() == "cpu" or op == "extend":
        return _default(op, B, Hk, device), None
    if op == "store":
        return _tune_store(sch.k, Hk, D, P, ctx, device, rep, save, verbose, candidates)
    from .decode import decode
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, ctx, device)
    q = torch.randn(B, Hq, D, device=device, dtype=torch.bfloat16)
    fp = dict(k_fp=None, v_fp=None, fp_len=None)
    if sch.window or sch.sink or sch.k.axis == "chan":
        W = max(sch.window + sch.sink, 1)
        fp = dict(k_fp=torch.randn(B, Hk, W, D, device=device, dtype=torch.bfloat16),
                  fp_len=torch.full((B,), W, dtype=torch.int32, device=device))
        fp["v_fp"] = torch.randn_like(fp["k_fp"])

    def launcher(cfg):  # planned: timing sees the kernels, not the Python checks
        return decode(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"],
                      sch.k, sch.v, P, **fp, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], config=cfg,
                      plan=True)

    cands = candidates or triton_space(B, Hk, sch.k, sch.v, device, quick=quick) + gluon_space(
        sch, B, Hq, Hk, D, P, device)
    res = _bench(launcher, cands, rep, warmup, verbose, graph=graph)
    if not res:
        raise RuntimeError(f"no decode config ran for {sch} at {shape}")
    best_ms, best = min(res, key=lambda r: r[0])
    if search_splits:
        res2 = _bench(launcher, split_space(best, B, Hk, device), rep, warmup, verbose, graph=graph)
        if res2 and min(r[0] for r in res2) < best_ms:
            best_ms, best = min(res2, key=lambda r: r[0])
    key = attention_key("decode", sch.k, sch.v, B, Hq, Hk, D, P)
    prev = measured_ms(key) if lookup(key, packaged=False) is not None else None  # the user's own file only
    if not (quick and prev is not None and prev <= best_ms):
        record(key, best, best_ms, save=save)
    return best, best_ms


def store_write(spec, tokens: int, Hk: int, D: int, P: int, device="cuda"):
    """A timing closure: fn(config=None) writes `tokens` (at most 32K) random bf16 tokens into fresh pages
    through the public store op and returns the backend that ran. Attributes: tokens, x, pages, page_size, slots,
    kw (static / tensor scales), bytes (bf16 read + every page tensor written). Channel-axis specs get pages of whole
    token groups."""
    from .store import store
    T = min(tokens, 32768)
    if spec.axis == "chan" and P % spec.group:
        P = spec.group * -(-P // spec.group)
    x = torch.randn(T, Hk, D, device=device, dtype=torch.bfloat16)
    pages = PageLayout(spec, D, P, Hk).allocate(-(-T // P), device)
    slots = torch.arange(T, device=device, dtype=torch.int64)
    kw = {"tensor_scale": torch.ones((), device=device)} if spec.tensor_scale else {}
    if spec.static_scale:
        kw["scale"] = torch.ones((), device=device)

    def fn(config=None):
        return store(x, pages, slots, spec, page_size=P, check_slots=False, config=config, **kw)
    fn.tokens, fn.x, fn.pages, fn.page_size, fn.slots, fn.kw = T, x, pages, P, slots, kw
    fn.bytes = x.numel() * 2 + sum(t.numel() * t.element_size() for t in pages.values() if t is not None)
    return fn


def store_candidates(spec, D: int, Hk: int) -> list:
    """The store tiles `tune("store", ...)` times for `spec` (the launched spec, `configs.store_kernel_spec`) at
    head_dim D: the kernel's candidates within its autotuner's bound (for callers above the kernel layer, such as the
    sweep's compile-ahead stage)."""
    from .configs import store_kernel_spec
    from .store import triton as store_triton
    return store_triton.candidates(store_kernel_spec(spec, D), D, Hk)


def _tune_store(spec, Hk: int, D: int, P: int, ctx: int, device, rep: int, save: bool, verbose: bool, candidates):
    from .configs import store_kernel_spec
    from .store import triton as store_triton
    write = store_write(spec, ctx, Hk, D, P, device)

    def launcher(cfg):
        write(cfg)  # compile outside the graph capture
        return lambda: write(cfg)
    kspec = store_kernel_spec(spec, D)  # the tiles the autotuner's bound keeps for the launched spec
    res = _bench(launcher, candidates or store_triton.candidates(kspec, D, Hk), rep, 0, verbose, graph=True)
    if not res:
        raise RuntimeError(f"no store config ran for {spec}")
    best_ms, best = min(res, key=lambda r: r[0])
    record(store_key(kspec, Hk, D, write.tokens), best, best_ms, save=save)
    return best, best_ms
