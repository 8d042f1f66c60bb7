"""HF-directory and GGUF loaders on tiny random models, checked against transformers."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _model_testlib import rel_err, write_tiny_gguf

pytestmark = pytest.mark.filterwarnings("ignore:no tokenizer.json")
IDS = torch.tensor([[5, 17, 3, 88, 41, 41, 2, 60, 9, 33, 71, 12, 0, 95, 50, 7, 23, 64, 19, 8]])


def _hf_logits(model, ids=IDS):
    with torch.inference_mode():
        return model(ids).logits.float()


def _ours(path, ids=IDS, **kw):
    from kvlab.model import load_model

    model, _ = load_model(path, cache=False, **kw)
    with torch.inference_mode():
        return model, model(ids)


@pytest.mark.parametrize("arch,kw", [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "shard": True}),
    ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("llama", {"rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8}}),
    ("llama", {"attention_bias": True}),
    ("qwen2", {}),
    ("qwen2", {"shard": True, "tie_word_embeddings": True}),
    ("mistral", {"sliding_window": 6}),
], ids=["llama", "llama-tied-sharded", "llama-rope-linear", "llama-rope-llama3", "llama-bias",
        "qwen2", "qwen2-tied-sharded", "mistral-window6"])
def test_hf_dir_matches_transformers(make_hf, arch, kw):
    hf, d = make_hf(arch, **kw)
    model, ours = _ours(d)
    assert rel_err(ours, _hf_logits(hf)) < 1e-5
    if arch == "qwen2":
        assert model.config.attention_bias and model.layers[0].self_attn.q_proj.bias is not None


def test_hf_rope_inv_freq_matches_transformers(transformers):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from kvlab.model import LlamaConfig, rope_inv_freq

    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
    hf_cfg = transformers.LlamaConfig(hidden_size=2048, num_attention_heads=16, head_dim=128,
                                      rope_parameters={**rs, "rope_theta": 500000.0})
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = rope_inv_freq(LlamaConfig(vocab_size=8, hidden_size=2048, intermediate_size=8, n_layers=1,
                                     n_heads=16, n_kv_heads=16, head_dim=128, rope_theta=500000.0,
                                     rope_scaling=rs))
    torch.testing.assert_close(ours, ref.float())


def test_hf_incremental_decode(make_hf):
    from kvlab.model import DenseCausalBackend

    hf, d = make_hf("mistral", sliding_window=5)
    model, full = _ours(d)
    be = DenseCausalBackend()
    with torch.inference_mode():
        parts = [model(IDS[:, :7], backend=be)] + [model(IDS[:, t:t + 1], backend=be) for t in range(7, 20)]
    assert rel_err(torch.cat(parts, 1), full) < 1e-5


def test_hf_bf16(make_hf):
    hf, d = make_hf("llama")
    model, ours = _ours(d, dtype=torch.bfloat16)
    assert model.embed_tokens.weight.dtype == torch.bfloat16 and ours.dtype == torch.float32
    assert model.to(torch.bfloat16).inv_freq.dtype == torch.float32  # RoPE frequencies stay fp32
    assert rel_err(ours, _hf_logits(hf)) < 3e-2


def test_permute_roundtrip():
    from kvlab.model.gguf_loader import gguf_permute, undo_gguf_permute

    w = np.random.default_rng(0).standard_normal((3 * 64, 40)).astype(np.float32)
    assert np.array_equal(undo_gguf_permute(gguf_permute(w, 3), 3), w)
    b = np.arange(3 * 64, dtype=np.float32)
    assert np.array_equal(undo_gguf_permute(gguf_permute(b, 3), 3), b)
    # llama.cpp's interleaved pairs (2i, 2i+1) of a head are HF's rotate-half pairs (i, i + D/2)
    assert list(gguf_permute(b, 3)[:4]) == [0, 32, 1, 33]


LLAMA3 = {"rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8}}


@pytest.mark.parametrize("arch,qtype,kw", [("llama", "F32", {}), ("llama", "Q8_0", {"tie_word_embeddings": True}),
                                           ("llama", "F16", LLAMA3), ("qwen2", "Q4_1", {})],
                         ids=["llama-F32", "llama-Q8_0-tied", "llama-F16-ropefreqs", "qwen2-Q4_1"])
def test_gguf_matches_transformers(make_hf, tmp_path, monkeypatch, arch, qtype, kw):
    """A tiny model written like llama.cpp's converter (q/k permuted for 'llama') loads back to
    the same logits as transformers on the weights the file holds."""
    from kvlab.model import gguf_loader

    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    hf, _ = make_hf(arch, **kw)
    rounded = write_tiny_gguf(tmp_path / "tiny.gguf", hf, arch, qtype)
    hf.load_state_dict(rounded, strict=False)  # strict=False: a tied lm_head is not listed
    with pytest.warns(UserWarning, match="tokenizer"):  # the tiny file has no vocabulary
        model, ours = _ours(tmp_path / "tiny.gguf")
    assert model.config.arch == arch
    assert rel_err(ours, _hf_logits(hf)) < 1e-5
    # the same file from the disk cache, in a "fresh process" (in-process cache dropped)
    assert len(list((tmp_path / "cache" / "gguf").glob("tiny-*.safetensors"))) == 1
    cold = gguf_loader.load_gguf(tmp_path / "tiny.gguf")
    assert gguf_loader.load_gguf(tmp_path / "tiny.gguf") is cold  # in-process cache
    monkeypatch.setattr(gguf_loader, "_MEM_CACHE", {})
    monkeypatch.setattr(gguf_loader, "_convert", None)  # must not be called
    warm = gguf_loader.load_gguf(tmp_path / "tiny.gguf")
    assert warm.config == cold.config and warm.tensors.keys() == cold.tensors.keys()
    for k, v in cold.tensors.items():
        assert torch.equal(warm.tensors[k], v), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda(make_hf, dtype):
    """On a GPU: logits match transformers' (fp32 tight, bf16 loose) and incremental decode
    through DenseCausalBackend matches the full forward."""
    from kvlab.model import DenseCausalBackend, load_model

    hf, d = make_hf("qwen2")
    ref = _hf_logits(hf)
    model, _ = load_model(d, device="cuda", dtype=dtype, cache=False)
    ids = IDS.cuda()
    with torch.inference_mode():
        full = model(ids)
        be = DenseCausalBackend()
        inc = torch.cat([model(ids[:, :9], backend=be)] + [model(ids[:, t:t + 1], backend=be)
                                                           for t in range(9, ids.shape[1])], 1)
    assert full.device.type == "cuda" and full.dtype == torch.float32
    assert rel_err(full.cpu(), ref) < (1e-4 if dtype == torch.float32 else 3e-2)
    assert rel_err(inc, full) < (1e-5 if dtype == torch.float32 else 3e-2)
