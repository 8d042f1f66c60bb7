"""One-call extend (`extend/onecall.py`): every sequence's pages, buffer and chunk written into one workspace in the
model's space, attended in one call with a bottom-right causal mask == the float32 reference.

On the CPU the workspace launch runs under the Triton interpreter and a float32 masked softmax stands in for cuDNN,
reading the lengths the launch wrote; on a GPU with the cuDNN frontend installed the same tests run cuDNN itself
(skipped where it is not installed)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kvlab
from kvlab.kernels.checks import check_prefix
from kvlab.kernels.extend import extend, graphs, onecall
from kvlab.kernels.paged import sequence_kv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decode"))
from paged_cases import call_args, make_paged  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-2 if DEV == "cuda" else 1e-4
DT = torch.bfloat16 if DEV == "cuda" else torch.float32
pytestmark = pytest.mark.skipif(DEV == "cuda" and onecall.frontend() is None,
                                reason="the cuDNN frontend (nvidia-cudnn-frontend) is not installed")

# (prefix lens, chunk length, Hq, Hk, D, P, scheme, fp_lens): every family, buffers, rotations, GGML column orders,
# outlier slots, a mixed pair; prefixes of different lengths (one empty) in one batch
CASES = [
    ([17, 40], 5, 8, 2, 64, 16, "q4_0", None),
    ([0, 63], 17, 8, 2, 64, 16, "q8_0", [2, 0]),
    ([33, 1], 4, 4, 4, 64, 1, "int4_had", [1, 3]),
    ([64, 32], 7, 8, 2, 64, 32, "kivi4", [5, 31]),
    ([20], 70, 16, 2, 64, 16, "nvfp4", None),
    ([17, 9, 30], 3, 8, 1, 128, 64, "bf16", [3, 0, 1]),
    ([100], 33, 8, 2, 128, 16, "int3:g32:asym", None),
    ([40, 9], 6, 8, 2, 64, 16, "k=lm3:g32:rot=had,v=lm4", [0, 2]),
    ([50, 70], 9, 8, 2, 64, 16, "fp8_e4m3", None),
    ([33], 12, 4, 2, 64, 16, "mxfp4", [4]),
    ([40, 9], 6, 8, 2, 64, 16, "k=int3:g32:asym:out=2,v=lm3:g64:rot=had:out=1", [0, 2]),
    ([64, 32], 7, 8, 2, 64, 32, "k=int2:g32:chan:asym:out=1,v=int2:g32:asym:out=3", [5, 31]),
    ([45, 20], 8, 8, 2, 64, 16, "k=nf4:smooth,v=iq4nl", None),
]


def _id(c):
    lens, C, Hq, Hk, D, P, s, fp = c
    return f"L{lens}-C{C}-Hq{Hq}-Hk{Hk}-D{D}-P{P}-{s}" + ("-fp" if fp else "")


def _setup(c, seed=0):
    lens, C, Hq, Hk, D, P, name, fp = c
    sch = kvlab.scheme(name)
    cache = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=fp, seed=seed + 7, device=DEV)
    g = torch.Generator().manual_seed(seed + 3)
    n = C * len(lens)
    q, kn, vn = (torch.randn(n, h, D, generator=g).to(DEV, DT) for h in (Hq, Hk, Hk))
    qo = torch.arange(0, n + 1, C, dtype=torch.int32, device=DEV)
    args, kw = call_args(cache)
    return sch, P, q, kn, vn, qo, args, kw


def _err(got, ref):
    return (got.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_onecall_matches_reference(c):
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="onecall", out=torch.full_like(q, float("nan")))
    assert not torch.isnan(got).any(), "unwritten or NaN output elements"
    assert _err(got, ref) < TOL


@pytest.mark.parametrize("c", [CASES[i] for i in (0, 2, 3, 7, 10)], ids=[_id(CASES[i]) for i in (0, 2, 3, 7, 10)])
def test_workspace_holds_each_sequences_keys_in_the_models_space(c):
    """The workspace launch writes, per sequence, its S = L + F + C tokens: the oracle's dequantized pages (in the
    model's space and channel order), the buffer, then the chunk; and zeros past S to the workspace's end (a value
    left there would meet cuDNN's masked scores in a tile that straddles S: 0 x NaN)."""
    if DEV == "cuda":
        pytest.skip("float32 workspace equality: checked on the CPU")
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    B = qo.shape[0] - 1
    kv = check_prefix(q, *args, sch.k, sch.v, P, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw.get("k_tensor_scale"),
                      kw.get("v_tensor_scale"), B)
    host = (qo.tolist(), kv.kv_indptr.tolist(), kv.kv_last_page_len.tolist())
    S = onecall.workspace_tokens(host, kv, 32)
    D, Hk = q.shape[-1], kv.n_kv_heads
    wk = torch.full((B, Hk, S, D), float("nan"))
    wv = torch.full_like(wk, float("nan"))
    _, _, skv = onecall.build_workspace(q, kn, vn, qo, kv, S, wk, wv)
    C = c[1]
    for b in range(B):
        k, v = sequence_kv(kv, b, D)  # float32 [Hk, L + F, D], the oracle's (un-rotated) values
        k = torch.cat([k, kn[b * C:(b + 1) * C].float().transpose(0, 1)], 1)
        v = torch.cat([v, vn[b * C:(b + 1) * C].float().transpose(0, 1)], 1)
        n = k.shape[1]
        assert int(skv[b]) == n
        torch.testing.assert_close(wk[b, :, :n], k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(wv[b, :, :n], v, rtol=1e-5, atol=1e-5)
        assert (wk[b, :, n:] == 0).all() and (wv[b, :, n:] == 0).all(), "the workspace past the sequence is not zero"


def test_workspace_tokens_cover_the_bucket():
    """S rounds the longest prefix up past its bucket (the plan and a graph serve every length of that bucket), plus
    the buffer's capacity and the chunk."""
    c = ([17, 40], 5, 8, 2, 64, 16, "q8_0", [3, 1])
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    kv = check_prefix(q, *args, sch.k, sch.v, P, kw["k_fp"], kw["v_fp"], kw["fp_len"], None, None, 2)
    host = (qo.tolist(), kv.kv_indptr.tolist(), kv.kv_last_page_len.tolist())
    W = kv.k_fp.shape[2]
    assert onecall.workspace_tokens(host, kv, 32) == 64 + W + 5
    assert onecall.workspace_tokens(host, kv, 64) == 64 + W + 5
    assert onecall.workspace_tokens(host, kv, 16) == 48 + W + 5


def test_nan_in_one_prefix_poisons_only_its_sequence():
    c = ([40, 33], 6, 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    kp = dict(args[0])
    sc = kp["scales"].clone()
    sc[args[3][0].long()] = float("nan")  # the first page of sequence 0
    kp["scales"] = sc
    got = extend(q, kn, vn, qo, kp, *args[1:], sch.k, sch.v, P, **kw, backend="onecall")
    assert torch.isnan(got[:6]).all()
    assert not torch.isnan(got[6:]).any()


def test_ragged_chunks_are_refused_with_the_reason():
    c = ([17, 40], 5, 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, _, args, kw = _setup(c)
    qo = torch.tensor([0, 3, 10], dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="chunks of one nonzero length; got \\[3, 7\\]"):
        extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="onecall")


def test_why_not_names_what_is_missing(monkeypatch):
    c = ([17], 5, 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    kv = check_prefix(q, *args, sch.k, sch.v, P, None, None, None, None, None, 1)
    assert onecall.why_not(q, kv, [0, 5]) is None
    assert "nonzero length" in onecall.why_not(q, kv, [0, 0])
    assert "cover q's 5 rows" in onecall.why_not(q, kv, [0, 4])  # a padded q: chunks end before its rows do
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if DEV == "cpu":
        assert "needs a CUDA GPU" in onecall.why_not(q, kv, [0, 5])


def test_workspace_bound_refuses_the_call(monkeypatch):
    c = ([40], 5, 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    monkeypatch.setattr(onecall, "MAX_WORKSPACE", 1024)
    with pytest.raises(ValueError, match="MAX_WORKSPACE"):
        extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="onecall")


def test_onecall_replays_through_a_graph_at_other_lengths_of_the_bucket(monkeypatch):
    """Batch 1 with host lengths: captured at the first length, replayed at longer ones of the bucket (more pages, a
    longer buffer): the workspace launch reads the device lengths, so each replay equals its eager call."""
    monkeypatch.setattr(graphs, "EMULATE", DEV == "cpu")
    monkeypatch.setattr(graphs, "GRAPH_AFTER", 0)
    monkeypatch.delenv("KVLAB_EXTEND_GRAPHS", raising=False)
    graphs.clear()
    graphs.STATS.clear()
    sch = kvlab.scheme("kivi4")
    P, Hq, Hk, D, C = 32, 8, 2, 64, 9
    cache = make_paged([2048 + 224], Hk, D, P, sch.k, sch.v, fp_lens=[7], fp_width=8, seed=5, device=DEV)
    g = torch.Generator().manual_seed(3)
    q, kn, vn = (torch.randn(C, h, D, generator=g).to(DEV, DT) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0, C], dtype=torch.int32, device=DEV)
    (kp, vp, _, ind, _), kw = call_args(cache)
    try:
        for i, (L, F) in enumerate([(2048 + 32, 2), (2048 + 160, 7), (2048 + 224, 5)]):
            n = L // P
            args = (kp, vp, torch.tensor([0, n], dtype=torch.int32, device=DEV), ind[:n].clone(),
                    torch.tensor([P], dtype=torch.int32, device=DEV))
            k = dict(kw, fp_len=torch.tensor([F], dtype=torch.int32, device=DEV))
            host = ([0, C], [0, n], [P])
            got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **k, backend="onecall", host_lens=host)
            eager = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **k, backend="onecall", host_lens=host,
                           graphs=False)
            ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **k, backend="reference")
            assert _err(got, ref) < TOL and _err(got, eager) < TOL, (L, F)
        assert graphs.STATS["captured"] == 1 and graphs.STATS["replayed"] == 2
    finally:
        graphs.clear()


@pytest.mark.skipif(DEV == "cpu", reason="the auto dispatch takes the one-call path on a GPU only")
def test_auto_takes_the_onecall_path_when_enabled(monkeypatch):
    c = ([3000], 256, 8, 2, 128, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    calls = []
    real = onecall.run
    monkeypatch.setattr(onecall, "ENABLED", True)
    monkeypatch.setattr(onecall, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    host = (qo.tolist(), args[2].tolist(), args[4].tolist())
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, host_lens=host, graphs=False)
    assert calls and _err(got, ref) < TOL
