"""The sweep's speed stage (GPU): autotuned decode and store timings of one scheme at one shape.

Decode: `kvlab.kernels.tuning.tune` searches tiles/warps/stages/splits (key without the sequence
length), records the winner in the per-GPU tuned-config cache, and returns its median time.
Store: a `context`-token prefill write through the store kernel (do_bench median).
Bytes: K+V payload and scales the kernel must read (decode) or read+write (store).

With several workers the executor first runs every speed cell with warm_only=True in parallel
(Triton compiles land in its on-disk cache), then times the cells one after another in a single
process, so no timed region shares the GPU with other work.
"""
from __future__ import annotations

import functools

import torch

from .stages import Skip

@functools.lru_cache(maxsize=1)
def copy_bandwidth_tbps() -> float:
    """Measured device-to-device copy bandwidth (read + write), TB/s."""
    import triton
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=50, return_mode="median")
    return 2 * n / ms / 1e9


def _page(sch, P: int) -> int:
    """Page size used: channel-axis keys need pages holding whole token groups."""
    return sch.k.group * -(-P // sch.k.group) if sch.k.axis == "chan" and P % sch.k.group else P


def kv_bytes(sch, batch: int, context: int, heads_kv: int, head_dim: int) -> float:
    """Bytes of K and V (codes + scales + zeros; fp window at 2 B) the decode reads once."""
    per_el = sch.bits_per_element(head_dim, context=context) / 8
    return 2 * per_el * batch * context * heads_kv * head_dim


def _store_fn(sch, shape: dict, device: str = "cuda"):
    """A closure writing a `context`-token (at most 32K) prefill of K through the store API;
    .tokens and .bytes (bf16 read + codes and scales written) ride along, and .kernel, the same
    write as one bare Triton launch (.kernel.bytes: what that launch reads and writes)."""
    from ..cache.layout import PageLayout
    from ..cache.paging import prerotate
    from ..kernels.store import store
    from ..kernels.store.triton import store_triton
    T, Hk, D, P = min(shape["context"], 32768), shape["heads_kv"], shape["head_dim"], _page(sch, shape["page_size"])
    x = torch.randn(T, Hk, D, device=device, dtype=torch.bfloat16)
    spec = sch.k
    pages = PageLayout(spec, D, P, Hk).allocate(-(-T // P), device)
    slots = torch.arange(T, device=device, dtype=torch.int64)
    kw = {"tensor_scale": torch.ones((), device=device)} if spec.tensor_scale else {}
    if spec.axis == "tensor" and spec.has_scale and not spec.is_float_storage:
        kw["scale"] = torch.ones((), device=device)

    def fn():
        return store(x, pages, slots, spec, page_size=P, check_slots=False, **kw)
    fn.tokens = T
    page_bytes = sum(t.numel() * t.element_size() for t in pages.values() if t is not None)
    fn.bytes = x.numel() * 2 + page_bytes
    xr, spec_r = prerotate(x, spec)  # what the kernel itself reads (float32 once rotated)
    kr = {k: v.reshape(1) for k, v in kw.items()}

    def kernel():  # the Triton launch alone: no input checks, no rotation (for graph-replayed timing)
        return store_triton(xr, pages, slots, spec_r, P, **kr)
    kernel.bytes = xr.numel() * xr.element_size() + page_bytes
    fn.kernel, fn.pages = kernel, pages
    return fn


def speed_cell(sch, shape: dict, ops=("decode", "store"), warm_only: bool = False, quick: bool = True) -> dict:
    """Tune and time `sch` at `shape`; quick: the tuner's quick space (2-4 configs, then 4 split
    counts around the best)."""
    import triton

    from ..kernels.tuning import tune
    if sch.k.pre_rope:
        raise Skip("the Triton decode kernel takes post-RoPE keys; pre-RoPE schemes run on the reference backend")
    if warm_only:  # compile (Triton's disk cache) without timing: decode candidates and the store kernel
        if "decode" in ops:
            tune("decode", sch, {**shape, "page_size": _page(sch, shape["page_size"])}, rep=1, warmup=1,
                 save=False, quick=quick)
        if "store" in ops:
            _store_fn(sch, shape)()
        return {}
    out = {"gpu": torch.cuda.get_device_name(), "copy_tbps": copy_bandwidth_tbps()}
    B, L, Hk, D, P = shape["batch"], shape["context"], shape["heads_kv"], shape["head_dim"], shape["page_size"]
    if _page(sch, P) != P:
        P = out["page_size_used"] = _page(sch, P)
    if "decode" in ops:
        cfg, ms = tune("decode", sch, {**shape, "page_size": P}, quick=quick)
        nbytes = kv_bytes(sch, B, L, Hk, D)
        out.update(decode_ms=ms, decode_config=str(cfg), kv_bytes=nbytes, decode_tbps=nbytes / ms / 1e9,
                   decode_roofline_frac=(nbytes / (out["copy_tbps"] * 1e9)) / ms)
    if "store" in ops:
        fn = _store_fn(sch, shape)
        ms = triton.testing.do_bench(fn, warmup=5, rep=30, return_mode="median")
        from ..kernels.store.api import supports_triton
        from ..kernels.store.triton import tuned_config
        ok, why = supports_triton(sch.k)
        out.update(store_tokens=fn.tokens, store_ms=ms, store_gbps=fn.bytes / ms / 1e6,  # Triton autotune: key
                   store_config=tuned_config() if ok else f"torch reference ({why})")  # without the token count
        if ok:  # the kernel alone, replayed from a CUDA graph: a ~30 us write is otherwise timed with the
            try:  # Python launch path (checks, autotuner dispatch) that the GPU waits on between launches
                fn.kernel()  # autotuned outside the capture
                gms = triton.testing.do_bench_cudagraph(fn.kernel, rep=30, return_mode="median")
                out.update(store_graph_ms=gms, store_graph_gbps=fn.kernel.bytes / gms / 1e6,
                           store_graph_frac=fn.kernel.bytes / gms / 1e6 / (out["copy_tbps"] * 1e3))
            except Exception as e:  # noqa: BLE001 - reported beside the eager timing
                out["store_graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return out
