"""Engine profiles (kvlab.spec.engines) and the space the evaluation attends in for them (kvlab.eval.engine_space):
names and round trips, the engine facts they encode, and a profile's decode-faithful attention against the same
arithmetic written out by hand on a tiny random model."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kvlab
from kvlab.eval.engine_space import EngineSpace, gguf_order
from kvlab.eval.faithful import DecodeFaithfulBackend
from kvlab.spec.engines import LLAMA_CPP_TYPES, llama_cpp_profiles


@pytest.mark.parametrize("name", llama_cpp_profiles() + ["llama.cpp:q8_0/q4_0", "llama.cpp:f16/q4_1:norot"])
def test_profile_names_round_trip(name):
    s = kvlab.scheme(name)
    assert str(s) == name and kvlab.scheme(str(s)) == s and kvlab.scheme(s.to_dict()) == s
    assert s.engine is not None and s.window == 0 and s.sink == 0  # llama.cpp keeps no full-precision tokens
    assert s != kvlab.scheme(s.engine.k_spec if s.is_uniform else f"k={s.k},v={s.v}")  # the bytes alone differ


def test_profile_facts():
    q4 = kvlab.scheme("llama.cpp:q4_0").engine
    assert kvlab.scheme("llama.cpp:q4_0").k == kvlab.scheme("q4_0").k  # GGML's block, byte-exact preset
    assert q4.rotation_blocks(64) == (64, 64) and q4.rotation_blocks(128) == (128, 64)  # V always 64 blocks
    assert q4.rotation_blocks(96) == (0, 0)  # head_dim % 64 != 0: no rotation
    assert kvlab.scheme("llama.cpp:q4_0:norot").engine.rotation_blocks(128) == (0, 0)
    assert kvlab.scheme("llama.cpp:f16/q4_0").engine.rotation_blocks(128) == (0, 64)  # only the quantized side
    assert kvlab.scheme("llama.cpp:f16").engine.rotation_blocks(128) == (0, 0)
    assert kvlab.scheme("llama.cpp:q4_1").engine.q_round == "int8:g32:sym:recip"  # q8_1 values: q8_0's rounding
    assert kvlab.scheme("llama.cpp:f16").engine.q_round == "fp16"
    assert set(LLAMA_CPP_TYPES) == {"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"}


@pytest.mark.parametrize("text,match", [("llama.cpp:q3_k", "cache type 'q3_k'"), ("llama.cpp:q4_0/fp8", "'fp8'"),
                                        ("llama.cpp:", "cache type ''")])
def test_bad_profiles_name_the_type(text, match):
    with pytest.raises(ValueError, match=match):
        kvlab.scheme(text)


def test_gguf_order_is_the_converters_row_permutation(tiny_llama):
    """The K channel order the profile assumes is exactly what the GGUF loader undoes (kvlab.model's
    gguf_permute, the converter's permute): row g of the permuted matrix is HF row gguf_order[g]."""
    from kvlab.model.gguf_loader import gguf_permute
    D, H = 64, 3
    rows = np.arange(H * D)[:, None].astype(np.float32)
    got = gguf_permute(rows, H)[:, 0].astype(int).reshape(H, D) % D
    assert (got == np.array(gguf_order(D))[None]).all()
    assert sorted(gguf_order(D)) == list(range(D))
    import dataclasses
    c = tiny_llama(heads=2, kv_heads=1, max_pos=128).config
    for arch, want in (("llama", True), ("mistral", True), ("qwen2", False)):
        assert dataclasses.replace(c, arch=arch).gguf_qk_permuted == want


@pytest.mark.parametrize("name", ["llama.cpp:q4_0", "llama.cpp:q4_0:norot", "llama.cpp:f16/q5_1"])
def test_space_keeps_scores_and_values(name):
    """Permutation and rotation are orthogonal: q.k is unchanged (without the query's rounding) and the
    output map undoes the value map."""
    sp = EngineSpace(kvlab.scheme(name).engine, 128, True, "cpu")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 128, generator=g) for _ in range(3))
    assert torch.allclose(sp.keys(q) @ sp.keys(k).transpose(-1, -2), q @ k.transpose(-1, -2), atol=1e-4)
    assert torch.allclose(sp.output(sp.values(v)), v, atol=1e-5)
    assert not torch.equal(sp.queries(q), sp.keys(q))  # the query is rounded (q8_0 or fp16)


def _by_hand(model, tokens, name):
    """The profile's arithmetic written out: capture q / k / v per layer, move them to GGUF order and rotate
    (K: H over the head, V: H_64), quantize the cache with the block specs and the query with q8_0, causal
    attention, rotate the output back."""
    from kvlab.model.llama import DenseCausalBackend
    prof = kvlab.scheme(name).engine
    D = model.config.head_dim
    perm = torch.tensor(gguf_order(D))
    H = kvlab.quant.hadamard(D)

    class Backend(DenseCausalBackend):
        def attend(self, layer, q, k_pre, k, v, positions, model):
            qq = kvlab.quant.fake_quantize(q[..., perm] @ H, prof.q_round)
            kq = kvlab.quant.fake_quantize(k[..., perm] @ H, prof.k_spec)
            vq = kvlab.quant.fake_quantize(v @ H, prof.v_spec)
            r = q.shape[1] // k.shape[1]
            o = F.scaled_dot_product_attention(qq, kq.repeat_interleave(r, 1), vq.repeat_interleave(r, 1),
                                               is_causal=True)
            return o @ H.T
    return model(tokens, backend=Backend())


@torch.no_grad()
def test_profile_attention_equals_the_engine_arithmetic_by_hand(tiny_llama):
    model = tiny_llama(heads=2, kv_heads=1, max_pos=128)
    tokens = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    name = "llama.cpp:q4_0"
    got = model(tokens, backend=DecodeFaithfulBackend(name, model.config.n_layers))
    want = _by_hand(model, tokens, name)
    assert (got - want).abs().max() / want.abs().max() < 1e-4
    plain = model(tokens, backend=DecodeFaithfulBackend("q4_0", model.config.n_layers))
    assert (plain - want).abs().max() / want.abs().max() > 1e-3  # the profile is not the bare block format


# ---- vLLM, SGLang, FreeToken -------------------------------------------------------------------------
from kvlab.quant import engine_codecs  # noqa: E402
from kvlab.spec.engines import all_profiles  # noqa: E402


@pytest.mark.parametrize("name", all_profiles())
def test_every_profile_round_trips_and_names_real_codecs(name):
    s = kvlab.scheme(name)
    assert str(s) == name and kvlab.scheme(s.to_dict()) == s and s.engine.source
    p = s.engine
    for codec in (p.k_codec, p.v_codec, p.q_round):
        if codec:
            assert codec in engine_codecs.CODECS or kvlab.spec.parse_spec(codec)
    if p.exact:  # the engine's bytes are kvlab.encode's: where a codec computes the values, they must agree
        x = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(0)) * 3
        for codec, spec in ((p.k_codec, s.k), (p.v_codec, s.v)):
            if codec:
                assert torch.equal(engine_codecs.apply(codec, x), kvlab.quant.fake_quantize(x, spec).float())


def test_engine_facts():
    tq = kvlab.scheme("vllm:turboquant_4bit_nc")
    assert tq.engine.boundary_layers(30) == {0, 1, 28, 29} and tq.engine.boundary_layers(3) == {0, 2}
    assert tq.for_layer(1, 30) == (kvlab.spec.parse_spec("bf16"),) * 2 and tq.for_layer(2, 30)[0].bits == 4
    # K: 4-bit codes + an fp16 norm per (token, head); V: 4-bit + fp16 scale and min; 4 of 30 layers in bf16
    assert tq.bits_per_element(64, n_layers=30) == pytest.approx((26 * (4.25 + 4.5) / 2 + 4 * 16) / 30)
    i4 = kvlab.scheme("vllm:int4_per_token_head")
    assert i4.bits_per_element(64) == 4.5 and i4.engine.rotation_blocks(96) == (32, 32)  # 96 = 3 x 32
    assert kvlab.scheme("vllm:fp8").engine.q_round == "fp8_e4m3"  # FlashAttention-3 takes an fp8 query
    assert kvlab.scheme("vllm:fp8_e5m2").engine.q_round is None  # FlashInfer (FA3 rejects e5m2)
    assert kvlab.scheme("sglang:fp8_e4m3").engine.k_codec == "torch_fp8_e4m3"  # PyTorch's cast, not vLLM's
    ft = kvlab.scheme("freetoken:q4_0")
    assert ft.k == kvlab.spec.parse_spec("freetoken:q4_0") and ft.k.rule == "full" and ft.k.twos


@pytest.mark.parametrize("text,match", [("vllm:int2", "vLLM --kv-cache-dtype 'int2'"),
                                        ("sglang:fp8", "SGLang --kv-cache-dtype 'fp8'"),
                                        ("freetoken:q5_0", "allowed: q8_0, q6_0, q4_0, fp8_e4m3")])
def test_bad_engine_options_name_what_is_allowed(text, match):
    with pytest.raises(ValueError, match=match):
        kvlab.scheme(text)


@torch.no_grad()
@pytest.mark.parametrize("name", [n for n in all_profiles() if not n.startswith("llama.cpp")])
def test_every_profile_scores_the_tiny_model(name, tiny_llama):
    model = tiny_llama(heads=2, kv_heads=1, max_pos=128)
    tokens = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(2))
    got = model(tokens, backend=DecodeFaithfulBackend(name, model.config.n_layers))
    assert torch.isfinite(got).all()


@torch.no_grad()
def test_turboquant_boundary_layers_stay_bf16(tiny_llama):
    """vLLM keeps turboquant's first and last two layers (at most half) at the model dtype: a 2-layer model
    has none quantized."""
    model = tiny_llama(heads=2, kv_heads=1, max_pos=128)
    tokens = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(2))
    tq = model(tokens, backend=DecodeFaithfulBackend("vllm:turboquant_3bit_nc", model.config.n_layers))
    bf = model(tokens, backend=DecodeFaithfulBackend("bf16", model.config.n_layers))
    assert torch.equal(tq, bf)


@torch.no_grad()
def test_vllm_int4_profile_equals_its_arithmetic_by_hand(tiny_llama):
    """vllm:int4_per_token_head written out: random-sign Hadamard of q, k, v (rounded to bf16), the codec on
    k and v, plain causal attention, the output rotated back."""
    from kvlab.eval.engine_space import rht_signs
    from kvlab.model.llama import DenseCausalBackend
    model = tiny_llama(heads=2, kv_heads=1, max_pos=128)
    D = model.config.head_dim
    R = torch.tensor(rht_signs(D))[:, None] * kvlab.quant.hadamard(D)
    bf = (lambda t: t.to(torch.bfloat16).float())  # noqa: E731

    class Backend(DenseCausalBackend):
        def attend(self, layer, q, k_pre, k, v, positions, model):
            qq, kq, vq = bf(q @ R), engine_codecs.vllm_int4_zp(bf(k @ R)), engine_codecs.vllm_int4_zp(bf(v @ R))
            r = q.shape[1] // k.shape[1]
            o = F.scaled_dot_product_attention(qq, kq.repeat_interleave(r, 1), vq.repeat_interleave(r, 1),
                                               is_causal=True)
            return o @ R.T
    tokens = torch.randint(0, 64, (1, 40), generator=torch.Generator().manual_seed(1))
    want = model(tokens, backend=Backend())
    got = model(tokens, backend=DecodeFaithfulBackend("vllm:int4_per_token_head", model.config.n_layers))
    assert (got - want).abs().max() / want.abs().max() < 1e-4
    plain = model(tokens, backend=DecodeFaithfulBackend("int4:head:asym:s=f32", model.config.n_layers))
    assert (plain - want).abs().max() / want.abs().max() > 1e-3


def test_rht_signs_are_vllms_seeded_draw():
    s = rht_signs_local = __import__("kvlab.eval.engine_space", fromlist=["rht_signs"]).rht_signs(64)
    g = torch.Generator().manual_seed(0x9E3779B9)
    assert list(s) == (2.0 * torch.bernoulli(torch.full((64,), 0.5), generator=g) - 1.0).tolist()
    assert set(rht_signs_local) == {-1.0, 1.0}


def test_pool_refuses_profiles_whose_arithmetic_it_does_not_run():
    from kvlab.cache import KVPool
    with pytest.raises(ValueError, match="k=q4_0|k=int4"):
        KVPool("llama.cpp:q4_0", 2, 1, 64, 4)
    with pytest.raises(ValueError, match="vllm:int4_per_token_head"):
        KVPool("vllm:int4_per_token_head", 2, 1, 64, 4)
    KVPool("freetoken:q4_0", 2, 1, 64, 4)  # FreeToken does nothing around its blocks: the pool stores them
