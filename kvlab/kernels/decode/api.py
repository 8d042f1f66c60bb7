"""Decode attention over a paged, quantized KV cache: input checks, config resolution, dispatch.

`decode(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size, ...)`
attends one query token per sequence to its quantized pages (CSR block table, FlashInfer style) plus
its full-precision tokens. Backends: `reference.py` (torch), `triton.py` (every spec family), `gluon.py`
(MMA fragments on CUDA: int2, 3, 4, 5, 6 and 8 (q5_0 / q5_1 included), fp8, fp4, codebooks, KIVI's channel-axis
keys; `gluon.unsupported` says why a spec is not; codecs in `gluon.GPU_UNTESTED` run only by an explicit config). This module alone chooses among them: an explicit config names its kernel; otherwise, in order, the tuned entry for this GPU and shape (the user's file, then
the configs shipped with kvlab), the entry tuned at the closest batch bucket (its split count re-derived; after the
Gluon default where few programs occupy the SMs, `candidates`), the Gluon kernel's default on a GPU it is verified
on, and the Triton default, each taken only if that backend's own `why_not` accepts the call. Never imports Triton at import time.
"""
from __future__ import annotations

import logging

from ..checks import check_out, check_prefix, check_query, check_sm_scale, need
from ..configs import GluonDecodeConfig, TritonDecodeConfig, auto_splits, config_from_dict
from ..env import num_sms
from ..key_fold import strip_key_fold
from ..tuned import attention_key, lookup, nearest

GLUON_DEFAULT = GluonDecodeConfig(num_warps=4, tokens_per_warp=32)  # the shape most tuned Gluon entries share
# (sequence, KV head) programs from which, up to the SM count, the untuned Gluon config is 8 warps at about one
# program an SM rather than GLUON_DEFAULT at `auto_splits` (~2-6 an SM). H100, B x 32K, D 128, same process
# (sweeps/results/h100/runs/s32h-c7aaa2d/heuristic_cells.txt), ms GLUON_DEFAULT -> 8 warps: Llama 3 70B's heads at B 8
# (64 programs, 5 -> 2 splits) kivi4 0.186 -> 0.141, nf4 0.211 -> 0.169, q4_1 0.176 -> 0.136, q8_0 0.241 -> 0.203,
# int3 0.172 -> 0.136, q4_0 0.125 -> 0.128; Qwen2.5 7B's at B 8 (32, 9 -> 4) kivi4 0.105 -> 0.078, mxfp4 0.116 ->
# 0.087, q4_0 0.070 -> 0.072; B 16, Hk 8 (128, 4 -> 1) q4_0 0.263 -> 0.232, nf4 0.346 -> 0.324, kivi2 0.210 -> 0.213.
# The H200's tuned B 8 entries pick the same for KIVI and the codebooks. Below 32 programs (B 1) the tuned entries
# keep 4 warps at ~2 programs an SM, so the rule stops there; other head dims are unmeasured and keep the old rule.
FEW_PROGRAMS = 32


def gluon_default(B: int, n_kv_heads: int, k_spec, device=None, v_spec=None, D: int = 128) -> GluonDecodeConfig:
    """The Gluon kernel's untuned config for a call: 32-token warp tiles (`GLUON_DEFAULT`), except 16-token ones where
    the (sequence, KV head) programs fill every SM before any split (B * Hk >= SMs) and the keys are not on the
    channel axis (those run 32-token tiles only) or int5 / int6 / groups of 16 (`_wide_tile`). There the kernel is
    issue-bound and the smaller tile keeps fewer registers per thread, so more warps stay resident: on the H200, q4_0
    at B 32 x 32K takes 123 registers at 16-token
    tiles against 200 at 32 (22% vs 12% achieved occupancy; 432 vs 503 us, ncu in benchmarks/NOTES_decode.md).
    At head_dim 256 (`v_spec`, `D` given), 16-token tiles also for values other than symmetric int4, int2 and lm2:
    their 32-token kernels spill (the tile of a thread's value fragments and codes outgrows 255 registers) and
    ran slower on the H200, e.g. q8_0 0.234 -> 0.163 ms, nf4 0.237 -> 0.186, lm3 0.368 -> 0.257 at B 32 x 8K, Hk 4,
    while q4_0 (0.115 vs 0.123) and a K lm3 / V lm2 pair kept 32 (sweeps/results/h200/runs/s15-ca78947/).
    At head_dim 128 with `FEW_PROGRAMS` to SMs - 1 programs before any split: 8 warps of 32 tokens and about one
    program an SM (splits = SMs // programs), every family (see `FEW_PROGRAMS` for the measurements)."""
    n, sms = B * n_kv_heads, num_sms(device)
    if few_programs(B, n_kv_heads, D, device):
        return GluonDecodeConfig(num_warps=8, tokens_per_warp=32, num_splits=max(1, sms // n))
    if k_spec.axis == "chan":
        return GLUON_DEFAULT
    if D >= 256 and v_spec is not None and not _light_values(v_spec):
        return GLUON_DEFAULT.replace(tokens_per_warp=16)
    if n >= sms and not _wide_tile(k_spec, v_spec):
        return GLUON_DEFAULT.replace(tokens_per_warp=16)
    return GLUON_DEFAULT


def _wide_tile(k_spec, v_spec) -> bool:
    """Specs whose untuned Gluon config keeps 32-token tiles where the programs fill the SMs: int5 / int6, and int4 or
    codebooks at groups of 16, on either side (fp4's groups of 16 keep the general rule). On an H100 at B 32 x 32K
    (Hq 32, Hk 8), 2 splits, ms 16 -> 32-token tiles: q5_0 0.695 -> 0.570, q5_1 0.645 -> 0.613, int5:g32:asym
    0.655 -> 0.606, int6:g32:sym 0.679 -> 0.634, int6:g32:asym 0.722 -> 0.683, int4:g16:sym 0.592 -> 0.545, nf4:g16
    0.690 -> 0.669 (sweeps/results/h100/runs/s34-6c13e71/np_cells.txt)."""
    return any(s is not None and s.axis == "tok" and ((s.fmt == "int" and s.bits in (5, 6)) or
                                                      (s.group == 16 and s.fmt != "fp4_e2m1"))
               for s in (k_spec, v_spec))


def _light_values(spec) -> bool:
    """Value specs whose 32-token Gluon tiles fit the registers at head_dim 256: symmetric int4, int2, lm2."""
    return (spec.fmt == "int" and (spec.bits == 2 or (spec.bits == 4 and spec.sym))) or spec.fmt == "lm2"

BACKENDS = ("triton", "reference")  # "triton": the Triton-family kernels (Triton or Gluon, by config)


def _kernel(name: str):
    """The backend module of a config's kernel (imported on first use)."""
    if name == "gluon":
        try:
            from . import gluon
        except ImportError as e:  # a Triton without the Gluon dialect
            raise ValueError(f"config kernel='gluon' needs Triton's Gluon dialect, which this Triton lacks ({e})") \
                from None
        return gluon
    from . import triton
    return triton


def _gluon_verified(device, k_spec=None, v_spec=None) -> bool:
    try:
        return _kernel("gluon").gpu_verified(device, k_spec, v_spec)
    except ValueError:
        return False


def tile_tokens(cfg, kv=None) -> int:
    """Paged tokens one split program takes per tile under `cfg`: warps x tokens per warp (Gluon); for Triton
    block_n, or a channel-axis spec's token group where that is larger (`kv`: the call's PagedKV, as the kernel
    widens its tile to whole groups)."""
    if isinstance(cfg, GluonDecodeConfig):
        return cfg.num_warps * cfg.tokens_per_warp
    groups = [] if kv is None else [s.group for s in (kv.k_spec, kv.v_spec) if s.axis == "chan"]
    return max([cfg.block_n] + groups)


def few_programs(B: int, n_kv_heads: int, D: int, device=None) -> bool:
    """True where the untuned Gluon config is the few-programs one (`FEW_PROGRAMS`): head_dim 128 and 32 to SMs - 1
    (sequence, KV head) programs before any split."""
    return D == 128 and FEW_PROGRAMS <= B * n_kv_heads < num_sms(device)


def candidates(key: str, B: int, n_kv_heads: int, D: int, k_spec, v_spec, device,
               gluon_ok: bool) -> list[tuple[str, object]]:
    """The untuned-call configs `resolve` tries, in order, as (source, config), sources from `SOURCES`: the tuned entry
    of `key`; else the closest tuned batch bucket's (`tuned.nearest`), except that in the few-programs regime
    (`few_programs`) the Gluon default goes first: on an H100 it beat another bucket's config for 12 of 17 schemes at
    B 16 (int3 by 20%; mxfp4 9% slower) and by 14-36% at B 8 for the keys with no B 8 entry (int4_had, lm2, lm3;
    sweeps/results/h100/runs/s32v-145fa37/); then the Gluon default (`gluon_ok`: a GPU it is verified on) and the
    Triton default."""
    tuned = lookup(key)
    gd = gluon_default(B, n_kv_heads, k_spec, device, v_spec, D) if gluon_ok else None
    few = gd is not None and few_programs(B, n_kv_heads, D, device)
    gd_src = "gluon few-programs default" if few else "gluon default"
    if tuned is not None:
        cands = [("tuned: user file" if lookup(key, packaged=False) is not None else "tuned: packaged", tuned)]
    else:
        cands = [("nearest batch bucket", c) for c in (nearest(key),) if c is not None]
        if few:
            cands.insert(0, (gd_src, gd))
    if gd is not None:
        cands.append((gd_src, gd))
    return cands + [("triton default", TritonDecodeConfig())]


SOURCES = ("explicit config", "tuned: user file", "tuned: packaged", "nearest batch bucket", "gluon few-programs default",
           "gluon default", "triton default")
_LAST: dict = {}     # `last_dispatch()`'s record of the latest call
_LOGGED: set = set()  # (key, source) pairs already logged at DEBUG


def last_dispatch() -> dict:
    """How the most recent `decode` / `resolve` call in this process chose its kernel: {"key": the tuned-store key
    (None for an explicit config), "source": one of `SOURCES`, "config": the typed config launched (splits set),
    "refused": [(source, config, reason)] for the candidates tried before it}. Empty before the first call. Also
    logged at DEBUG on the "kvlab.dispatch" logger, once per key and source."""
    return dict(_LAST)


def _record(key, source, cfg, refused) -> None:
    _LAST.clear()
    _LAST.update(key=key, source=source, config=cfg, refused=refused)
    if (key, source) not in _LOGGED:
        _LOGGED.add((key, source))
        logging.getLogger("kvlab.dispatch").debug("decode %s: %s %s%s", key, source, cfg,
                                                  "".join(f"; refused {s}: {w}" for s, _, w in refused))


def resolve(q, kv, config=None, num_splits: int | None = None, max_kv_len: int | None = None):
    """(backend module, typed config with num_splits set) for a checked call.

    config given (a typed config or its dict): its kernel must run the call, else ValueError with the
    kernel's reason. None: the first of the tuned entry, the closest tuned batch bucket, the Gluon default
    (on a GPU it is verified on) and the Triton default whose kernel runs the call. max_kv_len (a bound on every
    sequence's paged tokens): the split count, unless `num_splits` is given, is capped at the tiles that many tokens
    fill, so no split program is left without a tile (at Gemma 3's 512-token sliding layers the default 9 splits of
    128-token tiles left 5 of 9 programs empty: 0.020 ms against 0.014 at 4 splits, H200, benchmarks/NOTES_decode.md)."""
    B, Hq, D = q.shape
    refused = []
    if config is not None:
        key, source = None, "explicit config"
        cfg = config_from_dict("decode", config)
        mod = _kernel(cfg.kernel)
        why = mod.why_not(q, kv, cfg)
        need(why is None, f"config kernel={cfg.kernel!r} cannot run this call: {why}")
    else:
        key = attention_key("decode", kv.k_spec, kv.v_spec, B, Hq, kv.n_kv_heads, D, kv.page_size)
        cands = candidates(key, B, kv.n_kv_heads, D, kv.k_spec, kv.v_spec, q.device,
                           q.is_cuda and _gluon_verified(q.device, kv.k_spec, kv.v_spec))
        for source, cfg in cands:
            try:
                mod = _kernel(cfg.kernel)
            except ValueError as e:
                refused.append((source, cfg, str(e)))
                continue
            why = mod.why_not(q, kv, cfg)
            if why is None and cfg.kernel == "gluon":  # a tuned or nearest entry for codecs not yet GPU-tested
                why = mod.untested(kv.k_spec, kv.v_spec)
            if why is None:
                break
            refused.append((source, cfg, why))
        need(why is None, why)
    if num_splits is not None:
        cfg = cfg.replace(num_splits=num_splits)
    if cfg.num_splits is None:
        cfg = cfg.replace(num_splits=auto_splits(B, kv.n_kv_heads, q.device))
    if max_kv_len is not None and num_splits is None:
        cfg = cfg.replace(num_splits=max(1, min(cfg.num_splits, -(-max_kv_len // tile_tokens(cfg, kv)))))
    _record(key, source, cfg, refused)
    return mod, cfg


def decode(q, k_pages: dict, v_pages: dict, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size: int,
           *, k_fp=None, v_fp=None, fp_len=None, k_tensor_scale=None, v_tensor_scale=None, sm_scale=None,
           backend: str = "triton", num_splits: int | None = None, config=None, out=None, plan: bool = False,
           max_kv_len: int | None = None):
    """Paged decode attention over a quantized cache.

    q:                [B, Hq, D] float32/float16/bfloat16 (one new token per sequence)
    k_pages, v_pages: page dicts {"codes", "scales", "zeros"} laid out as `PageLayout(spec, D, page_size, Hk)`
                      (plus "codebook" for `cal` specs; "smooth" for a `smooth` K spec, whose pages and k_fp hold
                      k / smooth: q is multiplied by it here, exactly, and the backends see the plain spec; "perm"
                      for a `perm` K spec, whose pages and k_fp hold k[..., perm]: q is gathered alike)
    kv_indptr:        [B+1] int32/64, CSR offsets into kv_indices; kv_indices: page ids of every sequence, in order
    kv_last_page_len: [B] tokens used in each sequence's last page (1..page_size; ignored for 0 pages)
    k_spec, v_spec:   `KVQuantSpec` or spec text
    k_fp, v_fp:       [B, Hk, W, D] full-precision tokens (sinks, window, unfinished group); fp_len [B] used
    k/v_tensor_scale: per-tensor float (axis-tensor static scale or NVFP4's fp32 second-level scale)
    sm_scale:         softmax scale (default 1/sqrt(D)); num_splits: split-K count (default: config's, else auto)
    backend:          "triton" (the Triton or Gluon kernel, by config) or "reference" (torch float32)
    config:           a `TritonDecodeConfig` / `GluonDecodeConfig` or its dict (default: the tuned store's
                      entry for this GPU and shape, else the Triton default)
    out:              optional [B, Hq, D] tensor of q.dtype to write into (kernel backends)
    plan:             return a zero-argument callable that re-launches on the same buffers (q read in place
                      each call; checks and page views done once; CUDA-graph friendly)
    max_kv_len:       optional bound on every sequence's paged tokens in this call (and in every later call of a
                      plan: a sliding window, the longest context served): caps the split count (a config's too;
                      not an explicit num_splits) at the tiles that many tokens fill, so a sequence at the bound
                      leaves no split program without tokens; a longer sequence is still attended correctly, with
                      fewer splits than the bound allows
    Returns [B, Hq, D] in q.dtype: softmax(q K^T * sm_scale) V over all tokens of each sequence.
    """
    need(backend in BACKENDS, f"backend={backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    Hq, D = check_query(q, "B")
    q_in = q
    q, k_pages, k_spec, fold = strip_key_fold(q, k_pages, k_spec)
    kv = check_prefix(q, k_pages, v_pages, kv_indptr, kv_indices, kv_last_page_len, k_spec, v_spec, page_size,
                      k_fp, v_fp, fp_len, k_tensor_scale, v_tensor_scale, q.shape[0])
    sm_scale = check_sm_scale(sm_scale, D)
    need(num_splits is None or (isinstance(num_splits, int) and 1 <= num_splits <= 256),
         f"num_splits must be an int in 1..256, got {num_splits!r}")
    need(max_kv_len is None or (isinstance(max_kv_len, int) and not isinstance(max_kv_len, bool) and max_kv_len >= 1),
         f"max_kv_len must be an int >= 1 (a bound on each sequence's paged tokens) or None, got {max_kv_len!r}")
    check_out(out, q)
    if backend == "reference":
        from . import reference
        run = lambda: reference.run(q, kv, sm_scale)  # noqa: E731
    else:
        mod, cfg = resolve(q, kv, config, num_splits, max_kv_len)
        run = mod.run(q, kv, sm_scale, cfg, out=out, plan=plan)
        if not plan:
            return run
    if not plan:
        return run()
    if fold is None:
        return run
    refresh = fold.planned(q_in, q)

    def launch():  # q is read in place each call: its smoothed / permuted copy is refreshed first (fixed shapes)
        refresh()
        return run()
    return launch
