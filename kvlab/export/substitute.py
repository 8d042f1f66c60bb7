"""The nearest scheme an engine can run, and what the substitution costs, measured with kvlab.

Nearest = closest stored bits/element to the requested scheme (to the whole bit), then the lowest KL on the
real model under the engine's profile (kvlab.export.quality: the committed engine-options table, SmolLM2,
decode-faithful), then the lower round-trip rel-L1 on synthetic heavy-tailed data (student_t4; also the only
measure for options missing from the table). Synthetic error alone misranks real K/V: it calls kivi4 and
q4_1 equal where SmolLM2 separates them more than tenfold in PPL cost. When a model is given, the requested
scheme and the chosen substitute are also scored decode-faithfully on text.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..spec import KVQuantSpec, KVScheme, as_scheme
from .engines import Plan, candidates
from .quality import engine_profile, profile_cost, scheme_cost

SECOND = "outlier_channels"  # a few channels 5-20x larger: the structure of real keys


@dataclass
class Substitution:
    engine: str
    requested: KVScheme
    reasons: list[str]
    chosen: KVScheme
    label: str                       # the engine's name for the chosen dtype(s)
    bits: tuple[float, float]        # (requested, chosen) bits/element
    metrics: dict                    # requested / chosen round-trip metrics on `dist`
    protocol: dict                   # dist, n, d, seed
    others: list[dict] = field(default_factory=list)
    also: dict | None = None         # the same comparison on SECOND (outlier channels, like real keys)
    model_eval: dict | None = None   # {"requested": {...}, "chosen": {...}, "protocol": {...}}
    quality: dict | None = None      # committed real-model costs {"requested": ..., "chosen": ...} (or None each)

    def to_dict(self) -> dict:
        return {"engine": self.engine, "requested": str(self.requested), "requested_name": self.requested.name,
                "reasons": self.reasons, "chosen": str(self.chosen), "chosen_label": self.label,
                "bits_per_element": {"requested": self.bits[0], "chosen": self.bits[1]},
                "roundtrip": self.metrics, "protocol": self.protocol, "alternatives": self.others,
                "roundtrip_also": self.also,
                "model_eval": self.model_eval, "quality": self.quality}

    def message(self) -> str:
        req = self.requested.name or str(self.requested)
        m, p = self.metrics, self.protocol
        r0, r1 = m["requested"]["rel_l1"], m["chosen"]["rel_l1"]
        s0, s1 = m["requested"]["sqnr_db"], m["chosen"]["sqnr_db"]
        from .engines import get_engine
        lines = [f"{self.engine} cannot run {req} ({'; '.join(self.reasons)}). "
                 f"Its cache dtypes: {', '.join(get_engine(self.engine).names)}.",
                 f"Nearest: {self.label} = {self.chosen} ({self.bits[1]:.2f} bits/elem vs {self.bits[0]:.2f}): "
                 f"rel-L1 {r1:.3f} vs {r0:.3f} ({_pct(r1, r0)}), SQNR {s1:.1f} vs {s0:.1f} dB "
                 f"on {p['dist']} ({p['n']}x{p['d']}, seed {p['seed']}; K and V averaged)"
                 + (f"; on {self.also['dist']}: rel-L1 {self.also['chosen']['rel_l1']:.3f} vs "
                    f"{self.also['requested']['rel_l1']:.3f} "
                    f"({_pct(self.also['chosen']['rel_l1'], self.also['requested']['rel_l1'])})" if self.also else "")
                 + "."]
        qa, qb = (self.quality or {}).get("requested"), (self.quality or {}).get("chosen")
        if qb:
            lines.append(f"On {qb['model']} ({qb['what']}, decode-faithful, {qb['file']}): KL {qb['kl']:.4f}, "
                         f"PPL {qb['ppl_delta_pct']:+.2f}% +- {qb['ppl_delta_pct_sd']:.2f}"
                         + (f"; requested ({qa['what']}, {qa['file']}): KL {qa['kl']:.4f}, PPL "
                            f"{qa['ppl_delta_pct']:+.2f}% +- {qa['ppl_delta_pct_sd']:.2f}" if qa else
                            "; the requested scheme is in no committed table (pass --model to score it)") + ".")
        if self.model_eval:
            a, b, q = self.model_eval["requested"], self.model_eval["chosen"], self.model_eval["protocol"]
            lines.append(f"On {q['model']}: KL {b['kl']:.4f}+-{b['kl_sd']:.4f} vs {a['kl']:.4f}+-{a['kl_sd']:.4f}, "
                         f"PPL {b['ppl_delta_pct']:+.2f}% vs {a['ppl_delta_pct']:+.2f}% (+-sd "
                         f"{b['ppl_delta_pct_sd']:.2f} / {a['ppl_delta_pct_sd']:.2f}) over {q['segments']}x"
                         f"{q['tokens']} tokens of {q['text']}, decode-faithful, calibration on {q['calib_text']}; "
                         f"effective bits/elem there {b['eff_bits_per_element']:.2f} vs {a['eff_bits_per_element']:.2f}.")
        if self.others:
            alts = ", ".join(f"{o['label']} ({o['bits_per_element']:.2f} b/e, "
                             + (f"KL {o['kl']:.4f}, PPL {o['ppl_delta_pct']:+.2f}%" if o.get("kl") is not None
                                else f"rel-L1 {o['rel_l1']:.3f}") + ")" for o in self.others[:3])
            lines.append(f"Other options: {alts}.")
        return "\n".join(lines)


def _pct(new: float, old: float) -> str:
    return "n/a" if old == 0 else f"{100 * (new / old - 1):+.0f}%"


_MEMO: dict = {}  # (spec, dist, n, d, seed) -> metrics: the oracle is deterministic


def _spec_metrics(specs: list[KVQuantSpec], dist: str, n: int, d: int, seed: int) -> dict:
    """Round-trip metrics per distinct spec on one shared sample (chan specs: whole groups)."""
    from ..eval import roundtrip, sample
    x = None
    out = {}
    for s in specs:
        key = (s, dist, n, d, seed)
        if key not in _MEMO:
            x = sample(dist, n, d, seed) if x is None else x
            _MEMO[key] = roundtrip(x[: n - n % s.group] if s.axis == "chan" else x, s)
        out[s] = _MEMO[key]
    return out


def _pair(m: dict, k: KVQuantSpec, v: KVQuantSpec) -> dict:
    return {key: (m[k][key] + m[v][key]) / 2 for key in ("rel_l1", "rel_l2", "sqnr_db", "max_abs")}


def nearest(p: Plan, head_dim: int = 128, dist: str = "student_t4", n: int = 4096, seed: int = 0) -> Substitution:
    """The engine's nearest runnable scheme to `p.scheme` (which it cannot run), with round-trip cost."""
    req = p.scheme
    cands = candidates(p.engine)
    if not cands:
        raise ValueError(f"engine {p.engine.name} has no cache dtypes to substitute with")
    specs = [req.k, req.v] + [s for _, c, _, _ in cands for s in (c.k, c.v)]
    for s in specs:
        s.check_head_dim(head_dim)
    m = _spec_metrics(specs, dist, n, head_dim, seed)
    bits_req = req.bits_per_element(head_dim)
    bk, bv = req.k.bits_per_element_at(head_dim), req.v.bits_per_element_at(head_dim)
    rows = []
    for label, c, _, _ in cands:
        r = _pair(m, c.k, c.v)
        # K and V each as close as possible in bits (engines with separate K/V dtypes), then the error
        gap = abs(c.k.bits_per_element_at(head_dim) - bk) + abs(c.v.bits_per_element_at(head_dim) - bv)
        prof = engine_profile(p.engine.name, label)
        cost = profile_cost(prof) if prof else None
        rows.append({"label": label, "scheme": str(c), "bits_per_element": c.bits_per_element(head_dim), **r,
                     "bits_distance": round(gap, 6), "profile": prof, "kl": cost["kl"] if cost else None,
                     "ppl_delta_pct": cost["ppl_delta_pct"] if cost else None, "_s": c, "_cost": cost})
    # whole bits first (a 4.5- and a 5-bit option are one choice), then the real model's KL, then synthetic error
    rows.sort(key=lambda r: (round(r["bits_distance"]), r["kl"] if r["kl"] is not None else float("inf"),
                             r["bits_distance"], r["rel_l1"]))
    best = rows[0]
    chosen, chosen_cost = best.pop("_s"), best.pop("_cost")
    try:  # name it after the preset it equals (q4_1), as kvlab.scheme("q4_1") would
        if as_scheme(best["label"]) == chosen:
            chosen = KVScheme(k=chosen.k, v=chosen.v, name=best["label"])
    except ValueError:
        pass
    others = [{k: v for k, v in r.items() if k not in ("_s", "_cost")} for r in rows[1:]]
    m2 = _spec_metrics([req.k, req.v, chosen.k, chosen.v], SECOND, n, head_dim, seed)
    also = {"dist": SECOND, "requested": _pair(m2, req.k, req.v), "chosen": _pair(m2, chosen.k, chosen.v)}
    return Substitution(
        engine=p.engine.name, requested=req, reasons=list(p.reasons), chosen=chosen, label=best["label"],
        bits=(bits_req, best["bits_per_element"]),
        metrics={"requested": _pair(m, req.k, req.v), "chosen": {k: best[k] for k in ("rel_l1", "rel_l2", "sqnr_db",
                                                                                      "max_abs")}},
        protocol={"dist": dist, "n": n, "d": head_dim, "seed": seed, "metric": "round trip quantize->dequantize"},
        others=others, also=also, quality={"requested": scheme_cost(req), "chosen": chosen_cost})


def model_cost(sub: Substitution, model, tokenizer, model_name: str, n_tokens: int = 256, n_segments: int = 2,
               text: str = "pydoc", calib_text: str = "license") -> dict:
    """Score requested and chosen schemes on the model (decode-faithful KL / PPL); stores and returns it."""
    from ..eval.perplexity import evaluate_scheme
    res = {}
    for key, s in (("requested", sub.requested), ("chosen", sub.chosen)):
        r = evaluate_scheme(model, tokenizer, s, text=text, n_tokens=n_tokens, n_segments=n_segments,
                            calib_text=calib_text)
        res[key] = {k: r[k] for k in ("kl", "kl_sd", "ppl", "ppl_sd", "ppl_delta_pct", "ppl_delta_pct_sd", "top1",
                                      "eff_bits_per_element")}
    res["protocol"] = {"model": model_name, "text": text, "tokens": n_tokens, "segments": n_segments, "seed": 0,
                       "calib_text": calib_text, "protocol": "decode-faithful (kvlab.eval.perplexity)"}
    sub.model_eval = res
    return res
