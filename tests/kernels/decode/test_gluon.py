"""Gluon MMA-fragment decode (int4 sym / asym g32, q8_0 / int8 g32, fp8_e4m3; K and V codecs independent).

Gluon has no interpreter. On CPU: the kernel's own source runs through devtools/gluon_emu.py (torch
ops, a PTX interpreter for its asm) against the float32 reference, the asm strings are checked value
by value, and the kernel is compiled for sm_90 offline (no spills, no shared memory in the main loop).
On a GPU: the compiled kernel against the reference."""
from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from paged_cases import call_args, make_paged

import kvlab
from kvlab.kernels.decode import decode

gluon = pytest.importorskip("kvlab.kernels.decode.gluon", reason="this Triton has no Gluon dialect",
                            exc_type=ImportError)
from kvlab.kernels import autotune  # noqa: E402
from kvlab.kernels.checks import check_prefix  # noqa: E402
from kvlab.kernels.configs import GluonDecodeConfig  # noqa: E402
from kvlab.kernels.decode import gluon_codecs as gc  # noqa: E402

CUDA = torch.cuda.is_available()
GPU = pytest.mark.skipif(not CUDA, reason="Gluon kernels run on a CUDA GPU only (no interpreter)")
# the emulated kernel runs on CPU tensors; with splits, the Triton merge kernel runs on them too (interpreter)
EMU = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                         reason="emulated kernel + Triton merge on CPU tensors need TRITON_INTERPRET=1")
TOL = 2e-2  # fp16 MMA operands, fp32 accumulation (as the Triton fast paths)
SCHEMES = ["q4_0", "q8_0", "fp8_e4m3", "q4_1", "int4_had", "int4:g32:sym", "k=q8_0,v=q4_0", "k=fp8_e4m3,v=q8_0",
           "int8:g64:asym", "int4:g128:sym", "int4:g64:asym:pack=ggml", "int2:g32:asym", "int2:g64:sym:pack=ggml",
           "k=q4_0,v=int2:g32:asym", "mxfp4", "nvfp4", "k=nvfp4,v=q8_0", "nf4", "iq4nl",
           "k=iq4nl,v=nf4", "int3:g32:asym", "k=int3:g32:asym,v=q4_0", "lm2:rot=had", "k=lm4:rot=had,v=lm2:rot=had",
           "lm3:rot=had", "int3:g64:asym", "lm2:s=e4m3:rot=had", "k=lm3:s=e4m3:rot=had,v=lm2:s=e4m3:rot=had",
           "q5_0", "q5_1", "int5:g64:asym", "int6:g32:sym", "k=int6:g128:asym,v=q5_0", "int6:g32:sym:s=e4m3",
           "int4:g16:asym", "k=nf4:g16,v=int4:g16:sym"]


@pytest.mark.parametrize("codec,pack,G,D", [(c, p, G, D) for c in (gc.Q4, gc.Q4A) for p in ("ggml", "seq")
                                             for G in gc.GROUPS for D in gc.HEAD_DIMS if D // 4 <= G <= D]
                         + [(gc.I8, "ggml", 32, D) for D in (64, 128)] + [(gc.I8A, "seq", 64, 256)]
                         + [(gc.F8, "seq", D, D) for D in gc.HEAD_DIMS]  # no groups: G = D
                         + [(c, p, G, 128) for c in (gc.Q2, gc.Q2A) for p in ("ggml", "seq") for G in gc.GROUPS]
                         + [(gc.Q2A, "seq", 64, 256)] + [(c, "seq", 32, D) for c in gc.CHAN for D in gc.HEAD_DIMS]
                         + [(c, "seq", G, D) for c in gc.PLANE3 for G in gc.GROUPS for D in gc.HEAD_DIMS if G <= D]
                         + [(c, p, 32, 64) for c in (gc.Q2, gc.Q2A) for p in ("ggml", "seq")]
                         + [(c, "seq", G, D) for c in (gc.I5, gc.I6A) for G in gc.GROUPS for D in gc.HEAD_DIMS]
                         + [(gc.I5G, "ggml", 32, D) for D in gc.HEAD_DIMS]
                         + [(c, p, 16, D) for c in (gc.Q4, gc.CB) for p in ("ggml", "seq") for D in (64, 128)])
def test_channel_orders_are_permutations(codec, pack, G, D):
    k = gc.k_channel_order(codec, pack, G, D)
    assert sorted(k) == list(range(D))
    if codec == gc.Q4 and G == 32:  # keys by groups (C_Q4G): the same channels, each 16-deep slice in one group, and
        # the high nibbles at contraction bit 3 (whose query entries the kernel divides by 16)
        kg = gc.k_channel_order(gc.Q4G, pack, G, D)
        assert sorted(kg) == list(range(D))
        assert all(kg[kap] // 32 == kap // 32 for kap in range(D))
        low = [(c % 32) < 16 if pack == "ggml" else c % 2 == 0 for c in kg]
        assert all(low[kap] == (not (kap >> 3) & 1) for kap in range(D))
    if codec in gc.CHAN:  # thread r holds channels D / 4 r .. D / 4 (r + 1) - 1, in pairs (2 x, 2 x + 1)
        assert all(k[kap] // (D // 4) == (kap >> 1) & 3 and k[kap] % 2 == kap % 2 for kap in range(D))
        return
    v = gc.v_channel_order(codec, pack, G, D)
    assert sorted(v) == list(range(D))
    if codec in gc.PLANE3:  # a thread reads D / 8 value channels, D / 4 key channels in 16- or 32-channel runs
        assert all(v[n] // (D // 8) == n & 7 for n in range(D))
        assert all(k[kap] // (D // 4) == (kap >> 1) & 3 for kap in range(D))
        run = min(32, D // 4)  # a register pairs channels of one run (and so of one group)
        assert all(k[kap] // run == k[kap ^ 1] // run for kap in range(D))
    elif codec in gc.NIBP:  # a register pairs two channels of one group (words 2 u and 2 u + 1 of the thread-row)
        assert all(k[kap] // G == k[kap ^ 1] // G for kap in range(D))
        if D // 4 <= G:
            assert all(k[kap] // G == D // 4 * ((kap >> 1) & 3) // G for kap in range(D))
    elif D // 4 <= G:  # a thread (lane % 4 = r) reads one scale per key row: its channels lie in group (D / 4) r // G
        assert all(k[kap] // G == D // 4 * ((kap >> 1) & 3) // G for kap in range(D))
    # a thread (lane // 4 = g) reads one scale per value row: its channels lie in group (D / 8) g // G
    assert all(v[n] // G == D // 8 * (n & 7) // G for n in range(D))


def test_codec_of():
    names = ("q4_0", "int4:g128:sym", "q8_0", "int8:g64:sym", "fp8_e4m3", "q4_1", "int4:g64:asym", "int4_had",
             "int8:g32:asym")
    assert [gc.codec_of(kvlab.scheme(n).k) for n in names] == [gc.Q4, gc.Q4, gc.I8, gc.I8, gc.F8, gc.Q4A, gc.Q4A,
                                                               gc.Q4A, gc.I8A]
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("int2:g32:asym", "int2:g64:sym", "int2:g32:asym:pack=ggml")] == \
        [gc.Q2A, gc.Q2, gc.Q2A]
    assert gc.codec_of(kvlab.scheme("kivi2").v, "v") == gc.Q2A
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("kivi4", "kivi2", "int4:g64:chan:asym", "int3:g32:chan:asym")] == \
        [gc.KC4, gc.KC2, gc.KC4, gc.KC3]
    for n in ("kivi4", "int4:g32:chan:asym"):  # channel-axis codecs serve keys only
        assert gc.codec_of(kvlab.scheme(n).k, "v") is None
    # calibrated ints: channel-axis keys through the level table; the others run the Triton tiles
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("int2:g32:chan:asym:cal", "int3:g64:chan:asym:cal",
                                                     "int4:g32:chan:asym:cal")] == [gc.KT2, gc.KT3, gc.KT4]
    for n in ("int2:g32:chan:asym:cal", "int3:g32:chan:asym:cal", "int4:g32:chan:asym:cal"):
        assert gc.codec_of(kvlab.scheme(n).k, "v") is None, n
    for n in ("int2:g32:asym:cal", "int4:g32:cal", "int3:g32:chan:sym:cal"):
        assert gc.codec_of(kvlab.scheme(n).k) is None, n
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("mxfp4", "nvfp4", "fp4_e2m1:g32:s=e4m3")] == [gc.F4M, gc.F4N,
                                                                                                   gc.F4N]
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("nf4", "iq4nl", "lm4:rot=had", "nf4:g32:pack=ggml")] == [gc.CB] * 4
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("int3:g32:asym", "int3:g32:sym", "int3:g64:asym")] == \
        [gc.I3A, gc.I3, gc.I3A]
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("lm3", "lm3:g32:rot=had", "lm3:g128:cal")] == [gc.CB3] * 3
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("lm2", "lm2:g32:rot=had", "lm2:g128:pack=ggml", "lm2:cal")] == \
        [gc.CB2] * 4
    assert gc.codec_of(kvlab.scheme("lm2:g16").k) is None and gc.codec_of(kvlab.scheme("lm2:s=bf16").k) is None
    # e4m3 group scales (bytes converted in the loaders) for the codebooks and the symmetric int codecs
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("lm2:s=e4m3:rot=had", "lm3:s=e4m3", "nf4:s=e4m3",
                                                     "int4:g32:sym:s=e4m3", "int2:g32:sym:s=e4m3")] == \
        [gc.CB2, gc.CB3, gc.CB, gc.Q4, gc.Q2]
    assert [gc.scale_code(kvlab.scheme(n).k) for n in ("q4_0", "mxfp4", "nvfp4", "lm2:s=e4m3")] == [0, 1, 2, 2]
    assert gc.codec_of(kvlab.scheme("lm2:s=e8m0").k) is None  # e8m0 scales: the fp4 codec only
    # int5 / int6: sequential planes at groups 32-128, GGML's q5 blocks at groups of 32
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("int5:g32:sym", "int5:g64:asym", "int6:g128:sym", "int6:g32:asym",
                                                     "q5_0", "q5_1", "int5:g32:sym:s=e4m3")] == \
        [gc.I5, gc.I5A, gc.I6, gc.I6A, gc.I5G, gc.I5GA, gc.I5]
    # groups of 16: int4 and 16-entry codebooks (a scale per code word, as fp4's)
    assert [gc.codec_of(kvlab.scheme(n).k) for n in ("int4:g16:sym", "int4:g16:asym:pack=ggml", "nf4:g16",
                                                     "iq4nl:g16:s=e4m3")] == [gc.Q4, gc.Q4A, gc.CB, gc.CB]
    for n in ("int8:g16:asym", "fp8_e5m2", "bf16", "int3:g16:asym", "int2:g16:sym", "int4:g32:chan:sym",
              "int3:g32:asym:pack=ggml", "int5:g64:asym:pack=ggml", "int6:g32:sym:pack=ggml", "int5:g16:asym",
              "freetoken:q6_0", "int6:g32:sym:s=bf16",
              "lm3:g16", "lm3:s=bf16", "nf4:g64:s=bf16",
              "fp4_e2m1:g8", "fp4_e2m1:g32:s=f16",
              "int3:g32:chan:sym", "int4:g16:chan:asym",
              "int4:g32:asym:s=bf16", "int4:head:asym"):
        assert gc.codec_of(kvlab.scheme(n).k) is None, n


def _sm90_offline(*args) -> tuple[str, str]:
    """(resources + loop mix line, shared-memory ops line) of `devtools.sm90_offline` on one Gluon scheme, main loop
    only (--no-fp), in a subprocess without TRITON_INTERPRET (this session's jit helpers were built for the
    interpreter); skips where the Triton wheel has no ptxas."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-m", "devtools.sm90_offline", *args, "--top", "60", "--no-fp"],
                       capture_output=True, text=True, env=env, timeout=300)
    if "ptxas" in p.stderr and "No such file" in p.stderr:
        pytest.skip("this Triton wheel has no ptxas")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("gluon:") or "smem ops:" in ln]
    assert p.returncode == 0 and len(lines) == 2, p.stdout[-2000:] + p.stderr[-3000:]
    return lines[0], lines[1]


@pytest.mark.parametrize("scheme,D,tw", [("q4_0", 128, 16), ("q8_0", 128, 16), ("fp8_e4m3", 128, 16), ("q4_0", 64, 16),
                                         ("int4:g64:sym", 256, 16), ("int2:g32:asym", 128, 16), ("kivi4", 128, 32),
                                         ("kivi2", 128, 32), ("mxfp4", 128, 16), ("nvfp4", 128, 16),
                                         ("nf4", 128, 16), ("iq4nl", 128, 16), ("int3:g32:asym", 128, 16),
                                         ("lm2", 128, 16), ("lm2", 64, 16), ("lm2:s=e4m3", 64, 16),
                                         ("lm3", 128, 16), ("lm3", 64, 16),
                                         ("int3:g32:asym", 64, 16), ("int3:g32:asym", 256, 16), ("lm3", 256, 16),
                                         ("k=int3:g32:chan:asym,v=lm2", 128, 32), ("k=int3:g32:chan:asym,v=lm3", 64, 32)])
def test_compiles_for_sm90_without_shared_memory_in_the_loop(scheme, D, tw):
    """Offline sm_90 compile (stub driver, Triton's ptxas / cuobjdump) in a subprocess without
    TRITON_INTERPRET (this session's jit helpers were built for the interpreter). The main loop only (no
    full-precision buffers): channel-axis keys put their K^T fragments in place by register moves."""
    head, smem = _sm90_offline(f"gluon:{scheme}", "--head-dim", str(D), "--tw", str(tw), "--page", "32")
    assert "STACK:0" in head and "LOCAL:0" in head, f"spills: {head}"
    ops = dict(re.findall(r"([A-Z][A-Z0-9_]*):(\d+)", head.split("loop_instrs=")[1]))
    assert int(re.search(r"loop_instrs=(\d+)", head).group(1)) > 100
    # mma.m16n8k16 per 16 tokens per warp: 2 x D / 16 for the scores, D / 16 for V^T P^T (8 head columns: GQA 4)
    assert int(ops.get("HMMA", 0)) == 3 * D // 16 * tw // 16, head
    assert smem.split("smem ops:")[1].strip() == "", f"shared-memory instructions in the main loop: {smem}"


def test_gluon_default_tiles(monkeypatch):
    """The untuned Gluon config: 16-token tiles once the (sequence, KV head) programs fill the SMs, 32-token tiles
    below that and always for channel-axis keys (which run only those)."""
    from kvlab.kernels.decode import api as dapi
    monkeypatch.setattr(dapi, "num_sms", lambda device=None: 132)
    q4, kv4 = kvlab.scheme("q4_0"), kvlab.scheme("kivi4")
    assert dapi.gluon_default(32, 8, q4.k).tokens_per_warp == 16        # 256 programs >= 132 SMs
    assert dapi.gluon_default(32, 3, q4.k).tokens_per_warp == 32        # 96 programs: splits fill the GPU
    assert dapi.gluon_default(1, 8, q4.k).tokens_per_warp == 32
    assert dapi.gluon_default(64, 8, kv4.k).tokens_per_warp == 32       # channel-axis keys: 32-token tiles only
    assert dapi.gluon_default(32, 8, q4.k).replace(tokens_per_warp=32) == dapi.GLUON_DEFAULT
    assert "tokens_per_warp" in gluon.unsupported(kv4.k, kv4.v, 128, 32, 4, "cpu", 16)
    for B, Hk, sch in ((32, 8, q4), (1, 8, q4), (64, 8, kv4)):
        why = gluon.unsupported(sch.k, sch.v, 128, 32, 4, "cpu", dapi.gluon_default(B, Hk, sch.k).tokens_per_warp)
        assert "tokens_per_warp" not in why and "needs a CUDA GPU" in why  # no pick is refused for its tiles
    # head_dim 256 at 32 programs: 16-token tiles unless the values are light (their 32-token kernels fit the registers)
    tw = {n: dapi.gluon_default(32, 1, kvlab.scheme(n).k, None, kvlab.scheme(n).v, 256).tokens_per_warp
          for n in ("q4_0", "q8_0", "nf4", "q4_1", "lm3:rot=had", "k=lm3:s=e4m3:rot=had,v=lm2:s=e4m3:rot=had",
                    "int2:g32:asym", "kivi4")}
    assert tw == {"q4_0": 32, "q8_0": 16, "nf4": 16, "q4_1": 16, "lm3:rot=had": 16,
                  "k=lm3:s=e4m3:rot=had,v=lm2:s=e4m3:rot=had": 32, "int2:g32:asym": 32, "kivi4": 32}
    assert dapi.gluon_default(32, 1, q4.k, None, kvlab.scheme("q8_0").v, 128).tokens_per_warp == 32  # D 128: as before
    # int5 / int6 and int4 / codebooks at groups of 16 keep 32-token tiles where the programs fill the SMs (H100: 3-18%
    # faster, sweeps/results/h100/runs/s34-6c13e71/); fp4's groups of 16 keep the rule; head_dim 256's spill rule first
    wide = {n: dapi.gluon_default(32, 8, kvlab.scheme(n).k, None, kvlab.scheme(n).v, 128).tokens_per_warp
            for n in ("q5_0", "int6:g32:asym", "k=q4_0,v=int5:g64:sym", "int4:g16:sym", "nf4:g16", "nvfp4", "q4_1")}
    assert wide == {"q5_0": 32, "int6:g32:asym": 32, "k=q4_0,v=int5:g64:sym": 32, "int4:g16:sym": 32, "nf4:g16": 32,
                    "nvfp4": 16, "q4_1": 16}
    assert dapi.gluon_default(32, 1, kvlab.scheme("q5_0").k, None, kvlab.scheme("q5_0").v, 256).tokens_per_warp == 16


def test_gluon_default_few_programs(monkeypatch):
    """At head_dim 128 with `FEW_PROGRAMS` .. SMs - 1 (sequence, KV head) programs: 8 warps of 32 tokens at about one
    program an SM, channel-axis keys included; B 1 (8 programs), a full GPU and other head dims keep their rules."""
    from kvlab.kernels.decode import api as dapi
    monkeypatch.setattr(dapi, "num_sms", lambda device=None: 132)
    q4, kv4 = kvlab.scheme("q4_0"), kvlab.scheme("kivi4")
    shape = lambda c: (c.num_warps, c.tokens_per_warp, c.num_splits)  # noqa: E731
    assert shape(dapi.gluon_default(8, 8, q4.k)) == (8, 32, 2)            # 64 programs x 2 = 128 <= 132
    assert shape(dapi.gluon_default(8, 4, kv4.k)) == (8, 32, 4)           # 32 x 4
    assert shape(dapi.gluon_default(16, 8, q4.k)) == (8, 32, 1)           # 128
    assert shape(dapi.gluon_default(32, 3, q4.k)) == (8, 32, 1)           # 96
    assert dapi.gluon_default(1, 8, q4.k) == dapi.GLUON_DEFAULT           # 8 < FEW_PROGRAMS
    assert dapi.gluon_default(3, 8, q4.k) == dapi.GLUON_DEFAULT           # 24
    assert shape(dapi.gluon_default(17, 8, q4.k)) == (4, 16, None)        # 136 >= 132: the full-GPU rule
    assert dapi.gluon_default(8, 8, q4.k, None, q4.v, 64) == dapi.GLUON_DEFAULT  # other head dims: unmeasured
    assert dapi.gluon_default(8, 8, q4.k, None, kvlab.scheme("q8_0").v, 256).tokens_per_warp == 16
    for B, Hk, sch in ((8, 8, q4), (8, 4, kv4)):  # no pick is refused for its tiles
        why = gluon.unsupported(sch.k, sch.v, 128, 32, 4, "cpu", dapi.gluon_default(B, Hk, sch.k).tokens_per_warp)
        assert "tokens_per_warp" not in why and "needs a CUDA GPU" in why


def test_untuned_candidates_order(monkeypatch):
    """`api.candidates`: the key's own entry alone before the defaults; without one, the nearest bucket's config
    before the defaults, except where few programs occupy the SMs (the Gluon default goes first there)."""
    from kvlab.kernels.configs import TritonDecodeConfig
    from kvlab.kernels.decode import api as dapi
    monkeypatch.setattr(dapi, "num_sms", lambda device=None: 132)
    q4 = kvlab.scheme("q4_0")
    mine = GluonDecodeConfig(num_warps=4, tokens_per_warp=16, num_splits=3)
    near = GluonDecodeConfig(num_warps=2, tokens_per_warp=16)  # what the closest bucket's entry would give
    entries = {}
    configs = lambda *a: [c for _, c in dapi.candidates(*a)]  # noqa: E731
    monkeypatch.setattr(dapi, "lookup", lambda key, packaged=True: entries.get(key))
    monkeypatch.setattr(dapi, "nearest", lambda key: near)
    few = dapi.gluon_default(8, 8, q4.k)
    assert (few.num_warps, few.num_splits) == (8, 2)
    assert configs("k", 8, 8, 128, q4.k, q4.v, None, True) == [few, near, few, TritonDecodeConfig()]
    assert configs("k", 32, 8, 128, q4.k, q4.v, None, True)[0] == near  # a full GPU: nearest first
    assert configs("k", 1, 8, 128, q4.k, q4.v, None, True)[0] == near   # B 1: 8 programs
    assert configs("k", 8, 8, 64, q4.k, q4.v, None, True)[0] == near    # other head dims
    assert configs("k", 8, 8, 128, q4.k, q4.v, None, False) == [near, TritonDecodeConfig()]  # no Gluon
    entries["k"] = mine
    assert configs("k", 8, 8, 128, q4.k, q4.v, None, True)[0] == mine   # the key's entry always first
    assert [s for s, _ in dapi.candidates("k", 8, 8, 128, q4.k, q4.v, None, True)] == [
        "tuned: user file", "gluon few-programs default", "triton default"]
    del entries["k"]
    assert [s for s, _ in dapi.candidates("k", 32, 8, 128, q4.k, q4.v, None, True)] == [
        "nearest batch bucket", "gluon default", "triton default"]
    assert dapi.few_programs(8, 8, 128) and not dapi.few_programs(8, 8, 256) and not dapi.few_programs(3, 8, 128)


def test_gluon_config_rejects_other_schemes():
    sch = kvlab.scheme("int5:g16:asym")
    dev = "cuda" if CUDA else "cpu"
    c = make_paged([20], 2, 128, 16, sch.k, sch.v, device=dev)
    q = torch.randn(1, 8, 128, device=dev)
    args, kw = call_args(c)
    with pytest.raises(ValueError, match="kernel='gluon' cannot run this call: K spec .* has no Gluon codec"):
        decode(q, *args, sch.k, sch.v, 16, **kw, config={"kernel": "gluon"})
    with pytest.raises(ValueError, match="config kernel='cuda' for 'decode'; allowed: 'triton', 'gluon'"):
        decode(q, *args, sch.k, sch.v, 16, **kw, config={"kernel": "cuda"})


def test_unsupported_names_each_limit():
    s = kvlab.scheme("q4_0")
    assert "head_dim must be one of (64, 128, 256)" in gluon.unsupported(s.k, s.v, 96, 16, 4, "cpu")
    assert "page size must be a multiple of 16" in gluon.unsupported(s.k, s.v, 128, 8, 4, "cpu")
    assert "GQA group must be <= 16" in gluon.unsupported(s.k, s.v, 128, 16, 32, "cpu")
    assert "CUDA GPU" in gluon.unsupported(s.k, s.v, 128, 16, 4, "cpu")
    h = kvlab.scheme("k=q4_0,v=int5:g16:asym")
    assert "V spec" in gluon.unsupported(h.k, h.v, 128, 16, 4, "cpu")
    i3 = kvlab.scheme("int3:g32:asym")
    assert "CUDA GPU" in gluon.unsupported(i3.k, i3.v, 128, 16, 4, "cpu")
    assert "CUDA GPU" in gluon.unsupported(i3.k, i3.v, 64, 16, 4, "cpu")  # D 64: a key thread-row is half a group
    assert "V groups of 32 channels at head_dim 512" not in (gluon.unsupported(i3.k, i3.v, 512, 16, 4, "cpu") or "")
    assert "CUDA GPU" in gluon.unsupported(i3.k, i3.v, 256, 16, 4, "cpu")  # D 256: keys read a scale per word
    i2 = kvlab.scheme("int2:g32:asym")  # a value thread-row of 8 int2 channels is half a word: it runs
    assert "CUDA GPU" in gluon.unsupported(i2.k, i2.v, 64, 16, 4, "cpu")
    kv4 = kvlab.scheme("kivi4")
    assert "tokens_per_warp=32, got 16" in gluon.unsupported(kv4.k, kv4.v, 128, 32, 4, "cpu", 16)
    assert "CUDA GPU" in gluon.unsupported(kv4.k, kv4.v, 128, 32, 4, "cpu", 32)
    assert "V spec" in gluon.unsupported(kv4.k, kv4.k, 128, 32, 4, "cpu")
    nv = kvlab.scheme("nvfp4")  # groups of 16: keys and (fp4) values take a scale per code word where they span groups
    assert "CUDA GPU" in gluon.unsupported(nv.k, nv.v, 128, 16, 4, "cpu")
    assert "CUDA GPU" in gluon.unsupported(nv.k, nv.v, 256, 16, 4, "cpu")
    iq = kvlab.scheme("iq4nl")  # keys: a scale per word; values at D 256: 32 channels per thread, one group of 32
    assert "CUDA GPU" in gluon.unsupported(iq.k, iq.v, 256, 16, 4, "cpu")
    assert "V groups of 32 channels at head_dim 512" not in (gluon.unsupported(iq.k, iq.v, 512, 16, 4, "cpu") or "")
    q4 = kvlab.scheme("q4_0")  # keys of every grouped codec take a scale per word at D 256
    assert "CUDA GPU" in gluon.unsupported(q4.k, q4.v, 256, 16, 4, "cpu")
    n4 = kvlab.scheme("k=q8_0,v=nf4:g16")  # groups of 16 at D 256: int4 sym and codebook values read a scale per
    assert "CUDA GPU" in gluon.unsupported(n4.k, n4.v, 256, 16, 4, "cpu")  # code word as fp4's; int4 asym values do not
    a16 = kvlab.scheme("k=q8_0,v=int4:g16:asym")
    assert "V groups of 16 channels at head_dim 256" in gluon.unsupported(a16.k, a16.v, 256, 16, 4, "cpu")
    assert "CUDA GPU" in gluon.unsupported(a16.k, a16.v, 128, 16, 4, "cpu")
    assert "CUDA GPU" in gluon.unsupported(a16.v, a16.k, 256, 16, 4, "cpu")  # as keys: a scale and zero per word


# ---- the PTX strings, run by the emulator's interpreter ------------------------------------------------------
RNG = np.random.default_rng(0)
W = RNG.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32)
WB = RNG.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32)
S = (RNG.standard_normal(256) * 0.05).astype(np.float16)
SR = S[::-1].copy()


def _bits(x):
    return x.view(np.uint16).astype(np.uint32)


def _f16(r):
    return (r & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)


def _want(code, sc):
    return (code.astype(np.float32) * sc.astype(np.float32)).astype(np.float16).astype(np.float32)


def _byte(w, k):
    return (w >> (8 * k)) & 0xFF


def _e4m3(b):
    return torch.from_numpy(b.astype(np.uint8)).view(torch.float8_e4m3fn).float().numpy()


def _hi_close(got, want, sc):
    """High nibbles: exact where s / 16 is a normal fp16 number (|s| >= 2^-10), else within one rounding of
    the subnormal s / 16 times |n - 8| <= 8 (gluon_codecs module doc)."""
    normal = np.abs(sc.astype(np.float32)) >= 2.0 ** -10
    assert (~normal).any() and normal.any()  # the samples cover both cases
    np.testing.assert_array_equal(got[normal], want[normal])
    assert (np.abs(got - want)[~normal] <= 8 * 2.0 ** -20 + np.abs(want[~normal]) * 2.0 ** -10).all()


def test_ptx_q4_decodes_nibbles():
    from devtools.gluon_emu import run_ptx
    s16 = (S.astype(np.float32) / 16).astype(np.float16)
    nib = lambda w, k, h: ((_byte(w, k) >> (4 * h)) & 0xF).astype(np.int64) - 8
    outs = run_ptx(gc.ASM_K_Q4.value, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [W, _bits(S), _bits(s16)])
    for q in range(4):
        for h2 in range(2):  # register q, half h2 = byte (q >> 1) + 2 h2, nibble q & 1 (k_channel_order)
            got, want = _f16(outs[2 * q + h2]), _want(nib(W, (q >> 1) + 2 * h2, q & 1), S)
            if q & 1:
                _hi_close(got, want, S)
            else:
                np.testing.assert_array_equal(got, want)
    for k in range(4):
        lo_a, lo_b, hi_a, hi_b = run_ptx(gc.asm_v(gc.Q4, k), "=h,=h,=h,=h,r,r,h,h,h,h",
                                         [W, WB, _bits(S), _bits(SR), _bits(s16), _bits(s16[::-1].copy())])
        np.testing.assert_array_equal(_f16(lo_a), _want(nib(W, k, 0), S))
        np.testing.assert_array_equal(_f16(lo_b), _want(nib(WB, k, 0), SR))
        _hi_close(_f16(hi_a), _want(nib(W, k, 1), S), S)
        _hi_close(_f16(hi_b), _want(nib(WB, k, 1), SR), SR)


def test_ptx_q4a_decodes_nibbles_with_zeros():
    from devtools.gluon_emu import run_ptx
    s16 = (S.astype(np.float32) / 16).astype(np.float16)
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    nib = lambda w, k, h: ((_byte(w, k) >> (4 * h)) & 0xF).astype(np.int64)
    want = lambda c, sc, z: (c.astype(np.float32) * sc.astype(np.float32) + z.astype(np.float32))
    # one fp16 rounding of c s + m (HFMA2), as the reference rounds the fp32 value once to fp16
    close = lambda got, w: np.testing.assert_array_equal(got, w.astype(np.float16).astype(np.float32))
    outs = run_ptx(gc.ASM_K_Q4A.value, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h,h", [W, _bits(S), _bits(s16), _bits(m)])
    normal = np.abs(S.astype(np.float32)) >= 2.0 ** -10
    for q in range(4):
        for h2 in range(2):
            got, w = _f16(outs[2 * q + h2]), want(nib(W, (q >> 1) + 2 * h2, q & 1), S, m)
            if q & 1:  # high nibbles: 16 n meets s / 16 (exact while s / 16 is a normal fp16)
                close(got[normal], w[normal])
            else:
                close(got, w)
    for k in range(4):
        lo_a, lo_b, hi_a, hi_b = run_ptx(gc.asm_v(gc.Q4A, k), "=h,=h,=h,=h,r,r,h,h,h,h,h,h",
                                         [W, WB, _bits(S), _bits(SR), _bits(s16), _bits(s16[::-1].copy()), _bits(m),
                                          _bits(mr)])
        close(_f16(lo_a), want(nib(W, k, 0), S, m))
        close(_f16(lo_b), want(nib(WB, k, 0), SR, mr))
        close(_f16(hi_a)[normal], want(nib(W, k, 1), S, m)[normal])
        close(_f16(hi_b)[normal[::-1]], want(nib(WB, k, 1), SR, mr)[normal[::-1]])


def test_ptx_i8_decodes_signed_bytes():
    from devtools.gluon_emu import run_ptx
    sb = lambda w, k: _byte(w, k).astype(np.uint8).view(np.int8).astype(np.int64)
    outs = run_ptx(gc.ASM_K_I8.value, "=h,=h,=h,=h,r,h", [W, _bits(S)])
    for q in range(2):
        for h2 in range(2):  # register q, half h2 = byte q + 2 h2
            np.testing.assert_array_equal(_f16(outs[2 * q + h2]), _want(sb(W, q + 2 * h2), S))
    for k in range(4):
        a, b = run_ptx(gc.asm_v(gc.I8, k), "=h,=h,r,r,h,h", [W, WB, _bits(S), _bits(SR)])
        np.testing.assert_array_equal(_f16(a), _want(sb(W, k), S))
        np.testing.assert_array_equal(_f16(b), _want(sb(WB, k), SR))


def test_ptx_i8a_decodes_unsigned_bytes_with_zeros():
    from devtools.gluon_emu import run_ptx
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    ub = lambda w, k: _byte(w, k).astype(np.int64)  # noqa: E731
    want = lambda c, sc, z: (c * sc.astype(np.float32) + z.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    outs = run_ptx(gc.ASM_K_I8A.value, "=h,=h,=h,=h,r,h,h", [W, _bits(S), _bits(m)])
    for q in range(2):
        for h2 in range(2):
            np.testing.assert_array_equal(_f16(outs[2 * q + h2]), want(ub(W, q + 2 * h2), S, m))
    for k in range(4):
        a, b = run_ptx(gc.asm_v(gc.I8A, k), "=h,=h,r,r,h,h,h,h", [W, WB, _bits(S), _bits(SR), _bits(m), _bits(mr)])
        np.testing.assert_array_equal(_f16(a), want(ub(W, k), S, m))
        np.testing.assert_array_equal(_f16(b), want(ub(WB, k), SR, mr))


@pytest.mark.parametrize("asym", [False, True])
def test_ptx_q2_decodes_fields(asym):
    """int2: field f of every byte, times s (fields 1 and 3 as 4 c times s / 4: exact while s / 4 is a normal
    fp16, |s| >= 2^-12; the samples' |s| stay above that), minus the sym offset 2 or plus the zero (one HFMA2)."""
    from devtools.gluon_emu import run_ptx
    s = (S.astype(np.float32) * 8).astype(np.float16)
    s4 = (s.astype(np.float32) / 4).astype(np.float16)
    sr, s4r = s[::-1].copy(), s4[::-1].copy()
    assert (np.abs(s.astype(np.float32)) >= 2.0 ** -12).all()
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    field = lambda w, k, f: ((_byte(w, k) >> (2 * f)) & 3).astype(np.int64) - (0 if asym else 2)  # noqa: E731
    want = lambda c, sc, z: (c * sc.astype(np.float32) + (z.astype(np.float32) if asym else 0)).astype(  # noqa: E731
        np.float16).astype(np.float32)
    kasm, vcodec = (gc.ASM_K_Q2A, gc.Q2A) if asym else (gc.ASM_K_Q2, gc.Q2)
    outs = run_ptx(kasm.value, "=h," * 16 + ("r,h,h,h" if asym else "r,h,h"),
                   [W, _bits(s), _bits(s4)] + ([_bits(m)] if asym else []))
    for q in range(8):
        for h2 in range(2):  # register q, half h2 = byte (q >> 2) + 2 h2, field q & 3 (k_channel_order)
            np.testing.assert_array_equal(_f16(outs[2 * q + h2]), want(field(W, (q >> 2) + 2 * h2, q & 3), s, m))
    for k in range(4):
        outs = run_ptx(gc.asm_v(vcodec, k), "=h," * 8 + ("r,r,h,h,h,h,h,h" if asym else "r,r,h,h,h,h"),
                       [W, WB, _bits(s), _bits(sr), _bits(s4), _bits(s4r)] + ([_bits(m), _bits(mr)] if asym else []))
        for f in range(4):  # (f0 A, f0 B, f1 A, f1 B, ...)
            np.testing.assert_array_equal(_f16(outs[2 * f]), want(field(W, k, f), s, m))
            np.testing.assert_array_equal(_f16(outs[2 * f + 1]), want(field(WB, k, f), sr, mr))


@pytest.mark.parametrize("codec", ["KC4", "KC2"])
def test_ptx_channel_axis_keys(codec):
    """Channel-axis keys: the code units of two channels (words A, B) -> (c0, c1) per token, c s + m with the
    packed scale and zero pairs (one HFMA2; high nibbles / odd fields meet s / 16 / s / 4, exact for the
    samples' |s|)."""
    from devtools.gluon_emu import run_ptx
    c = getattr(gc, codec)
    s = S.astype(np.float32) * 8
    s = np.where(np.abs(s) < 2.0 ** -9, 2.0 ** -9, s).astype(np.float16)  # (subnormal s / 16: as Q4, not here)
    sr = s[::-1].copy()
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    sw, mw = _bits(s) | (_bits(sr) << 16), _bits(m) | (_bits(mr) << 16)  # pairs (c0, c1)
    want = lambda code, sc, z: (code * sc.astype(np.float32) + z.astype(np.float32)).astype(  # noqa: E731
        np.float16).astype(np.float32)
    bits = 4 if c == gc.KC4 else 2
    tok = lambda w, t: ((w >> (bits * t)) & (2 ** bits - 1)).astype(np.int64)  # token t of a channel's unit  # noqa: E731
    n_out = 4 if c == gc.KC4 else 8
    for k in range(2 if c == gc.KC4 else 1):
        outs = run_ptx(gc.asm_kc(c, k), "=h," * n_out + "r,r,r,r", [W, WB, sw, mw])
        for i in range(n_out // 2):  # register i: token (8 / bits) k / 2... = 2 k + i (int4) or i (int2)
            t = 2 * k + i if c == gc.KC4 else i
            np.testing.assert_array_equal(_f16(outs[2 * i]), want(tok(W, t), s, m))
            np.testing.assert_array_equal(_f16(outs[2 * i + 1]), want(tok(WB, t), sr, mr))


def test_ptx_calibrated_channel_axis_keys():
    """Calibrated int2 channel-axis keys: token t's code = field t of byte 0 of each channel's unit, looked up in the
    4-entry level table (fp16), times s plus m (one HFMA2), for channels c0 (word A) and c1 (word B); levels that
    differ in both bytes and one past 2^-14 in size."""
    from devtools.gluon_emu import run_ptx
    levels = (0.0, 0.8173828125, 2.2421875, 3.0)
    lv = np.array(levels, dtype=np.float32).astype(np.float16).astype(np.float32)
    words = gc.cb_table_words(levels + (3.0,) * 12)
    s = (S.astype(np.float32) * 8).astype(np.float16)
    sr = s[::-1].copy()
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    sw, mw = _bits(s) | (_bits(sr) << 16), _bits(m) | (_bits(mr) << 16)
    A, B = W & 0xFF, WB & 0xFF  # what kc_load hands the asm: a channel's byte of 4 tokens
    code = lambda w, t: ((w >> (2 * t)) & 3).astype(np.int64)  # noqa: E731
    # one HFMA2: the exact product and sum (float64 holds them), rounded once to fp16
    want = lambda c, sc, z: (lv[c].astype(np.float64) * sc.astype(np.float64) + z.astype(np.float64)  # noqa: E731
                             ).astype(np.float16).astype(np.float32)
    outs = run_ptx(gc.asm_kt2(), "=h," * 8 + "r,r,r,r,r,r", [A, B, sw, mw, np.uint32(words[0]), np.uint32(words[4])])
    for t in range(4):
        np.testing.assert_array_equal(_f16(outs[2 * t]), want(code(A, t), s, m))
        np.testing.assert_array_equal(_f16(outs[2 * t + 1]), want(code(B, t), sr, mr))
    assert set(code(A, 0).tolist()) == set(range(4))


@pytest.mark.parametrize("bits", [3, 4])
def test_ptx_calibrated_channel_axis_keys_3_4(bits):
    """Calibrated int3 / int4 channel-axis keys: each token's code (int3: field | plane bit << 2 from the loader's
    unit; int4: nibble t of the unit's two bytes) looked up in the 8- / 16-entry level table, times s plus m, for
    channels c0 (word A) and c1 (word B), in KC3's / KC4's register order."""
    from devtools.gluon_emu import run_ptx
    n = 2 ** bits
    levels = tuple(float(v) for v in np.sort(RNG.uniform(0, n - 1, n)).astype(np.float16))
    lv = np.array(levels, dtype=np.float32)
    words = [np.uint32(w) for w in gc.cb_table_words(levels + (levels[-1],) * (16 - n))]
    s = (S.astype(np.float32) * 8).astype(np.float16)
    sr = s[::-1].copy()
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    sw, mw = _bits(s) | (_bits(sr) << 16), _bits(m) | (_bits(mr) << 16)
    want = lambda c, sc, z: (lv[c].astype(np.float64) * sc.astype(np.float64) + z.astype(np.float64)  # noqa: E731
                             ).astype(np.float16).astype(np.float32)
    seen = set()
    if bits == 3:
        A, B = ((w & 0xFF) | (((w >> 16) & 0xF) << 8) for w in (W, WB))  # what kc_load hands the asm
        code = lambda w, t: (((w >> (2 * t)) & 3) | (((w >> (8 + t)) & 1) << 2)).astype(np.int64)  # noqa: E731
        outs = run_ptx(gc.asm_kt3(), "=h," * 8 + "r," * 7 + "r", [A, B, sw, mw] + [words[i] for i in (0, 1, 4, 5)])
        for t in range(4):
            np.testing.assert_array_equal(_f16(outs[2 * t]), want(code(A, t), s, m))
            np.testing.assert_array_equal(_f16(outs[2 * t + 1]), want(code(B, t), sr, mr))
            seen |= set(code(A, t).tolist())
    else:
        A, B = W & 0xFFFF, WB & 0xFFFF  # a channel's two bytes of 4 tokens, low nibble first
        code = lambda w, t: ((w >> (4 * t)) & 15).astype(np.int64)  # noqa: E731
        for k in range(2):
            outs = run_ptx(gc.asm_kt4(k), "=h," * 4 + "r," * 11 + "r", [A, B, sw, mw] + words)
            for i in range(2):
                t = 2 * k + i
                np.testing.assert_array_equal(_f16(outs[2 * i]), want(code(A, t), s, m))
                np.testing.assert_array_equal(_f16(outs[2 * i + 1]), want(code(B, t), sr, mr))
                seen |= set(code(A, t).tolist())
    assert seen == set(range(n))


def test_ptx_channel_axis_int3_keys():
    """int3 channel-axis keys: token t's code = 2-bit field t of byte 0 | bit 8 + t << 2 (the loader's plane nibble),
    times s (odd tokens: 4 c times s / 4) plus m, for channels c0 (word A) and c1 (word B)."""
    from devtools.gluon_emu import run_ptx
    s = S.astype(np.float32) * 8
    s = np.where(np.abs(s) < 2.0 ** -9, 2.0 ** -9, s).astype(np.float16)
    sr = s[::-1].copy()
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    sw, mw = _bits(s) | (_bits(sr) << 16), _bits(m) | (_bits(mr) << 16)
    units = lambda w: (w & 0xFF) | (((w >> 16) & 0xF) << 8)  # noqa: E731 - what kc_load hands the asm
    A, B = units(W), units(WB)
    code = lambda w, t: (((w >> (2 * t)) & 3) | (((w >> (8 + t)) & 1) << 2)).astype(np.int64)  # noqa: E731
    want = lambda c, sc, z: (c * sc.astype(np.float32) + z.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    outs = run_ptx(gc.asm_kc3(), "=h," * 8 + "r,r,r,r", [A, B, sw, mw])
    for t in range(4):
        np.testing.assert_array_equal(_f16(outs[2 * t]), want(code(A, t), s, m))
        np.testing.assert_array_equal(_f16(outs[2 * t + 1]), want(code(B, t), sr, mr))
    assert set(code(A, 0).tolist()) == set(range(8))


def test_ptx_fp4_decodes_e2m1_and_scales():
    """fp4: every nibble's e2m1 value (sign-magnitude, -0 kept) times s, in Q4's register order (keys) and
    (lo A, lo B, hi A, hi B) (values); e8m0 / e4m3 scale bytes to fp16 (2^(E - 127) rounded to fp16: inf past
    2^15, 0 below 2^-24)."""
    from devtools.gluon_emu import run_ptx

    from kvlab.quant.formats import E2M1
    e2m1 = np.array(E2M1, dtype=np.float32)
    s = S.astype(np.float32) * 8
    s = np.where(np.abs(s) < 2.0 ** -9, 2.0 ** -9, s).astype(np.float16)
    sr = s[::-1].copy()
    nib = lambda w, k, h: (_byte(w, k) >> (4 * h)) & 0xF  # noqa: E731
    want = lambda c, sc: (e2m1[c] * sc.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    outs = run_ptx(gc.ASM_K_F4.value, "=h," * 8 + "r,h", [W, _bits(s)])
    for q in range(4):
        for h2 in range(2):  # register q, half h2 = byte (q >> 1) + 2 h2, nibble q & 1 (as Q4)
            got, w = _f16(outs[2 * q + h2]), want(nib(W, (q >> 1) + 2 * h2, q & 1), s)
            np.testing.assert_array_equal(got, w)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(w))  # -0 stays -0
    for k in range(4):
        lo_a, lo_b, hi_a, hi_b = run_ptx(gc.AVE0.value if k == 0 else (gc.AVE1, gc.AVE2, gc.AVE3)[k - 1].value,
                                         "=h,=h,=h,=h,r,r,h,h", [W, WB, _bits(s), _bits(sr)])
        np.testing.assert_array_equal(_f16(lo_a), want(nib(W, k, 0), s))
        np.testing.assert_array_equal(_f16(lo_b), want(nib(WB, k, 0), sr))
        np.testing.assert_array_equal(_f16(hi_a), want(nib(W, k, 1), s))
        np.testing.assert_array_equal(_f16(hi_b), want(nib(WB, k, 1), sr))
    E = np.arange(255, dtype=np.uint32)  # e8m0 (255 is NaN: set by scale16, not the asm)
    got = _f16(run_ptx(gc.ASM_S_E8M0.value, "=h,r", [E])[0])
    with np.errstate(over="ignore"):
        ref = np.exp2(E.astype(np.float64) - 127).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, ref)
    assert got[127] == 1 and got[142] == 2 ** 15 and np.isinf(got[143]) and got[103] == 2.0 ** -24 and got[102] == 0
    b = np.arange(256, dtype=np.uint32)  # e4m3 scale bytes
    np.testing.assert_array_equal(_f16(run_ptx(gc.ASM_S_E4M3.value, "=h,h", [b])[0]), _e4m3(b))


@pytest.mark.parametrize("fmt", ["nf4", "iq4nl", "lm4"])
def test_ptx_codebook_lookups(fmt):
    """4-bit codebooks: every nibble's table entry (as fp16) times s, keys in Q4's register order, values as
    (lo A, lo B, hi A, hi B)."""
    from devtools.gluon_emu import run_ptx

    from kvlab.quant.formats import codebook16
    cb = np.array(codebook16(fmt), dtype=np.float32).astype(np.float16).astype(np.float32)
    tab = [np.uint32(t) for t in gc.cb_table_words(codebook16(fmt))]
    s = S.astype(np.float32) * 8
    s = np.where(np.abs(s) < 2.0 ** -9, 2.0 ** -9, s).astype(np.float16)
    sr = s[::-1].copy()
    nib = lambda w, k, h: (_byte(w, k) >> (4 * h)) & 0xF  # noqa: E731
    want = lambda c, sc: (cb[c] * sc.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    outs = run_ptx(gc.ASM_K_CB.value, "=h," * 8 + "r,h" + ",r" * 8, [W, _bits(s)] + tab)
    for q in range(4):
        for h2 in range(2):
            np.testing.assert_array_equal(_f16(outs[2 * q + h2]), want(nib(W, (q >> 1) + 2 * h2, q & 1), s))
    for k, asm in enumerate((gc.AVC0, gc.AVC1, gc.AVC2, gc.AVC3)):
        lo_a, lo_b, hi_a, hi_b = run_ptx(asm.value, "=h,=h,=h,=h,r,r,h,h" + ",r" * 8, [W, WB, _bits(s), _bits(sr)] + tab)
        np.testing.assert_array_equal(_f16(lo_a), want(nib(W, k, 0), s))
        np.testing.assert_array_equal(_f16(lo_b), want(nib(WB, k, 0), sr))
        np.testing.assert_array_equal(_f16(hi_a), want(nib(W, k, 1), s))
        np.testing.assert_array_equal(_f16(hi_b), want(nib(WB, k, 1), sr))


@pytest.mark.parametrize("table", ["lm2", "steps"])
def test_ptx_two_bit_codebook_lookups(table):
    """2-bit codebooks: every field's table entry (as fp16) times s, keys in int2's register order, values as
    (f0 A, f0 B, f1 A, f1 B, ...). "steps": a table whose four entries differ in both bytes, so a lookup that took
    a low byte or a high byte from the wrong entry (or sign-filled it) fails."""
    from devtools.gluon_emu import run_ptx

    from kvlab.quant.formats import codebook16
    vals = codebook16("lm2") if table == "lm2" else (-3.5, -0.3125, 0.0078125, 1.5) + (1.5,) * 12
    cb = np.array(vals, dtype=np.float32).astype(np.float16).astype(np.float32)
    words = gc.cb_table_words(vals)
    lo, hi = np.uint32(words[0]), np.uint32(words[4])
    s = (S.astype(np.float32) * 8).astype(np.float16)
    sr = s[::-1].copy()
    field = lambda w, k, f: ((_byte(w, k) >> (2 * f)) & 3).astype(np.int64)  # noqa: E731
    want = lambda c, sc: (cb[c] * sc.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    outs = run_ptx(gc.ASM_K_CB2.value, "=h," * 16 + "r,h,r,r", [W, _bits(s), lo, hi])
    for q in range(8):
        for h2 in range(2):  # register q, half h2 = byte (q >> 2) + 2 h2, field q & 3 (k_channel_order)
            np.testing.assert_array_equal(_f16(outs[2 * q + h2]), want(field(W, (q >> 2) + 2 * h2, q & 3), s))
    for k, asm in enumerate((gc.AVL0, gc.AVL1, gc.AVL2, gc.AVL3)):
        outs = run_ptx(asm.value, "=h," * 8 + "r,r,h,h,r,r", [W, WB, _bits(s), _bits(sr), lo, hi])
        for f in range(4):
            np.testing.assert_array_equal(_f16(outs[2 * f]), want(field(W, k, f), s))
            np.testing.assert_array_equal(_f16(outs[2 * f + 1]), want(field(WB, k, f), sr))


@pytest.mark.parametrize("asym", [False, True])
def test_ptx_i3_decodes_planes(asym):
    """int3: code 4 k + f of words A and B = 2-bit field f of byte k | plane bit 4 k + f (of pA / pB's low halves)
    << 2, times s (fields 1 and 3 as 4 c with s / 4), minus the sym offset 4 or plus the zero."""
    from devtools.gluon_emu import run_ptx
    s = S.astype(np.float32) * 8
    s = np.where(np.abs(s) < 2.0 ** -9, 2.0 ** -9, s).astype(np.float16)
    s4, sr = (s.astype(np.float32) / 4).astype(np.float16), s[::-1].copy()
    s4r = (sr.astype(np.float32) / 4).astype(np.float16)
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    P_ = RNG.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32)
    PB = P_[::-1].copy()
    code = lambda w, p, k, f: (((_byte(w, k) >> (2 * f)) & 3) | (((p >> (4 * k + f)) & 1) << 2)).astype(np.int64)  # noqa: E731
    want = lambda c, sc, z: ((c - (0 if asym else 4)) * sc.astype(np.float32) +  # noqa: E731
                             (z.astype(np.float32) if asym else 0)).astype(np.float16).astype(np.float32)
    for k in range(4):
        args = [W, WB, P_, PB, _bits(s), _bits(sr), _bits(s4), _bits(s4r)] + ([_bits(m), _bits(mr)] if asym else [])
        outs = run_ptx(gc.asm_i3(k, asym), "=h," * 8 + "r,r,r,r,h,h,h,h" + (",h,h" if asym else ""), args)
        for f in range(4):
            np.testing.assert_array_equal(_f16(outs[2 * f]), want(code(W, P_, k, f), s, m))
            np.testing.assert_array_equal(_f16(outs[2 * f + 1]), want(code(WB, PB, k, f), sr, mr))


@pytest.mark.parametrize("codec", ["I5", "I5A", "I6", "I6A", "I5G", "I5GA"])
def test_ptx_int5_int6_decode_nibbles_and_planes(codec):
    """int5 / int6: nibble f of byte k of words A and B with its high-plane bits above it (sequential: bits PB (2 k + f)
    of pA / pB; GGML's q5: bit k, or k + 16 for the high nibble), times s (high nibbles as 16 c with s / 16), minus the
    sym offset 2^(b-1) or plus the zero."""
    from devtools.gluon_emu import run_ptx
    c = getattr(gc, codec)
    bits, asym, ggml = (6 if c in (gc.I6, gc.I6A) else 5), c in gc.ASYM, c in (gc.I5G, gc.I5GA)
    pb = bits - 4
    s = S.astype(np.float32) * 8
    s = np.where(np.abs(s) < 2.0 ** -9, 2.0 ** -9, s).astype(np.float16)
    s16, sr = (s.astype(np.float32) / 16).astype(np.float16), s[::-1].copy()
    s16r = (sr.astype(np.float32) / 16).astype(np.float16)
    m = (RNG.standard_normal(256) * 0.3).astype(np.float16)
    mr = m[::-1].copy()
    P_ = RNG.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32)
    PB = P_[::-1].copy()

    def code(w, p, k, f):
        bit = (k + 16 * f) if ggml else pb * (2 * k + f)
        return (((_byte(w, k) >> (4 * f)) & 15) | (((p >> bit) & ((1 << pb) - 1)) << 4)).astype(np.int64)

    def want(cv, sc, z):
        return ((cv - (0 if asym else 1 << (bits - 1))) * sc.astype(np.float32) +
                (z.astype(np.float32) if asym else 0)).astype(np.float16).astype(np.float32)
    for k in range(4):
        args = [W, WB, P_, PB, _bits(s), _bits(sr), _bits(s16), _bits(s16r)] + ([_bits(m), _bits(mr)] if asym else [])
        outs = run_ptx(gc.asm_np(c, k), "=h," * 4 + "r,r,r,r,h,h,h,h" + (",h,h" if asym else ""), args)
        for f in range(2):  # (lo A, lo B, hi A, hi B)
            np.testing.assert_array_equal(_f16(outs[2 * f]), want(code(W, P_, k, f), s, m))
            np.testing.assert_array_equal(_f16(outs[2 * f + 1]), want(code(WB, PB, k, f), sr, mr))


@pytest.mark.parametrize("table", ["lm3", "steps"])
def test_ptx_three_bit_codebook_lookups(table):
    """3-bit codebooks: code 4 k + f of words A and B = 2-bit field f of byte k | plane bit 4 k + f << 2, looked up
    in the 8-entry table, times s (int3's register order). "steps": entries that differ in both bytes."""
    from devtools.gluon_emu import run_ptx

    from kvlab.quant.formats import codebook16
    vals = codebook16("lm3") if table == "lm3" else (-6.0, -1.25, -0.375, -0.0078125, 0.03125, 0.5, 1.75, 3.5) + \
        (3.5,) * 8
    cb = np.array(vals, dtype=np.float32).astype(np.float16).astype(np.float32)
    words = gc.cb_table_words(vals)
    tab = [np.uint32(words[i]) for i in (0, 1, 4, 5)]
    s = (S.astype(np.float32) * 8).astype(np.float16)
    sr = s[::-1].copy()
    P_ = RNG.integers(0, 2 ** 32, 256, dtype=np.uint64).astype(np.uint32)
    PB = P_[::-1].copy()
    code = lambda w, p, k, f: (((_byte(w, k) >> (2 * f)) & 3) | (((p >> (4 * k + f)) & 1) << 2)).astype(np.int64)  # noqa: E731
    want = lambda c, sc: (cb[c] * sc.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    seen = set()
    for k in range(4):
        outs = run_ptx(gc.asm_cb3(k), "=h," * 8 + "r,r,r,r,h,h,r,r,r,r", [W, WB, P_, PB, _bits(s), _bits(sr)] + tab)
        for f in range(4):
            np.testing.assert_array_equal(_f16(outs[2 * f]), want(code(W, P_, k, f), s))
            np.testing.assert_array_equal(_f16(outs[2 * f + 1]), want(code(WB, PB, k, f), sr))
            seen |= set(code(W, P_, k, f).tolist())
    assert seen == set(range(8))


def test_ptx_f8_converts_e4m3():
    from devtools.gluon_emu import run_ptx
    outs = run_ptx(gc.ASM_K_F8.value, "=h,=h,=h,=h,r", [W])
    for q in range(2):
        for h2 in range(2):  # register q, half h2 = byte 2 q + h2
            np.testing.assert_array_equal(_f16(outs[2 * q + h2]), _e4m3(_byte(W, 2 * q + h2)))
    for k in range(4):
        a, b = run_ptx(gc.asm_v(gc.F8, k), "=h,=h,r,r", [W, WB])
        np.testing.assert_array_equal(_f16(a), _e4m3(_byte(W, k)))
        np.testing.assert_array_equal(_f16(b), _e4m3(_byte(WB, k)))


# ---- CPU: the kernel's own source run by devtools/gluon_emu.py ----------------------------------------------
def _poison_past_end(cache, lens, P):
    """NaN / inf scales (and NaN fp8 codes) in every row the kernel may read past a sequence's end."""
    indptr, idx = cache["kv_indptr"].tolist(), cache["kv_indices"].tolist()
    for name in ("k_pages", "v_pages"):
        pages = cache[name]
        unused = sorted(set(range(pages["codes"].shape[0])) - set(idx))
        tail = [(idx[indptr[b + 1] - 1], L - (indptr[b + 1] - indptr[b] - 1) * P) for b, L in enumerate(lens)
                if indptr[b + 1] > indptr[b]]
        if pages.get("scales") is not None:
            e8m0 = pages["scales"].dtype == torch.uint8  # (its NaN is 255; e4m3 has no inf: NaN there too)
            pages["scales"][unused] = 255 if e8m0 else float("nan")
            for pg, r in tail:
                pages["scales"][pg, :, r:] = 255 if e8m0 else float("inf")
        else:  # fp8 codes: 0x7F is NaN in e4m3
            pages["codes"][unused] = 0x7F
            for pg, r in tail:
                pages["codes"][pg, :, r:] = 0x7F


# (scheme, lens, Hq, Hk, P, splits, warps, tokens per warp)
EMU_CASES = [
    ("q4_0", [1, 17, 63, 200], 8, 2, 16, 1, 4, 16),
    ("q4_0", [1, 17, 63, 200], 8, 2, 16, 3, 4, 32),   # two pages per warp and tile
    ("q4_0", [100, 70], 16, 1, 64, 2, 8, 16),         # GQA 16, pages of 64, 8 warps
    ("q8_0", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),
    ("q8_0", [0, 130], 4, 4, 32, 2, 2, 32),           # GQA 1, an empty sequence, pages of 32
    ("fp8_e4m3", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),
    ("fp8_e4m3", [150, 97], 8, 2, 48, 2, 2, 32),      # pages of 48: a warp's tokens cross a page mid-tile
    ("k=q8_0,v=q4_0", [5, 77], 8, 2, 16, 2, 4, 32),
    ("k=fp8_e4m3,v=q8_0", [5, 77], 8, 2, 32, 1, 4, 16),
    ("q4_1", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),
    ("int4:g32:asym", [40, 130], 8, 2, 16, 2, 2, 32),    # sequential nibbles
    ("int4_had", [40, 130], 8, 2, 32, 2, 4, 16),         # Hadamard-rotated K and V
    ("int4:g32:sym", [33, 90], 16, 2, 16, 1, 4, 16),     # sym, sequential nibbles
    ("int4:g64:asym:pack=ggml", [33, 90], 8, 2, 16, 2, 4, 16),   # groups of 64, GGML halves of 32
    ("int4:g128:sym", [33, 90], 8, 2, 16, 2, 4, 32),
    ("int8:g64:asym", [17, 100], 8, 2, 16, 3, 4, 16),
    ("k=int8:g128:sym,v=int4:g64:sym", [17, 100], 8, 2, 32, 2, 2, 16),
    ("int2:g32:asym", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),
    ("int2:g32:asym", [40, 130], 8, 2, 16, 2, 2, 32),
    ("int2:g64:sym:pack=ggml", [33, 90], 16, 2, 32, 2, 4, 16),
    ("k=int2:g128:asym,v=q4_0", [17, 100], 8, 2, 16, 1, 4, 32),
    ("k=q8_0,v=int2:g32:asym:rot=had", [5, 77], 8, 2, 16, 2, 4, 16),
    ("kivi4", [32, 96, 160, 320], 8, 2, 32, 3, 4, 32),                  # channel-axis keys (groups of 32 tokens)
    ("kivi2", [64, 256], 8, 2, 32, 2, 2, 32),
    ("k=int4:g64:chan:asym,v=q8_0", [128, 64, 320], 16, 2, 64, 2, 4, 32),   # groups of 64: two warps per group
    ("k=int2:g32:chan:asym,v=int4:g32:asym", [0, 96, 224], 8, 8, 32, 1, 4, 32),  # GQA 1, an empty sequence
    ("k=int4:g32:chan:asym:rot=had,v=fp8_e4m3", [96, 160], 8, 2, 32, 2, 4, 32),
    ("kivi4", [64, 128], 8, 2, 32, 2, 4, 32, [40, 3]),   # KIVI's residual: an unfinished group in full precision
    ("mxfp4", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),    # fp4 e2m1, e8m0 scales, GGML nibbles
    ("nvfp4", [1, 17, 63, 200], 8, 2, 16, 2, 4, 32),    # e4m3 scales of 16 channels (two per key thread), tensor scale
    ("k=nvfp4,v=q4_0", [33, 90], 16, 2, 32, 1, 4, 16),
    ("k=q8_0,v=fp4_e2m1:g32:pack=ggml:rot=had", [40, 130], 8, 2, 16, 2, 2, 32),
    ("nf4", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),      # 16-entry codebooks through PRMT tables
    ("iq4nl", [40, 130], 8, 2, 16, 2, 4, 32),
    ("k=lm4:rot=had,v=nf4:g32:pack=ggml", [33, 90], 16, 2, 32, 1, 4, 16),
    ("k=lm4:g32:cal,v=lm4:rot=had:cal", [17, 90], 8, 2, 16, 2, 4, 16),  # calibrated tables, read from the pages
    ("k=iq4nl,v=q4_1", [17, 100], 8, 2, 16, 2, 2, 32),
    ("int3:g32:asym", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),   # bit planes (2 + 1)
    ("int3:g32:sym", [40, 130], 16, 2, 32, 2, 4, 32),
    ("int5:g32:asym", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),   # a nibble plane and a 1-bit plane
    ("q5_0", [40, 130], 16, 2, 32, 2, 4, 32),                 # GGML's q5 blocks (qh before the nibbles)
    ("k=q5_1,v=int6:g64:sym", [33, 90], 8, 2, 16, 1, 2, 32, [5, 0]),  # int6: a 2-bit high plane
    ("k=int6:g128:asym:rot=had,v=q5_1", [17, 100], 8, 2, 16, 2, 4, 16),
    ("int6:g32:sym:s=e4m3", [17, 100], 8, 2, 16, 2, 4, 16),      # e4m3 group scales
    ("int5:g32:sym", [40, 130], 16, 1, 16, 2, 4, 32),           # GQA 16 (scores not transposed)
    ("int4:g16:asym", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),    # groups of 16: a key scale and zero per code word
    ("k=nf4:g16,v=int4:g16:sym:pack=ggml", [40, 130], 8, 2, 32, 2, 4, 32),
    ("k=int3:g32:asym,v=q8_0", [33, 90], 8, 2, 16, 1, 2, 32, [5, 0]),
    ("k=q4_0,v=int3:g32:asym:rot=had", [17, 100], 8, 2, 16, 2, 4, 16),
    ("lm2:rot=had", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),    # 2-bit codebooks: int2's layout, 4-entry tables
    ("lm2:g32:pack=ggml", [40, 130], 8, 2, 16, 2, 2, 32),
    ("k=lm2:g128:cal,v=lm2:rot=had:cal", [17, 90], 8, 2, 16, 2, 4, 16),  # calibrated tables, read from the pages
    ("k=lm4:rot=had,v=lm2:rot=had", [33, 90], 16, 2, 32, 1, 4, 16),      # the search's K | V pairs
    ("int3:g64:asym", [40, 130], 8, 2, 16, 2, 4, 16),     # int3 groups of 64: a thread-row is half a group
    ("int3:g128:sym", [33, 90], 8, 2, 32, 2, 2, 32),
    ("lm3:rot=had", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16),   # 3-bit codebooks: int3's layout, 8-entry tables
    ("lm3:g32", [40, 130], 16, 2, 16, 2, 4, 32),
    ("k=lm3:g128:cal,v=lm3:rot=had:cal", [17, 90], 8, 2, 16, 2, 4, 16),  # calibrated tables, read from the pages
    ("k=lm4:rot=had,v=lm3:rot=had", [33, 90], 16, 2, 32, 1, 4, 16),      # the search's K | V pairs
    ("lm2:s=e4m3:rot=had", [1, 17, 63, 200], 8, 2, 16, 2, 4, 16),   # e4m3 group scales (the 2.5-bit winners)
    ("k=lm3:s=e4m3:rot=had,v=lm2:s=e4m3:rot=had", [33, 90], 8, 2, 16, 1, 2, 32, [4, 0]),
    ("k=int4:g32:sym:s=e4m3,v=nf4:s=e4m3", [17, 100], 8, 2, 16, 2, 4, 16),
    ("k=int4:g32:chan:asym,v=lm3:rot=had", [64, 160], 8, 2, 32, 2, 4, 32),
    ("k=int3:g32:chan:asym,v=int3:g32:asym", [32, 96, 160, 320], 8, 2, 32, 3, 4, 32),  # int3 channel-axis keys
    ("k=int3:g64:chan:asym,v=lm2:rot=had", [64, 192], 16, 2, 64, 2, 4, 32, [0, 8]),
    ("k=int3:g32:chan:asym,v=lm3:rot=had", [0, 96, 224], 8, 8, 32, 1, 4, 32, [5, 40, 0]),  # GQA 1, fp tokens
    ("k=int2:g32:chan:asym:cal,v=lm2:rot=had", [64, 160], 8, 2, 32, 2, 4, 32),  # calibrated int2 keys: level table
    ("k=int2:g64:chan:asym:cal,v=q4_0", [0, 128, 320], 8, 4, 64, 3, 4, 32, [3, 0, 40]),  # fp tokens, GQA 2
    ("k=int3:g32:chan:asym:cal,v=lm3:rot=had", [32, 96, 160], 8, 2, 32, 2, 4, 32),  # calibrated int3 / int4 keys
    ("k=int4:g32:chan:asym:cal,v=lm4:rot=had", [64, 160], 16, 2, 32, 2, 4, 32, [7, 0]),
]


# full-precision window / sink tokens: (scheme, lens, fp_lens, splits, tokens per warp)
EMU_FP_CASES = [
    ("q4_0", [17, 300, 0], [5, 0, 40], 3, 16),      # a sequence held only in the full-precision buffer
    ("int4_had", [40, 130], [70, 3], 2, 32),       # rotated: the buffer tokens are rotated as the pages
    ("fp8_e4m3", [64, 90], [1, 33], 1, 16),
    ("int2:g32:asym", [40, 130], [9, 0], 2, 16),
]


def _kv(q, sch, args, kw, P):
    """The checked PagedKV of a call (what the api hands a backend)."""
    return check_prefix(q, *args, sch.k, sch.v, P, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw["k_tensor_scale"],
                        kw["v_tensor_scale"], q.shape[0])


def _case(name, lens, Hq, Hk, P, *, seed, q_seed, device="cpu", fp_lens=None, D=128, q_scale=1.0):
    """A paged cache poisoned past each sequence's end, bf16 queries (standard normal times q_scale) and the float32
    reference: -> (scheme, positional args, keyword args, q, ref)."""
    sch = kvlab.scheme(name)
    cache = make_paged(lens, Hk, D, P, sch.k, sch.v, seed=seed, device=device, fp_lens=fp_lens)
    _poison_past_end(cache, lens, P)
    args, kw = call_args(cache)
    q = torch.randn(len(lens), Hq, D, generator=torch.Generator().manual_seed(q_seed)) * q_scale
    q = q.to(device, torch.bfloat16)
    ref = decode(q.float(), *args, sch.k, sch.v, P, **kw, backend="reference")
    return sch, args, kw, q, ref


def _spy_emulated(monkeypatch, key: str) -> list:
    """Replace the kernel by its emulation, recording the constexpr `key` of every launch: -> the list it fills."""
    from devtools.gluon_emu import emulate
    emulated, seen = emulate(gluon._decode_mma_kernel), []

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **kw):
                seen.append(kw[key])
                return emulated[grid](*a, **kw)
            return launch
    monkeypatch.setattr(gluon, "_decode_mma_kernel", Spy())
    return seen


def _gpu_lens(name, lens):
    """`lens` for a GPU test, rounded up to whole token groups of 32 for channel-axis keys (KIVI): their pages hold
    whole groups, the unfinished one lives in the full-precision buffer, so other paged lengths have no finite
    reference."""
    return [-(-n // 32) * 32 for n in lens] if "kivi" in name else lens


def _rel_err(got, ref) -> float:
    return (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()


def _emu_ids(cases):
    return [f"{c[0]}-L{max(c[1])}-Hq{c[2]}-Hk{c[3]}-P{c[4]}-S{c[5]}-w{c[6]}-tw{c[7]}" for c in cases]


@pytest.mark.parametrize("c", EMU_CASES + [(n, lens, 8, 2, 16, S_, 4, tw, fp) for n, lens, fp, S_, tw in EMU_FP_CASES],
                         ids=_emu_ids(EMU_CASES) + [f"{n}-fp{max(fp)}-S{S_}-tw{tw}" for n, _, fp, S_, tw in EMU_FP_CASES])
@EMU
def test_emulated_kernel_matches_reference(c, monkeypatch):
    """The backend's host code + the kernel's source (emulated) == the float32 reference, with NaN / inf in
    every row past a sequence's end (read unmasked by the kernel) and a NaN-poisoned output."""
    from devtools.gluon_emu import emulate
    name, lens, Hq, Hk, P, S_, NW, TW = c[:8]
    fp_lens = c[8] if len(c) > 8 else None
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=11, q_seed=2, fp_lens=fp_lens)
    assert torch.isfinite(ref).all()
    out = torch.full_like(q, float("nan"))
    cfg = GluonDecodeConfig(num_warps=NW, tokens_per_warp=TW, num_splits=S_)
    got = gluon.run(q, _kv(q, sch, args, kw, P), 128 ** -0.5, cfg, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"
    for b, L in enumerate(lens):
        if L == 0 and not (fp_lens and fp_lens[b]):
            assert (got[b] == 0).all()


def _restrided(t: torch.Tensor, pad_bytes: int) -> torch.Tensor:
    """The same pages with `pad_bytes` unused bytes after each page (a page stride that is no multiple of 16
    elements; the kernel's 32-bit word views need byte strides that are multiples of 4)."""
    pad = pad_bytes // t.element_size()
    buf = torch.full((t.shape[0], t[0].numel() + pad), -1, dtype=t.dtype)
    buf[:, :t[0].numel()] = t.reshape(t.shape[0], -1)
    return buf[:, :t[0].numel()].reshape(t.shape)


@EMU
@pytest.mark.parametrize("name", ["q4_0", "kivi4", "int3:g32:asym"])
def test_emulated_odd_page_strides(name, monkeypatch):
    """Pages whose stride is no multiple of 16 elements (a view into a larger pool): the kernel takes its
    unaligned addressing (PS = 1) and returns what the dense pool gives."""
    import dataclasses
    from devtools.gluon_emu import emulate
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    P, tw = (32, 32) if name == "kivi4" else (16, 16)
    lens = [64, 128] if name == "kivi4" else [17, 130]
    sch, args, kw, q, ref = _case(name, lens, 8, 2, P, seed=5, q_seed=3)
    kv = _kv(q, sch, args, kw, P)
    odd = dataclasses.replace(kv, k_pages={k: v if v is None else _restrided(v, 12) for k, v in kv.k_pages.items()},
                              v_pages={k: v if v is None else _restrided(v, 20) for k, v in kv.v_pages.items()})
    assert odd.k_pages["codes"].stride(0) % 16 != 0
    cfg = GluonDecodeConfig(num_splits=2, tokens_per_warp=tw)
    dense, got = gluon.run(q, kv, 128 ** -0.5, cfg), gluon.run(q, odd, 128 ** -0.5, cfg)
    assert torch.equal(got, dense)
    assert _rel_err(got, ref) < TOL


def test_pages_over_two_gib_are_refused():
    """Page strides are 32-bit in the kernel: a page of 2 GiB or more is refused before any launch."""
    import dataclasses
    sch, args, kw, q, ref = _case("q4_0", [10], 8, 2, 16, seed=1, q_seed=1)
    kv = _kv(q, sch, args, kw, 16)
    codes = kv.k_pages["codes"]
    one = codes[:1]  # one page, so a 2 GiB page stride stays inside its storage
    huge = one.as_strided(one.shape, (2 ** 31 // one.element_size(),) + one.stride()[1:])
    bad = dataclasses.replace(kv, k_pages={**kv.k_pages, "codes": huge})
    with pytest.raises(ValueError, match="K codes: a page of 2147483648 bytes.*under 2 GiB"):
        gluon.run(q, bad, 128 ** -0.5, GluonDecodeConfig())


@EMU
@pytest.mark.parametrize("name,S_", [("q4_0", 3), ("int4_had", 5), ("kivi4", 2)])
def test_emulated_fused_merge_equals_merge_kernel(name, S_, monkeypatch):
    """The last split program's merge (one launch) == the separate merge kernel, to float32 rounding; its
    counters are zero again after the call (so a plan replays), and a second call gives the same output."""
    from devtools.gluon_emu import emulate
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    P = 32 if name == "kivi4" else 16
    lens = [0, 64, 128, 96] if name == "kivi4" else [0, 40, 130, 97]  # (channel-axis pages hold whole groups)
    sch, args, kw, q, ref = _case(name, lens, 8, 2, P, seed=9, q_seed=1, fp_lens=[3, 0, 5, 0] if name == "kivi4" else None)
    kv = _kv(q, sch, args, kw, P)
    tw = 32 if name == "kivi4" else 16
    cfg = GluonDecodeConfig(num_splits=S_, tokens_per_warp=tw, fused_merge=True)
    fused = gluon.run(q, kv, 128 ** -0.5, cfg)
    assert (gluon.counters("cpu", 1) == 0).all()
    again = gluon.run(q, kv, 128 ** -0.5, cfg)
    sep = gluon.run(q, kv, 128 ** -0.5, GluonDecodeConfig(num_splits=S_, tokens_per_warp=tw, fused_merge=False))
    assert torch.equal(fused, again)
    torch.testing.assert_close(fused.float(), sep.float(), rtol=1e-2, atol=1e-2)  # bf16 outputs of one fp32 merge
    assert _rel_err(fused, ref) < TOL
    if name != "kivi4":  # (its empty sequence has full-precision tokens)
        assert (fused[0] == 0).all()  # an empty sequence: every split empty


@EMU
@pytest.mark.parametrize("name,Hq", [("q4_0", 8), ("k=q8_0,v=q4_1", 16)])
def test_emulated_untransposed_accumulator(name, Hq, monkeypatch):
    """transpose_o=False (O = P V, 16 padded head rows) == the reference too."""
    from devtools.gluon_emu import emulate
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    sch, args, kw, q, ref = _case(name, [33, 90], Hq, 1, 16, seed=3, q_seed=5)
    cfg = GluonDecodeConfig(num_warps=2, tokens_per_warp=16, num_splits=2, transpose_o=False)
    got = gluon.run(q, _kv(q, sch, args, kw, 16), 128 ** -0.5, cfg)
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


# other head dims: (scheme, lens, Hq, Hk, P, splits, warps, tokens per warp, D, fp_lens)
EMU_D_CASES = [
    ("q4_0", [1, 17, 63, 200], 9, 3, 16, 3, 4, 16, 64, None),      # SmolLM2's heads
    ("q8_0", [0, 130], 9, 3, 32, 2, 2, 32, 64, [7, 0]),
    ("fp8_e4m3", [150, 97], 8, 2, 48, 2, 2, 32, 64, None),
    ("q4_1", [40, 130], 8, 4, 16, 1, 4, 16, 64, [0, 12]),
    ("k=q8_0,v=q4_0", [5, 77], 16, 2, 16, 2, 4, 32, 64, None),
    ("int4:g64:sym", [33, 90], 8, 4, 16, 2, 4, 16, 256, None),    # Gemma-style head_dim 256
    ("k=fp8_e4m3,v=int8:g64:asym", [17, 100], 8, 4, 32, 3, 2, 16, 256, [3, 0]),
    ("k=int2:g32:asym,v=q4_0", [40, 130], 9, 3, 16, 2, 4, 16, 64, None),
    ("int2:g32:asym", [40, 130], 9, 3, 16, 2, 4, 16, 64, [3, 0]),    # values: half a code word per thread-row
    ("kivi2", [64, 160], 9, 3, 32, 2, 4, 32, 64, [20, 0]),
    ("k=q8_0,v=int2:g64:sym:pack=ggml", [33, 90], 8, 4, 16, 3, 2, 32, 64, None),
    ("int2:g64:asym", [33, 90], 8, 4, 16, 2, 4, 32, 256, [0, 5]),
    ("kivi4", [64, 160], 9, 3, 32, 2, 4, 32, 64, [20, 0]),                     # SmolLM2's heads
    ("nvfp4", [40, 130], 9, 3, 16, 2, 4, 16, 64, None),
    ("k=mxfp4,v=fp4_e2m1:g32:s=e4m3", [33, 90], 8, 4, 16, 2, 4, 32, 256, None),
    ("nf4", [40, 130], 9, 3, 16, 2, 4, 16, 64, [0, 9]),
    ("iq4nl:g64", [33, 90], 8, 4, 16, 2, 4, 16, 256, None),
    ("iq4nl", [33, 90], 8, 4, 16, 2, 4, 32, 256, None),     # groups of 32 at D 256: two scales per key thread-row
    ("q4_0", [40, 130], 8, 4, 16, 2, 4, 16, 256, [3, 0]),   # Gemma's heads with GGML blocks
    ("q4_1", [33, 90], 8, 4, 32, 1, 4, 32, 256, None),       # a zero per key word too
    ("k=q8_0,v=int2:g32:asym", [17, 100], 8, 4, 16, 2, 2, 16, 256, None),
    ("k=int2:g32:asym,v=q8_0", [17, 100], 8, 4, 16, 2, 4, 32, 256, None),
    ("k=nf4:g32,v=int4:g64:sym", [17, 100], 8, 4, 32, 2, 4, 16, 256, [4, 0]),
    ("k=int4:g64:chan:asym,v=int4:g64:asym", [64, 192], 8, 4, 64, 2, 4, 32, 256, None),
    ("lm2:rot=had", [40, 130], 9, 3, 16, 2, 4, 16, 64, [3, 0]),       # SmolLM2's heads: half a value word per thread
    ("k=int4:g32:chan:asym,v=lm2:rot=had", [64, 160], 9, 3, 32, 2, 4, 32, 64, None),  # a searched K | V pair
    ("lm2:g32:rot=had", [33, 90], 8, 4, 16, 2, 4, 16, 256, None),     # Gemma's heads: a key scale per code word
    ("lm2:rot=had", [17, 100], 4, 1, 16, 2, 4, 32, 256, [0, 5]),
    ("int3:g32:asym", [40, 130], 9, 3, 16, 2, 4, 16, 64, [3, 0]),    # int3 at SmolLM2's heads: a key thread-row is
    ("int3:g64:sym", [33, 90], 8, 4, 16, 3, 4, 32, 64, None),       # half a group (word), a value thread-row a quarter
    ("lm3:rot=had", [40, 130], 9, 3, 16, 2, 4, 16, 64, [0, 7]),
    ("lm3:g32:rot=had", [33, 90], 9, 3, 32, 1, 4, 32, 64, None),
    ("k=lm3:s=e4m3:rot=had,v=lm2:s=e4m3:rot=had", [40, 130], 9, 3, 16, 2, 4, 16, 64, [0, 20]),  # a winner's pair
    ("lm2:g32:s=e4m3:rot=had", [33, 90], 8, 4, 16, 2, 4, 16, 256, None),  # an e4m3 key scale per code word
    ("k=int4:g32:chan:asym,v=lm3:rot=had", [64, 160], 9, 3, 32, 2, 4, 32, 64, None),  # searched K | V pairs
    ("k=int3:g32:chan:asym:cal,v=lm2:rot=had", [64, 160], 9, 3, 32, 2, 4, 32, 64, None),  # calibrated int keys
    ("k=int3:g32:chan:asym,v=lm2:rot=had", [64, 160], 9, 3, 32, 2, 4, 32, 64, [0, 20]),
    ("k=int3:g32:chan:asym,v=int3:g32:asym", [96, 128], 4, 1, 32, 2, 4, 32, 256, None),
    ("k=lm4:rot=had,v=lm3:rot=had", [17, 100], 9, 3, 16, 2, 4, 16, 64, None),
    ("q5_0", [40, 130], 9, 3, 16, 2, 4, 16, 64, [3, 0]),            # int5 / int6 at SmolLM2's heads: a key thread-row
    ("int6:g32:asym", [33, 90], 9, 3, 32, 1, 4, 32, 64, None),      # is half a group, a value thread-row a quarter
    ("q5_1", [40, 130], 8, 4, 16, 2, 4, 16, 256, [0, 5]),           # D 256: a key thread-row spans two q5 blocks
    ("k=int6:g32:sym,v=int5:g128:asym", [17, 100], 4, 1, 16, 2, 4, 32, 256, None),
    ("k=int5:g32:sym,v=int5:g32:asym", [40, 130], 8, 4, 16, 2, 4, 16, 256, [0, 5]),  # 1-bit planes, keys spanning
    ("k=int5:g64:sym,v=int5:g32:sym", [33, 90], 9, 3, 16, 2, 4, 32, 64, None),       # groups; D 64
    ("k=int4:g16:asym,v=nf4:g16", [40, 130], 8, 4, 16, 2, 4, 16, 256, [0, 5]),  # groups of 16 at D 256: a value
    ("int4:g16:sym:pack=ggml", [33, 90], 8, 4, 16, 2, 4, 32, 256, None),        # scale per code word too
    ("iq4nl:g16", [40, 130], 9, 3, 16, 2, 4, 16, 64, None),
    ("int3:g32:asym", [40, 130], 8, 4, 16, 2, 4, 16, 256, [0, 5]),   # D 256: two 32-channel runs per key thread-row,
    ("lm3:rot=had", [33, 90], 4, 1, 16, 2, 4, 32, 256, None),       # a scale per run for groups of 32
    ("k=int4:g32:chan:asym,v=lm3:rot=had", [64, 160], 4, 1, 32, 2, 4, 32, 256, [3, 0]),  # Gemma's searched pairs
    ("k=int4:g32:chan:asym:cal,v=lm3:rot=had", [64, 160], 4, 1, 32, 2, 4, 32, 256, [3, 0]),
    ("k=lm3:g128:cal,v=int3:g64:sym", [17, 100], 8, 4, 16, 3, 4, 16, 256, None),
    ("nvfp4", [40, 130], 8, 4, 16, 2, 4, 16, 256, None),   # fp4 groups of 16 at D 256: a value scale per code word
    ("k=q8_0,v=fp4_e2m1:g16:pack=ggml", [33, 90], 4, 1, 16, 1, 4, 32, 256, [0, 5]),   # e8m0, GGML nibbles
    ("k=nvfp4,v=nvfp4", [17, 100], 9, 3, 16, 2, 2, 32, 256, None),
]


@EMU
@pytest.mark.parametrize("c", EMU_D_CASES, ids=[f"{c[0]}-D{c[8]}-Hq{c[2]}-Hk{c[3]}-tw{c[7]}" for c in EMU_D_CASES])
def test_emulated_kernel_matches_reference_at_other_head_dims(c, monkeypatch):
    from devtools.gluon_emu import emulate
    name, lens, Hq, Hk, P, S_, NW, TW, D, fp_lens = c
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=13, q_seed=4, fp_lens=fp_lens, D=D)
    out = torch.full_like(q, float("nan"))
    got = gluon.run(q, _kv(q, sch, args, kw, P), D ** -0.5, GluonDecodeConfig(num_warps=NW, tokens_per_warp=TW,
                                                                             num_splits=S_), out=out)
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


@EMU
@pytest.mark.parametrize("name,D,prefetch", [("q4_0", 128, False), ("k=int4:g32:chan:asym,v=lm3:rot=had", 256, True),
                                             ("kivi2", 256, None)])
def test_emulated_prefetch_on_and_off(name, D, prefetch, monkeypatch):
    """The register prefetch of the next tile's codes (config `prefetch`) on, off and at its default (off for
    channel-axis int4 / int3 keys at head_dim 256, on for kivi2's int2 ones: `gluon.prefetches`): the same attention
    over several tiles a split."""
    from devtools.gluon_emu import emulate
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    P = 32 if "chan" in name or "kivi" in name else 16
    sch, args, kw, q, ref = _case(name, [96, 192], 4, 1, P, seed=17, q_seed=5, D=D)  # whole token groups
    out = torch.full_like(q, float("nan"))
    cfg = GluonDecodeConfig(num_warps=2, tokens_per_warp=32, num_splits=1, prefetch=prefetch)
    got = gluon.run(q, _kv(q, sch, args, kw, P), D ** -0.5, cfg, out=out)
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


@EMU
@pytest.mark.parametrize("name,D", [("q4_0", 128), ("k=int4:g32:chan:asym,v=lm3:rot=had", 128), ("mxfp4", 64),
                                    ("int3:g32:asym", 256)])
@pytest.mark.parametrize("S_", [1, 2])
def test_emulated_unrolled_loop(name, D, S_, monkeypatch):
    """The prefetching tile loop unrolled by two (config `unroll`, constexpr U2 checked at the launch): splits of 0 to
    5 tiles of 64 tokens (lengths 0, 96, 192, 256, 320: with one split 0, 2, 3, 4 and 5 tiles, so the loop runs zero
    to two iterations, with and without a tail tile), with one and two splits, the same attention as the reference (a
    wrong tail tile, a skipped one or a wrong stride between iterations fails it)."""
    seen = _spy_emulated(monkeypatch, "U2")
    P = 32 if "chan" in name else 16
    sch, args, kw, q, ref = _case(name, [0, 96, 192, 256, 320], 4, 1, P, seed=19, q_seed=6, D=D)
    out = torch.full_like(q, float("nan"))
    cfg = GluonDecodeConfig(num_warps=2, tokens_per_warp=32, num_splits=S_, prefetch=True, unroll=True)
    got = gluon.run(q, _kv(q, sch, args, kw, P), D ** -0.5, cfg, out=out)
    assert seen == [True], "the unrolled loop did not reach the kernel"
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    assert (got[0] == 0).all(), "an empty sequence attends nothing"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"
    with pytest.raises(ValueError, match="unroll=True unrolls the prefetching loop"):
        GluonDecodeConfig(unroll=True, prefetch=False)


def _prefetch_coverage(trace, tensors) -> tuple[int, int, int, int, int, int]:
    """Summed over the programs of an emulated launch's trace (`gluon_emu.traced`): (lines loaded from the page tensors
    after the program's first tile, of those not prefetched before their load, lines prefetched, of those outside
    every page tensor, of those never loaded by the program, programs). Page 0 is left out of the loaded lines: tiles past a split's end read it
    (its rows' scores are masked), and the prefetch skips them. A program's first tile is what it loads before its
    first prefetch that follows a load (the loop's; the prologue prefetches come before any load)."""
    spans = [(t.data_ptr(), t.data_ptr() + t.untyped_storage().nbytes(), t.data_ptr() + t.stride(0) * t.element_size())
             for t in tensors]

    def ours(a):
        return any(lo <= a < hi for lo, hi, _ in spans)

    def page0(a):
        return any(lo <= a < p0 for lo, _, p0 in spans)
    stats = [0, 0, 0, 0, 0, 0]
    segs, cur = [], None
    for kind, val, es in trace:
        if kind == "prog":
            cur = []
            segs.append(cur)
        elif cur is not None:
            cur.append((kind, val, es))
    for seg in segs:
        pf, loaded, first, pf_all = set(), [], True, []
        for kind, val, es in seg:
            if kind == "pf":
                lines = {int(a) // 128 for a in val}
                pf |= lines
                pf_all.append(lines)
                first = first and not loaded  # the loop's first prefetch ends the first tile
                continue
            for a in val:
                a = int(a)
                if not ours(a):
                    continue
                loaded.append(a // 128)
                if not first and not page0(a):
                    stats[0] += 1
                    stats[1] += (a // 128) not in pf
        ld_lines = set(loaded)
        stats[5] += 1
        for lines in pf_all:
            stats[2] += len(lines)
            stats[3] += sum(1 for ln in lines if not (ours(ln * 128) or ours(ln * 128 + 127)))
            stats[4] += sum(1 for ln in lines if ln not in ld_lines)
    return tuple(stats)


@EMU
@pytest.mark.parametrize("name,D,P,tw,l2,unroll", [
    ("q4_0", 128, 16, 16, 2, False),              # a page a warp tile, rows r0.. of it
    ("q8_0", 128, 16, 32, 1, False),              # a warp's 32 tokens over two pages; more than 32 lines a warp
    ("int4:g32:asym", 128, 64, 16, 3, True),      # zeros; rows 16 k of 64-token pages; the unrolled loop
    ("mxfp4", 64, 16, 16, 2, False),              # e8m0 scale bytes: 32-byte tiles off the 128-byte lines
    ("kivi4", 128, 32, 32, 2, False),             # channel-axis keys: a token group's block a part
    ("k=int4:g64:chan:asym,v=nf4", 128, 64, 32, 2, True),  # groups of 64 tokens read by two warps
    ("q4_0", 128, 48, 16, 2, False),              # 48-token pages: rows 0, 16, 32 of a page
    ("q4_1", 128, 48, 32, 2, False),              # 32-token warp tiles crossing 48-token pages: not laid out, off
])
def test_emulated_l2_prefetch(name, D, P, tw, l2, unroll, monkeypatch):
    """The L2 prefetch (config `l2_prefetch`): the same attention as without it, and, from the emulated trace, every
    code / scale / zero line a program loads after its first tile was prefetched before (none is missed: a wrong
    page, row, stride or unit fails it), no prefetched line lies outside the page tensors, and at most the masked
    value-scale rows of a split's last tile are prefetched without being read."""
    from devtools import gluon_emu
    from devtools.gluon_emu import emulate
    monkeypatch.setattr(gluon, "_decode_mma_kernel", emulate(gluon._decode_mma_kernel))
    chan = "chan" in name or "kivi" in name
    lens = [0, 128, 256, 640] if chan else [0, 17, 300, 645]  # (channel-axis keys: whole token groups)
    sch, args, kw, q, ref = _case(name, lens, 4, 2, P, seed=23, q_seed=8, D=D)
    kvp = _kv(q, sch, args, kw, P)
    outs = []
    for pf in (0, l2):
        cfg = GluonDecodeConfig(num_warps=2, tokens_per_warp=tw, num_splits=2, prefetch=True, unroll=unroll,
                                l2_prefetch=pf)
        with gluon_emu.traced() as trace:
            outs.append(gluon.run(q, kvp, D ** -0.5, cfg, out=torch.full_like(q, float("nan"))))
    assert torch.isfinite(outs[1]).all()
    assert torch.equal(outs[0], outs[1]), "the prefetch changed the attention"
    assert _rel_err(outs[1], ref) < TOL
    pages = [t for p in (kvp.k_pages, kvp.v_pages) for n, t in p.items()
             if n in ("codes", "scales", "zeros") and t is not None]
    loaded, missed, issued, outside, unread, progs = _prefetch_coverage(trace, pages)
    if gluon.l2_parts([(pages[0], 1)], P, tw) is None:  # a layout the prefetch does not take: nothing issued
        assert issued == 0
        return
    assert loaded > 100 and issued > 50
    assert missed == 0, f"{missed} of {loaded} lines loaded after a program's first tile were not prefetched before"
    assert outside == 0, f"{outside} of {issued} prefetched lines lie outside the page tensors"
    # a split's last warp tile reads its rows past the end with masked value scales: at most those lines go unread
    assert unread <= 2 * progs, f"{unread} of {issued} prefetched lines are never loaded by their program"


def test_l2_prefetch_config_and_layout():
    """The config's range, and the line layout for one pool: a line per 128 bytes of each part, one more for a part
    that may start off a line, padding to a power of two, two page parts where a warp's tokens span two pages, and
    no layout where they would cross a page mid-tile."""
    for bad in (-1, 9, True, 1.0, None):
        with pytest.raises(ValueError, match="l2_prefetch"):
            GluonDecodeConfig(l2_prefetch=bad)

    def aligned(shape, dtype):  # a tensor starting on a 128-byte line (CPU allocations need not)
        n = math.prod(shape)
        buf = torch.zeros(n + 128, dtype=dtype)
        off = (-buf.data_ptr()) % 128 // buf.element_size()
        return buf[off:off + n].view(shape)
    codes = aligned((8, 2, 16, 16), torch.int32)  # 64 bytes a token: 1 KB a 16-token part, 8 lines
    scales = aligned((8, 2, 16, 2), torch.float16)  # 4 bytes a token: 64-byte parts, at 64-byte steps
    got = gluon.l2_parts([(codes, 1), (None, 1), (None, 1), (codes, 1), (scales, 1), (None, 1)], 16, 16)
    assert got["L2N"] == (8, 0, 0, 8, 2, 0) and got["L2B"] == (1024, 0, 0, 1024, 64, 0)
    assert got["L2U"] == (64, 0, 0, 64, 4, 0) and got["L2E"] == (4, 0, 0, 4, 2, 0) and got["NLP"] == 32
    off = aligned((8, 2, 16, 16 + 1), torch.int32)[..., :16]  # page and head strides off the lines: one more line
    assert gluon.l2_parts([(off, 1)] + [(None, 1)] * 5, 16, 16)["L2N"][0] == 9
    two = gluon.l2_parts([(codes, 1), (None, 1), (None, 1), (codes, 1), (scales, 1), (None, 1)], 16, 32)
    assert two["L2N"] == (8, 0, 0, 8, 2, 0) and two["NLP"] == 64  # 2 pages x 18 lines a warp
    kivi = aligned((8, 2, 1, 128, 16), torch.int16)  # a 32-token group of 4-bit codes: 128 channels x 16 bytes
    assert gluon.l2_parts([(kivi, 32)] + [(None, 1)] * 5, 32, 32)["L2S"][0] == 5
    assert gluon.l2_parts([(codes, 1)] + [(None, 1)] * 5, 48, 32) is None  # 48-token pages, 32-token warp tiles


@GPU
@pytest.mark.parametrize("name,tw,l2,unroll", [("q4_0", 16, 2, False), ("q4_0", 32, 4, False), ("q8_0", 32, 2, True),
                                               ("fp8_e4m3", 32, 3, False), ("nf4", 16, 2, False),
                                               ("kivi4", 32, 2, False), ("int4_had", 16, 1, True)])
def test_gluon_l2_prefetch_on_the_gpu(name, tw, l2, unroll):
    """The L2 prefetch compiled for the GPU (its asm, the tables' addresses): the same attention as without it, and
    as the reference, over odd lengths and splits."""
    P = 32 if "kivi" in name else 16
    sch, args, kw, q, ref = _case(name, _gpu_lens(name, [1, 63, 1000, 4096, 4000]), 32, 8, P, seed=6, q_seed=4,
                                  device="cuda")
    assert torch.isfinite(ref).all()
    outs = [decode(q, *args, sch.k, sch.v, P, **kw, num_splits=3,
                   config=GluonDecodeConfig(tokens_per_warp=tw, prefetch=True, unroll=unroll, l2_prefetch=n))
            for n in (0, l2)]
    assert torch.isfinite(outs[1]).all(), "unwritten, NaN or inf output elements"
    assert torch.equal(outs[0], outs[1]), "the prefetch changed the attention"
    err = _rel_err(outs[1], ref)
    assert err < TOL, f"relative error {err:.2e}"


@pytest.mark.parametrize("scheme,tw,page", [("q4_0", 16, 16), ("fp8_e4m3", 32, 16), ("q8_0", 32, 16)])
def test_l2_prefetch_compiles_for_sm90(scheme, tw, page):
    """Offline sm_90: the L2 prefetch is one CCTL (prefetch) a lane line in the main loop (not removed as unused),
    without spills. (kivi4 at 32-token tiles spills 16 bytes with it on the H200's ptxas: runs/s26-9c1f792.)"""
    head, _ = _sm90_offline(f"gluon:{scheme}", "--tw", str(tw), "--page", str(page), "--l2", "2")
    assert "STACK:0" in head and "LOCAL:0" in head, f"spills: {head}"
    assert int(re.search(r"CCTL:(\d+)", head).group(1)) >= 1, head


@GPU
@pytest.mark.parametrize("name,tw", [("q4_0", 16), ("q8_0", 32), ("mxfp4", 16), ("nf4", 16), ("int3:g32:asym", 16),
                                     ("kivi4", 32), ("int4_had", 16)])
def test_gluon_unrolled_loop_on_the_gpu(name, tw):
    """The unrolled tile loop compiled for the GPU: lengths of odd and even tile counts per split, against the
    reference."""
    P = 32 if "kivi" in name else 16
    sch, args, kw, q, ref = _case(name, _gpu_lens(name, [1, 63, 1000, 4096, 4000]), 32, 8, P, seed=6, q_seed=4,
                                  device="cuda")
    assert torch.isfinite(ref).all()
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=3,
                 config=GluonDecodeConfig(tokens_per_warp=tw, prefetch=True, unroll=True))
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


def test_prefetch_default():
    """Channel-axis int4 / int3 keys at head_dim 256 load one tile at a time (two tiles of their code units, scales
    and zeros spill); every other codec and head dim prefetches; the config field checks its value."""
    assert not gluon.prefetches(gc.KC4, 256) and not gluon.prefetches(gc.KC3, 256)
    assert gluon.prefetches(gc.KC2, 256)  # measured faster with it (kivi2, the H200)
    assert gluon.prefetches(gc.KC4, 128) and gluon.prefetches(gc.Q4, 256)
    for bad in ("yes", 1, 0, 1.0):  # (1 == True: a bool, not any truthy number)
        with pytest.raises(ValueError, match="prefetch"):
            GluonDecodeConfig(prefetch=bad)


# ---- GPU ------------------------------------------------------------------------------------------------
# (scheme, lens, Hq, Hk, P, splits, warps, tokens per warp)
CASES = [
    ("q4_0", [1, 17, 63, 1000, 4096], 32, 8, 16, None, 4, 16),
    ("q4_0", [1, 17, 63, 1000, 4096], 32, 8, 16, 1, 4, 32),
    ("q4_0", [1, 17, 63, 1000, 4096], 32, 8, 16, 7, 8, 16),
    ("q4_0", [5, 100, 333], 8, 8, 32, 3, 4, 32),     # GQA 1
    ("q4_0", [64, 65, 777], 64, 8, 64, 2, 4, 16),    # GQA 8, pages of 64
    ("q4_0", [0, 48, 2000], 16, 1, 16, 5, 2, 32),    # GQA 16, an empty sequence
    ("q4_0", [150, 97], 32, 8, 48, 2, 4, 32),        # a warp's tokens cross a page mid-tile
    ("q4_0", [32768], 32, 8, 16, None, 4, 32),
    *[(s, [1, 17, 63, 1000, 4096], 32, 8, 16, S_, 4, tw) for s in SCHEMES[1:] for S_, tw in ((None, 16), (3, 32))],
    ("q8_0", [0, 48, 2000], 16, 1, 16, 5, 8, 32),
    ("fp8_e4m3", [150, 97], 32, 8, 48, 2, 4, 32),
    # channel-axis keys (KIVI): 32 tokens per warp, pages of whole token groups
    ("kivi4", [32, 96, 1024, 4096, 0], 32, 8, 32, None, 4, 32),
    ("kivi4", [32, 96, 1024, 4096], 32, 8, 32, 3, 8, 32),
    ("kivi4", [32768], 32, 8, 32, None, 4, 32),
    ("kivi2", [32, 96, 1024, 4096], 32, 8, 32, None, 4, 32),
    ("kivi2", [64, 2048], 16, 1, 64, 5, 4, 32),                          # GQA 16, pages of 64
    ("k=int4:g32:chan:asym,v=lm3:rot=had", [32, 96, 1024, 4096], 32, 8, 32, 3, 4, 32),  # the searched K | V pair
    ("k=int3:g32:chan:asym,v=lm2:rot=had", [32, 96, 1024, 4096], 32, 8, 32, None, 4, 32),
    ("k=int3:g64:chan:asym,v=int3:g32:asym", [64, 1024, 3968], 16, 1, 64, 3, 4, 32),
    ("k=int4:g64:chan:asym,v=q8_0", [128, 1024, 4096], 32, 8, 64, 3, 4, 32),
    ("k=int4:g32:chan:asym:rot=had,v=int4:g32:asym:rot=had", [96, 4000], 32, 8, 32, 2, 4, 32),
    ("kivi4", [1024, 96], 32, 8, 32, 2, 4, 32, [40, 130]),               # KIVI's residual in full precision
    ("kivi2", [4096, 0], 32, 8, 32, 3, 4, 32, [150, 7]),
    ("k=int2:g32:chan:asym:cal,v=lm2:rot=had", [32, 96, 1024, 4096], 32, 8, 32, 3, 4, 32),  # calibrated int keys
    ("k=int3:g32:chan:asym:cal,v=lm3:rot=had", [96, 4000], 32, 8, 32, 2, 4, 32),
    ("k=int4:g32:chan:asym:cal,v=lm3:rot=had", [1024, 96], 32, 8, 32, 2, 4, 32, [40, 130]),
]
GPU_FP_CASES = [("q4_0", [17, 3000, 0], [5, 132, 40], 3, 16), ("int4_had", [40, 1300], [70, 3], 2, 32),
                ("q8_0", [640, 90], [1, 33], 1, 16)]


@GPU
@pytest.mark.parametrize("c", CASES + [(n, lens, 32, 8, 16, S_, 4, tw, fp) for n, lens, fp, S_, tw in GPU_FP_CASES],
                         ids=_emu_ids(CASES) + [f"{n}-fp{max(fp)}-S{S_}-tw{tw}" for n, _, fp, S_, tw in GPU_FP_CASES])
def test_gluon_matches_reference(c):
    name, lens, Hq, Hk, P, S_, NW, TW = c[:8]
    if TW == 16 and gc.codec_of(kvlab.scheme(name).k) in gc.CHAN:
        pytest.skip("channel-axis keys run with 32 tokens per warp")
    fp_lens = c[8] if len(c) > 8 else None
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=sum(lens) % 997, q_seed=3, device="cuda",
                                  fp_lens=fp_lens)
    out = torch.full_like(q, float("nan"))
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=S_, out=out,
                 config={"kernel": "gluon", "num_warps": NW, "tokens_per_warp": TW})
    assert got.data_ptr() == out.data_ptr()
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"
    empty = [i for i, L in enumerate(lens) if L == 0 and not (fp_lens and fp_lens[i])]
    if empty:
        assert (got[empty] == 0).all()


@GPU
@pytest.mark.parametrize("name", SCHEMES + ["kivi4", "kivi2", "lm4:rot=had"])
@pytest.mark.parametrize("B,Hq,Hk", [(8, 32, 8), (8, 28, 4)])
def test_gluon_few_programs_default_on_the_gpu(name, B, Hq, Hk):
    """The untuned config where few (sequence, KV head) programs fill the SMs (`api.gluon_default`: 8 warps of 32
    tokens, about one program an SM) on ragged lengths, an empty sequence and poisoned pages == the reference."""
    from kvlab.kernels.decode import api as dapi
    sch = kvlab.scheme(name)
    P = 32 if sch.k.axis == "chan" else 16
    if not dapi.few_programs(B, Hk, 128, "cuda"):  # a GPU with B * Hk SMs or fewer: its config, 8 warps at 1 split
        cfg = GluonDecodeConfig(num_warps=8, tokens_per_warp=32, num_splits=1)
    else:
        cfg = dapi.gluon_default(B, Hk, sch.k, "cuda", sch.v, 128)
    assert (cfg.num_warps, cfg.tokens_per_warp) == (8, 32) and cfg.num_splits >= 1
    lens = [1, 17, 1000, 4097, 0, 63, 2000, 333][:B] if sch.k.axis != "chan" else [32, 96, 1024, 4096, 0, 64, 2048, 320]
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=11, q_seed=3, device="cuda")
    out = torch.full_like(q, float("nan"))
    got = decode(q, *args, sch.k, sch.v, P, **kw, out=out, config=cfg)
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"
    assert (got[4] == 0).all()  # the empty sequence


@GPU
@pytest.mark.parametrize("c", EMU_D_CASES, ids=[f"{c[0]}-D{c[8]}-Hq{c[2]}-Hk{c[3]}-tw{c[7]}" for c in EMU_D_CASES])
def test_gluon_matches_reference_at_other_head_dims(c):
    name, lens, Hq, Hk, P, S_, NW, TW, D, fp_lens = c
    lens = [L * 13 for L in lens]  # longer on the GPU: many tiles per split
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=7, q_seed=3, device="cuda", fp_lens=fp_lens, D=D)
    out = torch.full_like(q, float("nan"))
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=S_, out=out,
                 config={"kernel": "gluon", "num_warps": NW, "tokens_per_warp": TW})
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


@GPU
@pytest.mark.parametrize("name", ["q4_0", "kivi4", "nvfp4"])
def test_gluon_fused_merge_on_the_gpu(name):
    """One launch (the last split program merges) == the merge kernel; counters stay zero across CUDA-graph replays."""
    P = 32 if name == "kivi4" else 16
    sch, args, kw, q, ref = _case(name, [32, 1024, 4096, 0], 32, 8, P, seed=2, q_seed=6, device="cuda")
    kv = _kv(q, sch, args, kw, P)
    cfg = GluonDecodeConfig(num_splits=7, tokens_per_warp=32, fused_merge=True)
    sep = gluon.run(q, kv, 128 ** -0.5, cfg.replace(fused_merge=False))
    out = torch.empty_like(q)
    run = gluon.run(q, kv, 128 ** -0.5, cfg, out=out, plan=True)
    g = torch.cuda.CUDAGraph()
    run()
    with torch.cuda.graph(g):
        run()
    for _ in range(3):
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.float(), sep.float(), rtol=1e-2, atol=1e-2)
    assert (gluon.counters("cuda", 1) == 0).all()
    assert _rel_err(out, ref) < TOL


@GPU
def test_gluon_plan_relaunches_on_updated_q():
    sch = kvlab.scheme("q4_0")
    cache = make_paged([300, 40], 8, 128, 16, sch.k, sch.v, seed=1, device="cuda")
    args, kw = call_args(cache)
    q = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    run = decode(q, *args, sch.k, sch.v, 16, **kw, config={"kernel": "gluon"}, plan=True)
    first = run().clone()
    q.copy_(torch.randn_like(q))
    second = run()
    ref = decode(q.float(), *args, sch.k, sch.v, 16, **kw, backend="reference")
    assert not torch.equal(first, second)
    assert (second.float() - ref).abs().max().item() / ref.abs().max().item() < TOL


@GPU
@pytest.mark.parametrize("name", ["k=int2:g32:chan:asym:cal,v=lm2:rot=had:cal", "k=lm3:g64:cal,v=q4_0"])
def test_gluon_calibrated_tables_in_a_cuda_graph(name):
    """A calibrated table's words are made from the pages at every launch, with no host-to-device copy, so a plan
    captures in a CUDA graph; the replay reads the table as it is then (a changed table changes the output)."""
    sch = kvlab.scheme(name)
    cache = make_paged([320, 64], 8, 128, 32, sch.k, sch.v, seed=1, device="cuda")
    args, kw = call_args(cache)
    q = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    run = decode(q, *args, sch.k, sch.v, 32, **kw, config={"kernel": "gluon", "tokens_per_warp": 32}, plan=True)
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = run()
    g.replay()
    ref = decode(q.float(), *args, sch.k, sch.v, 32, **kw, backend="reference")
    assert (out.float() - ref).abs().max().item() / ref.abs().max().item() < TOL
    first = out.clone()
    cache["k_pages"]["codebook"].mul_(1.5)  # the next replay reads the new levels
    g.replay()
    assert not torch.equal(first, out)


@GPU
@pytest.mark.parametrize("name,maxnreg,tw,ot", [("q4_0", 168, 16, True), ("q4_0", 128, 32, True),
                                                 ("q8_0", 168, 32, True), ("int4_had", 128, 16, True),
                                                 ("q4_0", None, 16, False), ("q8_0", 168, 32, False),
                                                 ("fp8_e4m3", None, 32, False)])
def test_gluon_register_cap_and_orientation_keep_results(name, maxnreg, tw, ot):
    """A register cap (maxnreg: spills at 128 / at 32 tokens) changes the schedule, never the result; so does
    accumulating O = P V (ot False) instead of O^T."""
    sch, args, kw, q, ref = _case(name, [1, 63, 1000, 4096], 32, 8, 16, seed=5, q_seed=4, device="cuda")
    got = decode(q, *args, sch.k, sch.v, 16, **kw, num_splits=3,
                 config=GluonDecodeConfig(tokens_per_warp=tw, maxnreg=maxnreg, transpose_o=ot))
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


def test_gluon_rejects_bad_register_cap():
    sch = kvlab.scheme("q4_0")
    cache = make_paged([20], 2, 128, 16, sch.k, sch.v, seed=1)
    args, kw = call_args(cache)
    q = torch.randn(1, 8, 128).to(torch.bfloat16)
    with pytest.raises(ValueError, match="maxnreg=16; allowed: None or an int in \\[32, 255\\]"):
        decode(q, *args, sch.k, sch.v, 16, **kw, config={"kernel": "gluon", "maxnreg": 16})


@GPU
def test_tuner_offers_gluon_where_it_runs(monkeypatch):
    monkeypatch.setenv("KVLAB_GLUON", "1")
    for name in ("q4_0", "q8_0", "fp8_e4m3", "q4_0,window=16"):
        space = autotune.gluon_space(kvlab.scheme(name), 32, 32, 8, 128, 16, "cuda")
        assert len(space) == 7 and all(isinstance(c, GluonDecodeConfig) for c in space), name
    assert autotune.gluon_space(kvlab.scheme("int5:g16:asym"), 32, 32, 8, 128, 16, "cuda") == []


def test_tuner_leaves_gluon_out_until_gpu_verified(monkeypatch):
    monkeypatch.delenv("KVLAB_GLUON", raising=False)
    monkeypatch.setattr(gluon, "GPU_VERIFIED", ())
    assert autotune.gluon_space(kvlab.scheme("q4_0"), 32, 32, 8, 128, 16, "cuda") == []
    assert not gluon.gpu_verified("cpu")


def test_codecs_untested_on_gpu_stay_off_the_default_path(monkeypatch):
    """A codec in GPU_UNTESTED (as int5 / int6 were until their GPU tests ran), or in GPU_UNTESTED_G16 at groups of 16,
    is not verified on a verified GPU, on either side, so default dispatch and the tuner leave it to the Triton
    kernels; the others are. Both lists are empty today."""
    assert gluon.GPU_UNTESTED == () and gluon.GPU_UNTESTED_G16 == ()
    monkeypatch.setattr(gluon, "GPU_UNTESTED", gc.NIBP)
    monkeypatch.setattr(gluon, "GPU_UNTESTED_G16", (gc.Q4, gc.Q4A, gc.CB))
    monkeypatch.delenv("KVLAB_GLUON", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda dev=None: (9, 0))
    ok = lambda n: gluon.gpu_verified("cuda", kvlab.scheme(n).k, kvlab.scheme(n).v)  # noqa: E731
    assert gluon.gpu_verified("cuda") and ok("q4_0") and ok("k=int3:g32:asym,v=lm2")
    assert not ok("q5_0") and not ok("k=q8_0,v=int6:g32:sym") and not ok("k=int5:g64:asym,v=q4_0")
    assert not ok("int4:g16:sym") and not ok("k=q8_0,v=nf4:g16") and ok("nvfp4") and ok("k=q4_0,v=int4:g32:asym")
    assert autotune.gluon_space(kvlab.scheme("q5_1"), 32, 32, 8, 128, 16, "cuda") == []
    monkeypatch.setattr(gluon, "GPU_UNTESTED", ())
    monkeypatch.setattr(gluon, "GPU_UNTESTED_G16", ())
    assert ok("q5_0") and ok("int4:g16:sym")


def test_tuned_gluon_entries_for_untested_codecs_are_refused(monkeypatch):
    """A tuned (or nearest-bucket) entry that names the Gluon kernel does not bring an untested codec back onto the
    default path: `resolve` refuses it with the reason and falls through to the Triton kernels."""
    from kvlab.kernels.configs import TritonDecodeConfig
    from kvlab.kernels.decode import api as dapi
    monkeypatch.setattr(gluon, "GPU_UNTESTED", gc.NIBP)
    monkeypatch.setattr(gluon, "why_not", lambda q, kv, cfg: None)  # as on a GPU the kernel runs
    dev = "cuda" if CUDA else "cpu"  # (the Triton fallback runs on CUDA tensors, or on the CPU under the interpreter)
    monkeypatch.setattr(dapi, "candidates", lambda *a, **k: [("tuned: user file", GluonDecodeConfig(num_splits=2)),
                                                              ("triton default", TritonDecodeConfig())])
    for name, kernel in (("q5_1", "triton"), ("k=q4_0,v=int6:g32:sym", "triton"), ("q4_0", "gluon")):
        sch = kvlab.scheme(name)
        c = make_paged([20], 2, 128, 16, sch.k, sch.v, device=dev)
        args, kw = call_args(c)
        q = torch.randn(1, 8, 128, device=dev)
        kv = check_prefix(q, *args, sch.k, sch.v, 16, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw["k_tensor_scale"],
                          kw["v_tensor_scale"], 1)
        _, cfg = dapi.resolve(q, kv)
        assert cfg.kernel == kernel, name
        refused = dapi.last_dispatch()["refused"]
        assert (kernel == "gluon") == (not refused), name
        if refused:
            assert "has not passed the GPU tests" in refused[0][2]


# every codec family, GQA 1 to 8, 16- and 32-token tiles, unrolled or not, D 64 / 128 / 256: (scheme, lens, Hq, Hk, P,
# splits, warps, tokens per warp, unroll, D)
ST_CASES = [
    ("q4_0", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, False, 128),
    ("q4_0", [0, 96, 192, 256, 320], 8, 1, 16, 1, 2, 32, True, 128),    # GQA 8, an empty sequence, odd tile counts
    ("q8_0", [0, 130], 4, 4, 32, 2, 2, 32, False, 128),                  # GQA 1
    ("fp8_e4m3", [150, 97], 8, 2, 48, 2, 2, 32, False, 128),            # a warp's tokens cross a page mid-tile
    ("k=q8_0,v=q4_0", [5, 77], 9, 3, 16, 2, 4, 16, True, 64),           # SmolLM2's GQA 3 at D 64
    ("int4_had", [40, 130], 8, 2, 32, 2, 4, 16, False, 128),
    ("int2:g32:asym", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, False, 128),
    ("kivi4", [32, 96, 160, 320], 8, 2, 32, 3, 4, 32, False, 128),      # channel-axis keys
    ("k=int3:g32:chan:asym,v=lm3:rot=had", [0, 96, 224], 8, 8, 32, 1, 4, 32, False, 128),
    ("mxfp4", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, True, 128),
    ("nvfp4", [1, 17, 63, 200], 8, 4, 16, 2, 4, 32, False, 256),        # GQA 2 at D 256
    ("nf4", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, False, 128),
    ("int3:g32:asym", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, True, 128),
    ("lm2:rot=had", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, False, 128),
]


@pytest.mark.parametrize("c", ST_CASES, ids=[f"{c[0]}-Hq{c[2]}-Hk{c[3]}-tw{c[7]}-u{int(c[8])}-D{c[9]}" for c in ST_CASES])
@EMU
def test_emulated_transposed_scores(c, monkeypatch):
    """Scores transposed (config `scores_t`, constexpr ST: S^T = K Q^T, the heads in the MMA's columns, each score's
    running sum kept apart until after the loop): the same attention as the float32 reference for every codec family,
    GQA 1 to 8, both tile sizes, the unrolled loop, head dims 64 / 128 / 256, with NaN past each sequence's end and a
    NaN-poisoned output; it reaches the kernel (a dropped ST, a wrong transposition of P or a sum over the wrong axis
    fails these)."""
    name, lens, Hq, Hk, P, S_, NW, TW, unroll, D = c
    seen = _spy_emulated(monkeypatch, "ST")
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=23, q_seed=8, D=D)
    assert torch.isfinite(ref).all()
    out = torch.full_like(q, float("nan"))
    cfg = GluonDecodeConfig(num_warps=NW, tokens_per_warp=TW, num_splits=S_, unroll=unroll, scores_t=True)
    got = gluon.run(q, _kv(q, sch, args, kw, P), D ** -0.5, cfg, out=out)
    assert seen == [True], "the transposed scores did not reach the kernel"
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"
    if lens[0] == 0:
        assert (got[0] == 0).all(), "an empty sequence attends nothing"


@EMU
def test_transposed_scores_config_and_group_limit(monkeypatch):
    """scores_t needs the O^T accumulator (a clear error otherwise) and applies to GQA groups of up to 8: a group of
    16 runs the padded-row scores (ST False at the launch) with the same result."""
    with pytest.raises(ValueError, match="scores_t=True .* needs transpose_o=True"):
        GluonDecodeConfig(scores_t=True, transpose_o=False)
    with pytest.raises(ValueError, match="scores_t=1; allowed: None, True, False"):
        GluonDecodeConfig(scores_t=1)
    monkeypatch.setattr(gluon, "SCORES_T", False)
    assert gluon.scores_t(GluonDecodeConfig(scores_t=True), 8) and not gluon.scores_t(GluonDecodeConfig(), 8)
    monkeypatch.setattr(gluon, "SCORES_T", True)  # the kernel's default where the config leaves it None
    assert gluon.scores_t(GluonDecodeConfig(), 4) and not gluon.scores_t(GluonDecodeConfig(scores_t=False), 4)
    assert not gluon.scores_t(GluonDecodeConfig(transpose_o=False), 4)
    seen = _spy_emulated(monkeypatch, "ST")
    sch, args, kw, q, ref = _case("q4_0", [100, 70], 16, 1, 64, seed=11, q_seed=2)
    got = gluon.run(q, _kv(q, sch, args, kw, 64), 128 ** -0.5,
                    GluonDecodeConfig(num_warps=4, tokens_per_warp=16, num_splits=2, scores_t=True))
    assert seen == [False]
    assert _rel_err(got, ref) < TOL


@pytest.mark.parametrize("scheme,tw,page", [("q4_0", 16, 16), ("kivi4", 32, 32), ("fp8_e4m3", 16, 16)])
def test_transposed_scores_compile_for_sm90(scheme, tw, page, monkeypatch):
    """Offline sm_90 compile of the transposed scores: a third fewer MMAs in the loop (Q K^T takes D / 16 of them a
    16-token tile instead of D / 8 with 16 padded head rows; P V D / 16 either way: 16 instead of 24 at D 128), no
    spill. (KIVI's keys per element: folded, they add the zeros' MMAs, `test_kivi_fold_compiles_for_sm90`.)"""
    monkeypatch.setenv("KVLAB_GLUON_KIVI_FOLD", "0")
    hmma = {}
    for st in ((), ("--st",)):
        head, _ = _sm90_offline(f"gluon:{scheme}", "--tw", str(tw), "--page", str(page), *st)
        assert "STACK:0" in head and "LOCAL:0" in head, f"spills: {head}"
        hmma[bool(st)] = int(re.search(r"HMMA:(\d+)", head).group(1))
    assert hmma == {False: 24 * tw // 16, True: 16 * tw // 16}, hmma


def _loads_by_program(q, kvp, D, cfg):
    """(output, each emulated program's loads in order as address tuples) of one `gluon.run` under the emulator's
    trace (the caller has put the emulated kernel in place)."""
    from devtools import gluon_emu
    with gluon_emu.traced() as trace:
        out = gluon.run(q, kvp, D ** -0.5, cfg, out=torch.full_like(q, float("nan")))
    progs = []
    for k, a, _ in trace:
        if k == "prog":
            progs.append([])
        elif k == "ld" and progs:
            progs[-1].append(tuple(a.tolist()))
    return out, progs


@EMU
@pytest.mark.parametrize("name,D,P,tw", [("q4_0", 128, 16, 32), ("q4_0", 128, 64, 16), ("kivi4", 128, 32, 32),
                                         ("int3:g32:asym", 256, 16, 16), ("nvfp4", 256, 16, 32), ("mxfp4", 64, 48, 16),
                                         ("k=int3:g32:chan:asym,v=lm2", 64, 32, 32), ("fp8_e4m3", 128, 16, 32)])
def test_emulated_folded_offsets_read_the_same_bytes(name, D, P, tw, monkeypatch):
    """`gluon_codecs.FOLD_ROWS` changes how the loads' offsets are summed, not what they read: with it off and on,
    every emulated load reads the same addresses in the same order and the attention is the same (one and two pages
    a warp tile, 64- and 48-token pages, channel-axis keys with a 3-bit plane, per-word fp4 scales at D 256)."""
    from devtools import gluon_emu
    monkeypatch.setattr(gluon, "_decode_mma_kernel", gluon_emu.emulate(gluon._decode_mma_kernel))
    chan = "chan" in name or "kivi" in name
    lens = [96, 320, 0] if chan else [77, 300, 1]  # (channel-axis keys: whole token groups)
    sch, args, kw, q, ref = _case(name, lens, 8, 2, P, seed=31, q_seed=6, D=D)
    kvp = _kv(q, sch, args, kw, P)
    cfg = GluonDecodeConfig(num_warps=2, tokens_per_warp=tw, num_splits=2)
    outs, traces = [], []
    for fold in (False, True):
        monkeypatch.setattr(gc, "FOLD_ROWS", gc.ttgl.constexpr(fold))
        out, progs = _loads_by_program(q, kvp, D, cfg)
        outs.append(out)
        traces.append(progs)
    assert sum(map(len, traces[1])) > 20 and traces[0] == traces[1], "the folded offsets read other bytes"
    assert torch.equal(outs[0], outs[1])
    assert _rel_err(outs[1], ref) < TOL


@EMU
@pytest.mark.parametrize("name,D,P,tw,S_,pf,l2", [("q4_0", 128, 16, 16, 3, None, 0), ("q4_0", 128, 16, 32, 1, None, 0),
                                                  ("q4_0", 128, 64, 16, 2, False, 0), ("kivi4", 128, 32, 32, 2, None, 0),
                                                  ("int3:g32:asym", 256, 16, 16, 1, False, 0),
                                                  ("fp8_e4m3", 64, 16, 32, 3, True, 0), ("nvfp4", 256, 16, 32, 2, None, 0),
                                                  ("k=int3:g32:chan:asym,v=lm2", 64, 32, 32, 1, True, 0),
                                                  ("q4_0", 128, 32, 32, 2, True, 2), ("kivi2", 128, 32, 32, 3, False, 1),
                                                  ("q4_0", 128, 16, 16, 2, "u", 0), ("kivi4", 128, 32, 32, 1, "u", 2),
                                                  ("int3:g32:asym", 64, 16, 16, 1, "u", 0)])
def test_emulated_whole_tiles_unmasked(name, D, P, tw, S_, pf, l2, monkeypatch):
    """`gluon.FULL_TILES`: the rolled loop loads and scores the tiles that lie wholly before a split's end without
    masks and only the partial last tile with them. Against every tile masked: in each program the same loads at the
    same addresses in the same order (an unmasked load past a tensor would fail the emulator's indexing), but for
    a last prefetch past the end that either loop may issue and the other not (one block of one tile's loads, the
    same count in every program where they differ), and the same attention; with lengths 0 and 1, whole splits,
    partial last tiles, one split (the direct output) and several, the register prefetch on and off, the loop
    unrolled by two ("u": against its masked form), the L2 prefetch (whose lines the emulator records apart:
    `test_emulated_l2_prefetch` checks them with whole tiles unmasked)."""
    from devtools import gluon_emu
    monkeypatch.setattr(gluon, "_decode_mma_kernel", gluon_emu.emulate(gluon._decode_mma_kernel))
    chan = "chan" in name or "kivi" in name
    lens = [96, 512, 0, 224] if chan else [77, 1, 300, 0, 256]  # (channel-axis keys: whole token groups)
    sch, args, kw, q, ref = _case(name, lens, 8, 2, P, seed=37, q_seed=9, D=D)
    kvp = _kv(q, sch, args, kw, P)
    cfg = GluonDecodeConfig(num_warps=2, tokens_per_warp=tw, num_splits=S_, prefetch=True if pf == "u" else pf,
                            unroll=pf == "u", l2_prefetch=l2)
    outs, traces = [], []
    for ft in (False, True):
        monkeypatch.setattr(gluon, "FULL_TILES", ft)
        out, progs = _loads_by_program(q, kvp, D, cfg)
        outs.append(out)
        traces.append(progs)
    assert len(traces[0]) == len(traces[1]) and sum(map(len, traces[1])) > 20
    extra = set()
    for old, new in zip(*traces):  # one program's loads: the longer list is the shorter with one block inserted
        short, long_ = sorted((old, new), key=len)
        d = len(long_) - len(short)
        k = next((i for i, (x, y) in enumerate(zip(short, long_)) if x != y), len(short))  # common prefix
        assert long_[:k] == short[:k] and long_[k + d:] == short[k:], "the unmasked whole tiles read other bytes"
        if d:
            extra.add(d)
    assert len(extra) <= 1, f"programs differ by blocks of different numbers of loads: {extra}"
    assert torch.isfinite(outs[1]).all() and torch.equal(outs[0], outs[1])
    assert _rel_err(outs[1], ref) < TOL


@pytest.mark.parametrize("scheme,tw,page", [("q4_0", 16, 16), ("kivi4", 32, 32)])
def test_folded_offsets_and_whole_tiles_compile_for_sm90(scheme, tw, page, monkeypatch):
    """`gluon_codecs.FOLD_ROWS` (the page tensors' offsets built as (page base + the lane parts) + each register's
    constant, which the compiler folds into the loads' immediate offsets) and then `gluon.FULL_TILES` (the whole
    tiles' loop without masks) each compile to fewer loop instructions, unspilled (on the H200's Triton 3.6: q4_0 at
    16-token tiles 417 -> 396 -> 370, kivi4 1104 -> 849 -> ...)."""
    counts = []
    for fold, full in (("0", "0"), ("1", "0"), ("1", "1")):
        monkeypatch.setenv("KVLAB_GLUON_FOLD_ROWS", fold)
        monkeypatch.setenv("KVLAB_GLUON_FULL_TILES", full)
        head, _ = _sm90_offline(f"gluon:{scheme}", "--tw", str(tw), "--page", str(page), "--st")
        assert "STACK:0" in head and "LOCAL:0" in head, head
        counts.append(int(re.search(r"loop_instrs=(\d+)", head).group(1)))
    assert counts[0] > counts[1] > counts[2], counts


@GPU
@pytest.mark.parametrize("name,tw,unroll,Hq,Hk,D", [("q4_0", 16, False, 32, 8, 128), ("q8_0", 32, True, 32, 8, 128),
                                                    ("fp8_e4m3", 16, False, 32, 8, 128), ("kivi4", 32, False, 32, 8, 128),
                                                    ("nf4", 16, True, 32, 8, 128), ("int3:g32:asym", 16, False, 32, 8, 128),
                                                    ("mxfp4", 16, False, 32, 32, 128), ("q4_0", 16, False, 9, 3, 64),
                                                    ("q8_0", 16, False, 8, 4, 256), ("int4_had", 32, False, 8, 1, 128)])
def test_gluon_transposed_scores_on_the_gpu(name, tw, unroll, Hq, Hk, D):
    """The transposed scores compiled for the GPU (GQA 1, 2, 3, 4, 8; D 64 / 128 / 256; both tile sizes, the unrolled
    loop), lengths 1..4096, against the reference."""
    P = 32 if "kivi" in name else 16
    sch, args, kw, q, ref = _case(name, _gpu_lens(name, [1, 17, 63, 1000, 4097]), Hq, Hk, P, seed=6, q_seed=4,
                                  device="cuda", D=D)
    assert torch.isfinite(ref).all()
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=3,
                 config=GluonDecodeConfig(tokens_per_warp=tw, unroll=unroll, scores_t=True))
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = _rel_err(got, ref)
    assert err < TOL, f"relative error {err:.2e}"


# keys by scale groups (`gluon.GROUPED_K`, codec C_Q4G): q4_0 keys at head dims 64 / 128 / 256, GQA 1 to 8, both tile
# sizes, the unrolled loop, splits, an empty sequence, values of other codecs, a rotated and a sequential-packing spec:
# (scheme, lens, Hq, Hk, P, splits, warps, tokens per warp, unroll, D)
KG_CASES = [
    ("q4_0", [1, 17, 63, 200], 8, 2, 16, 3, 4, 16, False, 128),
    ("q4_0", [0, 96, 192, 256, 320], 8, 1, 16, 1, 2, 32, True, 128),   # GQA 8, an empty sequence, odd tile counts
    ("k=q4_0,v=q8_0", [0, 130], 4, 4, 32, 2, 2, 32, False, 128),       # GQA 1
    ("k=q4_0,v=nf4", [150, 97], 8, 2, 48, 2, 2, 32, False, 128),       # a warp's tokens cross a page mid-tile
    ("k=q4_0,v=q4_1", [5, 77], 9, 3, 16, 2, 4, 16, True, 64),          # SmolLM2's GQA 3 at D 64
    ("q4_0", [1, 17, 63, 200], 8, 4, 16, 2, 4, 32, False, 256),        # GQA 2 at D 256
    ("int4:g32:sym:pack=seq", [40, 130], 8, 2, 32, 2, 4, 16, False, 128),
    ("int4:g32:sym:rule=signed:rnd=up:pack=ggml:recip:rot=had", [33, 64], 8, 2, 16, 2, 4, 16, False, 128),
]


@pytest.mark.parametrize("c", KG_CASES,
                         ids=[f"{c[0]}-Hq{c[2]}-Hk{c[3]}-tw{c[7]}-u{int(c[8])}-D{c[9]}" for c in KG_CASES])
@EMU
def test_emulated_grouped_keys(c, monkeypatch):
    """Keys by scale groups: the codes enter the MMA as 1024 + n, each group's partial scores take their scale and
    the offsets leave through one more MMA; the same attention as the float32 reference (NaN past each sequence's end,
    a NaN-poisoned output) and as the kernel without it, and it reaches the kernel (a wrong offset, a wrong group's
    scale or a missing high-nibble division fails these)."""
    name, lens, Hq, Hk, P, S_, NW, TW, unroll, D = c
    cfg = GluonDecodeConfig(num_warps=NW, tokens_per_warp=TW, num_splits=S_, unroll=unroll, scores_t=True)
    _switch_off_and_on(monkeypatch, "GROUPED_K", (gc.Q4G,), name, lens, Hq, Hk, P, D, cfg, seed=29, q_seed=5)


def _switch_off_and_on(monkeypatch, switch, codecs, name, lens, Hq, Hk, P, D, cfg, seed, q_seed, spy="KCODEC",
                       q_scale=1.0):
    """The emulated kernel with gluon.<switch> off, then on: on, the launch's constexpr `spy` is one of `codecs` (off
    it is not), every output element is written and finite, and the attention equals the float32 reference and the
    kernel with the switch off (NaN past each sequence's end, a NaN-poisoned output; an empty first sequence gives
    0)."""
    seen = _spy_emulated(monkeypatch, spy)
    sch, args, kw, q, ref = _case(name, lens, Hq, Hk, P, seed=seed, q_seed=q_seed, D=D, q_scale=q_scale)
    assert torch.isfinite(ref).all()
    monkeypatch.setattr(gluon, switch, False)
    base = gluon.run(q, _kv(q, sch, args, kw, P), D ** -0.5, cfg)
    monkeypatch.setattr(gluon, switch, True)
    out = torch.full_like(q, float("nan"))
    got = gluon.run(q, _kv(q, sch, args, kw, P), D ** -0.5, cfg, out=out)
    assert seen[-1] in codecs and seen[0] not in codecs, f"{switch} did not reach the kernel"
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    assert _rel_err(got, ref) < TOL, f"relative error {_rel_err(got, ref):.2e}"
    assert _rel_err(got, base) < TOL, f"relative error against the kernel without it {_rel_err(got, base):.2e}"
    if lens[0] == 0:
        assert (got[0] == 0).all(), "an empty sequence attends nothing"


def test_grouped_keys_apply_to_q4_0_keys_only(monkeypatch):
    """Keys by groups take int4 sym keys at groups of 32 with fp16 scales under the transposed scores, at head dims
    64 / 128 / 256, and nothing else (asym keys, e4m3 scales, other groups, other codecs, the padded-row scores, the
    switch off)."""
    monkeypatch.setattr(gluon, "GROUPED_K", True)
    on = GluonDecodeConfig(scores_t=True)

    def takes(name, D=128, cfg=on, group=4):
        spec = kvlab.scheme(name).k
        return gluon.grouped_k(gc.codec_of(spec), spec, D, cfg, group)
    assert all(takes("q4_0", D) for D in (64, 128, 256))
    assert takes("int4:g32:sym:pack=seq") and takes("int4:g32:sym:rule=signed:rnd=up:pack=ggml:recip:rot=had")
    assert not any(takes(n) for n in ("q4_1", "int4_had", "int4:g64:sym", "int4:g32:sym:s=e4m3", "q8_0", "nf4",
                                      "mxfp4", "kivi4", "int2:g32:asym"))
    assert not takes("q4_0", 96) and not takes("q4_0", cfg=GluonDecodeConfig(scores_t=False))
    assert not takes("q4_0", group=16)  # (groups over 8 run the padded-row scores)
    monkeypatch.setattr(gluon, "GROUPED_K", False)
    assert not takes("q4_0")


def test_grouped_keys_compile_for_sm90(monkeypatch):
    """Keys by groups compile for sm_90 unspilled, each 16-deep slice one MMA with the codes straight from the LOP3,
    to fewer loop instructions than the per-element dequantization (on the H200's Triton 3.6 at 16-token tiles without
    the register prefetch: q4_0 367 -> 349 at 128 registers, 359 -> 334 at 168)."""
    counts = []
    for kg in ("0", "1"):
        monkeypatch.setenv("KVLAB_GLUON_GROUPED_K", kg)
        head, _ = _sm90_offline("gluon:q4_0", "--tw", "16", "--st", "--prefetch", "off")
        assert "STACK:0" in head and "LOCAL:0" in head, head
        counts.append(int(re.search(r"loop_instrs=(\d+)", head).group(1)))
        hmma = int(re.search(r"HMMA:(\d+)", head).group(1))
        assert hmma == (17 if kg == "1" else 16), head  # (the offsets' MMA)
    assert counts[1] < counts[0], counts


@GPU
@pytest.mark.parametrize("name,tw,prefetch,unroll,Hq,Hk,D", [
    ("q4_0", 16, None, False, 32, 8, 128), ("q4_0", 32, False, False, 32, 8, 128), ("q4_0", 16, None, True, 32, 8, 128),
    ("q4_0", 32, False, False, 9, 3, 64), ("q4_0", 16, None, False, 8, 4, 256),
    ("k=q4_0,v=q8_0", 16, False, False, 8, 1, 128)])
def test_grouped_keys_on_the_gpu(name, tw, prefetch, unroll, Hq, Hk, D, monkeypatch):
    """Keys by groups compiled for the GPU (GQA 1, 3, 4; D 64 / 128 / 256; both tile sizes, with and without the
    register prefetch, the unrolled loop), lengths 1..4097, against the reference: what the emulator cannot check is
    the MMA's fp32 accumulation of 1024 + n codes against the offsets' MMA."""
    monkeypatch.setattr(gluon, "GROUPED_K", True)
    sch, args, kw, q, ref = _case(name, [1, 17, 63, 1000, 4097], Hq, Hk, 16, seed=7, q_seed=3, device="cuda", D=D)
    assert torch.isfinite(ref).all()
    cfg = GluonDecodeConfig(tokens_per_warp=tw, prefetch=prefetch, unroll=unroll, scores_t=True)
    assert gluon.grouped_k(gc.codec_of(sch.k), sch.k, D, cfg, Hq // Hk)
    got = decode(q, *args, sch.k, sch.v, 16, **kw, num_splits=3, config=cfg)
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    assert _rel_err(got, ref) < TOL, f"relative error {_rel_err(got, ref):.2e}"


# KIVI's int4 keys folded (`gluon.KIVI_FOLD`, codec C_KF4): (scheme, lens, Hq, Hk, P, splits, warps, unroll, D)
KF_CASES = [
    ("kivi4", [32, 96, 160, 320], 8, 2, 32, 3, 4, False, 128),
    ("kivi4", [0, 64, 192, 256], 8, 1, 32, 1, 2, True, 128),            # GQA 8, an empty sequence, the unrolled loop
    ("k=int4:g32:chan:asym,v=q8_0", [96, 32], 4, 4, 64, 2, 4, False, 128),  # GQA 1, 64-token pages
    ("kivi4", [32, 224], 9, 3, 32, 2, 4, False, 64),                    # SmolLM2's GQA 3 at D 64
    ("kivi4", [64, 160], 8, 4, 32, 2, 4, False, 256),                   # GQA 2 at D 256
    ("k=int4:g64:chan:asym,v=nf4", [64, 192], 8, 2, 64, 2, 4, False, 128),  # groups of 64: half a group a tile
    ("kivi2", [32, 96, 160, 320], 8, 2, 32, 3, 4, False, 128),            # int2 keys
    ("kivi2", [0, 64, 192], 9, 3, 32, 2, 4, True, 64),
    ("k=int2:g64:chan:asym,v=q4_0", [64, 192], 8, 4, 64, 2, 4, False, 256),
]


@pytest.mark.parametrize("c", KF_CASES,
                         ids=[f"{c[0]}-Hq{c[2]}-Hk{c[3]}-P{c[4]}-u{int(c[7])}-D{c[8]}" for c in KF_CASES])
@EMU
def test_emulated_kivi_keys_folded(c, monkeypatch):
    """KIVI's int4 keys with scales and zeros folded out of the tile: codes as fp16 subnormals, the query times the
    scales, the zeros by one MMA, 2^24 / 2^20 by token parity; the same attention as the float32 reference (NaN past
    each sequence's end, a NaN-poisoned output) and as the per-element kernel, and the codec reaches the kernel (a
    wrong parity factor, a dropped zero term or scale fails these)."""
    name, lens, Hq, Hk, P, S_, NW, unroll, D = c
    cfg = GluonDecodeConfig(num_warps=NW, tokens_per_warp=32, num_splits=S_, unroll=unroll, scores_t=True)
    _switch_off_and_on(monkeypatch, "KIVI_FOLD", tuple(gc.FOLDED), name, lens, Hq, Hk, P, D, cfg, seed=31, q_seed=6)


def test_kivi_fold_applies_to_int4_channel_keys_only(monkeypatch):
    """The fold takes KIVI's int4 and int2 channel-axis keys under the transposed scores, and nothing else (3-bit
    channel keys, calibrated tables, token-axis ints, the padded-row scores, the switch off)."""
    monkeypatch.setattr(gluon, "KIVI_FOLD", True)
    on = GluonDecodeConfig(tokens_per_warp=32, scores_t=True)

    def folds(name, cfg=on, group=4):
        return gluon.kivi_folds(gc.codec_of(kvlab.scheme(name).k), cfg, group)
    assert folds("kivi4") and folds("k=int4:g64:chan:asym,v=q4_0") and folds("k=int4:g128:chan:asym,v=q8_0")
    assert folds("kivi2") and folds("k=int2:g64:chan:asym,v=q4_0")
    assert not any(folds(n) for n in ("k=int3:g32:chan:asym,v=q4_0", "k=int4:g32:chan:asym:cal,v=q4_0",
                                      "k=int2:g32:chan:asym:cal,v=q4_0", "q4_1", "q4_0", "int2:g32:asym"))
    assert not folds("kivi4", cfg=GluonDecodeConfig(tokens_per_warp=32, scores_t=False))
    assert not folds("kivi4", group=16)
    monkeypatch.setattr(gluon, "KIVI_FOLD", False)
    assert not folds("kivi4")


@pytest.mark.parametrize("scheme", ["kivi4", "kivi2"])
def test_kivi_fold_compiles_for_sm90(scheme, monkeypatch):
    """KIVI's folded keys compile for sm_90 unspilled with the codes from one AND, the zeros' MMA chain beside the
    scores', and fewer loop instructions than the per-element scale and zero (on the H200's Triton 3.6, the packaged
    B 32 configs: kivi4 801 -> 723, kivi2 783 -> 687 a 32-token tile)."""
    counts = []
    for kf in ("0", "1"):
        monkeypatch.setenv("KVLAB_GLUON_KIVI_FOLD", kf)
        head, _ = _sm90_offline(f"gluon:{scheme}", "--tw", "32", "--page", "32", "--st")
        assert "STACK:0" in head and "LOCAL:0" in head, head
        counts.append(int(re.search(r"loop_instrs=(\d+)", head).group(1)))
        assert int(re.search(r"HMMA:(\d+)", head).group(1)) == (40 if kf == "1" else 32), head
        assert ("HFMA2:64" in head) == (kf == "1"), head  # (the values' 64 remain; the keys' 64 go)
    assert counts[1] < counts[0], counts


@GPU
@pytest.mark.parametrize("name,unroll,Hq,Hk,D,P", [("kivi4", False, 32, 8, 128, 32), ("kivi4", True, 32, 8, 128, 32),
                                                   ("kivi4", False, 9, 3, 64, 32), ("kivi4", False, 8, 4, 256, 32),
                                                   ("k=int4:g64:chan:asym,v=q8_0", False, 8, 1, 128, 64),
                                                   ("kivi2", False, 32, 8, 128, 32), ("kivi2", False, 8, 4, 256, 32)])
def test_kivi_fold_on_the_gpu(name, unroll, Hq, Hk, D, P, monkeypatch):
    """KIVI's folded keys compiled for the GPU (GQA 1, 3, 4; D 64 / 128 / 256; the unrolled loop; groups of 64),
    lengths 64..4096 in whole groups (of 64 too: a partial group lives in the full-precision buffer, so paged tokens
    past the last whole group have no finite reference), against the reference: what the emulator cannot check is the
    tensor cores taking fp16 subnormal codes (a flush to zero would leave only the zeros' term)."""
    monkeypatch.setattr(gluon, "KIVI_FOLD", True)
    sch, args, kw, q, ref = _case(name, [64, 128, 1024, 4096], Hq, Hk, P, seed=9, q_seed=2, device="cuda", D=D)
    assert torch.isfinite(ref).all()
    cfg = GluonDecodeConfig(tokens_per_warp=32, unroll=unroll, scores_t=True)
    assert gluon.kivi_folds(gc.codec_of(sch.k), cfg, Hq // Hk)
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=3, config=cfg)
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    assert _rel_err(got, ref) < TOL, f"relative error {_rel_err(got, ref):.2e}"


# The transposed scores' lazy rescale (`gluon.LAZY_RESCALE`, constexpr ST 2): (scheme, lens, Hq, Hk, P, splits, warps,
# tokens per warp, unroll, D, q_scale). A q_scale of 12 spreads the scores (log2 units) so that heads' maxima grow by
# more than 2^8 after the first tile and the rescale runs mid-sequence; at 1 the stale maxima stay and p reaches 2^8
LZ_CASES = [
    ("q4_0", [0, 1, 17, 1000], 8, 2, 16, 2, 4, 16, False, 128, 1.0),
    ("q4_0", [17, 1000], 8, 2, 16, 2, 4, 16, True, 128, 12.0),
    ("k=fp8_e4m3,v=q8_0", [500], 16, 2, 64, 1, 2, 32, False, 128, 12.0),  # GQA 8, two warps
    ("q8_0", [1, 300], 4, 4, 32, 2, 4, 16, False, 128, 12.0),               # GQA 1
    ("kivi4", [32, 224], 9, 3, 32, 2, 4, 32, False, 64, 12.0),               # SmolLM2's GQA 3 at D 64
    ("mxfp4", [700], 8, 4, 16, 1, 4, 16, False, 256, 12.0),                 # D 256: two packs a thread
    ("nf4", [64, 333], 8, 2, 16, 3, 4, 32, True, 128, 1.0),
]


@pytest.mark.parametrize("c", LZ_CASES, ids=[f"{c[0]}-Hq{c[2]}-Hk{c[3]}-D{c[9]}-x{c[10]:g}-u{int(c[8])}" for c in LZ_CASES])
@EMU
def test_emulated_lazy_rescale(c, monkeypatch):
    """The lazy rescale: a head's max moves only when it grows by more than 2^LAZY_TAU, and a warp skips its
    accumulator's rescale when none of its heads moved; the same attention as the float32 reference (NaN past each
    sequence's end, a NaN-poisoned output) and as the kernel that rescales every tile, and it reaches the kernel (a
    stale max left in the merge, a vote that misses a head or a skipped rescale that was needed fails these)."""
    name, lens, Hq, Hk, P, S_, NW, TW, unroll, D, xq = c
    cfg = GluonDecodeConfig(num_warps=NW, tokens_per_warp=TW, num_splits=S_, unroll=unroll, scores_t=True)
    _switch_off_and_on(monkeypatch, "LAZY_RESCALE", (2,), name, lens, Hq, Hk, P, D, cfg, seed=37, q_seed=8, spy="ST",
                       q_scale=xq)


def test_lazy_rescale_asm():
    """The rescale block: the accumulator's products behind one uniform branch on the first flag, its label local to
    the braces (the block is inlined many times), operands numbered results, accumulator, alpha, flag."""
    a = gluon.rescale_asm(4)
    assert a.startswith("{") and a.rstrip().endswith("}") and "kvlab:rescale" in a
    assert "setp.eq.s32 p, $12, 0;" in a and "@p bra.uni SKIP;" in a
    assert [ln for ln in a.splitlines() if ln.startswith("mul.f32")] == \
        [f"mul.f32 ${i}, ${4 + i}, ${8 + i};" for i in range(4)]
    assert a.index("bra.uni") < a.index("mul.f32") < a.index("SKIP:")


@pytest.mark.parametrize("maxnreg", [None, 128])
def test_lazy_rescale_compiles_for_sm90(maxnreg, monkeypatch):
    """The lazy rescale compiles for sm_90 with one vote and the accumulator's 32 FMUL behind a branch, so the loop a
    warp runs when no head's max moved is shorter than the loop that rescales every tile (q4_0, 16-token tiles; on
    the H200's Triton 3.6: 370 -> 354 uncapped, 370 -> 363 at 128 registers). Uncapped it does not spill; at 128
    registers the kernel keeps an 8-byte stack outside the loop (no local loads in it: `loop_mix` would count them)."""
    cap = [] if maxnreg is None else ["--maxnreg", str(maxnreg)]
    counts = []
    for lz in ("0", "1"):
        monkeypatch.setenv("KVLAB_GLUON_LAZY_RESCALE", lz)
        head, _ = _sm90_offline("gluon:q4_0", "--tw", "16", "--st", *cap)
        assert "LOCAL:0" in head and "LDL" not in head and "STL" not in head, head
        if maxnreg is None:
            assert "STACK:0" in head, head
        assert int(re.search(r"FMUL:(\d+)", head).group(1)) == 32, head
        assert ("VOTE:1" in head) == (lz == "1"), head
        counts.append(int(re.search(r"loop_instrs=(\d+)", head).group(1)))
    assert counts[1] - 32 < counts[0], counts


def test_skip_path_leaves_out_what_forward_branches_jump_over():
    """`sm90_offline.skip_path`: the loop body (the largest backward branch) less the instructions a forward branch
    inside it jumps over; a branch out of the loop or before it skips nothing, and a body without one keeps its
    count (`loop_mix`'s)."""
    from devtools.sm90_offline import loop_mix, skip_path

    def sass(ops):
        return "\n".join(f"        /*{16 * i:04x}*/                   {op} ;" for i, op in enumerate(ops))
    # at 0x10 .. 0x80: FMUL, a branch to the HMMA at 0x60 over three FMULs, the HMMA, a branch out of the loop,
    # the back edge to 0x10
    body = ["FMUL R1, R1, R2", "@!P0 BRA 0x60", "FMUL R3, R3, R4", "FMUL R5, R5, R6", "FMUL R7, R7, R8",
            "HMMA.16816.F32 R8, R8, R10, R8", "@P1 BRA 0x400", "@!P2 BRA 0x10"]
    text = sass(["MOV R0, RZ"] + body + ["EXIT"])
    assert loop_mix(text)[0] == 8
    assert skip_path(text) == 8 - 3
    assert skip_path(sass(["MOV R0, RZ"] + [b for b in body if "0x60" not in b])) == 7  # no branch inside: the body


@GPU
@pytest.mark.parametrize("name,unroll,Hq,Hk,D,P,tw,xq", [
    ("q4_0", False, 32, 8, 128, 16, 16, 1.0), ("q4_0", True, 32, 8, 128, 16, 16, 12.0),
    ("q4_0", False, 32, 8, 128, 16, 32, 12.0), ("kivi4", False, 32, 8, 128, 32, 32, 12.0),
    ("kivi4", False, 9, 3, 64, 32, 32, 12.0), ("mxfp4", False, 8, 4, 256, 16, 16, 12.0),
    ("k=fp8_e4m3,v=q8_0", False, 8, 1, 128, 16, 16, 12.0), ("nvfp4", False, 8, 4, 256, 16, 32, 1.0)])
def test_lazy_rescale_on_the_gpu(name, unroll, Hq, Hk, D, P, tw, xq, monkeypatch):
    """The lazy rescale compiled for the GPU (GQA 3, 4, 8; D 64 / 128 / 256; both tile sizes; the unrolled loop),
    lengths 1..4097, spread and narrow scores, against the reference: what the emulator cannot check is the vote and
    the branch (a lane that disagrees, a pack whose flag is not the warp's)."""
    monkeypatch.setattr(gluon, "LAZY_RESCALE", True)
    sch, args, kw, q, ref = _case(name, _gpu_lens(name, [1, 17, 1000, 4097]), Hq, Hk, P, seed=13, q_seed=4,
                                  device="cuda", D=D, q_scale=xq)
    assert torch.isfinite(ref).all()
    cfg = GluonDecodeConfig(tokens_per_warp=tw, unroll=unroll, scores_t=True)
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=3, config=cfg)
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    assert _rel_err(got, ref) < TOL, f"relative error {_rel_err(got, ref):.2e}"
