"""The evaluation protocol equals true incremental decode through the paged pool: real SmolLM2
q/k/v of one layer are appended token by token to a `KVPool` and attended by the paged decode
kernel (torch reference backend); each step must equal the parallel decode-faithful pass."""
import pytest
import torch

import kvlab
from kvlab.cache import KVPool
from kvlab.cache.window import FpPolicy
from kvlab.eval.faithful import faithful_attention, quantized_history
from kvlab.kernels.decode import decode

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def qkv():
    from kvlab.eval.attention import capture_qkv
    from kvlab.eval.perplexity import text_tokens
    from kvlab.model import load_model
    try:
        model, tok = load_model("smollm2")
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2 not installed: {e}")
    cap = capture_qkv(model, text_tokens(tok, "pydoc")[:70])
    return [(cap["q"][i][0], cap["k"][i][0], cap["v"][i][0]) for i in (0, 12)]  # [H, T, D] per layer


@pytest.mark.parametrize("name,page", [("q4_0", 16), ("k=int4:g16:chan:asym,v=int4:g32:asym,window=8,sink=2", 16),
                                       ("int3:g32:asym:rot=had,window=5", 1), ("nvfp4,window=4", 16),
                                       ("k=q8_0,v=int2:g16:asym,sink=3", 64)])
def test_pool_decode_equals_parallel_protocol(qkv, name, page):
    s = kvlab.scheme(name)
    for q, k, v in qkv:  # q [Hq, T, D]; k, v [Hk, T, D]
        Hk, T, D = k.shape
        pool = KVPool(s, 1, Hk, D, n_pages=T // page + 2, page_size=page)
        sid = pool.add_sequence()
        pos = torch.arange(T)
        cal = {}
        for t in range(T):
            pool.append(sid, 0, k[:, t][None], v[:, t][None])
            if t == 0:  # static scales come from the first tokens the pool stored: use the same in the protocol
                lc = pool.layer_cache(0)
                cal = {name_: {"tensor_scale": ts} for name_, ts in (("k", lc.k_tensor_scale), ("v", lc.v_tensor_scale))
                       if ts is not None and getattr(s, name_).tensor_scale}
            if t < 20:
                continue
            lc = pool.layer_cache(0)
            bt, fp = pool.block_table([sid]), pool.fp_buffer(0, [sid])
            got = decode(q[:, t][None], lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len,
                         lc.k_spec, lc.v_spec, page, k_fp=fp.k, v_fp=fp.v, fp_len=fp.length,
                         k_tensor_scale=lc.k_tensor_scale, v_tensor_scale=lc.v_tensor_scale, backend="reference")[0]
            kk, vv = k[None, :, : t + 1], v[None, :, : t + 1]
            kq = quantized_history(kk, s.k, s, cal.get("k"))
            vq = quantized_history(vv, s.v, s, cal.get("v"))
            want = faithful_attention(q[None, :, t:t + 1], kk, vv, kq, vq, pos[t:t + 1], pos[: t + 1], s.k, s.v,
                                      FpPolicy.of(s, 1))[0, :, 0]
            # both sides quantize the same values, so they hold the same codes (the Hadamard rotation's rows
            # did not depend on the row count, and 1-ulp changes of it flipped none): fp32 order only
            assert torch.allclose(got.float(), want, rtol=1e-4, atol=1e-5), (name, t, (got - want).abs().max())


@pytest.mark.parametrize("name,page", [("k=lm2:g64:s=e4m3:rot=had:smooth,v=lm2:g64:s=e4m3:rot=had,window=8,sink=2", 16),
                                       ("k=int4:g32:sym:smooth,v=q4_0", 1)])
def test_pool_decode_equals_protocol_with_smoothing(qkv, name, page):
    """A smoothed K spec: the pool stores k / s (pages and window) and decode multiplies q by s; the protocol
    quantizes k / s and multiplies back. Both quantize the same values, so they agree to fp32 order, and the
    factors change the result (they are not ignored)."""
    from kvlab.quant import fit_smoothing
    s = kvlab.scheme(name)
    for q, k, v in qkv:
        Hk, T, D = k.shape
        sm = fit_smoothing(k[None], q[None], sink=s.sink)
        assert (sm.log2().abs() > 0.2).any()
        pool = KVPool(s, 1, Hk, D, n_pages=T // page + 2, page_size=page)
        pool.set_static_scales(0, k_smooth=sm)
        sid = pool.add_sequence()
        pos = torch.arange(T)
        cal = {"k": {"smooth": sm[:, None, :]}}
        for t in range(T):
            pool.append(sid, 0, k[:, t][None], v[:, t][None])
            if t < 40:
                continue
            lc = pool.layer_cache(0)
            bt, fp = pool.block_table([sid]), pool.fp_buffer(0, [sid])
            got = decode(q[:, t][None], lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len,
                         lc.k_spec, lc.v_spec, page, k_fp=fp.k, v_fp=fp.v, fp_len=fp.length, backend="reference")[0]
            kk, vv = k[None, :, : t + 1], v[None, :, : t + 1]
            kq = quantized_history(kk, s.k, s, cal["k"])
            vq = quantized_history(vv, s.v, s)
            want = faithful_attention(q[None, :, t:t + 1], kk, vv, kq, vq, pos[t:t + 1], pos[: t + 1], s.k, s.v,
                                      FpPolicy.of(s, 1))[0, :, 0]
            assert torch.allclose(got.float(), want, rtol=1e-4, atol=1e-5), (name, t, (got - want).abs().max())
        import dataclasses
        base = dataclasses.replace(s.k, smooth=False)
        unsmoothed = faithful_attention(q[None, :, T - 1:], k[None], v[None], quantized_history(k[None], base, s),
                                        vq, pos[T - 1:], pos, base, s.v, FpPolicy.of(s, 1))[0, :, 0]
        assert not torch.allclose(unsmoothed, want, rtol=1e-3, atol=1e-4)
