"""`store`: check inputs, resolve the config, rotate if the spec rotates, dispatch to the Triton kernel
or the torch reference (through the Triton backend's own `why_not`). Neither Triton nor a backend is
imported until one runs.
"""
from __future__ import annotations

import os

import torch

from ...cache.layout import PageLayout
from ...cache.paging import prerotate
from ...quant.smoothing import unsmoothed
from ...spec import as_spec
from ..checks import FLOAT_DTYPES, INDEX_DTYPES, need
from ..configs import config_from_dict, fuses_rotation
from ..env import can_launch, interpreting
from ..tuned import lookup, record, store_key

BACKENDS = ("auto", "triton", "reference")


def supports_triton(spec) -> tuple[bool, str]:
    """(True, "") if the Triton store runs `spec`, else (False, why): the reference runs it instead."""
    from . import triton
    why = triton.why_not(as_spec(spec))
    return why is None, why or ""


def _static(name, v, device) -> torch.Tensor:
    need(isinstance(v, (float, int, torch.Tensor)), f"{name} must be a float or a 1-element tensor, got "
         f"{type(v).__name__}")
    t = torch.as_tensor(v, dtype=torch.float32).reshape(-1)
    need(t.numel() == 1, f"{name} must hold one value, got {t.numel()}")
    return t.to(device)


def check_pages(pages, spec, D: int, Hk: int, device, page_size: int | None) -> tuple[PageLayout, int]:
    """Validate `pages` against PageLayout; returns (layout, number of pages)."""
    need(isinstance(pages, dict) and isinstance(pages.get("codes"), torch.Tensor),
         "pages must be a dict with tensor 'codes' (and 'scales'/'zeros'), as PageLayout.allocate returns")
    codes = pages["codes"]
    need(codes.dim() >= 4, f"pages['codes'] must have rank 4 (rank 5 for axis chan), got shape {tuple(codes.shape)}")
    P = codes.shape[2] * (spec.group if spec.axis == "chan" else 1)
    need(page_size is None or page_size == P, f"page_size={page_size} but pages['codes'] holds {P} tokens per page")
    lay = PageLayout(spec, D, P, Hk)
    N = lay.check_pages(pages, device)
    for key in ("codes", "scales", "zeros"):
        t = pages.get(key)
        need(t is None or t.is_contiguous(), f"pages[{key!r}] must be contiguous")
    return lay, N


def _check_slots(slots: torch.Tensor, n_slots: int, G: int | None) -> None:
    lo, hi = int(slots.min()), int(slots.max())
    need(lo >= -1 and hi < n_slots, f"slot_mapping values must lie in [-1, {n_slots}) (-1 skips a token); got "
         f"[{lo}, {hi}]")
    if G:  # each run of G tokens fills one channel group: consecutive slots from a multiple of G
        s = slots.reshape(-1, G).to(torch.int64)
        run = (s[:, 0] % G == 0) & (s == s[:, :1] + torch.arange(G, device=s.device)).all(1)
        ok = run | (s == -1).all(1)
        need(bool(ok.all()), f"axis chan: each run of {G} tokens needs consecutive slots starting at a multiple of "
             f"{G} (or all -1)")


def store(x: torch.Tensor, pages: dict, slot_mapping: torch.Tensor, spec, *, page_size: int | None = None,
          scale=None, tensor_scale=None, backend: str = "auto", check_slots: bool = True, config=None) -> str:
    """Quantize new tokens and write them into a paged cache tensor; returns the backend that ran.

    x:            [T, Hk, D] float32 / float16 / bfloat16 (keys post-RoPE unless spec.pre_rope; for a `smooth`
                  spec, the keys as the cache stores them, already divided by pages["smooth"] / permuted by pages["perm"],
                  as `KVPool` does)
    pages:        {"codes", "scales", "zeros"} of `PageLayout(spec, D, P, Hk).allocate(N)`
    slot_mapping: [T] int64 or int32, slot = page * P + offset; -1 skips the token. Axis chan:
                  T is a multiple of the group G and every run of G tokens has consecutive slots
                  starting at a multiple of G (one channel group of one page).
    spec:         KVQuantSpec or spec text
    scale:        static scale of an axis-tensor spec (float32; the pool calibrates it)
    tensor_scale: NVFP4's fp32 second-level scale (specs with `ts`)
    backend:      "auto" (Triton on CUDA tensors, else the reference), "triton" (CUDA, or CPU under
                  TRITON_INTERPRET=1), "reference". Specs the kernel does not run (rule=mse: its
                  clipping-ratio search) go to the reference.
    check_slots:  verify slot ranges (one device sync); the pool, which builds slots itself, skips it.
    config:       a `StoreConfig` or its dict (default: the tuned store's entry, the user's file first, then the
                  package's; else, on a GPU, the family's default tile, `store.triton.default_config`: a first
                  write never waits for an autotuner. KVLAB_STORE_AUTOTUNE=1: Triton's autotuner picks one on a
                  key's first call instead, recorded in the tuned store for `export_configs`; `kvlab.tune(op=
                  "store")` searches and records one explicitly)

    Codes and scales equal `kvlab.quantize` of the same tokens bit for bit (NaN scales excepted:
    their NaN payload may differ; the group's codes are the oracle's).
    """
    need(backend in BACKENDS, f"backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    spec = as_spec(spec)
    for flag, key, what in ((spec.smooth, "smooth", "key smoothing factors"),
                            (spec.permute, "perm", "key channel permutation")):
        if flag:  # x is already divided / permuted: the codes are the plain spec's; the table stays beside the pages
            need(isinstance(pages, dict) and isinstance(pages.get(key), torch.Tensor), f"pages[{key!r}] (the "
                 f"layer's {what}) is required for spec {spec}")
    if spec.smooth or spec.permute:
        pages = {k: v for k, v in pages.items() if k not in ("smooth", "perm")}
        spec = unsmoothed(spec)
    need(isinstance(x, torch.Tensor) and x.dim() == 3, "x must be a tensor [T, Hk, D] (tokens, KV heads, head_dim)"
         f", got {tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    need(x.dtype in FLOAT_DTYPES, f"x dtype {x.dtype}; allowed: float32, float16, bfloat16")
    T, Hk, D = x.shape
    spec.check_head_dim(D)
    if spec.axis == "tensor" and not spec.is_float_storage:
        need(spec.fmt == "int" or spec.fmt.startswith("fp8"), f"axis tensor with {spec.fmt} needs a static codebook "
             "scale, which the store does not support; use axis tok, head or chan")
    need(spec.static_scale or scale is None, f"scale= is a static axis-tensor scale; spec {spec} does not take one")
    need(not spec.static_scale or scale is not None, f"spec {spec} (axis tensor) needs scale= (its calibrated static "
         "scale)")
    need(spec.tensor_scale or tensor_scale is None, f"tensor_scale= is NVFP4's second level; spec {spec} has none")
    need(not spec.tensor_scale or tensor_scale is not None, f"spec {spec} needs tensor_scale= (fp32, calibrated)")
    lay, N = check_pages(pages, spec, D, Hk, x.device, page_size)
    need(isinstance(slot_mapping, torch.Tensor) and slot_mapping.shape == (T,), f"slot_mapping must be a tensor [{T}]"
         f", got {tuple(slot_mapping.shape) if isinstance(slot_mapping, torch.Tensor) else type(slot_mapping)}")
    need(slot_mapping.dtype in INDEX_DTYPES, f"slot_mapping dtype {slot_mapping.dtype}; allowed: int64, int32")
    need(slot_mapping.device == x.device, f"slot_mapping is on {slot_mapping.device}, x on {x.device}")
    if spec.axis == "chan":
        need(T % spec.group == 0, f"axis chan stores whole groups of {spec.group} tokens; got {T} tokens")
    if check_slots and T:
        _check_slots(slot_mapping, N * lay.page_size, spec.group if spec.axis == "chan" else None)
    cfg = None if config is None else config_from_dict("store", config)
    s = _static("scale", scale, x.device) if scale is not None else None
    ts = _static("tensor_scale", tensor_scale, x.device) if tensor_scale is not None else None
    if backend == "auto":
        backend = "triton" if x.is_cuda else "reference"
    if backend == "triton":
        need(can_launch(x), "backend 'triton' needs CUDA tensors, or TRITON_INTERPRET=1 (set before importing "
             "triton) to run on the CPU")
        from . import triton
        backend = "triton" if triton.why_not(spec) is None else "reference"
    if backend == "triton":
        # rotated specs: the kernel rotates the tokens itself where it can (`fuses_rotation`), else they are
        # rotated here by the same fixed-order transform
        xr, spec_r = (x, spec) if fuses_rotation(spec, D) else prerotate(x, spec)
        walk = None if cfg is not None else walk_of(spec_r, D, pages)  # a given config is the group-row kernel's
        if walk == "chan_walk":  # KIVI keys by a token walk
            from . import triton_chan_walk
            triton_chan_walk.run(xr, pages, slot_mapping, spec_r, lay.page_size)
            return backend
        if walk == "row_walk":  # a group a thread
            from . import triton_row_walk
            triton_row_walk.run(xr, pages, slot_mapping, spec_r, lay.page_size, tensor_scale=ts)
            return backend
        key = store_key(spec_r, Hk, D, T)
        tuned = triton.run(xr, pages, slot_mapping, spec_r, lay.page_size, scale=s, tensor_scale=ts,
                           config=cfg or launch_config(spec_r, Hk, D, T))
        if tuned is not None:  # the autotuner's pick, kept for export_configs (not written to disk here)
            record(key, tuned, None, save=False)
        return backend
    from . import reference
    reference.run(x, pages, slot_mapping, spec, lay.page_size, scale=s, tensor_scale=ts)
    return backend


def walk_of(kernel_spec, D: int, pages: dict) -> str | None:
    """The walk kernel `store` runs for the launched spec (`configs.store_kernel_spec`) when no config is given:
    "chan_walk" (`triton_chan_walk`: channel-axis int keys) or "row_walk" (`triton_row_walk`: where its `worth` policy
    takes the spec), each only while switched on (ENABLED) and on word-aligned pages; else None (the group-row kernel,
    `store.triton`)."""
    from . import triton_chan_walk as chan_walk, triton_row_walk as row_walk
    if chan_walk.ENABLED and chan_walk.why_not(kernel_spec, D) is None and chan_walk.fits(pages):
        return "chan_walk"
    if (row_walk.ENABLED and row_walk.why_not(kernel_spec, D) is None and row_walk.worth(kernel_spec, D)
            and row_walk.fits(pages)):
        return "row_walk"
    return None


def store_autotunes() -> bool:
    """KVLAB_STORE_AUTOTUNE=1: a store key with no tuned entry is autotuned by Triton on its first call (a minute or
    so a key on the H200) instead of running `store.triton.default_config`."""
    return os.environ.get("KVLAB_STORE_AUTOTUNE", "0") == "1"


def launch_config(kernel_spec, Hk: int, D: int, tokens: int):
    """The config `store` launches the Triton kernel with for the launched spec (`configs.store_kernel_spec`) when the
    caller gives none: the tuned entry (the user's file, then the package's), else on a GPU the family's default tile
    (`store.triton.default_config`); None where the backend picks (Triton's autotuner with KVLAB_STORE_AUTOTUNE=1, the
    interpreter's small test tile)."""
    cfg = lookup(store_key(kernel_spec, Hk, D, tokens))
    if cfg is None and not interpreting() and not store_autotunes():
        from . import triton
        cfg = triton.default_config(kernel_spec, D, Hk)
    return cfg


def pool_store(x, pages, slots, spec, page_size, scale, tensor_scale) -> None:
    """The store as a `KVPool(store=...)` function: the Triton kernel where it runs the spec (CUDA tensors,
    or the CPU under TRITON_INTERPRET=1), else the reference; slots built by the pool are not re-checked."""
    store(x, pages, slots, spec, page_size=page_size, scale=scale, tensor_scale=tensor_scale,
          backend="triton" if can_launch(x) else "reference", check_slots=False)
