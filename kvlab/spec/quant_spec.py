"""`KVQuantSpec`: the layout of one quantized tensor (K or V), as a frozen dataclass.

Pure Python (no torch at import time). Every field is validated on construction, so a spec
that exists is a spec the oracle and the kernels can run; bad values raise `ValueError`
naming the field and listing what is allowed.

Conventions (they are the byte contract the oracle, kernels and exporters share):

* A *group* is `group` consecutive elements that share one scale (and one zero point when
  asymmetric). `axis="tok"`: groups run along head_dim inside one token (GGML style);
  `axis="chan"`: groups of `group` consecutive tokens inside one channel (KIVI keys);
  `axis="head"`: one group per (token, head) = all of head_dim; `axis="tensor"`: one static
  scale for the whole tensor (calibrated, as vLLM's fp8 k_scale).
* Dequantization is always one FMA per element: `x = scale * c + zero`, where `c` is the
  code's value (a signed integer for symmetric ints, an unsigned one for asymmetric ints, a
  float for fp/codebook formats) and `zero` is GGML's "min" offset (asymmetric only).
* Sub-byte codes are split into power-of-two bit planes (3 = 2+1, 5 = 4+1, 6 = 4+2,
  7 = 4+2+1) so no code straddles a byte; `pack` says how elements fill a plane's bytes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .text import format_spec
from .vocab import (AXES, CAL_INT_BITS, FORMAT_BITS, FORMATS, GROUP_MAX, GROUP_MIN, LLOYD_MAX, PACKINGS, ROTATIONS, ROUNDINGS,
                    OUTLIER_SLOT_BYTES, OUTLIERS_MAX, SCALE_BYTES, SCALE_DTYPES, SCALE_RULES, SPEC_VERSION, bit_planes)



def _allowed(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(map(str, allowed))}")


@dataclass(frozen=True)
class KVQuantSpec:
    """Layout of one quantized cache tensor. Build one with `kvlab.spec.parse_spec` or presets.

    fmt:         "int" | "fp8_e4m3" | "fp8_e5m2" | "fp4_e2m1" | "nf4" | "iq4nl" | "lm2" | "lm3" | "lm4" | "bf16" | "fp16"
    bits:        code width (2..8 for int; fixed for the others)
    group:       elements per scale group (8..256, must divide head_dim for tok); 0 for head/tensor
    axis:        "tok" | "chan" | "head" | "tensor"
    sym:         symmetric (no zero point) or asymmetric (stores GGML's min offset)
    scale_dtype: "f16" | "bf16" | "f32" | "e8m0" | "e4m3"
    rule:        "absmax" (|x|max / qmax), "signed" (GGML: the signed extreme / -2^(b-1)),
                 "mse" (grid search over clipping ratios), "unit" (scale 1, nothing stored; fp8),
                 "full" (|x|max / 2^(b-1): the whole two's-complement range, +|x|max clipped to
                 2^(b-1) - 1; FreeToken's q4_0)
    recip:       GGML arithmetic: codes use the fp32 reciprocal of the unrounded scale; otherwise
                 the scale is rounded to scale_dtype first and x is divided by it (FreeToken)
    rounding:    "even" (round half to even), "away" (half away from zero), "up" (half up)
    rotation:    "none" | "had" (normalised Hadamard over head_dim before quantizing)
    pack:        "seq" (plane element i -> byte i // k) or "ggml" (nibbles strided: byte j holds
                 elements j and j + G/2; 1-bit planes sequential as GGML's qh)
    tensor_scale: an extra fp32 per-tensor scale above the group scales (NVFP4)
    pre_rope:    quantize keys before RoPE (K only; the reader applies RoPE after dequantizing)
    twos:        symmetric sub-byte codes stored two's complement (FreeToken) instead of offset binary
                 (GGML, code + 2^(b-1)); 8-bit symmetric codes are always two's complement
    calibrated:  text `cal`: 2^bits levels calibrated per layer and tensor (weighted k-means,
                 `kvlab.quant.fit_codebook`) replace the format's fixed code values: a Lloyd-Max format's (lm2..lm4,
                 RMS units) or a 2..4-bit int's integers (in the int's code units: 0..2^b-1 asymmetric, -2^(b-1)..
                 2^(b-1)-1 symmetric; the scale and zero point keep the int's rule, each value takes the nearest
                 level, as KVQuant's non-uniform datatype over min-max normalised keys; `fit_codebook` keeps the
                 int's end levels); the table travels beside the
                 pages (`pages["codebook"]`) and every reader and writer takes it
    smooth:      K only: calibrated per-channel smoothing (`kvlab.quant.smoothing`): keys are stored divided by
                 factors s [Hk, D] (`pages["smooth"]`) and queries multiplied by them, so scores are unchanged and
                 the quantizer sees channels balanced against the queries (post-RoPE keys: not with pre_rope)
    smooth_pairs: with smooth (text `smooth=pair`): one factor per RoPE pair (c, c + D/2), fitted on the pair's
                 energy, which RoPE's rotation leaves unchanged, so the factors hold at positions the calibration
                 text never reached (per-channel factors of post-RoPE keys do not: sweeps/results/quality/
                 passkey_smoothing.txt); tied factors commute with RoPE and could fold into W_q / W_k offline
    permute:     K only (text `perm`): a calibrated permutation of the key channels per layer and KV head
                 (`kvlab.quant.permutation`): the cache stores k[..., perm] (`pages["perm"]`, int64 [Hk, D]) and
                 queries are read in the same order, so scores are unchanged and each group holds channels chosen to
                 share a scale; per-token groups only (axis tok), post-RoPE keys (not with pre_rope)
    outliers:    N outlier slots per token vector (0: none; text `out=N`, 1..8): the N values of largest magnitude
                 of each token's head_dim (after smoothing and rotation; NaN and inf first; lowest channel on ties)
                 are kept as fp16 with their uint8 channel index (`pages["out_val"]`, `pages["out_idx"]`
                 [pages, Hk, page_size, N]); the dense codes see them replaced by the mean of the rest of their
                 group (so they widen no scale); dequantization overwrites the N channels (`kvlab.quant.outliers`)
    """

    fmt: str = "int"
    bits: int = 4
    group: int = 32
    axis: str = "tok"
    sym: bool = True
    scale_dtype: str = "f16"
    rule: str = "absmax"
    recip: bool = False
    rounding: str = "even"
    rotation: str = "none"
    pack: str = "seq"
    tensor_scale: bool = False
    pre_rope: bool = False
    twos: bool = False
    calibrated: bool = False
    smooth: bool = False
    smooth_pairs: bool = False
    permute: bool = False
    outliers: int = 0

    def __post_init__(self) -> None:
        _allowed("format", self.fmt, FORMATS)
        _allowed("axis", self.axis, AXES)
        _allowed("scale dtype", self.scale_dtype, SCALE_DTYPES)
        _allowed("scale rule", self.rule, SCALE_RULES)
        _allowed("rounding", self.rounding, ROUNDINGS)
        _allowed("rotation", self.rotation, ROTATIONS)
        _allowed("pack", self.pack, PACKINGS)
        if self.fmt == "int":
            if not isinstance(self.bits, int) or not 2 <= self.bits <= 8:
                raise ValueError(f"bits={self.bits!r} out of range for int; allowed: 2..8")
        elif self.bits != FORMAT_BITS[self.fmt]:
            raise ValueError(f"bits={self.bits} not allowed for {self.fmt}; it has {FORMAT_BITS[self.fmt]} bits")
        if self.axis in ("tok", "chan"):
            if not isinstance(self.group, int) or not GROUP_MIN <= self.group <= GROUP_MAX:
                raise ValueError(f"group={self.group!r} out of range for axis {self.axis}; allowed: {GROUP_MIN}..{GROUP_MAX}")
            if self.group & (self.group - 1) and self.axis == "chan":
                raise ValueError(f"group={self.group} for axis chan must be a power of two (pages hold whole groups)")
            if self.group % 8:
                raise ValueError(f"group={self.group} must be a multiple of 8 so every bit plane fills whole bytes")
        elif self.group != 0:
            raise ValueError(f"group must be 0 for axis {self.axis} (one group per {self.axis})")
        if self.is_float_storage:
            if (self.axis, self.sym, self.rule, self.rotation) != ("tensor", True, "unit", "none") or self.tensor_scale:
                raise ValueError(f"{self.fmt} is stored unquantized; it takes no group, asym, scale rule, rotation or tensor scale")
        if self.rule == "unit" and self.fmt not in ("fp8_e4m3", "fp8_e5m2", "bf16", "fp16"):
            raise ValueError(f"scale rule 'unit' (no scale) is allowed only for fp8/bf16/fp16, not {self.fmt}")
        if self.rule == "signed" and not ((self.fmt == "int" and self.sym) or self.fmt in ("nf4", "iq4nl")):
            raise ValueError("scale rule 'signed' (GGML signed extreme) needs a symmetric int, nf4 or iq4nl format")
        if self.rule == "signed" and self.scale_dtype in ("e8m0", "e4m3"):
            raise ValueError(f"scale rule 'signed' gives negative scales, which {self.scale_dtype} cannot hold; "
                             "allowed scale dtypes: f16, bf16, f32")
        if not self.sym and self.axis == "tensor":
            raise ValueError("axis tensor holds one static (calibrated) symmetric scale; asym is allowed with axis "
                             "tok, chan or head")
        if not self.sym and self.fmt != "int":
            raise ValueError(f"asym (zero point) is allowed only for int formats, not {self.fmt}")
        if self.scale_dtype in ("e8m0", "e4m3") and self.fmt == "int" and not self.sym:
            raise ValueError(f"scale dtype {self.scale_dtype} cannot hold an asymmetric zero point; use f16, bf16 or f32")
        if self.scale_dtype == "e4m3" and self.fmt in ("fp8_e4m3", "fp8_e5m2"):
            raise ValueError("an fp8 format cannot take an e4m3 scale; use f16, bf16 or f32")
        if self.tensor_scale and self.scale_dtype != "e4m3":
            raise ValueError("tensor_scale (two-level scales, as NVFP4) needs scale dtype e4m3")
        if self.rounding != "even" and self.fmt != "int":
            raise ValueError(f"rounding {self.rounding!r} applies to int formats only; {self.fmt} rounds to nearest "
                             "(fp8: ties to even; fp4/codebooks: ties to the smaller magnitude, as GGML)")
        if self.recip and self.fmt != "int":
            raise ValueError("recip (GGML reciprocal arithmetic) applies to int formats only")
        if (self.rule == "rms") != (self.fmt in LLOYD_MAX):
            raise ValueError(f"scale rule 'rms' (scale = the group's RMS) goes with the Lloyd-Max codebooks "
                             f"{', '.join(LLOYD_MAX)}, whose levels are in RMS units, and they take it; got {self.fmt} "
                             f"with rule {self.rule}")
        if self.rule == "full" and not (self.fmt == "int" and self.sym):
            raise ValueError("scale rule 'full' (|x|max / 2^(b-1), FreeToken q4_0) needs a symmetric int format")
        if self.twos and not (self.fmt == "int" and self.sym and self.bits < 8):
            raise ValueError("twos (two's-complement sub-byte codes) needs a symmetric int format of 2..7 bits "
                             "(8-bit symmetric codes are always two's complement)")
        if self.calibrated and self.fmt not in LLOYD_MAX and not (self.fmt == "int" and self.bits <= CAL_INT_BITS):
            raise ValueError(f"cal (a calibrated codebook) applies to the Lloyd-Max formats {', '.join(LLOYD_MAX)} "
                             f"(levels in RMS units) and to ints of 2..{CAL_INT_BITS} bits (levels in code units); "
                             f"got {self.fmt}" + (f" with {self.bits} bits" if self.fmt == "int" else ""))
        if self.calibrated and self.fmt == "int":
            for bad, why in ((self.twos, "twos"), (self.recip, "recip"), (self.rounding != "even", f"rounding {self.rounding}"),
                             (self.rule == "mse", "rule mse")):
                if bad:
                    raise ValueError(f"a calibrated int (cal) takes the nearest of its levels, by the stored scale; "
                                     f"{why} describes uniform codes: drop it or cal")
        if self.smooth and self.is_float_storage:
            raise ValueError(f"smooth scales keys before quantizing them; {self.fmt} stores them as they are")
        if self.smooth_pairs and not self.smooth:
            raise ValueError("smooth_pairs ties smoothing factors within RoPE pairs; it needs smooth (text: smooth=pair)")
        if self.smooth and self.pre_rope:
            raise ValueError("smooth factors are per channel of post-RoPE keys (RoPE mixes channel c with c + D/2, "
                             "so they do not commute with it); drop prerope or smooth")
        if self.permute and (self.axis != "tok" or self.is_float_storage):
            raise ValueError(f"perm reorders the channels a token's groups are cut from; it needs a quantized spec "
                             f"with per-token groups (axis tok), got {self.fmt} axis {self.axis}")
        if self.permute and self.pre_rope:
            raise ValueError("perm reorders post-RoPE key channels (the reader applies RoPE to pre-RoPE keys in the "
                             "model's channel order); drop prerope or perm")
        if not isinstance(self.outliers, int) or isinstance(self.outliers, bool) or \
                not 0 <= self.outliers <= OUTLIERS_MAX:
            raise ValueError(f"outliers={self.outliers!r} out of range; allowed: 0..{OUTLIERS_MAX} slots per token vector")
        if self.outliers and self.is_float_storage:
            raise ValueError(f"outlier slots keep values a quantizer would round; {self.fmt} stores every value as it is")
        if self.outliers and self.pre_rope:
            raise ValueError("outlier slots are chosen among the stored (post-RoPE) channels; drop prerope or out=")
        if self.pack == "ggml" and self.axis != "tok":
            raise ValueError("pack ggml describes per-token GGML blocks; it needs axis tok")

    # ---- derived quantities -------------------------------------------------------------
    @property
    def is_float_storage(self) -> bool:
        """True for bf16/fp16: values are stored as they are."""
        return self.fmt in ("bf16", "fp16")

    @property
    def has_scale(self) -> bool:
        """True unless rule unit (fp8 / bf16 / fp16 values stored without a scale)."""
        return self.rule != "unit"

    @property
    def static_scale(self) -> bool:
        """One calibrated scale for the whole tensor (axis tensor with a scale), kept beside the pages."""
        return self.axis == "tensor" and self.has_scale

    @property
    def needs_tensor_scale(self) -> bool:
        """Readers need one per-tensor float beside the pages: the static scale or NVFP4's second level."""
        return self.static_scale or self.tensor_scale

    @property
    def needs_codebook(self) -> bool:
        """Readers and writers need the calibrated level table (`pages["codebook"]`, `quantize(codebook=)`)."""
        return self.calibrated

    @property
    def needs_smoothing(self) -> bool:
        """Readers and writers need the layer's smoothing factors (`pages["smooth"]`, `quantize(smooth=)`)."""
        return self.smooth

    @property
    def needs_permutation(self) -> bool:
        """Readers and writers need the layer's key channel permutation (`pages["perm"]`, `quantize(perm=)`)."""
        return self.permute

    @property
    def needs_outliers(self) -> bool:
        """Readers and writers keep per-token outlier slots beside the codes (`pages["out_idx"]`, `["out_val"]`)."""
        return self.outliers > 0

    @property
    def planes(self) -> tuple[int, ...]:
        return bit_planes(self.bits)

    def group_size(self, head_dim: int) -> int:
        """Elements per packing group for a tensor whose last dim is `head_dim`."""
        self.check_head_dim(head_dim)
        return self.group if self.axis in ("tok", "chan") else head_dim

    def check_head_dim(self, head_dim: int) -> None:
        """Raise ValueError if this spec cannot lay out rows of `head_dim` elements."""
        if self.axis == "tok" and head_dim % self.group:
            raise ValueError(f"group {self.group} does not divide head_dim {head_dim}; "
                             f"allowed groups: {[g for g in range(8, min(head_dim, 256) + 1, 8) if head_dim % g == 0]}")
        if head_dim % 8:
            raise ValueError(f"head_dim {head_dim} must be a multiple of 8 (codes pack into whole bytes)")
        if self.outliers and not self.outliers < head_dim <= 256:
            raise ValueError(f"{self.outliers} outlier slots need head_dim in {self.outliers + 1}..256 (uint8 channel "
                             f"indices), got {head_dim}")
        if self.rotation == "had" and head_dim % 8:
            raise ValueError(f"Hadamard rotation needs head_dim divisible by 8, got {head_dim}")

    def scale_bytes_per_group(self) -> float:
        n = SCALE_BYTES[self.scale_dtype] if self.has_scale else 0
        return n * (1 if self.sym else 2)

    def bits_per_element_at(self, head_dim: int = 128) -> float:
        """Exact stored bits per element (payload + scales + zero points + outlier slots) for rows of head_dim."""
        if self.is_float_storage:
            return float(self.bits)
        slots = 8 * OUTLIER_SLOT_BYTES * self.outliers / head_dim if self.outliers else 0.0
        if self.axis == "tensor":
            return self.bits + slots  # one scale per tensor: amortized to zero
        g = self.group_size(head_dim)
        return self.bits + 8 * self.scale_bytes_per_group() / g + slots

    @property
    def bits_per_element(self) -> float:
        """Stored bits per element at head_dim 128 (for axis head: per 128-element row)."""
        return self.bits_per_element_at(128)

    @property
    def bytes_per_element(self) -> float:
        """Stored bytes per element (payload + scales + zeros) at head_dim 128."""
        return self.bits_per_element / 8

    # ---- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Versioned plain dict (JSON-safe)."""
        return {"version": SPEC_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "KVQuantSpec":
        d = dict(d)
        version = d.pop("version", SPEC_VERSION)
        if version != SPEC_VERSION:
            raise ValueError(f"spec version {version} is not supported; this kvlab reads version {SPEC_VERSION}")
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown spec fields {sorted(unknown)}; allowed: {sorted(names)}")
        return cls(**d)

    def __str__(self) -> str:
        # cached on the instance (not a field: equality, hashing and asdict ignore it). Hot paths format specs into
        # their error messages before knowing whether they fail (12 formats an extend call: ~0.1 ms of host time)
        text = self.__dict__.get("_text")
        if text is None:
            text = format_spec(self)
            object.__setattr__(self, "_text", text)
        return text
