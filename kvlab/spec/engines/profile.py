"""`EngineProfile`: one engine option as data (see kvlab.spec.engines). Pure Python."""
from __future__ import annotations

from dataclasses import dataclass

ROTATIONS = {
    "ggml": "llama.cpp K: normalized Walsh-Hadamard over blocks of the largest power of two dividing head_dim, "
            "only when head_dim % 64 == 0",
    "ggml64": "llama.cpp V: normalized Walsh-Hadamard over blocks of 64, only when head_dim % 64 == 0",
    "rht": "vLLM int4_per_token_head: seeded random signs, then Walsh-Hadamard over blocks of the largest power "
           "of two dividing head_dim (normalized here; vLLM folds the norm into its softmax scale), rounded to "
           "the model dtype (bf16)",
}


@dataclass(frozen=True)
class EngineProfile:
    """How an engine stores and reads a KV cache, beyond the block bytes.

    engine, option: the engine and its flag value(s) (`q8_0/q4_0` for llama.cpp's -ctk/-ctv);
    k_spec, v_spec: kvlab specs with the engine's stored bytes per element (and its arithmetic unless a codec
    is named); k_codec, v_codec: kvlab.quant.engine_codecs names computing the engine's values instead;
    q_round: what the query is rounded to before Q.K (a spec text or codec name; None: kept as the model has
    it); k_rot, v_rot: ROTATIONS keys (K's rotation also applies to the query; V's is undone on the output);
    boundary: the first and last `boundary` layers (at most half of them) stay at the model dtype;
    gguf_k_order: K lives in the GGUF file's permuted q/k channel order (llama-arch models);
    exact: kvlab.encode(k_spec/v_spec) writes the engine's bytes; suffix: text after the option in the name;
    source: the engine revision the facts were read from; notes: what the profile does not model."""
    engine: str
    option: str
    k_spec: str
    v_spec: str
    q_round: str | None = None
    k_rot: str | None = None
    v_rot: str | None = None
    k_codec: str | None = None
    v_codec: str | None = None
    boundary: int = 0
    gguf_k_order: bool = False
    exact: bool = True
    suffix: str = ""
    source: str = ""
    notes: str = ""

    @property
    def name(self) -> str:
        return f"{self.engine}:{self.option}{self.suffix}"

    @property
    def rotate(self) -> bool:
        """True when the profile rotates K or V (where the head size allows)."""
        return bool(self.k_rot or self.v_rot)

    def rotation_blocks(self, head_dim: int) -> tuple[int, int]:
        """(K block, V block) of the profile's rotations at `head_dim`; 0 where there is none."""
        return _blocks(self.k_rot, head_dim), _blocks(self.v_rot, head_dim)

    def boundary_layers(self, n_layers: int) -> frozenset[int]:
        """Layers kept at the model's dtype (vLLM's turboquant skips its first and last two)."""
        n = min(self.boundary, n_layers // 2)
        return frozenset(list(range(n)) + list(range(n_layers - n, n_layers)))

    @property
    def overrides(self) -> tuple:
        """KVScheme layer overrides for the boundary layers (bf16), so bytes per element count them."""
        n = self.boundary
        return tuple((i, "bf16") for i in (*range(n), *range(-n, 0)))


def _blocks(kind: str | None, head_dim: int) -> int:
    if kind is None:
        return 0
    pow2 = head_dim & -head_dim  # the largest power of two dividing head_dim
    if kind == "ggml":
        return pow2 if head_dim % 64 == 0 else 0
    if kind == "ggml64":
        return 64 if head_dim % 64 == 0 else 0
    if kind == "rht":
        return pow2
    raise ValueError(f"unknown rotation {kind!r}; allowed: {', '.join(ROTATIONS)}")
