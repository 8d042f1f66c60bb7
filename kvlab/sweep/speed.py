"""The sweep's speed stage (GPU): tuned decode and store timings of one scheme at one shape.

Decode: `kvlab.kernels.autotune.tune` searches tiles / warps / stages / splits (the key holds no sequence
length), records the winner in the per-GPU tuned-config store, and returns its median time.
Store: a `context`-token (at most 32K) prefill write of K through the store op (do_bench median; a key with no
tuned tile is searched first by `tune("store", ...)`, recorded like decode's), and
the same write replayed from a CUDA graph (a ~30 us launch timed eagerly measures the host).
Bytes: `kvlab.eval.speed.kv_bytes` (decode reads) and the page bytes written plus bf16 read (store).

With several workers the executor first runs every speed cell with warm_only=True in parallel
(Triton compiles land in its on-disk cache), then times the cells one after another in a single
process, so no timed region shares the GPU with other work.
"""
from __future__ import annotations

import torch

from ..eval.speed import copy_bandwidth_tbps, fp_tokens_of, kv_bytes
from .cells import Skip


def _page(sch, P: int) -> int:
    """Page size used: channel-axis keys need pages holding whole token groups."""
    return sch.k.group * -(-P // sch.k.group) if sch.k.axis == "chan" and P % sch.k.group else P


def _store_fn(sch, shape: dict, device: str = "cuda"):
    """A `context`-token (at most 32K) prefill write of K through the public store op (autotune.store_write)."""
    from ..kernels.autotune import store_write
    return store_write(sch.k, shape["context"], shape["heads_kv"], shape["head_dim"], shape["page_size"], device)


def speed_cell(sch, shape: dict, ops=("decode", "store"), warm_only: bool = False, quick: bool = True) -> dict:
    """Tune and time `sch` at `shape`; quick: the tuner's quick space (2-4 configs, then 4 split
    counts around the best)."""
    import triton

    from ..kernels.autotune import tune
    from ..kernels.configs import store_kernel_spec
    from ..kernels.tuned import lookup, store_key
    if sch.k.pre_rope:
        raise Skip("the Triton decode kernel takes post-RoPE keys; pre-RoPE schemes run on the reference backend")
    if sch.overrides or sch.head_overrides:
        raise Skip("one layer's timing would be the base pair's alone: a scheme with per-layer or per-head specs is "
                   "timed over its layers by benchmarks/winners_decode.py")
    if warm_only:  # compile (Triton's disk cache) without timing: decode candidates and the store kernel
        if "decode" in ops:
            tune("decode", sch, {**shape, "page_size": _page(sch, shape["page_size"])}, rep=1, warmup=1,
                 save=False, quick=quick)
        if "store" in ops:  # the tiles `tune` will time where no tuned one exists (compiles only)
            fn = _store_fn(sch, shape)
            D, Hk = shape["head_dim"], shape["heads_kv"]
            if fn() == "triton" and lookup(store_key(store_kernel_spec(sch.k, D), Hk, D, fn.tokens)) is None:
                from ..kernels.autotune import store_candidates
                for c in store_candidates(sch.k, D, Hk):
                    try:
                        fn(c)
                    except Exception:  # noqa: BLE001 - `tune` skips a tile that does not run, as it will here
                        pass
        return {}
    out = {"gpu": torch.cuda.get_device_name(), "copy_tbps": copy_bandwidth_tbps()}
    B, L, Hk, D, P = shape["batch"], shape["context"], shape["heads_kv"], shape["head_dim"], shape["page_size"]
    if _page(sch, P) != P:
        P = out["page_size_used"] = _page(sch, P)
    if "decode" in ops:
        cfg, ms = tune("decode", sch, {**shape, "page_size": P}, quick=quick)
        nbytes = kv_bytes(sch, B, L, Hk, D, fp_tokens_of(sch))
        out.update(decode_ms=ms, decode_config=str(cfg), kv_bytes=nbytes, decode_tbps=nbytes / ms / 1e9,
                   decode_roofline_frac=(nbytes / (out["copy_tbps"] * 1e9)) / ms)
    if "store" in ops:
        fn = _store_fn(sch, shape)
        ran = fn()  # the backend that runs it (compiled outside the timing)
        key = store_key(store_kernel_spec(sch.k, D), Hk, D, fn.tokens)  # the spec the kernel is launched with
        if ran == "triton" and lookup(key) is None:  # no tuned tile: search the store's candidates (recorded)
            tune("store", sch, {**shape, "page_size": P}, rep=10)
        ms = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
        cfg = lookup(key)
        out.update(store_tokens=fn.tokens, store_ms=ms, store_gbps=fn.bytes / ms / 1e6,
                   store_config=str(cfg) if ran == "triton" else "torch reference")
        try:  # replayed from a CUDA graph: a ~30 us write is otherwise timed with the Python launch path
            gms = triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")
            out.update(store_graph_ms=gms, store_graph_gbps=fn.bytes / gms / 1e6,
                       store_graph_frac=fn.bytes / gms / 1e6 / (out["copy_tbps"] * 1e3))
        except Exception as e:  # noqa: BLE001 - reported beside the eager timing
            out["store_graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out
