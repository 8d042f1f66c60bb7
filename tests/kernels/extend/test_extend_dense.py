"""Dense-prefix extend (`extend/dense.py`): the prefix dequantized into a workspace and attended densely with its
log-sum-exp, the chunk's causal part continued in the Triton kernel == the float32 reference.

On the CPU the dequant pass runs under the Triton interpreter and torch's CPU flash attention stands in for
cuDNN; on a GPU this runs cuDNN (or flash) itself."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kvlab
from kvlab.kernels.checks import check_prefix
from kvlab.kernels.configs import ExtendConfig
from kvlab.kernels.extend import dense, extend
from kvlab.kernels.extend import triton as ext_triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decode"))
from paged_cases import call_args, make_paged  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-2 if DEV == "cuda" else 1e-4
DT = torch.bfloat16 if DEV == "cuda" else torch.float32

# (prefix lens, chunk lens, Hq, Hk, D, P, scheme, fp_lens): every family, windows, rotations, ragged chunks
CASES = [
    ([17, 40], [5, 3], 8, 2, 64, 16, "q4_0", None),
    ([0, 63], [17, 1], 8, 2, 64, 16, "q8_0", [2, 0]),
    ([33, 1], [4, 9], 4, 4, 64, 1, "int4_had", [1, 3]),
    ([64, 32], [7, 20], 8, 2, 64, 32, "kivi4", [5, 31]),
    ([20], [70], 16, 2, 64, 16, "nvfp4", None),
    ([17, 9], [3, 6], 8, 1, 128, 64, "bf16", [3, 0]),
    ([100], [33], 8, 2, 128, 16, "int3:g32:asym", None),
    ([40, 9], [6, 11], 8, 2, 64, 16, "k=lm3:g32:rot=had,v=lm4", [0, 2]),
    ([50, 70], [9, 4], 8, 2, 64, 16, "fp8_e4m3", None),
    ([33], [12], 4, 2, 64, 16, "mxfp4", [4]),
    ([40, 9], [6, 11], 8, 2, 64, 16, "k=int3:g32:asym:out=2,v=lm3:g64:rot=had:out=1", [0, 2]),  # outlier slots
    ([64, 32], [7, 20], 8, 2, 64, 32, "k=int2:g32:chan:asym:out=1,v=int2:g32:asym:out=3", [5, 31]),
]


def _id(c):
    lens, cl, Hq, Hk, D, P, s, fp = c
    return f"L{lens}-C{cl}-Hq{Hq}-Hk{Hk}-D{D}-P{P}-{s}" + ("-fp" if fp else "")


def _setup(c, seed=0):
    lens, cl, Hq, Hk, D, P, name, fp = c
    sch = kvlab.scheme(name)
    cache = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=fp, seed=seed + 7, device=DEV)
    g = torch.Generator().manual_seed(seed + 3)
    q, kn, vn = (torch.randn(sum(cl), h, D, generator=g).to(DEV, DT) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0] + torch.tensor(cl).cumsum(0).tolist(), dtype=torch.int32, device=DEV)
    args, kw = call_args(cache)
    return sch, P, q, kn, vn, qo, args, kw


def _err(got, ref):
    return (got.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_dense_prefix_matches_reference(c):
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                 out=torch.full_like(q, float("nan")), config={"block_m": 16, "block_n": 16})
    assert not torch.isnan(got).any(), "unwritten or NaN output elements"
    assert _err(got, ref) < TOL


def test_mixed_batch_some_sequences_dense_some_fused():
    """Sequences below the row threshold keep the fused path inside the same launch; covered sequences continue
    in the fused kernel past their last whole bucket; all are right."""
    c = ([40, 300, 17], [2, 40, 30], 8, 2, 64, 16, "q4_0", [3, 0, 5])
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=1)
    kv = check_prefix(q, *args, sch.k, sch.v, P, kw["k_fp"], kw["v_fp"], kw["fp_len"], kw.get("k_tensor_scale"),
                      kw.get("v_tensor_scale"), 3)
    calls = []

    def prefix(qq, ops, rotate_q):  # rows >= 4 * 30: the 2nd and 3rd sequences go dense, the 1st stays fused
        st = dense.attend_prefixes(qq, qo, kv, 64 ** -0.5, min_rows=100, min_prefix=1, bucket=16, ops=ops,
                                   rotate_q=rotate_q)
        calls.append(st[0].tolist())
        return st

    got = ext_triton.run(q, kn, vn, qo, kv, 64 ** -0.5, ExtendConfig(block_m=16, block_n=16), prefix=prefix)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    assert calls == [[0, 288, 16]]  # whole buckets of 16 tokens; the rest (12 and 1 tokens) stays fused
    assert _err(got, ref) < TOL


def test_prefix_pieces_merge_by_lse(monkeypatch):
    """A prefix longer than MAX_PIECE is attended in pieces merged by their log-sum-exps; pieces start on page
    boundaries even when MAX_PIECE is not a multiple of the page (40 tokens here, pages of 16)."""
    monkeypatch.setattr(dense, "MAX_PIECE", 40)
    c = ([150, 64], [6, 33], 8, 2, 64, 16, "q8_0", [5, 2])
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=2)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=16)
    assert _err(got, ref) < TOL


def test_dequantize_prefix_equals_oracle():
    """The workspace pass writes the oracle's dequantized values (in the tiles' column order, in the pages' rotated
    space for Hadamard specs)."""
    from kvlab.kernels.paged import sequence_kv
    from kvlab.quant.rotation import hadamard
    for name, P in (("q4_0", 16), ("kivi4", 32), ("nvfp4", 16), ("int4_had", 16)):
        sch = kvlab.scheme(name)
        cache = make_paged([64, 96], 2, 64, P, sch.k, sch.v, seed=5, device=DEV)
        args, kw = call_args(cache)
        q = torch.zeros(1, 4, 64, device=DEV)
        kv = check_prefix(q, *args, sch.k, sch.v, P, None, None, None, kw.get("k_tensor_scale"),
                          kw.get("v_tensor_scale"), 2)
        ops = dense.page_inputs(kv, 64, DEV)
        indptr = kv.kv_indptr.tolist()
        for b, L in ((0, 64), (1, 96)):
            k, v = dense.dequantize_prefix(kv, ops, b, 0, L, indptr, 64, torch.float32, DEV)
            rk, rv = sequence_kv(kv, b, 64)
            rk, rv = rk[..., ops[0]["perm"].long()], rv[..., ops[1]["perm"].long()]  # the tiles' column order
            if sch.k.rotation == "had":  # the oracle un-rotates; the pages (and the workspace) hold x H
                H = hadamard(64, DEV)
                rk, rv = sequence_kv(kv, b, 64)
                rk, rv = (rk @ H)[..., ops[0]["perm"].long()], (rv @ H)[..., ops[1]["perm"].long()]
            torch.testing.assert_close(k, rk, rtol=1e-6, atol=1e-6, msg=f"{name} K")
            torch.testing.assert_close(v, rv, rtol=1e-6, atol=1e-6, msg=f"{name} V")


def test_nan_group_in_prefix_poisons_only_its_sequence():
    """A non-finite cached group makes its sequence's rows NaN (as the reference), never finite garbage, and leaves
    the other sequence exact."""
    c = ([40, 33], [5, 6], 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=4)
    kp = args[0]
    page0 = int(args[3][0])  # first page of sequence 0
    kp["scales"][page0].view(-1)[0] = float("nan")
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=16)
    assert torch.isnan(ref[:5]).any() and torch.isnan(got[:5]).any()
    assert torch.equal(torch.isnan(got[:5]), torch.isnan(ref[:5]))
    assert _err(got[5:], ref[5:]) < TOL


def test_dense_bucket_must_fit_channel_groups():
    c = ([64, 32], [7, 20], 8, 2, 64, 32, "kivi4", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    with pytest.raises(ValueError, match="dense_bucket=48"):
        extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=48)


def test_dense_refuses_without_gpu_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    c = CASES[0]
    sch, P, q, kn, vn, qo, args, kw = _setup(c)
    if DEV == "cuda":
        pytest.skip("a GPU is present")
    kv = check_prefix(q, *args, sch.k, sch.v, P, None, None, None, None, None, 2)
    assert "CUDA GPU" in dense.why_not(q, kv)


def test_min_flops_leaves_small_prefixes_to_the_fused_kernel():
    """attend_prefixes covers only sequences whose prefix attention reaches min_flops (4 x Hq x chunk x prefix x D)."""
    c = ([40, 300], [40, 40], 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=6)
    kv = check_prefix(q, *args, sch.k, sch.v, P, None, None, None, None, None, 2)
    work = [4 * 8 * 40 * L * 64 for L in (40, 300)]  # Hq x chunk x prefix x D of each sequence
    got = dense.attend_prefixes(q, qo, kv, 64 ** -0.5, min_rows=1, min_prefix=1, bucket=16, min_flops=work[0] + 1)
    assert got[0].tolist() == [0, 288]  # whole buckets of 16 tokens of the second sequence only
    assert dense.attend_prefixes(q, qo, kv, 64 ** -0.5, min_rows=1, min_prefix=1, bucket=16,
                                 min_flops=work[1] + 1) is None


def test_slow_in_fused_families():
    from kvlab.kernels.extend.api import slow_in_fused
    slow = {n: slow_in_fused(kvlab.scheme(n).k) for n in ("fp8_e4m3", "q8_0", "nf4", "iq4nl", "q4_0", "bf16", "kivi4",
                                                           "mxfp4", "nvfp4", "int3:g32:asym", "lm2", "int4_had",
                                                           "int4:g32:asym")}
    assert slow == {"fp8_e4m3": True, "q8_0": True, "nf4": True, "iq4nl": True, "q4_0": False, "bf16": False,
                    "kivi4": False, "mxfp4": False, "nvfp4": False, "int3:g32:asym": False, "lm2": True,
                    "int4_had": True, "int4:g32:asym": False}


def test_host_lens_plan_without_a_device_read(monkeypatch):
    """With the lengths given on the host (as a pool knows them), the dense path never reads them back from the
    device and gives the same result; host lengths that disagree with the device tensors, or are malformed, are
    refused with what was wrong."""
    c = ([40, 300, 17], [2, 40, 30], 8, 2, 64, 16, "q4_0", [3, 0, 5])
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=2)
    host = (qo.tolist(), args[2].tolist(), args[4].tolist())  # qo_indptr, kv_indptr, kv_last_page_len
    want = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                  config={"block_m": 16, "block_n": 16})

    def no_read(*a, **k):
        raise AssertionError("the lengths were read back from the device")
    monkeypatch.setattr(dense, "_host_lists", no_read)
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                 config={"block_m": 16, "block_n": 16}, host_lens=host)
    assert torch.equal(got, want)
    cpu = tuple(torch.tensor(h) for h in host)
    assert torch.equal(extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                              config={"block_m": 16, "block_n": 16}, host_lens=cpu), want)
    for bad, msg in (((host[0], host[1]), "host_lens must be"),
                     ((host[0][:-1], host[1], host[2]), "qo_indptr has 3 entries"),
                     ((host[0], host[1], [x + 1 for x in host[2]]), "kv_last_page_len .* differs"),
                     ((host[0], [0.5] * 4, host[2]), "list of ints"),
                     ((host[0], [0, 9, 3, host[1][-1]], host[2]), "kv_indptr must start at 0, not decrease"),
                     (([0, 2, 42, 10 ** 6], host[1], host[2]), "qo_indptr must start at 0")):
        if DEV == "cuda" and "differs" in msg:
            continue  # on a GPU the values are trusted (checking them would be the synchronization saved)
        with pytest.raises(ValueError, match=msg):
            extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", host_lens=bad)


def test_chunk_attention_equals_masked_softmax():
    """attend_chunks: each chunk's causal self-attention (key j visible to query i when j <= i, GQA heads sharing
    their KV head) and its natural-log log-sum-exp, ragged chunks (one of them empty) in one call."""
    g = torch.Generator().manual_seed(11)
    cl, Hq, Hk, D = [5, 0, 9], 8, 2, 64
    q, kn, vn = (torch.randn(sum(cl), h, D, generator=g).to(DEV, DT) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0, 5, 5, 14], dtype=torch.int32, device=DEV)
    out, lse, (sb, sh, si), glob = dense.attend_chunks(q, kn, vn, qo, 9, D ** -0.5)
    flat = lse.reshape(-1)
    for b, (a, e) in enumerate(((0, 5), (5, 5), (5, 14))):
        for h in range(Hq):
            s = (q[a:e, h].float() @ kn[a:e, h // 4].float().T) * D ** -0.5
            s = s.masked_fill(torch.triu(torch.ones(e - a, e - a, dtype=torch.bool, device=DEV), 1), float("-inf"))
            want_o = torch.softmax(s, -1) @ vn[a:e, h // 4].float()
            rows = torch.arange(e - a, device=DEV) + (a if glob else 0)
            got_l = flat[b * sb + h * sh + rows * si]
            torch.testing.assert_close(got_l, torch.logsumexp(s, -1), rtol=TOL, atol=TOL)
            assert _err(out[a:e, h], want_o) < TOL if e > a else True


def test_chunk_lse_padded_layout_merges_the_same():
    """The fused kernel reads the chunk's log-sum-exp in either of flash's layouts: unpadded [Hq, C] (row = the
    query's global index) and padded [B, Hq, max_qo_len] (row = its index in the chunk)."""
    c = ([40, 300, 17], [2, 40, 30], 8, 2, 64, 16, "q4_0", [3, 0, 5])
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=8)
    kv = check_prefix(q, *args, sch.k, sch.v, P, kw["k_fp"], kw["v_fp"], kw["fp_len"], None, None, 3)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    qol = qo.tolist()

    def layout(want_glob):
        def chunk(qq, k, v, mx):
            o, lse, (sb, sh, si), glob = dense.attend_chunks(qq, k, v, qo, mx, 64 ** -0.5)
            flat = lse.reshape(-1)
            rows = [(b, h, i) for b in range(3) for h in range(8) for i in range(qol[b + 1] - qol[b])]
            vals = torch.stack([flat[b * sb + h * sh + (i + qol[b] * glob) * si] for b, h, i in rows])
            if want_glob:
                new = torch.full((8, qol[-1]), float("nan"), device=DEV)
                new[[h for _, h, _ in rows], [qol[b] + i for b, _, i in rows]] = vals
            else:  # rows past a chunk's end are NaN: never read
                new = torch.full((3, 8, mx), float("nan"), device=DEV)
                new[[b for b, _, _ in rows], [h for _, h, _ in rows], [i for _, _, i in rows]] = vals
            st = (0,) + new.stride() if want_glob else new.stride()
            return o, new, st, want_glob
        return chunk

    cfg = ExtendConfig(block_m=16, block_n=16)
    for chunk in (layout(False), layout(True)):
        got = ext_triton.run(q, kn, vn, qo, kv, 64 ** -0.5, cfg, chunk=chunk)
        assert _err(got, ref) < TOL


def test_dense_prefix_with_the_fused_causal_part(monkeypatch):
    """Where flash does not take the chunk (attend_chunks returns None), the fused kernel runs the causal part from the
    dense prefix's state."""
    monkeypatch.setattr(dense, "attend_chunks", lambda *a, **k: None)
    for c in (CASES[0], CASES[3], CASES[7]):
        sch, P, q, kn, vn, qo, args, kw = _setup(c)
        ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
        got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                     config={"block_m": 16, "block_n": 16})
        assert _err(got, ref) < TOL


def test_nan_chunk_key_poisons_only_later_queries():
    """A NaN key in a chunk makes the rows of its sequence's queries that see it NaN (as the reference) and leaves the
    earlier queries and the other sequence exact, with the chunk attended by attend_chunks."""
    c = ([40, 33], [5, 6], 8, 2, 64, 16, "q4_0", None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=9)
    kn[5 + 2, 1, 3] = float("nan")  # second sequence, chunk key 2, KV head 1
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=16)
    nan = torch.isnan(got)
    assert torch.equal(nan, torch.isnan(ref))
    assert nan[7:, 4:].all() and not nan[:7].any() and not nan[7:, :4].any()
    fin = ~nan
    assert (got[fin].float() - ref[fin].float()).abs().max().item() / ref[fin].float().abs().max().item() < TOL


@pytest.mark.parametrize("name", ["q4_0", "k=lm3:g32:rot=had,v=lm4", "bf16"])
def test_complete_dense_prefix_merge_only(name):
    """Prefixes that are whole buckets (64 and 32 tokens, buckets of 32) and no full-precision buffer: the dense part
    is complete, so the kernel only merges the prefix's and the chunk's states (MERGE_ONLY); a sequence with an empty
    chunk and one with no prefix ride along."""
    c = ([64, 32, 40, 0], [7, 20, 0, 9], 8, 2, 64, 16, name, None)
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=10)
    kv = check_prefix(q, *args, sch.k, sch.v, P, None, None, None, kw.get("k_tensor_scale"),
                      kw.get("v_tensor_scale"), 4)
    st = dense.attend_prefixes(q, qo, kv, 64 ** -0.5, min_rows=1, min_prefix=1, bucket=32)
    assert st[0].tolist() == [64, 32, 0, 0] and st[4] is True
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                 out=torch.full_like(q, float("nan")))
    assert not torch.isnan(got).any()
    assert _err(got, ref) < TOL


def test_equal_shapes_share_one_batched_attention(monkeypatch):
    """Covered sequences with the same covered length and padded rows attend in one batched call (the group's
    workspace within MAX_PIECE tokens), others alone; both equal the reference."""
    assert dense._groups([64, 64, 96, 0, 64], [0, 5, 14, 18, 18, 30], 4, 256, 4096) == [[0, 1, 4], [2]]
    assert dense._groups([64, 64, 64], [0, 5, 14, 18], 4, 256, 128) == [[0, 1], [2]]
    assert dense._groups([64, 64], [0, 5, 14 + 64], 4, 256, 4096) == [[0], [1]]  # 20 vs 292 rows: 256 vs 512 padded
    c = ([70, 64, 100, 66], [5, 9, 4, 7], 8, 2, 64, 16, "q4_0", [2, 0, 1, 3])
    sch, P, q, kn, vn, qo, args, kw = _setup(c, seed=12)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    calls = []
    real = dense.attend_dense
    monkeypatch.setattr(dense, "attend_dense", lambda qs, k, v, s: calls.append(qs.shape[0]) or real(qs, k, v, s))
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32)
    assert sorted(calls) == [1, 3]  # sequences 0, 1, 3 (64 tokens covered) batched; sequence 2 (96) alone
    assert _err(got, ref) < TOL


@pytest.mark.parametrize("gather", [False, True], ids=["permuted-in-registers", "gathered"])
@pytest.mark.parametrize("lens,cl", [([64, 64], [5, 9]), ([64], [12]), ([64, 32, 64, 0], [5, 20, 3, 4])],
                         ids=["one-batched-group", "one-sequence", "two-groups-and-no-prefix"])
def test_merge_only_reads_the_state_where_it_lies(lens, cl, gather, monkeypatch):
    """The merge-only launch reads the dense prefix's state where its attention call left it (a batched group: rows
    i x Hk x R of sequence i; a lone sequence; several groups copied into one buffer) and turns q4_0's GGML column
    order into the natural one in registers, or through the perm tensor (gathered) where a perm has no such form."""
    if gather:
        real = ext_triton.page_operands
        monkeypatch.setattr(ext_triton, "page_operands", lambda *a, **k: {**real(*a, **k), "pm": (0, 0)})
    launched = []
    kernel = ext_triton._merge_kernel

    class Spy:
        def __getitem__(self, grid):
            launched.append(grid)
            return kernel[grid]
    monkeypatch.setattr(ext_triton, "_merge_kernel", Spy())
    sch, P, q, kn, vn, qo, args, kw = _setup((lens, cl, 8, 2, 64, 16, "q4_0", None), seed=13)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32,
                 out=torch.full_like(q, float("nan")))
    assert len(launched) == 1
    assert not torch.isnan(got).any()
    assert _err(got, ref) < TOL


@pytest.mark.parametrize("name", ["int4_had", "k=int4:g32:asym,v=lm3:g32:rot=had", "k=lm3:g32:rot=had,v=q4_0"])
def test_merge_only_rotations_in_registers(name, monkeypatch):
    """Hadamard specs of one power-of-two block in a merge-only call: the stacking rotates the queries, the merge
    un-rotates the prefix's output, and the chunk is attended in the model's own space, so no torch rotation runs
    (`rotate_inputs` is never called); K rotated, V rotated, or both, equal the reference."""
    calls = []
    real = ext_triton.rotate_inputs
    monkeypatch.setattr(ext_triton, "rotate_inputs", lambda *a: calls.append(1) or real(*a))
    sch, P, q, kn, vn, qo, args, kw = _setup(([64, 32], [9, 6], 8, 2, 64, 16, name, None), seed=14)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32)
    assert calls == []
    assert not torch.isnan(got).any()
    assert _err(got, ref) < TOL


@pytest.mark.parametrize("name,fp", [("q4_0", [3, 0, 17]), ("kivi4", [1, 31, 5]), ("int4_had", [2, 4, 0]),
                                     ("k=lm3:g32:rot=had,v=int4:g32:sym:pack=ggml:rot=had", [20, 1, 2])])
def test_merge_only_attends_the_full_precision_buffer(name, fp, monkeypatch):
    """A complete dense prefix with a full-precision buffer (a window, sinks, a channel-axis group not yet full) still
    needs no fused pass: the merge launch attends the buffer's tokens itself (ragged lengths, up to 31 of them), in
    the model's space where the rotations are fused; equal to the reference."""
    launched = []
    kernel, fused = ext_triton._merge_kernel, ext_triton._extend_kernel

    class Spy:
        def __init__(self, k, tag):
            self.k, self.tag = k, tag

        def __getitem__(self, grid):
            launched.append(self.tag)
            return self.k[grid]
    monkeypatch.setattr(ext_triton, "_merge_kernel", Spy(kernel, "merge"))
    monkeypatch.setattr(ext_triton, "_extend_kernel", Spy(fused, "fused"))
    sch, P, q, kn, vn, qo, args, kw = _setup(([64, 32, 96], [9, 6, 12], 8, 2, 64, 32, name, fp), seed=15)
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32)
    assert launched == ["merge"]
    assert not torch.isnan(got).any()
    assert _err(got, ref) < TOL


@pytest.mark.skipif(DEV != "cuda", reason="the batched cuDNN chunk call runs on the GPU only")
@pytest.mark.parametrize("name", ["q4_0", "int4_had"])
def test_equal_chunks_through_one_cudnn_call(name, monkeypatch):
    """Chunks of one length with their lengths on the host attend their causal parts in one batched cuDNN call
    (threshold lowered to take these small ones); the result equals the reference, and flash is not called."""
    monkeypatch.setattr(dense, "CUDNN_CHUNK_MIN_FLOPS", 0)
    flash = []
    real = torch.ops.aten._flash_attention_forward
    monkeypatch.setattr(dense.torch.ops.aten, "_flash_attention_forward", lambda *a, **k: flash.append(1) or real(*a, **k),
                        raising=False)
    sch, P, q, kn, vn, qo, args, kw = _setup(([64, 96, 32], [40, 40, 40], 8, 2, 64, 16, name, [1, 0, 3]), seed=16)
    hl = (qo.tolist(), args[2].tolist(), args[4].tolist())
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32, host_lens=hl)
    assert flash == [] and dense._NO_CUDNN_CHUNK == set()
    assert _err(got, ref) < TOL


@pytest.mark.parametrize("val,on", [("1", True), ("on", True), ("0", False), ("off", False), ("", False)])
def test_overlap_switch_reads_the_environment(val, on, monkeypatch):
    """KVLAB_EXTEND_OVERLAP turns the side-stream chunk on or off at call time (unset: on)."""
    monkeypatch.setenv("KVLAB_EXTEND_OVERLAP", val)
    assert ext_triton.overlap_chunk() is on
    monkeypatch.delenv("KVLAB_EXTEND_OVERLAP")
    assert ext_triton.overlap_chunk() is True


@pytest.mark.skipif(DEV != "cuda", reason="streams are the GPU's")
@pytest.mark.parametrize("lens", [[64, 96, 32], [70, 100, 45]], ids=["whole-buckets", "partial-buckets"])
@pytest.mark.parametrize("name", ["q4_0", "int4_had", "k=lm3:g32:rot=had,v=lm4", "kivi4"])
def test_chunk_on_a_side_stream_equals_the_reference(name, lens, monkeypatch):
    """KVLAB_EXTEND_OVERLAP=1: the chunk's cuDNN call on a side stream beside the prefix's passes gives the reference
    (a rotated spec's merge-only call, KIVI's buffer, and prefixes that leave a partial bucket to the fused kernel),
    with the NaN-poisoned out fully written; the chunk is attended once a call, on the side stream except for a
    fused rotation whose prefix is not complete (then after the rotation, on the caller's stream, as without it)."""
    monkeypatch.setattr(dense, "CUDNN_CHUNK_MIN_FLOPS", 0)
    monkeypatch.setenv("KVLAB_EXTEND_OVERLAP", "1")
    calls = []
    real = dense.attend_chunks
    monkeypatch.setattr(dense, "attend_chunks", lambda *a, **k: calls.append(
        torch.cuda.current_stream() != torch.cuda.default_stream()) or real(*a, **k))
    sch, P, q, kn, vn, qo, args, kw = _setup((lens, [40, 40, 40], 8, 2, 64, 32, name, [1, 0, 3]), seed=17)
    hl = (qo.tolist(), args[2].tolist(), args[4].tolist())
    ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    for i in range(3):  # the allocator hands the side stream's blocks on: later calls must not read stale states
        got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=32, host_lens=hl,
                     out=torch.full_like(q, float("nan")))
        assert not torch.isnan(got).any()
        assert _err(got, ref) < TOL
        assert len(calls) == i + 1  # one chunk call an extend call
    fused_partial = sch.k.rotation == "had" and lens[0] % 32 != 0
    assert calls == [not fused_partial] * 3


@pytest.mark.skipif(DEV != "cpu", reason="a GPU reads the kernels' constexpr globals when it compiles (Triton refuses "
                    "a changed one)")
@pytest.mark.parametrize("name", ["int4_had", "k=lm3:g32:rot=had,v=lm4:g64:rot=had"])
def test_rotations_in_place_give_the_same_output(name, monkeypatch):
    """The Hadamard stages in place (`tiles.rotate.IN_PLACE`, off until timed on a GPU) where the dense path rotates in
    registers on the CPU (the stacked queries, `dense.py`'s stacking kernel) give the output of the constant-geometry
    stages bit for bit (stages in the reverse order fail it). The merge kernel's un-rotation of the prefix's output
    runs on a GPU only."""
    backend = "dense"
    import triton.language as tl

    from kvlab.kernels.tiles import rotate
    sch, P, q, kn, vn, qo, args, kw = _setup(([40, 9], [6, 11], 8, 2, 64, 16, name, None), seed=21)
    want = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend=backend, dense_bucket=32)
    monkeypatch.setattr(rotate, "IN_PLACE", tl.constexpr(True))
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend=backend, dense_bucket=32)
    assert not torch.isnan(got).any()
    assert torch.equal(got, want)
