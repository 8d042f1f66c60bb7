"""`KVScheme`: a K spec, a V spec, and the cache policy around them.

Text form (items joined by ','):

    SPEC                  the same spec for K and V (or a scheme preset such as kivi4)
    k=SPEC / v=SPEC       separate specs
    window=N              the N most recent tokens stay full precision
    sink=N                the first N tokens (attention sinks) stay full precision
    L<i>=SPEC             layer i (negative counts from the end) uses SPEC for K and V
    L<i>=KSPEC|VSPEC      layer i uses KSPEC for K and VSPEC for V

Example: `k=int4:g32:chan:asym,v=int4:g32:asym,window=128,L0=bf16,L-1=bf16`.

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

    # ---- queries ------------------------------------------------------------------------
    def for_layer(self, layer: int, n_layers: int) -> tuple[KVQuantSpec, KVQuantSpec]:
        """(K spec, V spec) used at `layer` of a model with `n_layers` layers."""
        for l, ks, vs in self.overrides:
            if l % n_layers == layer % n_layers and -n_layers <= l < n_layers:
                return ks, vs
        return self.k, self.v

    @property
    def is_uniform(self) -> bool:
        return self.k == self.v

    def chan_group(self, n_layers: int | None = None) -> int:
        """The pool's channel-group lcm Gc: lcm of the channel-axis group sizes of every K and V spec (of every layer
        when `n_layers` is given; 1 without channel axes). Every layer keeps its last up-to Gc - 1 tokens full
        precision beside the window (`kvlab.cache.window.FpPolicy`), so one block table serves all layers."""
        pairs = [(self.k, self.v)] if n_layers is None else [self.for_layer(i, n_layers) for i in range(n_layers)]
        g = 1
        for pair in pairs:
            for spec in pair:
                if spec.axis == "chan":
                    g = math.lcm(g, spec.group)
        return g

    def bits_per_element(self, head_dim: int = 128, context: int | None = None, n_layers: int | None = None,
                         chan_group: int | None = None) -> float:
        """Mean stored bits per K/V element. With `context`, the tokens the pool holds in full precision at worst
        (bf16: sinks, the window and an unfinished channel group of Gc - 1 tokens, Gc = `chan_group()` of the whole
        scheme, which every layer pays) are amortized over that many tokens; with `n_layers`, overrides count too.
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
        return ",".join(items)

    def to_dict(self) -> dict:
        return {"version": SPEC_VERSION, "text": str(self), "name": self.name, "k": self.k.to_dict(),
                "v": self.v.to_dict(), "window": self.window, "sink": self.sink,
                "overrides": [[l, ks.to_dict()] if ks == vs else [l, ks.to_dict(), vs.to_dict()]
                              for l, ks, vs in self.overrides],
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
                                       for o in d.get("overrides", [])))
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
        else:
            raise ValueError(f"unknown scheme item {item!r}; allowed: SPEC, k=SPEC, v=SPEC, window=N, sink=N, "
                             f"L<i>=SPEC, L<i>=KSPEC|VSPEC, or a preset ({', '.join(sorted(SCHEME_PRESETS))})")
    if k is None or v is None:
        raise ValueError(f"scheme {text!r} gives {'no K' if k is None else 'no V'} spec; write k=...,v=... or one spec for both")
    return KVScheme(k=k, v=v, window=window, sink=sink, overrides=tuple((l, *kv) for l, kv in overrides.items()),
                    name=name)
