"""`merge_with_fp`: the full-precision tokens (sinks, window) attended beside the split-K merge of the paged
partials, against attention over all tokens in float32 (the Triton kernel under the interpreter on the CPU)."""
from __future__ import annotations

import pytest
import torch

from kvlab.kernels.paged import attend
from kvlab.quant.rotation import hadamard

LOG2 = torch.log(torch.tensor(2.0)).item()
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU (tests/kernels/conftest.py)


def _partials(q, k, v, cuts, sm_scale):
    """Split partials of q [B, Hq, D] over k / v [B, Hk, L, D] cut at `cuts` (token ranges): normalized outputs
    [B, Hq, S, D] and log2-sum-exps [B, Hq, S] (-inf for an empty split), as the paged kernels write them."""
    B, Hq, D = q.shape
    Hk = k.shape[1]
    S = len(cuts)
    op = torch.zeros(B, Hq, S, D)
    lse = torch.full((B, Hq, S), float("-inf"))
    for b in range(B):
        for i, (lo, hi) in enumerate(cuts[:]):
            if hi <= lo:
                continue
            kk = k[b, :, lo:hi].repeat_interleave(Hq // Hk, 0)  # [Hq, n, D]
            vv = v[b, :, lo:hi].repeat_interleave(Hq // Hk, 0)
            s = torch.einsum("hd,hnd->hn", q[b], kk) * sm_scale
            op[b, :, i] = torch.einsum("hn,hnd->hd", torch.softmax(s, -1), vv)
            lse[b, :, i] = torch.logsumexp(s, -1) / LOG2
    return op, lse


@pytest.mark.parametrize("D,Hq,Hk,rot", [(64, 9, 3, False), (64, 8, 2, True), (256, 4, 1, False), (256, 4, 1, True),
                                         (128, 32, 8, True)])
def test_merge_with_fp_is_attention_over_all_tokens(D, Hq, Hk, rot):
    from kvlab.kernels.tiles.operands import merge_with_fp
    g = torch.Generator().manual_seed(D + Hq)
    B, L, W = 3, 40, 37
    q = torch.randn(B, Hq, D, generator=g)
    k = torch.randn(B, Hk, L, D, generator=g)
    v = torch.randn(B, Hk, L, D, generator=g)
    kf = torch.randn(B, Hk, W, D, generator=g).to(torch.bfloat16)
    vf = torch.randn(B, Hk, W, D, generator=g).to(torch.bfloat16)
    fp_len = torch.tensor([36, 0, 5], dtype=torch.int32)  # one sequence with no full-precision token
    sm = D ** -0.5
    H = hadamard(D, "cpu")
    cuts = [(0, 16), (16, 32), (32, 40), (40, 40)]  # the last split empty (as a split past the sequence's end)
    op, lse = _partials(q, k, v @ H if rot else v, cuts, sm)
    op[2], lse[2] = 0.0, float("-inf")  # sequence 2: no paged token at all
    out = torch.empty(B, Hq, D, device=DEV)
    merge_with_fp(*(t.to(DEV) for t in (op, lse, q, kf, vf, fp_len)), sm, out, v_rot=H.to(DEV) if rot else None)
    out = out.cpu()
    for b in range(B):
        F = int(fp_len[b])
        kb = torch.cat([k[b] if b != 2 else k[b, :, :0], kf[b, :, :F].float()], 1)
        vb = torch.cat([v[b] if b != 2 else v[b, :, :0], vf[b, :, :F].float()], 1)
        ref = attend(q[b:b + 1], kb, vb, sm)[0]
        torch.testing.assert_close(out[b], ref, atol=2e-5, rtol=2e-5)


def test_merge_with_fp_writes_the_out_dtype_and_strides():
    from kvlab.kernels.tiles.operands import merge_with_fp
    g = torch.Generator().manual_seed(3)
    B, Hq, Hk, D, W = 2, 4, 2, 64, 8
    q = torch.randn(B, Hq, D, generator=g)
    op = torch.randn(B, Hq, 2, D, generator=g)
    lse = torch.randn(B, Hq, 2, generator=g)
    kf, vf = torch.randn(B, Hk, W, D, generator=g), torch.randn(B, Hk, W, D, generator=g)
    fp_len = torch.tensor([8, 3])
    op, lse, q, kf, vf, fp_len = (t.to(DEV) for t in (op, lse, q, kf, vf, fp_len))
    big = torch.zeros(B, Hq, 2 * D, dtype=torch.bfloat16, device=DEV)
    out = big[:, :, :D]  # a strided view: rows 2 D apart
    merge_with_fp(op, lse, q, kf, vf, fp_len, 0.125, out)
    assert big[:, :, D:].abs().sum() == 0  # nothing written past the view
    ref = torch.empty(B, Hq, D, device=DEV)
    merge_with_fp(op, lse, q, kf, vf, fp_len, 0.125, ref)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


def test_a_non_finite_window_token_shows_up():
    """A NaN key in one sequence's window makes that sequence's heads of its KV head NaN (as the reference), and
    no other output."""
    from kvlab.kernels.tiles.operands import merge_with_fp
    g = torch.Generator().manual_seed(5)
    B, Hq, Hk, D, W = 2, 4, 2, 64, 8
    q = torch.randn(B, Hq, D, generator=g)
    op, lse = torch.randn(B, Hq, 3, D, generator=g), torch.randn(B, Hq, 3, generator=g)
    kf, vf = torch.randn(B, Hk, W, D, generator=g), torch.randn(B, Hk, W, D, generator=g)
    kf[0, 1, 2, 5] = float("nan")
    out = torch.empty(B, Hq, D, device=DEV)
    merge_with_fp(*(t.to(DEV) for t in (op, lse, q, kf, vf, torch.tensor([W, W]))), 0.125, out)
    bad = out.isnan().any(-1).cpu()
    assert bad.tolist() == [[False, False, True, True], [False, False, False, False]]


@pytest.mark.parametrize("with_fp", [False, True])
def test_merges_skip_the_unwritten_partials_of_empty_splits(with_fp):
    """A split without tokens writes only its log2-sum-exp (-inf) and returns (the Gluon kernel, at short contexts):
    `merge_splits` and `merge_with_fp` must not read its partial, which holds whatever the buffer held (NaN here)."""
    from kvlab.kernels.tiles.operands import merge_splits, merge_with_fp
    g = torch.Generator().manual_seed(7)
    B, Hq, Hk, D, L = 2, 4, 1, 64, 24
    q = torch.randn(B, Hq, D, generator=g)
    k = torch.randn(B, Hk, L, D, generator=g)
    v = torch.randn(B, Hk, L, D, generator=g)
    cuts = [(0, 16), (16, 24), (24, 24), (24, 24), (24, 24)]
    sm = D ** -0.5
    op, lse = _partials(q, k, v, cuts, sm)
    op[:, :, 2:] = float("nan")  # the empty splits' partials: never written
    out = torch.empty(B, Hq, D, device=DEV)
    if with_fp:
        kf = torch.zeros(B, Hk, 4, D, dtype=torch.bfloat16)
        merge_with_fp(*(t.to(DEV) for t in (op, lse, q, kf, kf, torch.zeros(B, dtype=torch.int32))), sm, out)
    else:
        merge_splits(op.to(DEV), lse.to(DEV), out)
    ref = torch.stack([attend(q[b:b + 1], k[b], v[b], sm)[0] for b in range(B)])
    torch.testing.assert_close(out.cpu(), ref, atol=2e-5, rtol=2e-5)



@pytest.mark.parametrize("D", [64, 128, 256])
def test_merge_splits_unrotates_rotated_partials(D):
    """Partials of v H (a rotated V spec) merged with `rotated=True` equal the plain merge times H^T (the fast
    transform in the kernel against the matmul), to float32 rounding; an empty split (-inf, NaN partial) is skipped."""
    from kvlab.kernels.tiles.operands import fused_unrotation, merge_splits
    g = torch.Generator().manual_seed(D)
    B, Hq, S = 2, 4, 3
    op = torch.randn(B, Hq, S, D, generator=g)
    lse = torch.randn(B, Hq, S, generator=g)
    op[1, :, 2] = float("nan")
    lse[1, :, 2] = float("-inf")
    op, lse = op.to(DEV), lse.to(DEV)
    plain = torch.empty(B, Hq, D, device=DEV)
    merge_splits(op, lse, plain)
    got = torch.full((B, Hq, D), float("nan"), device=DEV, dtype=torch.bfloat16)
    merge_splits(op, lse, got, rotated=True)
    want = plain @ hadamard(D, DEV).T
    assert fused_unrotation(D) == D.bit_length() - 1
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)  # bf16 output
    f32 = torch.empty(B, Hq, D, device=DEV)
    merge_splits(op, lse, f32, rotated=True)
    torch.testing.assert_close(f32, want, atol=1e-5, rtol=1e-5)


def test_merge_refuses_an_unrotation_it_cannot_do():
    """A head dim whose rotation is not one power-of-two block (96: blocks of 32) is un-rotated by the caller."""
    from kvlab.kernels.tiles.operands import fused_unrotation, merge_splits
    assert fused_unrotation(96) == 0
    op, lse = torch.zeros(1, 1, 2, 96, device=DEV), torch.zeros(1, 1, 2, device=DEV)
    with pytest.raises(ValueError, match="head_dim 96"):
        merge_splits(op, lse, torch.empty(1, 1, 96, device=DEV), rotated=True)
