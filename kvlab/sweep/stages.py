"""What one cell computes, per stage. Runs in any process (local, worker, Ray task): heavy
objects (the model, captured Q/K/V) are cached per process."""
from __future__ import annotations

import functools
import json
import time

import torch

from ..eval import roundtrip
from ..eval.distributions import sample
from ..spec import as_scheme
from .cells import Skip


@functools.lru_cache(maxsize=2)
def _model(name: str, device: str):
    """The evaluated model, float32 on every device: in bf16 the scored pass and the reference pass
    (different batch shapes, attention paths) round differently, which puts a KL floor under every
    scheme (measured: sweeps/results/h200/README.md)."""
    from ..model import load_model
    return load_model(name, device=device, dtype=torch.float32)


def _tokens(name: str, device: str, text: str, tokens: int) -> torch.Tensor:
    """The first `tokens` tokens of `text` as the evaluation feeds the model (Gemma 3: its BOS first)."""
    from ..eval.perplexity import bos_prefix, text_tokens
    _, tok = _model(name, device)
    ids = text_tokens(tok, text)
    if ids.numel() < tokens:
        raise ValueError(f"text {text!r} has {ids.numel()} tokens, fewer than the {tokens} requested")
    head = bos_prefix(tok)
    return torch.cat([torch.tensor(head, dtype=ids.dtype), ids[:tokens - len(head)]])


@functools.lru_cache(maxsize=4)
def _captured(name: str, device: str, text: str, tokens: int):
    from ..eval.attention import capture_qkv
    model, _ = _model(name, device)
    cap = capture_qkv(model, _tokens(name, device, text, tokens))
    return {k: ([t.float() for t in v] if isinstance(v, list) else v) for k, v in cap.items()}


def _roundtrip(sch, p, device):
    d = p["distribution"]
    out = {}
    cal = sch.k.calibrated or sch.v.calibrated  # calibrated codebooks fit on other data: license text / seed + 1

    def real(text):
        cap = _captured(p["model"], device, text, min(p["tokens"], 1024))
        t = {"k": torch.cat(cap["k"], 1)[0], "k_pre": torch.cat(cap["k_pre"], 1)[0], "v": torch.cat(cap["v"], 1)[0]}
        return {"k": t["k_pre"] if sch.k.pre_rope else t["k"], "v": t["v"]}  # [L*Hk, T, D]
    if d == "real":
        xs, cs = real("pydoc"), (real("license") if cal else None)
    else:
        x = sample(d, p["tokens"], p["head_dim"], p["seed"], device)
        xs = {"k": x, "v": x}
        c = sample(d, p["tokens"], p["head_dim"], p["seed"] + 1, device) if cal else None
        cs = {"k": c, "v": c} if cal else None
    for name, spec in (("k", sch.k), ("v", sch.v)):
        x, c = xs[name], (cs[name] if cs else None)
        if spec.axis == "chan":
            x = x[..., : x.shape[-2] - x.shape[-2] % spec.group, :]
            c = None if c is None else c[..., : c.shape[-2] - c.shape[-2] % spec.group, :]
        try:
            r = roundtrip(x.float(), spec, None if c is None else c.float())
        except ValueError as e:
            raise Skip(str(e)) from None
        out.update({f"{name}_{k}": v for k, v in r.items()})
    for k in ("rel_l1", "rel_l2", "sqnr_db"):
        out[k] = (out[f"k_{k}"] + out[f"v_{k}"]) / 2
    out["bits_per_element"] = sch.bits_per_element(xs["k"].shape[-1])
    return out


def _attention(sch, p, device):
    from ..eval.attention import attention_delta
    from ..eval.faithful import calibrate, needs_calibration
    model, _ = _model(p["model"], device)
    _check_model_fit(sch, model)
    calib = None
    if any(needs_calibration(s) for layer in range(model.config.n_layers) for s in sch.for_layer(
            layer, model.config.n_layers)):  # static scales and calibrated codebooks: from other text
        other = "license" if p["text"] != "license" else "pydoc"
        calib = calibrate(model, _tokens(p["model"], device, other, p["tokens"])[None], sch)
    r = attention_delta(model, _captured(p["model"], device, p["text"], p["tokens"]), sch, calib)
    c = model.config
    return {"attn_k_rel_l2": r["k"], "attn_v_rel_l2": r["v"], "attn_kv_rel_l2": r["kv"],
            "bits_per_element": sch.bits_per_element(c.head_dim, n_layers=c.n_layers, n_kv_heads=c.n_kv_heads),
            "eff_bits_per_element": sch.bits_per_element(c.head_dim, context=p["tokens"], n_layers=c.n_layers,
                                                    n_kv_heads=c.n_kv_heads)}


def _check_model_fit(sch, model):
    c = model.config
    for pair in sch.pairs(c.n_layers):
        for spec in pair:
            try:
                spec.check_head_dim(c.head_dim)
            except ValueError as e:
                raise Skip(f"model head_dim {c.head_dim}: {e}") from None


def _model_stage(sch, p, device):
    from ..eval.passkey import passkey
    from ..eval.perplexity import evaluate_scheme
    model, tok = _model(p["model"], device)
    _check_model_fit(sch, model)
    r = evaluate_scheme(model, tok, sch, text=p["text"], n_tokens=p["tokens"], n_segments=p["segments"],
                        seed=p["seed"], greedy_tokens=p["greedy"])
    out = {k: v for k, v in r.items() if isinstance(v, (int, float)) and k not in ("seed",)}
    if p["passkey"]:
        pk = passkey(model, tok, sch, lengths=tuple(p["passkey"]), seed=p["seed"])
        out.update(passkey_hits=pk["hits"], passkey_trials=pk["trials"])
    return out


def _speed(sch, p, device, warm_only=False):
    if device != "cuda":
        raise Skip("the speed stage needs a CUDA GPU (Triton kernels are timed on the device)")
    from .speed import speed_cell
    return speed_cell(sch, p["shape"], p.get("ops", ["decode", "store"]), warm_only, quick=p.get("tune", "quick") == "quick")


RUNNERS = {"roundtrip": _roundtrip, "attention": _attention, "model": _model_stage, "speed": _speed}


def warm_cell(cell: dict, device: str) -> None:
    """Compile a speed cell's kernels without timing them (parallel warm-up before timing)."""
    if cell["stage"] == "speed" and device == "cuda":
        params = {k: json.loads(v) for k, v in json.loads(cell["params_items"])}
        try:
            _speed(as_scheme(cell["scheme"]), params, device, warm_only=True)
        except Skip:
            pass
        except Exception as e:  # noqa: BLE001 - the timed run reports it in the results; say so here too
            import sys
            print(f"warm-up of {cell['scheme']} failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr)


def run_cell(cell: dict, device: str) -> dict:
    """Run one cell (a `Cell.to_dict()` plus its id) and return its result row."""
    params = {k: json.loads(v) for k, v in json.loads(cell["params_items"])}
    t0 = time.perf_counter()
    row = {k: cell[k] for k in ("cell_id", "index", "scheme", "name", "stage", "shape", "params")}
    try:
        row.update(RUNNERS[cell["stage"]](as_scheme(cell["scheme"]), params, device))
        row["status"] = "ok"
    except Skip as e:
        row["status"] = f"skipped: {e}"
    except Exception as e:  # noqa: BLE001 - one failing cell must not sink the sweep; it is reported
        row["status"] = f"error: {type(e).__name__}: {e}"
    row["elapsed_s"] = time.perf_counter() - t0
    if device == "cuda" and cell["stage"] in ("model", "attention"):
        torch.cuda.empty_cache()  # workers share one GPU: hand back this cell's peak
    return row
