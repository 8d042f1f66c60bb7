"""Gluon q4_0 decode (MMA-fragment dequantization): GPU == float32 reference; on CPU an sm_90 compile check.

Gluon has no interpreter, so the CPU run compiles the kernel for sm_90 with a stub driver and checks
what the kernel exists for: no spills and no shared-memory instruction in its main loop."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import kvlab
from kvlab.kernels.decode import decode
from paged_cases import call_args, make_paged

gluon_q4 = pytest.importorskip("kvlab.kernels.decode.gluon_q4", reason="this Triton has no Gluon dialect",
                               exc_type=ImportError)
CUDA = torch.cuda.is_available()
GPU = pytest.mark.skipif(not CUDA, reason="Gluon kernels run on a CUDA GPU only (no interpreter)")
TOL = 2e-2  # fp16 MMA operands, fp32 accumulation (as the Triton fast paths)


def test_channel_orders_are_permutations():
    for order in (gluon_q4.k_channel_order(), gluon_q4.v_channel_order()):
        assert sorted(order) == list(range(128))
    # each thread's 16 key bytes are one block (one scale): kappa with the same r = (kappa >> 1) & 3
    k = gluon_q4.k_channel_order()
    assert all(k[kap] // 32 == (kap >> 1) & 3 for kap in range(128))


def test_compiles_for_sm90_without_shared_memory_in_the_loop():
    """Offline sm_90 compile (stub driver, Triton's ptxas / cuobjdump) in a subprocess without
    TRITON_INTERPRET (this session's jit helpers were built for the interpreter)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-m", "kvlab.kernels.decode.sm90_offline", "gluon_q4", "--top", "60"],
                       capture_output=True, text=True, env=env, timeout=300)
    if "ptxas" in p.stderr and "No such file" in p.stderr:
        pytest.skip("this Triton wheel has no ptxas")
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("gluon_q4") or "smem ops:" in ln]
    assert p.returncode == 0 and len(lines) == 2, p.stdout[-2000:] + p.stderr[-3000:]
    head, smem = lines
    assert "STACK:0" in head and "LOCAL:0" in head, f"spills: {head}"
    ops = dict(re.findall(r"([A-Z][A-Z0-9_]*):(\d+)", head.split("loop_instrs=")[1]))
    assert int(re.search(r"loop_instrs=(\d+)", head).group(1)) > 100
    assert int(ops.get("HMMA", 0)) >= 32, head  # 2 x 8 (scores) + 16 (P V) mma.m16n8k16 per 16 tokens per warp
    assert smem.split("smem ops:")[1].strip() == "", f"shared-memory instructions in the main loop: {smem}"


def test_gluon_config_rejects_other_schemes():
    sch = kvlab.scheme("q8_0")
    dev = "cuda" if CUDA else "cpu"
    c = make_paged([20], 2, 128, 16, sch.k, sch.v, device=dev)
    q = torch.randn(1, 8, 128, device=dev)
    args, kw = call_args(c)
    with pytest.raises(ValueError, match="kernel='gluon' cannot run this call: K and V must both be q4_0"):
        decode(q, *args, sch.k, sch.v, 16, **kw, config={"kernel": "gluon"})
    with pytest.raises(ValueError, match="config kernel='cuda'; allowed: 'triton', 'gluon'"):
        decode(q, *args, sch.k, sch.v, 16, **kw, config={"kernel": "cuda"})


def test_why_not_names_each_limit():
    s = kvlab.scheme("q4_0")
    assert "head_dim must be 128" in gluon_q4.why_not(s.k, s.v, 64, 16, 4, False, "cpu")
    assert "page size must be a multiple of 16" in gluon_q4.why_not(s.k, s.v, 128, 8, 4, False, "cpu")
    assert "GQA group must be <= 16" in gluon_q4.why_not(s.k, s.v, 128, 16, 32, False, "cpu")
    assert "full-precision window" in gluon_q4.why_not(s.k, s.v, 128, 16, 4, True, "cpu")
    assert "CUDA GPU" in gluon_q4.why_not(s.k, s.v, 128, 16, 4, False, "cpu")
    h = kvlab.scheme("int4:g32:asym")
    assert "q4_0" in gluon_q4.why_not(h.k, h.v, 128, 16, 4, False, "cpu")


# (lens, Hq, Hk, P, splits, warps, tokens per warp)
CASES = [
    ([1, 17, 63, 1000, 4096], 32, 8, 16, None, 4, 16),
    ([1, 17, 63, 1000, 4096], 32, 8, 16, 1, 4, 32),
    ([1, 17, 63, 1000, 4096], 32, 8, 16, 7, 8, 16),
    ([5, 100, 333], 8, 8, 32, 3, 4, 32),     # GQA 1
    ([64, 65, 777], 64, 8, 64, 2, 4, 16),    # GQA 8, pages of 64
    ([0, 48, 2000], 16, 1, 16, 5, 2, 32),    # GQA 16, an empty sequence
    ([150, 97], 32, 8, 48, 2, 4, 32),        # a warp's tokens cross a page mid-tile
    ([32768], 32, 8, 16, None, 4, 32),
]


@GPU
@pytest.mark.parametrize("c", CASES, ids=[f"L{max(c[0])}-Hq{c[1]}-Hk{c[2]}-P{c[3]}-S{c[4]}-w{c[5]}-tw{c[6]}"
                                          for c in CASES])
def test_gluon_matches_reference(c):
    lens, Hq, Hk, P, S, NW, TW = c
    sch = kvlab.scheme("q4_0")
    cache = make_paged(lens, Hk, 128, P, sch.k, sch.v, seed=sum(lens) % 997, device="cuda")
    q = torch.randn(len(lens), Hq, 128, generator=torch.Generator().manual_seed(3)).to("cuda", torch.bfloat16)
    args, kw = call_args(cache)
    ref = decode(q.float(), *args, sch.k, sch.v, P, **kw, backend="reference")
    out = torch.full_like(q, float("nan"))
    got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=S, out=out, config={"kernel": "gluon", "num_warps": NW,
                                                                                "tokens_per_warp": TW})
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "unwritten or NaN output elements"
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().clamp_min(1e-6).item()
    assert err < TOL, f"relative error {err:.2e}"
    empty = [i for i, L in enumerate(lens) if L == 0]
    if empty:
        assert (got[empty] == 0).all()


@GPU
def test_gluon_ignores_garbage_in_unused_pages():
    """Rows past a sequence's end are read unmasked (K codes and scales, V codes; page 0 for a warp past
    the end) or masked (V scales): NaN / inf scales there must not leak into the output."""
    sch = kvlab.scheme("q4_0")
    lens, P = [37, 50], 16
    cache = make_paged(lens, 8, 128, P, sch.k, sch.v, seed=5, device="cuda")
    indptr, idx = cache["kv_indptr"].tolist(), cache["kv_indices"].tolist()
    for name in ("k_pages", "v_pages"):
        sc = cache[name]["scales"]
        for pg in set(range(sc.shape[0])) - set(idx):
            sc[pg] = float("nan")
        for b, L in enumerate(lens):
            n = indptr[b + 1] - indptr[b]
            sc[idx[indptr[b + 1] - 1], :, L - (n - 1) * P:] = float("inf")
    args, kw = call_args(cache)
    q = torch.randn(2, 32, 128, device="cuda", dtype=torch.bfloat16)
    ref = decode(q.float(), *args, sch.k, sch.v, P, **kw, backend="reference")
    assert torch.isfinite(ref).all()
    for S in (1, 2, 3):
        got = decode(q, *args, sch.k, sch.v, P, **kw, num_splits=S, config={"kernel": "gluon"})
        assert torch.isfinite(got).all(), f"splits {S}"
        err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().item()
        assert err < TOL, f"splits {S}: relative error {err:.2e}"


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
def test_tuner_offers_gluon_for_q4_0_only(monkeypatch):
    from kvlab.kernels import tuning
    monkeypatch.setenv("KVLAB_GLUON", "1")
    q4 = kvlab.scheme("q4_0")
    assert [c["kernel"] for c in tuning.gluon_space(q4, 32, 32, 8, 128, 16, False, "cuda")] == ["gluon", "gluon"]
    assert tuning.gluon_space(q4, 32, 32, 8, 128, 16, True, "cuda") == []
    assert tuning.gluon_space(kvlab.scheme("q8_0"), 32, 32, 8, 128, 16, False, "cuda") == []


# ---- CPU: the kernel's own source run by kvlab.kernels.gluon_emu (torch ops, PTX interpreter) -----------------
def test_ptx_emulator_decodes_q4_nibbles():
    """The asm strings of the kernel, run by the PTX interpreter, give (nibble - 8) * scale exactly, in the
    register order k_channel_order assumes (K) and token pairs (V)."""
    import numpy as np
    from kvlab.kernels.gluon_emu import run_ptx
    rng = np.random.default_rng(0)
    w = rng.integers(0, 2 ** 32, 64, dtype=np.uint64).astype(np.uint32)
    wb = rng.integers(0, 2 ** 32, 64, dtype=np.uint64).astype(np.uint32)
    s = (rng.standard_normal(64) * 0.05).astype(np.float16)
    s16 = (s.astype(np.float32) / 16).astype(np.float16)
    sr = s[::-1].copy()
    sr16 = s16[::-1].copy()
    bits = lambda x: x.view(np.uint16).astype(np.uint32)  # noqa: E731
    f16 = lambda r: (r & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)  # noqa: E731
    want = lambda nib, sc: ((nib.astype(np.float32) - 8) * sc.astype(np.float32)).astype(np.float16).astype(np.float32)  # noqa: E731
    nib = lambda word, byte, hi: ((word >> (8 * byte)) >> (4 * hi)) & 0xF  # noqa: E731
    outs = run_ptx(gluon_q4.ASM_K.value, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h", [w, bits(s), bits(s16)])
    for q in range(4):
        for h2 in range(2):  # register q, half h2 = byte (q >> 1) + 2 h2, nibble q & 1 (k_channel_order)
            np.testing.assert_array_equal(f16(outs[2 * q + h2]), want(nib(w, (q >> 1) + 2 * h2, q & 1), s))
    for k in range(4):
        lo_a, lo_b, hi_a, hi_b = run_ptx(gluon_q4.asm_v(k), "=h,=h,=h,=h,r,r,h,h,h,h",
                                         [w, wb, bits(s), bits(sr), bits(s16), bits(sr16)])
        np.testing.assert_array_equal(f16(lo_a), want(nib(w, k, 0), s))
        np.testing.assert_array_equal(f16(lo_b), want(nib(wb, k, 0), sr))
        np.testing.assert_array_equal(f16(hi_a), want(nib(w, k, 1), s))
        np.testing.assert_array_equal(f16(hi_b), want(nib(wb, k, 1), sr))


# (lens, Hq, Hk, P, splits, warps, tokens per warp)
EMU_CASES = [
    ([1, 17, 63, 200], 8, 2, 16, 1, 4, 16),
    ([1, 17, 63, 200], 8, 2, 16, 3, 4, 16),
    ([1, 17, 63, 200], 8, 2, 16, 3, 4, 32),   # two pages per warp and tile
    ([0, 130], 4, 4, 32, 2, 2, 32),           # GQA 1, an empty sequence, pages of 32
    ([100, 70], 16, 1, 64, 2, 8, 16),         # GQA 16, pages of 64, 8 warps
    ([150, 97], 8, 2, 48, 2, 2, 32),          # pages of 48: a warp's tokens cross a page mid-tile
]


@pytest.mark.parametrize("c", EMU_CASES, ids=[f"L{max(c[0])}-Hq{c[1]}-Hk{c[2]}-P{c[3]}-S{c[4]}-w{c[5]}-tw{c[6]}"
                                              for c in EMU_CASES])
def test_emulated_kernel_matches_reference(c, monkeypatch):
    """decode_gluon's host code + the kernel's source (emulated) == the float32 reference, with NaN / inf
    scales in every row past a sequence's end (read unmasked by the kernel) and a NaN-poisoned output."""
    from kvlab.kernels.gluon_emu import emulate
    lens, Hq, Hk, P, S, NW, TW = c
    monkeypatch.setattr(gluon_q4, "_decode_q4_kernel", emulate(gluon_q4._decode_q4_kernel))
    sch = kvlab.scheme("q4_0")
    cache = make_paged(lens, Hk, 128, P, sch.k, sch.v, seed=11)
    indptr, idx = cache["kv_indptr"].tolist(), cache["kv_indices"].tolist()
    for name in ("k_pages", "v_pages"):
        sc = cache[name]["scales"]
        for pg in set(range(sc.shape[0])) - set(idx):
            sc[pg] = float("nan")
        for b, L in enumerate(lens):
            n = indptr[b + 1] - indptr[b]
            if n:
                sc[idx[indptr[b + 1] - 1], :, L - (n - 1) * P:] = float("inf")
    args, kw = call_args(cache)
    q = torch.randn(len(lens), Hq, 128, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    ref = decode(q.float(), *args, sch.k, sch.v, P, **kw, backend="reference")
    out = torch.full_like(q, float("nan"))
    got = gluon_q4.decode_gluon(q, *args, P, sm_scale=128 ** -0.5, num_splits=S, num_warps=NW, tokens_per_warp=TW,
                                out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.isfinite(got).all(), "unwritten, NaN or inf output elements"
    err = (got.float() - ref).abs().max().item() / ref.abs().max().item()
    assert err < TOL, f"relative error {err:.2e}"
    for b, L in enumerate(lens):
        if L == 0:
            assert (got[b] == 0).all()


def test_tuner_leaves_gluon_out_until_gpu_verified(monkeypatch):
    from kvlab.kernels import tuning
    monkeypatch.delenv("KVLAB_GLUON", raising=False)
    monkeypatch.setattr(gluon_q4, "GPU_VERIFIED", False)
    assert tuning.gluon_space(kvlab.scheme("q4_0"), 32, 32, 8, 128, 16, False, "cuda") == []
