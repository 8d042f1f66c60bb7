"""Store kernel variants timed at fixed configs (no autotuning: seconds, not minutes, of compiles).

    python benchmarks/store_variants.py int2 nf4 lm2 --configs 16x4,32x4,32x4r64 [--packed 0|1] [--hw-rint 0|1]

A config is ROWSxWARPS, optionally rMAXNREG (a register cap per thread); for channel-axis specs also "walk" (the token
walk, `store.triton_chan_walk`, with its own launch shape), "walkL" (its pass 2 a word at a time), either with rMAXNREG; for
token-axis specs "roww" (the row walk, `store.triton_row_walk`: one group a thread, whatever its `worth` policy says).

--bound 0: the sorted brackets' rare check per element too. --lut 0: fixed codebooks by the bisection instead of the bin table. --two 0: the exact fallback inline (one launch) instead of the two-pass store. --rare 0: without the exact fallbacks of rare tiles (timing only). --packed 0: the group-row path's per-element loads instead of its word loads (`store.triton.PACKED_LOADS`). Prints one line
per scheme and config: graph-replayed median ms of a 32K-token write (Hk 8, D 128) and its fraction of the copy
bandwidth measured in the same process.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


POISON = 0xA5  # the page bytes before each config's first write (as the store tests poison theirs)
# (option, switch, default, help): the kernels' compile-time switches a variant sets (`store.triton.set_switches`)
CONSTEXPRS = [
    ("rare", "RARE_PATHS", 1, "0: compile without the exact fallbacks of rare tiles (codes may then differ "
     "from the oracle's: timing only)"),
    ("hw-rint", "HW_RINT", 1, "0: round-half-even int codes by the float path on the GPU too, not cvt.rni"),
    ("rare-reload", "RARE_RELOAD", 1, "the inline exact fallback's inputs: 0 kept live, 1 loaded again, 2 "
     "loaded and coded one element tile at a time"),
    ("fwht-in-place", "FWHT_IN_PLACE", 1, "0: the oracle's Hadamard stages (split / join / transpose) instead of "
     "the in-place pair exchange"),
    ("wide-lut", "WIDE_LUT", 1, "0: the group-row kernel's codebook bin and levels by three gathers, not one "
     "16-byte load"),
    ("chan-j", "CHAN_J", 0, "1: channel-axis element tiles loaded as [bytes, channels] and turned"),
    ("chan-heads", "CHAN_HEADS", 0, "1: channel-axis rows over (head, channel): a tile may span heads"),
    ("chan-t", "CHAN_T", 0, "1: channel-axis rows loaded as one [G, BLOCK_R] tile and transposed"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--configs", default="16x4,32x4")
    ap.add_argument("--packed", type=int, default=1)
    ap.add_argument("--lut", type=int, default=1, help="0: fixed codebooks bisect instead of their bin table "
                    "(`store.triton.BRACKET_LUT`)")
    ap.add_argument("--e2m1-pow2", type=int, default=1, help="0: e2m1 codes under an e8m0 scale (mxfp4) from the bin "
                    "table instead of by arithmetic (`store.triton.E2M1_POW2`)")
    ap.add_argument("--e2m1-arith", type=int, default=1, help="0: e2m1 codes under other scales (nvfp4) from the bin "
                    "table instead of by arithmetic (`store.triton.E2M1_ARITH`)")
    ap.add_argument("--bound", type=int, default=1, help="0: the sorted brackets' rare check per element as well, where "
                    "the group's scale bounds x (`store.triton.BOUND_CHECK`)")
    ap.add_argument("--two", type=int, default=1, help="0: the rare exact fallback inline instead of a second launch "
                    "(`store.triton.TWO_PASS`)")
    ap.add_argument("--gate", type=int, default=1, help="1: after timing, compare the pages the timed write left with "
                    "the CPU oracle's for the same tokens (bytes that differ; the variant's own compiled kernel)")
    for opt, name, default, text in CONSTEXPRS:
        ap.add_argument(f"--{opt}", type=int, default=default, help=f"{text} (`{name}`)")
    a = ap.parse_args()
    if a.chan_t and a.chan_j:
        ap.error("--chan-t and --chan-j are two loads of the same tiles: give one")
    import triton

    import kvlab
    from kvlab.kernels.autotune import store_write
    from kvlab.kernels.configs import StoreConfig
    from kvlab.kernels.store import triton_chan_walk as chan_walk, triton_row_walk as row_walk
    from kvlab.kernels.store import triton as st
    worth = row_walk.worth
    from run import SCHEMES, page_size
    st.PACKED_LOADS = bool(a.packed)
    st.TWO_PASS = bool(a.two)
    st.BRACKET_LUT = bool(a.lut)
    st.BOUND_CHECK = bool(a.bound)
    st.E2M1_POW2 = bool(a.e2m1_pow2)
    st.E2M1_ARITH = bool(a.e2m1_arith)
    vals = {name: getattr(a, opt.replace("-", "_")) for opt, name, _, _ in CONSTEXPRS}
    st.set_switches(**{k: v if k == "RARE_RELOAD" else bool(v) for k, v in vals.items()})  # before anything compiles
    flags = " ".join(f"{opt.replace('-', '_')}={vals[name]}" for opt, name, *_ in CONSTEXPRS)
    src = torch.empty(1 << 28, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = triton.testing.do_bench_cudagraph(lambda: dst.copy_(src), rep=20, return_mode="median")
    tbps = 2 * src.numel() / copy / 1e9
    for name in a.schemes:
        sch = kvlab.scheme(SCHEMES.get(name, name))
        w = store_write(sch.k, 32768, 8, 128, page_size(sch), "cuda")
        ref = _oracle_pages(w, sch.k) if a.gate else None
        for c in a.configs.split(","):
            row_walk.ENABLED = c == "roww"
            row_walk.worth = (lambda spec, D: True) if c == "roww" else worth
            if c == "roww":  # the token-axis row walk (config None: its own launch shape)
                cfg = None
                chan_walk.ENABLED = False
            elif c.startswith("walk"):  # the channel-axis token walk (config None: its own launch shape)
                head, _, nreg = c.partition("r")
                chan_walk.ENABLED, chan_walk.WORD_LOOP = True, head.endswith("L")
                chan_walk.MAXNREG = int(nreg) if nreg else None
                cfg = None
            else:
                br, _, rest = c.partition("x")  # ROWSxWARPS[rMAXNREG]
                nw, _, nreg = rest.partition("r")
                cfg = StoreConfig(block_r=int(br), num_warps=int(nw), maxnreg=int(nreg) if nreg else None)
                chan_walk.ENABLED = False
            for t in w.pages.values():  # poisoned first: a byte this config leaves unwritten cannot pass the gate
                if t is not None:
                    t.view(torch.uint8).fill_(POISON)
            w(cfg)
            ms = triton.testing.do_bench_cudagraph(lambda: w(cfg), rep=20, return_mode="median")
            gate = "" if ref is None else f"  gate {_bytes_differ(ref, w.pages)} bytes differ"
            print(f"variant packed={a.packed} two={a.two} lut={a.lut} e2m1_pow2={a.e2m1_pow2} e2m1_arith={a.e2m1_arith} bound={a.bound} {flags} {name:9s} {c:8s} {ms:.4f} ms  "
                  f"{w.bytes / ms / 1e9 / tbps:.3f} of copy{gate}", flush=True)


def _oracle_pages(w, spec) -> dict:
    """The CPU oracle's pages for the tokens of the timing closure `w` (`kvlab.kernels.autotune.store_write`)."""
    from kvlab.cache.layout import PageLayout
    from kvlab.kernels.store import store
    T, Hk, D = w.x.shape
    pages = PageLayout(spec, D, w.page_size, Hk).allocate(-(-T // w.page_size), "cpu")
    store(w.x.cpu(), pages, w.slots.cpu(), spec, page_size=w.page_size, check_slots=False, backend="reference",
          **{k: v.cpu() for k, v in w.kw.items()})
    return pages


def _bytes_differ(ref: dict, got: dict) -> int:
    """Bytes of the page tensors that differ (NaN payloads included: the store's contract is bytes)."""
    return sum(int((r.view(torch.uint8) != got[k].cpu().view(torch.uint8)).sum())
               for k, r in ref.items() if r is not None and got.get(k) is not None)


if __name__ == "__main__":
    main()
