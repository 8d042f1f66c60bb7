"""Triton extend (chunked prefill) == float32 reference over the dequantized prefix + causal chunk."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kvlab
from kvlab.kernels.extend import extend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decode"))
from paged_cases import call_args, make_paged  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-2 if DEV == "cuda" else 1e-4

# (prefix lens, chunk lens, Hq, Hk, D, P, scheme, fp_lens)
CASES = [
    ([17, 40], [5, 3], 8, 2, 64, 16, "q4_0", None),
    ([0, 63], [17, 1], 8, 2, 64, 16, "q8_0", [2, 0]),
    ([33, 1], [4, 9], 4, 4, 64, 1, "int4_had", [1, 3]),
    ([64, 32], [7, 20], 8, 2, 64, 32, "kivi4", [5, 31]),
    ([20], [70], 16, 2, 64, 16, "nvfp4", None),
    ([17, 9], [3, 6], 8, 1, 128, 64, "bf16", [3, 0]),
    ([100], [33], 8, 2, 128, 16, "int3:g32:asym", None),
    ([40, 9], [6, 11], 8, 2, 64, 16, "k=lm3:g32:rot=had,v=lm4", [0, 2]),
    ([64, 32], [7, 20], 8, 2, 64, 32, "k=int2:g32:chan:asym:cal,v=int3:g32:asym:cal", [5, 31]),  # calibrated ints
    ([40, 9], [6, 11], 8, 2, 64, 16, "k=int3:g32:asym:out=2,v=lm3:g64:rot=had:out=1", [0, 2]),  # outlier slots
    ([64, 32], [7, 20], 8, 2, 64, 32, "k=int2:g32:chan:asym:out=1,v=int2:g32:asym:out=3", [5, 31]),
]


def _id(c):
    lens, cl, Hq, Hk, D, P, s, fp = c
    return f"B{len(lens)}-L{max(lens)}-C{max(cl)}-Hq{Hq}-Hk{Hk}-D{D}-P{P}-{s}" + ("-fp" if fp else "")


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_extend_matches_reference(c):
    lens, cl, Hq, Hk, D, P, name, fp = c
    sch = kvlab.scheme(name)
    cache = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=fp, seed=len(_id(c)), device=DEV)
    g = torch.Generator().manual_seed(3)
    C = sum(cl)
    q, kn, vn = (torch.randn(C, h, D, generator=g).to(DEV) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0] + torch.tensor(cl).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    args, kw = call_args(cache)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, out=torch.full_like(q, float("nan")),
                 config={"BLOCK_M": 16, "BLOCK_N": 16})
    assert not torch.isnan(got).any(), "unwritten or NaN output elements"
    err = (got.float() - ref.float()).abs().max().item() / ref.abs().max().item()
    assert err < TOL, f"relative error {err:.2e}"


def test_extend_without_prefix_is_causal_attention():
    """No cached prefix: extend is plain causal attention over the chunk."""
    sch = kvlab.scheme("q4_0")
    cache = make_paged([0], 2, 64, 16, sch.k, sch.v, device=DEV)
    q, kn, vn = torch.randn(9, 4, 64), torch.randn(9, 2, 64), torch.randn(9, 2, 64)
    args, kw = call_args(cache)
    got = extend(q.to(DEV), kn.to(DEV), vn.to(DEV), torch.tensor([0, 9], dtype=torch.int32, device=DEV), *args,
                 sch.k, sch.v, 16, **kw, config={"dot": "fp32"}).cpu()  # ieee fp32 dots: 1e-4 checks the masking
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), kn.transpose(0, 1), vn.transpose(0, 1),
                                                            is_causal=True, enable_gqa=True).transpose(0, 1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_extend_rejects_bad_chunk_shape():
    sch = kvlab.scheme("q4_0")
    cache = make_paged([16], 2, 64, 16, sch.k, sch.v)
    args, kw = call_args(cache)
    with pytest.raises(ValueError, match="k_new"):
        extend(torch.randn(3, 4, 64), torch.randn(3, 4, 64), torch.randn(3, 2, 64), torch.tensor([0, 3]), *args,
               sch.k, sch.v, 16, **kw)
