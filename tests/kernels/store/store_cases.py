"""Shared helpers of the store tests: build inputs, run one backend on poisoned pages, compare bytes."""
from __future__ import annotations

import torch

import kvlab
from kvlab.cache.layout import PageLayout
from kvlab.cache.paging import calibrate
from kvlab.kernels.store import store

DEV = "cuda" if torch.cuda.is_available() else "cpu"
POISON = 0xA5


def spec_of(text):
    return text if isinstance(text, kvlab.KVQuantSpec) else kvlab.scheme(text).k


def page_size_for(spec, P=16):
    return max(P, spec.group) if spec.axis == "chan" else P


def make_input(spec, T=17, Hk=2, D=64, P=16, n_pages=None, seed=0, scale=3.0, dtype=torch.float32):
    """(x [T, Hk, D], slots [T], page layout, static kwargs). Slots are a random permutation (tok) or
    whole shuffled channel groups (chan: T rounded up to a multiple of G)."""
    g = torch.Generator().manual_seed(seed)
    P = page_size_for(spec, P)
    if spec.axis == "chan":
        T = -(-T // spec.group) * spec.group
    n_pages = n_pages or (-(-T // P) + 2)
    x = (torch.randn(T, Hk, D, generator=g) * scale).to(dtype)
    if spec.axis == "chan":
        G = spec.group
        blocks = torch.randperm(n_pages * P // G, generator=g)[:T // G]
        slots = (blocks[:, None] * G + torch.arange(G)).reshape(-1)
    else:
        slots = torch.randperm(n_pages * P, generator=g)[:T]
    lay = PageLayout(spec, D, P, Hk)
    s, ts = calibrate(x, spec)
    kw = {}
    if s is not None:
        kw["scale"] = s
    if ts is not None:
        kw["tensor_scale"] = ts
    if spec.calibrated:  # levels fitted to this input: the store reads them from pages["codebook"]
        from kvlab.quant import fit_codebook
        xs = x.transpose(0, 1)
        kw["codebook"] = fit_codebook(xs[:, :xs.shape[1] // spec.group * spec.group] if spec.axis == "chan" else xs,
                                      spec)
    return x.to(DEV), slots.to(DEV), lay, n_pages, kw


def run_store(x, slots, lay, n_pages, spec, backend, **kw):
    """Pages (poisoned, then stored into) and the backend that ran. The reference always runs on the
    CPU: torch's CUDA division by a Python scalar multiplies by its reciprocal (not IEEE division),
    so only the CPU oracle is GGML-exact, and the kernel follows it."""
    dev = "cpu" if backend == "reference" else DEV
    x, slots = x.to(dev), slots.to(dev)
    kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    pages = lay.allocate(n_pages, dev)
    for t in pages.values():
        if t is not None:
            t.view(torch.uint8).fill_(POISON)
    cb = kw.pop("codebook", None)
    if cb is not None:
        from kvlab.cache.paging import codebook_table
        pages["codebook"].copy_(codebook_table(cb))
    used = store(x, pages, slots, spec, backend=backend, **kw)
    return pages, used


def as_bytes(pages) -> dict:
    return {k: (None if t is None else t.contiguous().view(torch.uint8).cpu().clone()) for k, t in pages.items()}


def assert_same_pages(a, b, msg=""):
    ba, bb = as_bytes(a), as_bytes(b)
    for key in ba:
        if ba[key] is None:
            assert bb[key] is None, f"{msg}: {key}"
            continue
        diff = (ba[key] != bb[key]).nonzero()
        assert diff.numel() == 0, f"{msg}: {key} differs at {diff.shape[0]} bytes, first at {diff[0].tolist()}"


def spec_id(text) -> str:
    return str(text).replace(":", "-").replace("=", "")
