"""Offline sm_90 compile of the store kernel (no GPU): registers, spills and the SASS instruction mix.

    python -m devtools.store_sass_offline q8_0 q4_0 bf16 kivi4 int4:g32:asym:rot=had [--block-rows 32] [--general] [--hot]

Reuses the decode tool's stub driver (devtools/sm90_offline.py): launches become compiles.
The store kernel has no main loop, so the counts are per thread for one program's tile
(BLOCK_R token rows x D elements, or for axis chan BLOCK_R channels x G tokens) over 32 x 4 warps:
`per element` = total / (tile elements / 128). The input is bf16 as the benchmark writes it; rotated
specs the kernel rotates itself (`fuses_rotation`) get it too, others the float32 rotated tokens (`prerotate`). Channel-axis specs get
pages of whole token groups. The counts are static (every instruction of the program once); rare exact
fallbacks (`RARE_PATHS` in the kernel: IEEE division, the full codebook search) are in them, and `--hot`
drops them to count what nearly every tile runs.
"""
from __future__ import annotations

import argparse
import collections
import os
import re

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--block-rows", type=int, default=32)
    ap.add_argument("--general", action="store_true", help="the general tile path, not the group-row one")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--fwht-in-place", type=int, default=1, help="0: the oracle's Hadamard stages instead of the "
                    "in-place ones (`store.triton.FWHT_IN_PLACE`)")
    ap.add_argument("--rare-reload", type=int, default=None, help="`store.triton.RARE_RELOAD` (0 / 1 / 2)")
    ap.add_argument("--chan-heads", action="store_true", help="channel rows over (head, channel) (`CHAN_HEADS`)")
    ap.add_argument("--chan-j", action="store_true", help="channel tiles loaded as [bytes, channels] (`CHAN_J`)")
    ap.add_argument("--chan-walk", action="store_true", help="channel-axis specs by the token walk (`store.triton_chan_walk`)")
    ap.add_argument("--row-walk", action="store_true", help="token-axis specs by the row walk (`store.triton_row_walk`)")
    ap.add_argument("--one", action="store_true", help="the walks in one launch (their exact paths inline)")
    ap.add_argument("--word-loop", action="store_true", help="the token walk's pass 2 a word at a time (`WORD_LOOP`)")
    ap.add_argument("--two", action="store_true", help="the two-pass store (`TWO_PASS`): main pass and fixup pass")
    ap.add_argument("--maxnreg", type=int, default=None, help="register cap per thread (spills show as LOCAL)")
    ap.add_argument("--dump", metavar="DIR", help="also write each kernel's SASS to DIR/<scheme>.sass")
    ap.add_argument("--hot", action="store_true", help="without the rare exact fallbacks (RARE_PATHS): the path "
                    "nearly every tile takes; wrong codes, for counting only")
    a = ap.parse_args()
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from kvlab.cache.layout import PageLayout
    from kvlab.cache.paging import prerotate
    from kvlab.kernels.configs import StoreConfig
    from kvlab.kernels.store import triton_chan_walk as chan_walk, triton_row_walk as row_walk
    from kvlab.kernels.store import triton as st
    from kvlab.spec import scheme

    from .sm90_offline import _StubDriver, resources, sass
    orig, kernels = JITFunction.run, []

    def run(self, *args, grid, warmup, **kw):
        k = orig(self, *args, grid=grid, warmup=True, **kw)
        kernels.append(k)
        return k
    driver.set_active(_StubDriver())
    JITFunction.run = run
    st.interpreting = chan_walk.interpreting = lambda: False  # compile for sm_90 instead of interpreting
    st._hw_fp8 = chan_walk._hw_fp8 = row_walk._hw_fp8 = lambda device: True  # as on an sm_90 GPU
    st.set_switches(FWHT_IN_PLACE=bool(a.fwht_in_place), CHAN_J=a.chan_j, CHAN_HEADS=a.chan_heads)
    if a.rare_reload is not None:
        st.set_switches(RARE_RELOAD=a.rare_reload)
    if a.two:
        st.TWO_PASS, st.TWO_PASS_MIN_TOKENS = True, 0
    if a.hot:
        st.set_switches(RARE_PATHS=False)
        chan_walk.RARE_PATHS = row_walk.RARE_PATHS = st.RARE_PATHS  # (imported by value there)
    D = 128
    for name in a.schemes:
        spec = scheme(name).k
        G = spec.group_size(D) if not spec.is_float_storage else D
        T, Hk = 64, 8
        P = max(16, G) if spec.axis == "chan" else 16
        x = torch.randn(T, Hk, D, dtype=torch.bfloat16)
        x, spec_r = (x, spec) if st.fuses_rotation(spec, D) else prerotate(x, spec)
        pages = PageLayout(spec_r, D, P, Hk).allocate(T // P, "cpu")
        kw = {"tensor_scale": torch.ones(1)} if spec.tensor_scale else {}
        if spec.static_scale:
            kw["scale"] = torch.ones(1)
        kernels.clear()
        if a.chan_walk:  # one program: G tokens x HB heads of channels, LANE_ELEMS channels a thread
            chan_walk.MAXNREG = a.maxnreg
            chan_walk.TWO_PASS_MIN_TOKENS = 10 ** 9 if a.one else 0
            chan_walk.WORD_LOOP = a.word_loop
            chan_walk.run(x, pages, torch.arange(T), spec_r, P)
            hb, a.warps = chan_walk.launch_shape(Hk, D)
            tile = G * hb * D
        elif a.row_walk:  # one program: 32 x WARPS groups, one a thread; two launches (main, fixup) unless --one
            row_walk.TWO_PASS_MIN_TOKENS = 10 ** 9 if a.one else 0
            row_walk.run(x, pages, torch.arange(T), spec_r, P, tensor_scale=kw.get("tensor_scale"))
            tile = 32 * row_walk.WARPS * (row_walk.piece(D, G, spec_r.fmt) if st.kernel_params(spec_r, D)["ROT"] else G)
            a.warps = row_walk.WARPS
        else:
            st.run(x, pages, torch.arange(T), spec_r, P, flat=not a.general,
                   config=StoreConfig(block_r=a.block_rows, num_warps=a.warps, maxnreg=a.maxnreg), **kw)
            tile = a.block_rows * (G if spec.axis == "chan" else D)
        for k in kernels:
            ops, text = collections.Counter(), sass(k)
            if a.dump:
                os.makedirs(a.dump, exist_ok=True)
                with open(os.path.join(a.dump, name.replace(":", "_") + ".sass"), "w") as f:
                    f.write(text)
                with open(os.path.join(a.dump, name.replace(":", "_") + ".ttgir"), "w") as f:
                    f.write(k.asm["ttgir"])
            for ln in text.splitlines():
                m = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.]+)?", ln)
                if m:
                    ops[m.group(1) + ((m.group(2) or "") if m.group(1) in ("LDG", "STG", "LDS", "STS") else "")] += 1
            total, per_el = sum(ops.values()), tile / (32 * a.warps)
            print(f"{name:12s} {resources(k).split(' CONSTANT')[0]} instrs/thread={total} "
                  f"per element={total / per_el:.1f} barriers={ops['BAR']} memory=[" + " ".join(
                      f"{o}:{c}" for o, c in sorted(ops.items()) if o[:3] in ("LDG", "STG", "LDS", "STS")) + "]  " + " ".join(f"{o}:{c}" for o, c in ops.most_common(14)))


if __name__ == "__main__":
    main()
