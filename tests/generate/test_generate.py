"""Generation through the real paged pool and kernels (kvlab.generate): decode steps equal the decode-faithful
simulation, chunked prefill over a float cache equals dense attention, the Triton kernels (interpreter) agree
with the torch backends, and the command reports capacity, timing, text and the check."""
from __future__ import annotations

import pytest
import torch

import kvlab
from kvlab.cache import KVPool
from kvlab.eval.faithful import DecodeFaithfulBackend
from kvlab.generate import PagedBackend, generate
from kvlab.generate.__main__ import main, page_size_for


DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the kernel-agreement test runs the real kernels on a GPU


def _pool(model, scheme, pages=32, device="cpu"):
    c, sch = model.config, kvlab.scheme(scheme)
    return KVPool(sch, c.n_layers, c.n_kv_heads, c.head_dim, pages, page_size_for(sch), max_seqs=4, device=device)


@torch.no_grad()
@pytest.mark.parametrize("scheme", ["q4_0", "k=int4:g32:chan:asym,v=int4:g32:asym,window=8,sink=2", "int3:g32:asym",
                                    # per-head specs: each layer's head 1 in another family (and bf16 in layer 1)
                                    "k=int4:g32:chan:asym,v=int4:g32:asym,window=8,sink=2,L0.h1=int2:g32:asym,"
                                    "L1.h1=bf16|int3:g32:asym",
                                    "q4_0,L-1.h0=lm3:g64:rot=had"])
def test_decode_steps_equal_the_decode_faithful_simulation(scheme, tiny_model):
    """Token by token (every step stores its token, then reads the cache back), the paged run is the
    simulation's arithmetic: logits agree to float32 accumulation order."""
    model = tiny_model
    tokens = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))
    pool = _pool(model, scheme)
    be = PagedBackend(pool, [pool.add_sequence(), pool.add_sequence()], kernels="reference")
    got = torch.cat([model(tokens[:, t:t + 1], positions=torch.tensor([t]), backend=be) for t in range(40)], 1)
    want = model(tokens, backend=DecodeFaithfulBackend(scheme, model.config.n_layers))
    assert (got - want).abs().max() / want.abs().max() < 1e-4


@torch.no_grad()
def test_chunked_prefill_over_a_float_cache_is_dense_attention(tiny_model):
    model = tiny_model
    tokens = torch.randint(0, 64, (1, 70), generator=torch.Generator().manual_seed(2))
    pool = _pool(model, "fp16")
    be = PagedBackend(pool, [pool.add_sequence()], kernels="reference")
    got = torch.cat([model(tokens[:, i:i + 32], positions=torch.arange(i, min(70, i + 32)), backend=be)
                     for i in range(0, 70, 32)], 1)
    want = model(tokens)
    assert (got - want).abs().max() / want.abs().max() < 1e-3  # the cache holds fp16 values


@torch.no_grad()
@pytest.mark.parametrize("scheme", ["q4_0", "k=int4:g32:chan:asym,v=int4:g32:asym,L0.h0=q4_0,L1.h1=q8_0|lm3:g64:rot=had"])
def test_triton_kernels_agree_with_the_torch_backends(scheme, tiny_model):
    """On the CPU under the interpreter; on a GPU the compiled kernels (default dispatch) over a CUDA pool."""
    model = tiny_model.to(DEV)
    prompts = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(3)).to(DEV)
    logits = {}
    for kernels in ("reference", "triton"):
        pool = _pool(model, scheme, device=DEV)
        be = PagedBackend(pool, [pool.add_sequence(), pool.add_sequence()], kernels=kernels)
        a = model(prompts[:, :16], positions=torch.arange(16, device=DEV), backend=be)  # extend
        b = torch.cat([model(prompts[:, t:t + 1], positions=torch.tensor([t], device=DEV), backend=be)
                       for t in range(16, 24)], 1)
        logits[kernels] = torch.cat([a, b], 1)
    ref, tri = logits["reference"], logits["triton"]
    # on a GPU the pool holds bf16 full-precision tokens and the kernels take bf16 queries: bf16's 2^-8
    tol = 1e-3 if DEV == "cpu" else 1e-2
    assert (tri - ref).abs().max() / ref.abs().max() < tol


def test_generate_reports_and_keeps_its_sequences(tiny_model):
    model = tiny_model
    pool = _pool(model, "q8_0")
    r = generate(model, pool, torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(4)), 5,
                 chunk=8, kernels="reference")
    assert r["tokens"].shape == (3, 5) and r["prefill_s"] > 0 and r["decode_tokens_per_s"] > 0
    assert [pool.seq_len(s) for s in r["seq_ids"]] == [24, 24, 24]  # 20 prompt + 4 fed back
    with pytest.raises(ValueError, match=r"prompts must be \[B, T\]"):
        generate(model, pool, torch.tensor([1, 2, 3]), 2)


def test_prerope_schemes_are_refused_with_the_reason(tiny_model):
    model = tiny_model
    pool = _pool(model, "k=int4:g32:chan:asym:prerope,v=int4:g32:asym")
    with pytest.raises(ValueError, match="before RoPE"):
        PagedBackend(pool, [pool.add_sequence()])


def test_command_runs_small(capsys, tmp_path):
    pytest.importorskip("gguf")
    try:
        from kvlab.model import load_model
        load_model("smollm2")
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2 not installed: {e}")
    csv = tmp_path / "g.csv"
    rc = main(["--scheme", "q4_0", "--kernels", "reference", "--device", "cpu", "--prompt-len", "48",
               "--new-tokens", "4", "--budget-gib", "0.02", "--check", "--csv", str(csv)])
    out = capsys.readouterr().out
    assert rc == 0 and "0.02 GiB holds" in out and "tokens/s" in out and "check:" in out
    assert csv.read_text().splitlines()[0].startswith("scheme,model,batch,context")
    assert main(["--scheme", "q4_0", "--batch", "0", "--device", "cpu"]) == 2
    assert "--batch must be >= 1" in capsys.readouterr().err
    rc = main(["--scheme", "q8_0", "--kernels", "reference", "--device", "cpu", "--prompt-len", "40",
               "--new-tokens", "4", "--requests", "3", "--batch", "2", "--budget-gib", "0.02"])
    out = capsys.readouterr().out
    assert rc == 0 and "3 requests over 2 slots" in out and "busy slots" in out and "latency" in out
    assert main(["--scheme", "q4_0", "--graphs", "--device", "cpu"]) == 2
    assert "--graphs needs --device cuda" in capsys.readouterr().err


@torch.no_grad()
def test_compiled_decode_layers_match_the_eager_ones(tiny_model):
    """compile_decode (fused q/k/v and gate/up matmuls through torch.compile) changes one-token forwards only,
    and only by float rounding."""
    model = tiny_model
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(6))
    pool = _pool(model, "q8_0")
    r_eager = generate(model, pool, tokens, 6, kernels="reference")
    try:
        model.compile_decode()
        pool = _pool(model, "q8_0")
        r_comp = generate(model, pool, tokens, 6, kernels="reference")
    except Exception as e:  # noqa: BLE001 - no C compiler for inductor on this machine
        pytest.skip(f"torch.compile unavailable: {type(e).__name__}: {str(e)[:120]}")
    assert torch.equal(r_eager["tokens"][:, :1], r_comp["tokens"][:, :1])  # prefill is not compiled
    be = [DecodeFaithfulBackend("q8_0", model.config.n_layers)]
    logits_e = model.forward(tokens[:, :1], backend=be[0])  # one-token forward: compiled path
    model._step_fns, fns = None, model._step_fns
    logits_ref = model.forward(tokens[:, :1], backend=DecodeFaithfulBackend("q8_0", model.config.n_layers))
    model._step_fns = fns
    assert (logits_e - logits_ref).abs().max() / logits_ref.abs().max() < 1e-5


@torch.no_grad()
def test_tensor_scaled_scheme_prefills_and_a_failed_prefill_frees_its_sequences(tiny_model, monkeypatch):
    """NVFP4 keeps an fp32 tensor scale per layer, calibrated from the layer's first tokens: a chunked prefill
    takes it before its first attention (it used to fail with 'k_tensor_scale is required'), and its result equals
    appending first and reading the same scale. A prefill that raises gives its pages and fp rows back."""
    model = tiny_model
    prompts = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(5))
    pool = _pool(model, "nvfp4")
    r = generate(model, pool, prompts, 3, chunk=8, kernels="reference")
    assert r["tokens"].shape == (2, 3)
    ts = pool.layer_cache(0).k_tensor_scale
    assert ts is not None and torch.isfinite(ts).all()
    pool = _pool(model, "q4_0")
    n_free = pool.n_free_pages

    def boom(*a, **k):
        raise RuntimeError("kernel failed")
    monkeypatch.setattr(PagedBackend, "attend", boom)
    with pytest.raises(RuntimeError, match="kernel failed"):
        generate(model, pool, prompts, 2, chunk=8, kernels="reference")
    assert pool.seq_ids == [] and pool.n_free_pages == n_free


@torch.no_grad()
def test_eager_decode_bounds_the_splits_by_the_longest_paged_sequence(tiny_model, monkeypatch):
    """The eager backend hands decode the longest sequence's paged (quantized) tokens as max_kv_len, host-known from
    its block table, so no split program is launched past them; the reference backend gets no bound."""
    import kvlab.generate.backend as gb
    seen = []
    real = gb.decode
    monkeypatch.setattr(gb, "decode", lambda *a, **k: seen.append(k.get("max_kv_len")) or real(*a, **k))
    model = tiny_model
    for kernels in ("triton", "reference"):
        pool = _pool(model, "q4_0")
        ids = [pool.add_sequence(), pool.add_sequence()]
        be = PagedBackend(pool, ids, kernels=kernels)
        model(torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(5)), positions=torch.arange(20),
              backend=be)
        seen.clear()
        model(torch.randint(0, 64, (2, 1), generator=torch.Generator().manual_seed(6)), positions=torch.tensor([20]),
              backend=be)
        want = max(pool.n_quantized(s, 0) for s in ids) if kernels == "triton" else None
        assert seen == [want] * model.config.n_layers
        assert kernels == "reference" or want >= 16
