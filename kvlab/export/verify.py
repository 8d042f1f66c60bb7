"""Verify engine profiles against a running engine: the same token ids through llama.cpp and through
kvlab's decode-faithful evaluation under the matching profile, compared position by position.

    python -m kvlab.export verify --engine llama.cpp [--types q4_0,q8_0] [--tokens 2048] [--segments 4]

llama.cpp runs through `llama-cpp-python` (an optional dependency: `pip install llama-cpp-python`, a source
build of llama.cpp, about 10 minutes on 2 CPU cores) on the CPU, with flash attention on (llama.cpp requires
it for a quantized V), every cache type with its Hadamard rotation on and off (`LLAMA_ATTN_ROT_DISABLE`).
Both sides score the same disjoint pydoc segments (no BOS) with every position's logits; each side's PPL
delta is taken against its own full-precision cache (llama.cpp's f16, kvlab's float32 reference). Writes one
row per (cache type, rotation): engine_ppl, engine_ppl_delta_pct, kvlab_ppl, kvlab_ppl_delta_pct (means over
segments, with sds), and the per-position NLL difference (mean, sd, correlation of the two deltas).
"""
from __future__ import annotations

import csv
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..spec.engines import LLAMA_CPP_TYPES

COLUMNS = ["engine", "cache_k", "cache_v", "rotation", "tokens", "segments", "engine_ppl", "engine_ppl_sd",
           "engine_ppl_delta_pct", "engine_ppl_delta_pct_sd", "kvlab_profile", "kvlab_ppl", "kvlab_ppl_sd",
           "kvlab_ppl_delta_pct", "kvlab_ppl_delta_pct_sd", "nll_diff_mean", "nll_diff_sd", "delta_corr",
           "engine_s", "kvlab_s"]
GGML_TYPE = {"f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}


def _nll(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """Per-position NLL of ids[1:] from logits [T, V] (float64)."""
    lg = torch.from_numpy(np.asarray(logits, dtype=np.float64))
    return F.cross_entropy(lg[:-1], torch.tensor(ids[1:]), reduction="none").numpy()


def llama_cpp_nlls(gguf: str, segs: list[list[int]], type_k: str, type_v: str, rotate: bool,
                   threads: int | None = None) -> list[np.ndarray]:
    """Per-position NLL of each segment through llama.cpp with the given cache types (CPU, flash attention)."""
    try:
        from llama_cpp import Llama
    except ImportError as e:
        raise ValueError("verify --engine llama.cpp needs llama-cpp-python (pip install llama-cpp-python; it "
                         f"builds llama.cpp from source): {e}") from None
    os.environ["LLAMA_ATTN_ROT_DISABLE"] = "0" if rotate else "1"  # read when the KV cache is built
    n = max(len(s) for s in segs)
    llm = Llama(model_path=gguf, n_ctx=n, n_batch=512, logits_all=True, flash_attn=True, verbose=False,
                type_k=GGML_TYPE[type_k], type_v=GGML_TYPE[type_v], n_threads=threads or os.cpu_count())
    out = []
    for ids in segs:
        llm.reset()
        llm.eval(ids)
        out.append(_nll(llm.scores[:len(ids)], ids))
    del llm
    return out


@torch.no_grad()
def kvlab_nlls(model, segs: list[torch.Tensor], scheme) -> list[np.ndarray]:
    """Per-position NLL of each segment under kvlab's decode-faithful evaluation of `scheme` (None: the
    full-precision model)."""
    from ..eval.faithful import DecodeFaithfulBackend
    dev = next(model.parameters()).device
    backend = None if scheme is None else DecodeFaithfulBackend(scheme, model.config.n_layers)
    out = []
    for seg in segs:  # one at a time: a batch of segments changes the matmul shapes, not the result
        lg = model(seg[None].to(dev), backend=backend)[0].float() if backend else model(seg[None].to(dev))[0].float()
        if backend is not None:
            backend.reset()
        out.append(F.cross_entropy(lg[:-1].double(), seg[1:].to(dev), reduction="none").cpu().numpy())
    return out


def _ppl(nlls: list[np.ndarray]) -> list[float]:
    return [float(np.exp(x.mean())) for x in nlls]


def _ms(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def verify_llama_cpp(types=None, tokens: int = 2048, segments: int = 4, out: str | None = None, threads=None,
                     log=print) -> list[dict]:
    """Rows of COLUMNS for every llama.cpp cache type in `types` (K = V), rotation on and off; written to `out`
    (CSV) as they finish."""
    from ..eval.perplexity import segments as take_segments
    from ..eval.perplexity import text_tokens
    from ..model import load_model, smollm2_gguf_path
    types = list(types or LLAMA_CPP_TYPES)
    bad = sorted(set(types) - set(LLAMA_CPP_TYPES))
    if bad:
        raise ValueError(f"unknown llama.cpp cache types {bad}; allowed: {', '.join(LLAMA_CPP_TYPES)}")
    model, tok = load_model("smollm2")
    segs = take_segments(text_tokens(tok, "pydoc"), tokens, segments)
    ids = [s.tolist() for s in segs]
    gguf = str(smollm2_gguf_path())
    base_engine = llama_cpp_nlls(gguf, ids, "f16", "f16", True, threads)
    base_kvlab = kvlab_nlls(model, segs, None)
    rows = []
    f = None
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        f = open(out, "w", newline="")
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
    for t in types:
        for rotate in (True, False):
            if t in ("f16", "bf16") and not rotate:
                continue  # llama.cpp rotates only quantized caches
            profile = f"llama.cpp:{t}" + ("" if rotate else ":norot")
            t0 = time.time()
            eng = llama_cpp_nlls(gguf, ids, t, t, rotate, threads)
            t1 = time.time()
            kv = kvlab_nlls(model, segs, profile)
            t2 = time.time()
            e_ppl, k_ppl = _ppl(eng), _ppl(kv)
            e_d = [100 * (a / b - 1) for a, b in zip(e_ppl, _ppl(base_engine))]
            k_d = [100 * (a / b - 1) for a, b in zip(k_ppl, _ppl(base_kvlab))]
            diff = np.concatenate([(e - be) - (k - bk) for e, be, k, bk in zip(eng, base_engine, kv, base_kvlab)])
            de = np.concatenate([e - be for e, be in zip(eng, base_engine)])
            dk = np.concatenate([k - bk for k, bk in zip(kv, base_kvlab)])
            row = {"engine": "llama.cpp", "cache_k": t, "cache_v": t, "rotation": "on" if rotate else "off",
                   "tokens": tokens, "segments": segments, "kvlab_profile": profile,
                   "nll_diff_mean": float(diff.mean()), "nll_diff_sd": float(diff.std()),
                   "delta_corr": float(np.corrcoef(de, dk)[0, 1]) if de.std() > 0 and dk.std() > 0 else float("nan"),
                   "engine_s": round(t1 - t0, 1), "kvlab_s": round(t2 - t1, 1)}
            for key, vals in (("engine_ppl", e_ppl), ("engine_ppl_delta_pct", e_d), ("kvlab_ppl", k_ppl),
                              ("kvlab_ppl_delta_pct", k_d)):
                row[key], row[key + "_sd"] = _ms(vals)
            rows.append(row)
            log(f"{profile:24s} llama.cpp {row['engine_ppl_delta_pct']:+6.2f}% +- {row['engine_ppl_delta_pct_sd']:.2f}"
                f"   kvlab {row['kvlab_ppl_delta_pct']:+6.2f}% +- {row['kvlab_ppl_delta_pct_sd']:.2f}"
                f"   per-token NLL diff {row['nll_diff_mean']:+.4f} (sd {row['nll_diff_sd']:.3f})")
            if f:
                w.writerow(row)
                f.flush()
    if f:
        f.close()
    return rows
