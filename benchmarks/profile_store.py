"""Three launches of the store kernel for Nsight Compute (a 32K-token prefill write, Hk 8, D 128).

    ncu --clock-control none -k regex:_store_kernel --launch-skip 2 --launch-count 1 \
        python3 benchmarks/profile_store.py q4_0 --block-rows 32        # on the H200 (device call)

`--block-rows` fixes BLOCK_R (a StoreConfig), so no autotuning launches precede the profiled one.
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scheme")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--block-rows", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test under TRITON_INTERPRET=1")
    ap.add_argument("--rare", type=int, default=1, help="0: compile without the rare exact fallbacks and their "
                    "per-element checks (`store.triton.RARE_PATHS`; timing and profiling only, not exact)")
    a = ap.parse_args()
    if not a.rare:
        import triton.language as tl
        from kvlab.kernels.store import triton as st
        st.RARE_PATHS = tl.constexpr(False)
    from kvlab.cache.layout import PageLayout
    from kvlab.kernels.configs import StoreConfig
    from kvlab.kernels.store import store
    from kvlab.spec import scheme
    spec = scheme(a.scheme).k
    T, Hk, D = a.tokens, 8, 128
    P = max(16, spec.group) if spec.axis == "chan" else 16  # channel-axis groups fill whole pages
    x = torch.randn(T, Hk, D, device=a.device, dtype=torch.bfloat16)
    pages = PageLayout(spec, D, P, Hk).allocate(-(-T // P), a.device)
    slots = torch.arange(T, device=a.device, dtype=torch.int64)
    kw = {"tensor_scale": torch.ones(1, device=a.device)} if spec.tensor_scale else {}
    for _ in range(3):
        store(x, pages, slots, spec, backend="triton", check_slots=False, config=StoreConfig(block_r=a.block_rows),
              **kw)
    if a.device == "cuda":
        torch.cuda.synchronize()
    nbytes = x.numel() * 2 + sum(t.numel() * t.element_size() for t in pages.values() if t is not None)
    print(f"profiled store {a.scheme} (rare paths {a.rare}): {T} tokens, BLOCK_R {a.block_rows}, {nbytes / 1e6:.1f} MB read + written")


if __name__ == "__main__":
    main()
