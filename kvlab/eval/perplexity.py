"""Model-level quality of a scheme: perplexity, KL to the full-precision model, top-1 and greedy
agreement, over disjoint text segments (decode-faithful, see faithful.py).

A quantized forward is chaotic (a 1e-6 input change moves per-token int4 PPL by ~0.5%), so every
number is a mean +- sd over several disjoint segments, and carries its text, segment count,
token count and seed.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..spec import as_scheme
from .faithful import DecodeFaithfulBackend, calibrate

TEXTS = ("pydoc", "license")


_TOKENS_CACHE: dict = {}


def text_tokens(tokenizer, text: str = "pydoc") -> torch.Tensor:
    """All tokens (no BOS) of an offline text: 'pydoc' (pydoc_data.topics) or 'license'. Cached."""
    from ..model.text import license_text, pydoc_topics_text
    if text not in TEXTS:
        raise ValueError(f"unknown text {text!r}; allowed: {', '.join(TEXTS)}")
    key = (id(tokenizer), text)
    if key not in _TOKENS_CACHE:
        raw = pydoc_topics_text() if text == "pydoc" else license_text()
        enc = tokenizer.encode(raw, add_special_tokens=False)
        _TOKENS_CACHE[key] = torch.tensor(list(getattr(enc, "ids", enc)), dtype=torch.int64)
    return _TOKENS_CACHE[key]


def bos_prefix(tokenizer) -> list[int]:
    """The tokens the model's tokenizer puts before a text (its BOS where the GGUF says add_bos_token: Gemma 3's
    [2]; none for SmolLM2). A model trained with a BOS is evaluated with it: Gemma 3 270M's full-precision PPL on
    512 pydoc tokens is 21.7 with it and 70.5 without."""
    ids = (lambda e: list(getattr(e, "ids", e)))  # noqa: E731 - tokenizers' Encoding or a plain list
    with_sp, plain = ids(tokenizer.encode("a", add_special_tokens=True)), ids(tokenizer.encode("a", add_special_tokens=False))
    for k in range(len(with_sp) - len(plain) + 1):  # the special tokens before the text; not an appended EOS
        if with_sp[k:k + len(plain)] == plain:
            return with_sp[:k]
    return []


def segments(tokens: torch.Tensor, n_tokens: int, n_segments: int, seed: int = 0,
             prefix: list[int] | None = None) -> list[torch.Tensor]:
    """`n_segments` disjoint slices of `n_tokens` (each `prefix` + n_tokens - len(prefix) text tokens): seed 0 takes
    the first ones in order, another seed a seeded random choice of slots."""
    prefix = list(prefix or [])
    if n_tokens <= len(prefix):
        raise ValueError(f"{n_tokens} tokens per segment leave no room after the prefix {prefix}")
    n_text = n_tokens - len(prefix)
    slots = tokens.numel() // n_text
    if slots < n_segments:
        raise ValueError(f"text has {tokens.numel()} tokens: too short for {n_segments} segments of {n_tokens} "
                         f"(at most {slots}); lower --tokens or --segments")
    idx = list(range(n_segments)) if seed == 0 else \
        torch.randperm(slots, generator=torch.Generator().manual_seed(seed))[:n_segments].tolist()
    head = torch.tensor(prefix, dtype=tokens.dtype)
    return [torch.cat([head, tokens[i * n_text:(i + 1) * n_text]]) for i in idx]


@dataclass
class _Ref:
    logprobs: torch.Tensor  # [T, V] float32 log-softmax of the full-precision model's logits
    top: torch.Tensor  # [T] its argmax
    nll: float


_REF_CACHE: dict = {}
_BIG = "large"  # the key of the one cached segment whose logits exceed LOGITS_BUDGET / 4
LOGITS_BUDGET = 1 << 29  # float32 logits elements scored at once (2 GiB); Gemma 3's 262K vocabulary needs this


@torch.no_grad()
def reference_logits(model, seg: torch.Tensor) -> _Ref:
    """Full-precision log-probabilities (and argmax, NLL) of a segment, cached per model and segment (a scored forward
    then costs one log-softmax, a gather, a fused KL and an argmax over its own logits): every segment while they fit
    LOGITS_BUDGET / 4, and above that the last large one alone (Gemma 3's [1024, 262144] calibration logits, scored
    once per layer and candidate by the search, are computed once; a new large segment replaces it)."""
    key = (id(model), seg.numel(), hash(tuple(seg[:64].tolist())), hash(tuple(seg[-64:].tolist())))
    if key in _REF_CACHE:
        return _REF_CACHE[key]
    if _BIG in _REF_CACHE and _REF_CACHE[_BIG][0] == key:
        return _REF_CACHE[_BIG][1]
    dev = next(model.parameters()).device
    _REF_CACHE.pop(_BIG, None)  # free the last large entry before computing another
    lg = model(seg[None].to(dev))[0].float()
    # kept as float32 log-probabilities with their argmax: every scored forward reuses them as they are
    ref = _Ref(F.log_softmax(lg, -1), lg.argmax(-1), F.cross_entropy(lg[:-1], seg[1:].to(dev)).item())
    del lg
    if ref.logprobs.numel() <= LOGITS_BUDGET // 4:
        _REF_CACHE[key] = ref
    else:
        _REF_CACHE[_BIG] = (key, ref)
    return ref


@torch.no_grad()
def score_segment(model, seg: torch.Tensor, scheme, calib: dict | None = None) -> dict:
    """PPL, KL(full || quantized), top-1 agreement of one segment [T] (tokens, no BOS)."""
    return score_segments(model, [seg], scheme, calib)[0]


@torch.no_grad()
def score_segments(model, segs: list[torch.Tensor], scheme, calib: dict | None = None) -> list[dict]:
    """score_segment for equal-length segments, scored in batches [n, T] (one decode-faithful pass per batch: n
    times fewer kernel launches) of at most LOGITS_BUDGET logits (SmolLM2: all 4 x 2048 at once; Gemma 3: one)."""
    if len({s.numel() for s in segs}) != 1:
        raise ValueError(f"segments must have one length to be batched, got {sorted({s.numel() for s in segs})}")
    per = max(1, LOGITS_BUDGET // (segs[0].numel() * model.config.vocab_size))
    rows = []
    for i in range(0, len(segs), per):
        rows += _score_batch(model, segs[i:i + per], scheme, calib)
    return rows


def _score_batch(model, segs, scheme, calib) -> list[dict]:
    dev = next(model.parameters()).device
    backend = DecodeFaithfulBackend(scheme, model.config.n_layers, calib)
    lgs = model(torch.stack(segs).to(dev), backend=backend)
    rows = []
    for seg, lg in zip(segs, lgs):
        ref = reference_logits(model, seg)
        tgt = seg[1:].to(dev)
        T1 = tgt.numel()
        nll = kl = agree = 0.0
        step = max(1, (1 << 26) // lg.shape[-1])  # rows per slice: the metrics' temporaries stay near 256 MiB
        for r in range(0, T1, step):  # sums over row slices: the same values as over the whole segment
            e = min(r + step, T1)
            a = lg[r:e].float()
            lp = F.log_softmax(a, -1)
            nll -= lp.gather(1, tgt[r:e, None]).sum().item()
            # sum p_ref (log p_ref - log p) in one pass over the cached reference log-probabilities
            kl += F.kl_div(lp, ref.logprobs[r:e], reduction="sum", log_target=True).item()
            agree += (ref.top[r:e] == a.argmax(-1)).sum().item()
        nll, kl, top1 = nll / T1, kl / T1, agree / T1
        ppl, ppl_ref = float(torch.tensor(nll).exp()), float(torch.tensor(ref.nll).exp())
        rows.append({"ppl": ppl, "ppl_ref": ppl_ref, "ppl_delta_pct": 100 * (ppl / ppl_ref - 1), "kl": kl,
                     "top1": top1})
    return rows


def _ms(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def evaluate_scheme(model, tokenizer, scheme, *, text: str = "pydoc", n_tokens: int = 2048, n_segments: int = 4,
                    seed: int = 0, greedy_tokens: int = 0, calib_text: str = "license", progress=None,
                    bos: bool | None = None) -> dict:
    """Score a scheme over disjoint segments; returns mean and sd of every metric plus provenance.
    bos: start each segment with the tokenizer's BOS (None: where the tokenizer adds one, `bos_prefix`)."""
    sch = as_scheme(scheme)
    c = model.config
    for pair in sch.pairs(c.n_layers):
        for spec in pair:
            spec.check_head_dim(c.head_dim)
    for layer in range(c.n_layers):  # per-head overrides name heads the model has
        sch.head_groups(layer, c.n_layers, c.n_kv_heads)
    if n_tokens > c.max_position_embeddings:
        raise ValueError(f"{n_tokens} tokens exceed the model's context of {c.max_position_embeddings}")
    prefix = bos_prefix(tokenizer) if bos is None or bos else []
    if bos and not prefix:
        raise ValueError("bos=True but this tokenizer adds no BOS token")
    segs = segments(text_tokens(tokenizer, text), n_tokens, n_segments, seed, prefix)
    calib_tokens = torch.cat([torch.tensor(prefix, dtype=torch.int64),
                              text_tokens(tokenizer, calib_text)[:n_tokens - len(prefix)]])
    calib = calibrate(model, calib_tokens[None], sch)
    rows = score_segments(model, segs, sch, calib)
    if greedy_tokens:
        from .greedy import agreements
        prompts = [seg[: min(256, n_tokens // 2)] for seg in segs]
        backend = DecodeFaithfulBackend(sch, c.n_layers, calib)
        for r, g in zip(rows, agreements(model, prompts, backend, greedy_tokens)):
            r["greedy_agree"] = g
    if progress is not None:
        for _ in rows:
            progress()
    out = {"scheme": str(sch), "name": sch.name, "text": text, "segments": n_segments, "tokens": n_tokens,
           "seed": seed, "bos": bool(prefix), "calib_text": calib_text if calib else None,
           "bits_per_element": sch.bits_per_element(c.head_dim, n_layers=c.n_layers, n_kv_heads=c.n_kv_heads),
           "eff_bits_per_element": sch.bits_per_element(c.head_dim, context=n_tokens, n_layers=c.n_layers,
                                                    n_kv_heads=c.n_kv_heads)}
    for key in rows[0]:
        out[key], out[key + "_sd"] = _ms([r[key] for r in rows])
    return out
