"""Offline sm_90 compile of the store kernel (no GPU): registers, spills and the SASS instruction mix.

    python -m devtools.store_sass_offline q8_0 q4_0 bf16 [--block-rows 32]

Reuses the decode tool's stub driver (devtools/sm90_offline.py): launches become compiles.
The store kernel has no main loop, so the counts are per thread for BLOCK_R rows x D / (32 x 4 warps)
elements: instructions per element = total / (BLOCK_R * D / 128).
"""
from __future__ import annotations

import argparse
import collections
import re

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--block-rows", type=int, default=32)
    ap.add_argument("--general", action="store_true", help="the general tile path, not the group-row one")
    a = ap.parse_args()
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from kvlab.cache.layout import PageLayout
    from kvlab.kernels.store import triton as st
    from kvlab.kernels.configs import StoreConfig
    from kvlab.spec import scheme

    from .sm90_offline import _StubDriver, resources, sass
    orig, kernels = JITFunction.run, []

    def run(self, *args, grid, warmup, **kw):
        k = orig(self, *args, grid=grid, warmup=True, **kw)
        kernels.append(k)
        return k
    driver.set_active(_StubDriver())
    JITFunction.run = run
    st.interpreting = lambda: False  # compile for sm_90 instead of interpreting
    st._hw_fp8 = lambda device: True  # as on an sm_90 GPU
    D = 128
    for name in a.schemes:
        spec = scheme(name).k
        T, Hk, P = 64, 8, 16
        pages = PageLayout(spec, D, P, Hk).allocate(T // P, "cpu")
        kw = {"tensor_scale": torch.ones(1)} if spec.tensor_scale else {}
        kernels.clear()
        st.run(torch.randn(T, Hk, D, dtype=torch.bfloat16), pages, torch.arange(T), spec, P, flat=not a.general,
               config=StoreConfig(block_r=a.block_rows), **kw)
        for k in kernels:
            ops = collections.Counter()
            for ln in sass(k).splitlines():
                m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", ln)
                if m:
                    ops[m.group(1) + ((m.group(2) or "") if m.group(1) in ("LDG", "STG") else "")] += 1
            total, per_el = sum(ops.values()), a.block_rows * D / 128
            print(f"{name:12s} {resources(k).split(' CONSTANT')[0]} instrs/thread={total} "
                  f"per element={total / per_el:.1f}  " + " ".join(f"{o}:{c}" for o, c in ops.most_common(12)))


if __name__ == "__main__":
    main()
