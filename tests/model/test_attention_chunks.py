"""causal_attention bounds the scores it holds (MAX_SCORES): chunked queries give the same output."""
import torch

import kvlab.model.llama as L


def test_chunked_causal_attention_equals_one_pass(monkeypatch):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 100, 64, generator=g)
    k, v = torch.randn(2, 2, 100, 64, generator=g), torch.randn(2, 2, 100, 64, generator=g)
    p = torch.arange(100)
    want = L.causal_attention(q, k, v, p, p)
    want_sw = L.causal_attention(q, k, v, p, p, sliding_window=10)
    dec = L.causal_attention(q[:, :, -3:], k, v, p[-3:], p)
    monkeypatch.setattr(L, "MAX_SCORES", 2 * 8 * 100 * 7)   # 7 query rows per chunk: 100 = 14 x 7 + 2
    torch.testing.assert_close(L.causal_attention(q, k, v, p, p), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(L.causal_attention(q, k, v, p, p, sliding_window=10), want_sw, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(L.causal_attention(q[:, :, -3:], k, v, p[-3:], p), dec, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dec, want[:, :, -3:], rtol=1e-5, atol=1e-5)
