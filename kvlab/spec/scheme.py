"""`KVScheme`: a K spec, a V spec, and the cache policy around them.

Text form (items joined by ','):

    SPEC                  the same spec for K and V (or a scheme preset such as kivi4)
    k=SPEC / v=SPEC       separate specs
    window=N              the N most recent tokens stay full precision
    sink=N                the first N tokens (attention sinks) stay full precision
    L<i>=SPEC             layer i (negative counts from the end) uses SPEC for K and V
    L<i>=KSPEC|VSPEC      layer i uses KSPEC for K and VSPEC for V
    L<i>.h<j>=SPEC        KV head j of layer i uses SPEC (or KSPEC|VSPEC) for K and V; the layer's other
                          heads keep the layer's specs (its L<i>= override, else k= / v=)

Example: `k=int4:g32:chan:asym,v=int4:g32:asym,window=128,L0=bf16,L-1=bf16,L5.h2=int3:g32:chan:asym|int3:g32:asym`.

A layer with per-head specs is "mixed": the pool keeps one set of pages per group of heads sharing a spec pair and
attention runs once per group (`kvlab.cache.pool`). Its specs may not need calibrated state (static or tensor
scales, calibrated codebooks, smoothing factors, permutations: `HEAD_STATE_RULE`), which the pool and the
exporter keep per layer.

An engine profile (`llama.cpp:q4_0`, `kvlab.spec.engines`) is a scheme too: its specs are the engine's
blocks and `engine` carries what the engine does around them (channel order, rotation, query rounding).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .dsl import parse_spec
from .engines import EngineProfile, parse_profile
from .quant_spec import SPEC_VERSION, KVQuantSpec
from .text import clean_text

HEAD_STATE_RULE = ("a layer with per-head specs takes no spec with calibrated state (axis tensor or NVFP4 tensor "
                   "scales, 'cal' codebooks, 'smooth', 'perm') and no 'prerope' keys: write such specs per layer")


def _keeps_state(spec: KVQuantSpec) -> bool:
    """True when a spec keeps calibrated state beside its pages (per layer), which per-head specs cannot."""
    return spec.needs_tensor_scale or spec.calibrated or spec.smooth or spec.permute


@dataclass(frozen=True)
class KVScheme:
    """K spec + V spec + full-precision window/sinks + per-layer overrides."""

    k: KVQuantSpec
    v: KVQuantSpec
    window: int = 0
    sink: int = 0
    overrides: tuple = field(default=())  # ((layer, K spec, V spec), ...) sorted; layer < 0 counts from the end
    # ((layer, spec), ...) is accepted too (one spec for K and V) and stored as (layer, spec, spec)
    name: str | None = field(default=None, compare=False)
    engine: EngineProfile | None = None  # an engine profile: what the engine does around the bytes
    head_overrides: tuple = field(default=())  # ((layer, KV head, K spec, V spec), ...) sorted; see module doc

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window={self.window!r} must be an int >= 0 (tokens kept full precision)")
        if not isinstance(self.sink, int) or self.sink < 0:
            raise ValueError(f"sink={self.sink!r} must be an int >= 0 (first tokens kept full precision)")
        if self.v.pre_rope:
            raise ValueError("prerope applies to keys only; write it on the k= spec")
        if self.v.smooth:
            raise ValueError("smooth applies to keys only (their factors fold into the queries); write it on the k= "
                             "spec")
        if self.v.permute:
            raise ValueError("perm applies to keys only (the queries follow the permuted channels); write it on the "
                             "k= spec")
        norm = []
        for item in self.overrides:
            if not isinstance(item, tuple) or len(item) not in (2, 3):
                raise ValueError(f"a layer override is (layer, spec) or (layer, K spec, V spec), got {item!r}")
            layer, ks, vs = (item[0], item[1], item[1]) if len(item) == 2 else item
            if not isinstance(layer, int):
                raise ValueError(f"layer override index {layer!r} must be an int")
            if ks.pre_rope or vs.pre_rope:
                raise ValueError("prerope cannot be set through a layer override")
            if vs.smooth or vs.permute:
                raise ValueError(f"layer {layer} override: {'smooth' if vs.smooth else 'perm'} applies to keys only "
                                 "(the K side of 'K|V')")
            norm.append((layer, ks, vs))
        object.__setattr__(self, "overrides", tuple(norm))
        layers = [l for l, *_ in self.overrides]
        if len(set(layers)) != len(layers):
            raise ValueError(f"layer overrides repeat a layer: {layers}")
        object.__setattr__(self, "overrides", tuple(sorted(self.overrides, key=lambda t: (t[0] < 0, t[0]))))
        self._check_heads()

    def _check_heads(self) -> None:
        norm = []
        for item in self.head_overrides:
            if not isinstance(item, tuple) or len(item) not in (3, 4):
                raise ValueError(f"a head override is (layer, head, spec) or (layer, head, K spec, V spec), "
                                 f"got {item!r}")
            layer, head, ks, vs = (*item[:3], item[2]) if len(item) == 3 else item
            if not isinstance(layer, int) or not isinstance(head, int) or head < 0:
                raise ValueError(f"head override (layer {layer!r}, head {head!r}): the layer is an int (negative "
                                 "counts from the end) and the KV head an int >= 0")
            where = f"layer {layer} head {head} override"
            if ks.pre_rope or vs.pre_rope:
                raise ValueError(f"{where}: prerope cannot be set per head")
            if vs.smooth or vs.permute:
                raise ValueError(f"{where}: {'smooth' if vs.smooth else 'perm'} applies to keys only")
            if _keeps_state(ks) or _keeps_state(vs):
                raise ValueError(f"{where} ({ks}|{vs}): {HEAD_STATE_RULE}")
            norm.append((layer, head, ks, vs))
        keys = [(l, h) for l, h, *_ in norm]
        if len(set(keys)) != len(keys):
            raise ValueError(f"head overrides repeat a (layer, head): {sorted(keys)}")
        if norm and self.engine is not None:
            raise ValueError("an engine profile takes no per-head overrides")
        object.__setattr__(self, "head_overrides", tuple(sorted(norm, key=lambda t: (t[0] < 0, t[0], t[1]))))

    # ---- queries ------------------------------------------------------------------------
    def for_layer(self, layer: int, n_layers: int) -> tuple[KVQuantSpec, KVQuantSpec]:
        """(K spec, V spec) used at `layer` of a model with `n_layers` layers."""
        for l, ks, vs in self.overrides:
            if l % n_layers == layer % n_layers and -n_layers <= l < n_layers:
                return ks, vs
        return self.k, self.v

    def head_specs(self, layer: int, n_layers: int, n_kv_heads: int) -> list[tuple[KVQuantSpec, KVQuantSpec]]:
        """(K spec, V spec) of each of the `n_kv_heads` KV heads of `layer`. ValueError when an override names a head
        past the model's, or a mixed layer keeps a spec with calibrated state (`HEAD_STATE_RULE`)."""
        base = self.for_layer(layer, n_layers)
        out = [base] * n_kv_heads
        mine = [(h, ks, vs) for l, h, ks, vs in self.head_overrides
                if -n_layers <= l < n_layers and l % n_layers == layer % n_layers]
        for h, ks, vs in mine:
            if h >= n_kv_heads:
                raise ValueError(f"layer {layer} head override names KV head {h}; the model has heads "
                                 f"0..{n_kv_heads - 1}")
            out[h] = (ks, vs)
        if len(set(out)) > 1 and any(_keeps_state(s) or s.pre_rope for s in base):
            raise ValueError(f"layer {layer} has per-head specs beside its spec pair {base[0]}|{base[1]}: "
                             f"{HEAD_STATE_RULE}")
        return out

    def head_groups(self, layer: int, n_layers: int, n_kv_heads: int) -> list[tuple[tuple, tuple[int, ...]]]:
        """[((K spec, V spec), KV heads ascending)] of `layer`, one entry per distinct spec pair in the order of
        its first head: one entry holding every head for a layer without per-head overrides."""
        groups: dict = {}
        for h, pair in enumerate(self.head_specs(layer, n_layers, n_kv_heads)):
            groups.setdefault(pair, []).append(h)
        return [(pair, tuple(heads)) for pair, heads in groups.items()]

    def pairs(self, n_layers: int | None = None) -> list:
        """Every (K spec, V spec) pair the scheme uses (of every layer and head override with `n_layers`)."""
        if n_layers is None:
            return [(self.k, self.v)]
        return [self.for_layer(i, n_layers) for i in range(n_layers)] + [(ks, vs) for *_, ks, vs in
                                                                         self.head_overrides]

    @property
    def is_uniform(self) -> bool:
        return self.k == self.v

    def chan_group(self, n_layers: int | None = None) -> int:
        """The pool's channel-group lcm Gc: lcm of the channel-axis group sizes of every K and V spec (of every layer
        when `n_layers` is given; 1 without channel axes). Every layer keeps its last up-to Gc - 1 tokens full
        precision beside the window (`kvlab.cache.window.FpPolicy`), so one block table serves all layers."""
        g = 1
        for pair in self.pairs(n_layers):
            for spec in pair:
                if spec.axis == "chan":
                    g = math.lcm(g, spec.group)
        return g

    def bits_per_element(self, head_dim: int = 128, context: int | None = None, n_layers: int | None = None,
                         chan_group: int | None = None, n_kv_heads: int | None = None) -> float:
        """Mean stored bits per K/V element. With `context`, the tokens the pool holds in full precision at worst
        (bf16: sinks, the window and an unfinished channel group of Gc - 1 tokens, Gc = `chan_group()` of the whole
        scheme, which every layer pays) are amortized over that many tokens; with `n_layers`, overrides count too
        (per-head ones need `n_kv_heads`: a layer's bits are the mean over its heads).
        `chan_group`: Gc of a larger scheme this one is a layer of (the search prices candidates with it)."""
        g = self.chan_group(n_layers) if chan_group is None else chan_group
        fp = 0 if context is None else min(context, self.sink + self.window + g - 1)

        def per_layer(k: KVQuantSpec, v: KVQuantSpec) -> float:
            q = (k.bits_per_element_at(head_dim) + v.bits_per_element_at(head_dim)) / 2
            if context is None:
                return q
            return (fp * 16 + (context - fp) * q) / context
        if n_layers is None:
            return per_layer(self.k, self.v)
        if self.head_overrides:
            if n_kv_heads is None:
                raise ValueError("a scheme with per-head overrides counts its bits per head: pass n_kv_heads")
            return sum(per_layer(*pair) for i in range(n_layers) for pair in self.head_specs(i, n_layers, n_kv_heads)
                       ) / (n_layers * n_kv_heads)
        return sum(per_layer(*self.for_layer(i, n_layers)) for i in range(n_layers)) / n_layers

    @property
    def bytes_per_element(self) -> float:
        return self.bits_per_element() / 8

    # ---- text and dict forms ------------------------------------------------------------
    def __str__(self) -> str:
        if self.engine is not None:
            return self.engine.name
        items = [str(self.k)] if self.is_uniform else [f"k={self.k}", f"v={self.v}"]
        if self.window:
            items.append(f"window={self.window}")
        if self.sink:
            items.append(f"sink={self.sink}")
        items += [f"L{l}={ks}" if ks == vs else f"L{l}={ks}|{vs}" for l, ks, vs in self.overrides]
        items += [f"L{l}.h{h}={ks}" if ks == vs else f"L{l}.h{h}={ks}|{vs}" for l, h, ks, vs in self.head_overrides]
        return ",".join(items)

    def to_dict(self) -> dict:
        return {"version": SPEC_VERSION, "text": str(self), "name": self.name, "k": self.k.to_dict(),
                "v": self.v.to_dict(), "window": self.window, "sink": self.sink,
                "overrides": [[l, ks.to_dict()] if ks == vs else [l, ks.to_dict(), vs.to_dict()]
                              for l, ks, vs in self.overrides],
                **({"head_overrides": [[l, h, ks.to_dict(), vs.to_dict()] for l, h, ks, vs in self.head_overrides]}
                   if self.head_overrides else {}),
                **({"engine": self.engine.name} if self.engine else {})}

    @classmethod
    def from_dict(cls, d: dict) -> "KVScheme":
        if d.get("version", SPEC_VERSION) != SPEC_VERSION:
            raise ValueError(f"scheme version {d.get('version')} is not supported; this kvlab reads {SPEC_VERSION}")
        if d.get("engine"):
            return parse_scheme(d["engine"])
        try:
            return cls(k=KVQuantSpec.from_dict(d["k"]), v=KVQuantSpec.from_dict(d["v"]), window=d.get("window", 0),
                       sink=d.get("sink", 0), name=d.get("name"),
                       overrides=tuple((int(o[0]), *(KVQuantSpec.from_dict(s) for s in o[1:]))
                                       for o in d.get("overrides", [])),
                       head_overrides=tuple((int(o[0]), int(o[1]), *(KVQuantSpec.from_dict(s) for s in o[2:]))
                                            for o in d.get("head_overrides", [])))
        except KeyError as e:
            raise ValueError(f"scheme dict lacks key {e}; needs at least 'k' and 'v'") from None


def parse_scheme(text: str) -> KVScheme:
    """Parse scheme text (see module doc) or a preset name into a `KVScheme`."""
    from .presets import SCHEME_PRESETS, SPEC_PRESETS
    text = clean_text(text, "scheme", "'q4_0' or 'k=int4:g32:chan:asym,v=int4:g32'")
    profile = parse_profile(text)
    if profile is not None:
        return KVScheme(k=parse_spec(profile.k_spec), v=parse_spec(profile.v_spec), name=profile.name, engine=profile,
                        overrides=tuple((i, parse_spec(s)) for i, s in profile.overrides))
    name = text if (text in SCHEME_PRESETS or text in SPEC_PRESETS) else None
    k = v = None
    window = sink = 0
    overrides: dict[int, tuple] = {}
    heads: dict[tuple, tuple] = {}
    for item in text.split(","):
        item = item.strip()
        key, eq, val = item.partition("=")
        if item in SCHEME_PRESETS:
            base = parse_scheme(SCHEME_PRESETS[item])
            k, v, window, sink = base.k, base.v, base.window, base.sink
            overrides.update({l: (ks, vs) for l, ks, vs in base.overrides})
        elif not eq or ":" in key:
            k = v = parse_spec(item)
        elif key == "k":
            k = parse_spec(val)
        elif key == "v":
            v = parse_spec(val)
        elif key in ("window", "sink"):
            if not re.fullmatch(r"\d+", val):
                raise ValueError(f"{key}={val!r} must be a non-negative integer number of tokens")
            window, sink = (int(val), sink) if key == "window" else (window, int(val))
        elif re.fullmatch(r"L-?\d+", key):
            ks, bar, vs = val.partition("|")
            overrides[int(key[1:])] = (parse_spec(ks), parse_spec(vs) if bar else parse_spec(ks))
        elif re.fullmatch(r"L-?\d+\.h\d+", key):
            ks, bar, vs = val.partition("|")
            layer, head = key[1:].split(".h")
            if (int(layer), int(head)) in heads:
                raise ValueError(f"scheme item {key} appears twice")
            heads[(int(layer), int(head))] = (parse_spec(ks), parse_spec(vs) if bar else parse_spec(ks))
        else:
            raise ValueError(f"unknown scheme item {item!r}; allowed: SPEC, k=SPEC, v=SPEC, window=N, sink=N, "
                             f"L<i>=SPEC, L<i>=KSPEC|VSPEC, L<i>.h<j>=SPEC (KV head j of layer i), or a preset "
                             f"({', '.join(sorted(SCHEME_PRESETS))})")
    if k is None or v is None:
        raise ValueError(f"scheme {text!r} gives {'no K' if k is None else 'no V'} spec; write k=...,v=... or one spec for both")
    return KVScheme(k=k, v=v, window=window, sink=sink, overrides=tuple((l, *kv) for l, kv in overrides.items()),
                    name=name, head_overrides=tuple((l, h, *kv) for (l, h), kv in heads.items()))
