"""Batch-1 extend through a captured graph (`extend/graphs.py`) == the eager call == the float32 reference, for every
prefix length of the captured bucket; keys, counts, eviction, outputs and switches.

On the CPU the graph is emulated (graphs.EMULATE: a replay copies into the static tensors, then re-runs the frozen
plan eagerly under the Triton interpreter), which tests what a replay may bake in: the plan of the captured length,
the static block table's capacity, the copies. On a GPU the same tests capture real CUDA graphs."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kvlab
from kvlab.kernels.extend import extend
from kvlab.kernels.extend import graphs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "decode"))
from paged_cases import call_args, make_paged  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = 2e-2 if DEV == "cuda" else 1e-4
DT = torch.bfloat16 if DEV == "cuda" else torch.float32
P, BUCKET, LMAX = 16, 32, 100  # channel-axis cases: 32-token pages, 128-token buckets, a 224-token sequence


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(graphs, "EMULATE", DEV == "cpu")
    monkeypatch.setattr(graphs, "GRAPH_AFTER", 0)
    monkeypatch.delenv("KVLAB_EXTEND_GRAPHS", raising=False)
    graphs.clear()
    graphs.STATS.clear()
    yield
    graphs.clear()


def _cache(name, Hq=8, Hk=2, D=64, C=9, fp=None, seed=0, P=P, lmax=LMAX):
    """One long sequence's pages; `call(L, fp_len)` gives the arguments of a batch-1 call over its first L tokens (the
    same page tensors, so the same graph key within a bucket) and the chunk's inputs."""
    sch = kvlab.scheme(name)
    c = make_paged([lmax], Hk, D, P, sch.k, sch.v, fp_lens=fp, fp_width=8 if fp else 0, seed=seed + 7, device=DEV)
    g = torch.Generator().manual_seed(seed + 3)
    q, kn, vn = (torch.randn(C, h, D, generator=g).to(DEV, DT) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0, C], dtype=torch.int32, device=DEV)
    (kp, vp, _, ind, _), kw = call_args(c)

    def call(L, fp_len=None):
        n = -(-L // P)  # (P: this cache's page size)
        args = (kp, vp, torch.tensor([0, n], dtype=torch.int32, device=DEV), ind[:n].clone(),
                torch.tensor([L - (n - 1) * P if n else 0], dtype=torch.int32, device=DEV))
        k = dict(kw)
        if fp_len is not None:
            k["fp_len"] = torch.tensor([fp_len], dtype=torch.int32, device=DEV)
        host = ([0, C], [0, n], args[4].tolist())
        return args, k, host
    return sch, q, kn, vn, qo, call


def _err(got, ref):
    return (got.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()


def _run(sch, q, kn, vn, qo, args, kw, host, P=P, bucket=BUCKET, **extra):
    return extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=bucket, host_lens=host,
                  config={"block_m": 16, "block_n": 16}, **extra)


@pytest.mark.parametrize("name,fp", [("q4_0", None), ("kivi4", [7]), ("int4_had", [3]), ("k=nf4,v=int3:g32:asym", None)])
def test_replay_equals_eager_for_every_length_of_the_bucket(name, fp):
    """Captured at the bucket's first length, replayed at two longer ones (more pages than at capture, another
    last-page length, another buffer length): each equals its own eager call and the reference. 16-token pages and
    32-token buckets at L = 40, 47, 63; KIVI (whole 32-token groups in 32-token pages) 128-token buckets at 160, 192,
    224."""
    chan = kvlab.scheme(name).k.axis == "chan"
    P, bucket, lens = (32, 128, [160, 192, 224]) if chan else (16, BUCKET, [40, 47, 63])
    sch, q, kn, vn, qo, call = _cache(name, fp=fp, P=P, lmax=lens[-1])
    outs = []
    for i, L in enumerate(lens):
        args, kw, host = call(L, None if fp is None else fp[0] - i)
        got = _run(sch, q, kn, vn, qo, args, kw, host, P=P, bucket=bucket)
        eager = _run(sch, q, kn, vn, qo, args, kw, host, P=P, bucket=bucket, graphs=False)
        ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
        assert not torch.isnan(got).any()
        if DEV == "cpu":
            assert torch.equal(got, eager), f"L={L}: the replay differs from the eager call"
        else:  # the same kernels on the same data; the graph's allocations may differ in alignment only
            assert _err(got, eager) < 1e-3, f"L={L}"
        assert _err(got, ref) < TOL, f"L={L}"
        outs.append((got, eager))
    assert graphs.STATS["captured"] == 1 and graphs.STATS["replayed"] == 2
    for got, eager in outs:  # a later replay did not overwrite an earlier call's result
        assert _err(got, eager) < (1e-3 if DEV == "cuda" else 1e-12)


def test_a_whole_bucket_is_its_own_key():
    """L = 64 is two whole buckets: its plan is merge-only (no remainder read), so L = 70 of the same bucket must not
    replay it; both are right."""
    sch, q, kn, vn, qo, call = _cache("q4_0")
    for L in (64, 70, 64):
        args, kw, host = call(L)
        got = _run(sch, q, kn, vn, qo, args, kw, host)
        ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
        assert _err(got, ref) < TOL, f"L={L}"
    assert graphs.STATS["captured"] == 2 and graphs.STATS["replayed"] == 1


def test_counts_switches_out_and_eviction(monkeypatch):
    """Two eager calls of a key before its capture (GRAPH_AFTER 2); graphs=False and KVLAB_EXTEND_GRAPHS=0 keep calls
    eager; out= is written; with MAX_GRAPHS 1 two alternating keys are captured again until the evictions outnumber
    the replays (the thrash guard), then new keys stay eager; a bad switch is refused."""
    monkeypatch.setattr(graphs, "GRAPH_AFTER", 2)
    sch, q, kn, vn, qo, call = _cache("q4_0")
    args, kw, host = call(40)
    for _ in range(4):
        _run(sch, q, kn, vn, qo, args, kw, host)
    assert dict(graphs.STATS) == {"eager": 2, "captured": 1, "replayed": 1}
    _run(sch, q, kn, vn, qo, args, kw, host, graphs=False)
    monkeypatch.setenv("KVLAB_EXTEND_GRAPHS", "0")
    _run(sch, q, kn, vn, qo, args, kw, host)
    monkeypatch.delenv("KVLAB_EXTEND_GRAPHS")
    assert graphs.STATS["replayed"] == 1
    out = torch.full_like(q, float("nan"))
    res = _run(sch, q, kn, vn, qo, args, kw, host, out=out)
    assert res is out and not torch.isnan(out).any() and graphs.STATS["replayed"] == 2
    monkeypatch.setattr(graphs, "GRAPH_AFTER", 0)
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    graphs.clear()
    graphs.STATS.clear()
    for L in (40, 70, 40):
        _run(sch, q, kn, vn, qo, *call(L))
    assert graphs.STATS["captured"] == 3 and len(graphs._GRAPHS) == 1
    _run(sch, q, kn, vn, qo, *call(70))  # two evictions, no replay: the keys cycle, so a new one stays eager
    assert graphs.STATS["captured"] == 3 and graphs.STATS["eager"] == 1
    _run(sch, q, kn, vn, qo, *call(40))  # the kept graph still replays
    assert graphs.STATS["replayed"] == 1
    with pytest.raises(ValueError, match="graphs='yes'; allowed: True or False"):
        _run(sch, q, kn, vn, qo, args, kw, host, graphs="yes")


def test_only_batch_one_with_host_lengths():
    """Without host lengths, or at batch 2, calls stay eager (a graph would freeze lengths it cannot see)."""
    sch, q, kn, vn, qo, call = _cache("q4_0")
    args, kw, host = call(40)
    extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="dense", dense_bucket=BUCKET,
           config={"block_m": 16, "block_n": 16})
    assert not graphs.STATS
    c = make_paged([40, 20], 2, 64, P, sch.k, sch.v, seed=1, device=DEV)
    qo2 = torch.tensor([0, 5, 9], dtype=torch.int32, device=DEV)
    a2, k2 = call_args(c)
    h2 = (qo2.tolist(), c["kv_indptr"].tolist(), c["kv_last_page_len"].tolist())
    got = extend(q, kn, vn, qo2, *a2, sch.k, sch.v, P, **k2, backend="dense", dense_bucket=BUCKET, host_lens=h2)
    ref = extend(q, kn, vn, qo2, *a2, sch.k, sch.v, P, **k2, backend="reference")
    assert _err(got, ref) < TOL and not graphs.STATS


def test_device_table_is_kept_by_the_graph_being_built():
    """While a graph is built, the warm-up call's host-to-device tables are reused (the capture may not copy from a
    pinned buffer that is freed after the call); outside, each call copies its own."""
    a = graphs.device_table([1, 2, 3], DEV)
    assert a.tolist() == [1, 2, 3] and a.dtype == torch.int32
    memo: dict = {}
    graphs._BUILD.append(memo)
    try:
        x = graphs.device_table([4, 5], DEV)
        assert graphs.device_table([4, 5], DEV) is x and len(memo) == 1
    finally:
        graphs._BUILD.pop()
    assert graphs.device_table([4, 5], DEV) is not x


@pytest.mark.skipif(DEV != "cuda", reason="the default dispatch (cuDNN / flash) runs on a GPU")
@pytest.mark.parametrize("name", ["q4_0", "kivi4", "bf16"])
def test_auto_backend_replays_on_the_gpu(name):
    """The default dispatch at a 2K+ prefix (dense prefix or fused, the chunk in flash) replays right across a
    bucket's lengths."""
    sch = kvlab.scheme(name)
    Hq, Hk, D, C = 16, 4, 128, 256
    chan = sch.k.axis == "chan"
    P, lens = (32, (2112, 2528, 4000)) if chan else (16, (2100, 2500, 4000))
    c = make_paged([4000], Hk, D, P, sch.k, sch.v, fp_lens=[7] if chan else None, seed=5, device=DEV)
    g = torch.Generator().manual_seed(9)
    q, kn, vn = (torch.randn(C, h, D, generator=g).to(DEV, DT) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0, C], dtype=torch.int32, device=DEV)
    (kp, vp, _, ind, _), kw = call_args(c)
    for L in lens:
        n = -(-L // P)
        args = (kp, vp, torch.tensor([0, n], dtype=torch.int32, device=DEV), ind[:n].clone(),
                torch.tensor([L - (n - 1) * P], dtype=torch.int32, device=DEV))
        host = ([0, C], [0, n], args[4].tolist())
        got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, host_lens=host)
        ref = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend="reference")
        assert _err(got, ref) < TOL, f"L={L}"
    assert graphs.STATS["captured"] == 1 and graphs.STATS["replayed"] == 2
