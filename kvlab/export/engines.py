"""What each serving engine can store in its KV cache, as kvlab specs, and the flags that select it.

An engine runs a scheme when its K spec and V spec are each one of the engine's cache dtypes
(and, for engines with one flag for both, the same one), and the scheme asks for nothing the
engine lacks (a full-precision window, sink tokens, per-layer overrides, per-channel groups,
rotations). `plan()` answers that with the reasons; `flags()` writes the engine's flags.

Engine names and scale formats, checked against the engines' sources (see SOURCES):
* llama.cpp: `-ctk/--cache-type-k`, `-ctv/--cache-type-v` take f32, f16, bf16, q8_0, q4_0,
  q4_1, iq4_nl, q5_0, q5_1 (common/arg.cpp `kv_cache_types`); a quantized V cache needs flash
  attention (`-fa on`; builds before the Aug 2025 `-fa on|off|auto` change take a bare `-fa`).
* vLLM: `--kv-cache-dtype` in vllm/config/cache.py `CacheDType` (auto, float16, bfloat16, fp8,
  fp8_e4m3, fp8_e5m2, int8_per_token_head and fp8_per_token_head are mapped here; int4_per_token_head,
  nvfp4 and the turboquant variants compute values no kvlab spec reproduces (engine codecs in
  kvlab.spec.engines / kvlab.quant.engine_codecs: their cost is in `python -m kvlab.export options`, but
  a kvlab scheme cannot be exported as them). Per-layer opt-out: `--kv-cache-dtype-skip-layers`.
* SGLang: `--kv-cache-dtype` choices in python/sglang/srt/server_args.py: auto, fp8_e5m2,
  fp8_e4m3, bf16, bfloat16, fp4_e2m1 (newer: mxfp8, nvfp4, fp4_mx_block16); note SGLang does
  not accept plain `fp8`.
* FreeToken: `--kv-cache-dtype` auto, q8_0, fp8_e4m3, q4_0, q6_0 (its kv_quant `resolve_kv_quant`);
  only `--attention-backend triton` reads the quantized slabs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..spec import KVQuantSpec, KVScheme, parse_spec

SOURCES = {
    "llama.cpp": [
        "ggml-org/llama.cpp common/arg.cpp: kv_cache_types = {F32, F16, BF16, Q8_0, Q4_0, Q4_1, IQ4_NL, Q5_0, "
        "Q5_1}; -ctk/--cache-type-k, -ctv/--cache-type-v; -fa/--flash-attn [on|off|auto]",
        "llama.cpp llama_init_from_model refuses a quantized V cache without flash attention ('V cache "
        "quantization requires flash_attn'; newer: 'quantized V cache was requested, but this requires Flash "
        "Attention')",
        "gguf-py gguf/quants.py (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL block layouts; kvlab's GGML presets are "
        "byte-exact with gguf.quants.quantize)",
    ],
    "vllm": [
        "vllm-project/vllm vllm/config/cache.py: CacheDType = Literal['auto', 'float16', 'bfloat16', 'fp8', "
        "'fp8_e4m3', 'fp8_e5m2', 'fp8_inc', 'fp8_ds_mla', ...]; kv_cache_dtype_skip_layers",
        "vllm docs/features/quantization/quantized_kvcache.md: per-tensor k/v scales (q/k/v_scale = [1]), "
        "scales default to 1.0, calculate_kv_scales, llm-compressor kv_cache_scheme",
        "vllm vllm/model_executor/layers/quantization/schema.py: QuantParamSchema {model_type, kv_cache: "
        "{dtype: 'float8_e4m3fn', scaling_factor: {tp_rank: {layer: scale}}}} read by --quantization-param-path "
        "(older releases; models' load_kv_cache_scales set k_scale = v_scale = the layer's factor)",
        "vllm vllm/model_executor/model_loader/weight_utils.py maybe_remap_kv_scale_name: checkpoint tensors "
        "'...self_attn.k_scale' / '.v_scale' -> '...self_attn.attn.k_scale' / '.v_scale'",
        "vllm PR #11688 (scales JSON applied on NVIDIA GPUs; maintainers plan to move away from "
        "quantization_param_path)",
        "vllm-project/compressed-tensors PR #135: kv-cache-only recipe kv_cache_scheme {num_bits: 8, type: float, "
        "strategy: tensor, dynamic: false, symmetric: true}",
    ],
    "sglang": [
        "sgl-project/sglang python/sglang/srt/server_args.py: kv_cache_dtype choices ['auto', 'fp8_e5m2', "
        "'fp8_e4m3', 'bf16', 'bfloat16', 'fp4_e2m1'] (newer: mxfp8, nvfp4, fp4_mx_block16); "
        "--quantization-param-path 'JSON file containing the KV cache scaling factors'",
        "sglang models (llama, qwen2, glm4) load_kv_cache_scales: kv_cache_scales_loader -> "
        "attn.k_scale = attn.v_scale = scaling_factor",
    ],
    "freetoken": [
        "FreeToken kv_quant: KVQuantSpec names auto, q8_0, fp8_e4m3, q4_0, q6_0; resolve_kv_quant "
        "('--kv-cache-dtype' value -> spec; BLOCK = 32, one fp16 scale per block)",
        "FreeToken docs (Quantized KV cache): 'only --attention-backend triton reads the code slabs'",
        "kvlab/spec/presets.py freetoken:* and tests/quant/test_oracle.py::test_freetoken_byte_layout",
    ],
    "json": ["kvlab scheme.json + conformance vectors (engine-neutral)"],
}


@dataclass(frozen=True)
class EngineDType:
    """One cache dtype of an engine: its flag value and the kvlab spec it stores."""

    name: str                  # the engine's flag value
    spec: str                  # kvlab spec text
    exact: bool = True         # kvlab.encode gives the engine's bytes (False: same format, other quantizer)
    candidate: bool = True     # offered as a substitute
    note: str = ""

    @property
    def kv_spec(self) -> KVQuantSpec:
        return _spec(self.spec)


@lru_cache(maxsize=None)
def _spec(text: str) -> KVQuantSpec:
    return parse_spec(text)


@dataclass(frozen=True)
class Engine:
    name: str
    dtypes: tuple[EngineDType, ...]
    separate_kv: bool = False   # K and V may take different dtypes (llama.cpp -ctk / -ctv)
    skip_layers: bool = False   # per-layer overrides back to the model dtype (vLLM)
    any_scheme: bool = False    # the engine-neutral json target

    def dtype_for(self, spec: KVQuantSpec) -> EngineDType | None:
        return next((d for d in self.dtypes if d.kv_spec == spec), None)

    @property
    def names(self) -> list[str]:
        return list(dict.fromkeys(d.name for d in self.dtypes))


# the fp8 cache options vLLM and SGLang share: a per-tensor scale per layer, or none
_FP8_PER_TENSOR = (
    EngineDType("fp8_e4m3", "fp8_e4m3:rule=absmax",
                note="per-tensor scale per layer: stored = fp8(x / k_scale), k_scale = amax / 448"),
    EngineDType("fp8_e4m3", "fp8_e4m3", candidate=False, note="k_scale = v_scale = 1.0 (uncalibrated)"),
    EngineDType("fp8_e5m2", "fp8_e5m2", note="no scaling"),
)

_GGML_CPU_NOTE = "llama.cpp stores the cache through GGML's reference quantizer (ggml-quants.c)"
ENGINES: dict[str, Engine] = {
    "json": Engine("json", (), any_scheme=True),
    "llama.cpp": Engine("llama.cpp", (
        EngineDType("f16", "fp16"),
        EngineDType("bf16", "bf16"),
        EngineDType("q8_0", "q8_0", note=_GGML_CPU_NOTE),
        EngineDType("q4_0", "q4_0", note=_GGML_CPU_NOTE),
        EngineDType("q4_1", "q4_1", note=_GGML_CPU_NOTE),
        EngineDType("q5_0", "q5_0", note=_GGML_CPU_NOTE),
        EngineDType("q5_1", "q5_1", note=_GGML_CPU_NOTE),
        # Same block (fp16 d + 16 nibbles, GGML nibble order) and codebook; GGML's iq4_nl quantizer
        # also searches nearby scales, so its bytes can differ from kvlab's (its error is <= ours).
        EngineDType("iq4_nl", "iq4nl:g32:rule=signed:pack=ggml", exact=False,
                    note="format-compatible: llama.cpp decodes these bytes identically, but its quantizer "
                         "searches scales, so its own bytes may differ"),
    ), separate_kv=True),
    "vllm": Engine("vllm", (
        EngineDType("auto", "bf16", note="model dtype bfloat16 (--dtype bfloat16)"),
        EngineDType("auto", "fp16", note="model dtype float16 (--dtype float16)"),
        *_FP8_PER_TENSOR,
        EngineDType("int8_per_token_head", "int8:head:sym:s=f32:recip:rnd=away",
                    note="one fp32 scale per (token, kv head), |x|max / 127, x * (1 / scale) rounded half away "
                         "from zero (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py); vLLM keeps the "
                         "scales in their own [blocks, block_size, heads] tensor (the vectors' .scales)"),
        EngineDType("fp8_per_token_head", "fp8_e4m3:head:s=f32", exact=False,
                    note="one fp32 scale per (token, kv head), |x|max / 448; vLLM multiplies by the reciprocal "
                         "where kvlab divides, so a code can differ by one step at a rounding tie"),
    ), skip_layers=True),
    "sglang": Engine("sglang", (
        EngineDType("bf16", "bf16"),
        EngineDType("auto", "fp16", note="model dtype float16 (--dtype float16)"),
        *_FP8_PER_TENSOR,
    )),
    "freetoken": Engine("freetoken", (
        EngineDType("auto", "bf16", note="model dtype bfloat16"),
        EngineDType("auto", "fp16", note="model dtype float16"),
        EngineDType("q8_0", "freetoken:q8_0"),
        EngineDType("q6_0", "freetoken:q6_0"),
        EngineDType("q4_0", "freetoken:q4_0"),
        EngineDType("fp8_e4m3", "freetoken:fp8_e4m3"),
    )),
}
ENGINE_NAMES = tuple(ENGINES)


@dataclass
class Plan:
    """Whether `engine` runs `scheme`, with the dtypes it would use or the reasons it cannot."""

    engine: Engine
    scheme: KVScheme
    k: EngineDType | None = None
    v: EngineDType | None = None
    reasons: list[str] = field(default_factory=list)
    skip_layers: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.reasons

    def why(self) -> str:
        return "; ".join(self.reasons)


@lru_cache(maxsize=None)
def _preset_names() -> dict:
    from ..spec import SPEC_PRESETS
    return {parse_spec(t): n for n, t in reversed(list(SPEC_PRESETS.items()))}


def spec_label(spec: KVQuantSpec) -> str:
    """`q4_0 (int4:g32:...)` for a spec equal to a preset, else the spec text."""
    name = _preset_names().get(spec)
    return f"{name} ({spec})" if name and name != str(spec) else str(spec)


def _gap(spec: KVQuantSpec, engine: Engine) -> str:
    parts = []
    if spec.axis == "chan":
        parts.append("per-channel groups (axis chan)")
    if spec.rotation == "had":
        parts.append("kvlab's Hadamard rotation" + (" (llama.cpp rotates quantized caches its own way by default, "
                                                    "in GGUF channel order: profile llama.cpp:TYPE)"
                                                    if engine.name == "llama.cpp" else ""))
    if spec.pre_rope:
        parts.append("pre-RoPE keys")
    if spec.smooth:
        parts.append("calibrated key smoothing (keys divided and queries multiplied per RoPE pair at run time, or "
                     "folded offline into W_k / W_q rows, which tied factors allow)" if spec.smooth_pairs else
                     "calibrated key smoothing (keys divided and queries multiplied per channel at run time)")
    if spec.tensor_scale:
        parts.append("two-level (tensor + group) scales")
    if spec.permute:
        parts.append("a calibrated key channel permutation (keys and queries gathered in the layer's order at run "
                     "time; post-RoPE channels, so it does not fold into W_k / W_q)")
    if spec.outliers:
        parts.append(f"outlier slots ({spec.outliers} fp16 values + uint8 channel indices a token vector, written over "
                     "the dequantized row: no engine keeps a sparse part in its paged cache)")
    return ", ".join(parts) if parts else f"{spec_label(spec)} is not one of its cache dtypes"


def get_engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; allowed: {', '.join(ENGINE_NAMES)}")
    return ENGINES[name]


def plan(engine: str | Engine, sch: KVScheme, n_layers: int | None = None) -> Plan:
    """Can `engine` run `sch`? Fills the dtypes for K and V, or the reasons it cannot."""
    eng = get_engine(engine) if isinstance(engine, str) else engine
    p = Plan(eng, sch)
    if eng.any_scheme:
        return p
    if sch.window:
        p.reasons.append(f"{sch.window}-token full-precision window")
    if sch.sink:
        p.reasons.append(f"{sch.sink} full-precision sink tokens")
    p.k, p.v = eng.dtype_for(sch.k), eng.dtype_for(sch.v)
    if p.k is None:
        p.reasons.append(("K and V: " if sch.is_uniform else "K: ") + _gap(sch.k, eng))
    if p.v is None and not (sch.is_uniform and p.k is None):
        p.reasons.append("V: " + _gap(sch.v, eng))
    if p.k and p.v and not eng.separate_kv and p.k.name != p.v.name:
        p.reasons.append(f"K ({p.k.name}) and V ({p.v.name}) must share one --kv-cache-dtype")
    if sch.overrides:
        _plan_overrides(p, n_layers)
    if sch.head_overrides:  # serving engines keep one cache dtype per layer at most
        n = len(sch.head_overrides)
        p.reasons.append(f"per-head specs ({n} KV head{'s' * (n > 1)} off {'their' if n > 1 else 'its'} layer's pair, "
                         f"e.g. L{sch.head_overrides[0][0]}.h{sch.head_overrides[0][1]}): {eng.name} keeps one cache "
                         "dtype for every KV head of a layer")
    return p


def _plan_overrides(p: Plan, n_layers: int | None) -> None:
    eng, sch = p.engine, p.scheme
    dense = {str(s) for _, ks, vs in sch.overrides for s in (ks, vs)}
    if not eng.skip_layers or not (dense <= {"bf16", "fp16"} and len(dense) == 1):
        p.reasons.append("per-layer overrides (" + ", ".join(
            f"L{l}={ks}" if ks == vs else f"L{l}={ks}|{vs}" for l, ks, vs in sch.overrides) + ")"
                         + (": vLLM can only skip layers back to the model dtype (all bf16 or all fp16)"
                            if eng.skip_layers else ""))
        return
    if any(l < 0 for l, *_ in sch.overrides) and n_layers is None:
        raise ValueError("per-layer overrides counted from the end (L-1=...) need the model's layer count: "
                         "pass --model")
    p.skip_layers = tuple(sorted(l % n_layers if n_layers else l for l, *_ in sch.overrides))


def candidates(engine: str | Engine) -> list[tuple[str, KVScheme, EngineDType, EngineDType]]:
    """Every (label, scheme, K dtype, V dtype) the engine can run, for substitution."""
    eng = get_engine(engine) if isinstance(engine, str) else engine
    ds = [d for d in eng.dtypes if d.candidate]
    out = []
    for kd in ds:
        for vd in (ds if eng.separate_kv else [kd]):
            label = kd.name if kd is vd else f"k={kd.name},v={vd.name}"
            if kd.name == "auto":
                label = f"auto ({kd.spec})"
            out.append((label, KVScheme(k=kd.kv_spec, v=vd.kv_spec), kd, vd))
    return out


# ---- flags ----------------------------------------------------------------------------------------
def _is_dense(d: EngineDType) -> bool:
    return d.kv_spec.is_float_storage


def flags(p: Plan, scales_file: str | None = None) -> dict:
    """The engine's flags for a plan that runs: {"flags": [...], "legacy_flags": [...], "notes": [...]}.

    scales_file: the kv-cache scales JSON (fp8 e4m3 with calibrated scales), relative to the export dir.
    """
    if not p.ok:
        raise ValueError(f"{p.engine.name} cannot run {p.scheme}: {p.why()}")
    e, k, v = p.engine.name, p.k, p.v
    out: dict = {"flags": [], "legacy_flags": [], "notes": []}
    if e == "json":
        return out
    if e == "llama.cpp":
        out["flags"] = ["--cache-type-k", k.name, "--cache-type-v", v.name]
        if not (_is_dense(k) and _is_dense(v)):
            out["flags"] += ["-fa", "on"]
            out["notes"].append("-fa on: llama.cpp refuses a quantized V cache without flash attention; builds "
                                "before the -fa on|off|auto change (Aug 2025) take a bare -fa")
        if k.name != v.name or k.name not in ("f16", "q4_0", "q8_0"):
            out["notes"].append(f"K {k.name} / V {v.name}: default CUDA builds have flash-attention kernels only for "
                                "f16, q4_0 and q8_0 with K and V alike; build with -DGGML_CUDA_FA_ALL_QUANTS=ON "
                                "for this pair (CPU and Metal are fine)")
        return out
    out["flags"] = ["--kv-cache-dtype", k.name]
    if k.name == "auto":  # the cache follows the model dtype
        out["flags"] += ["--dtype", "bfloat16" if k.spec == "bf16" else "float16"]
    if e == "vllm" and p.skip_layers:
        out["flags"] += ["--dtype", "bfloat16" if str(p.scheme.overrides[0][1]) == "bf16" else "float16",
                         "--kv-cache-dtype-skip-layers", *map(str, p.skip_layers)]
    if e == "freetoken" and k.name != "auto":
        out["flags"] += ["--attention-backend", "triton"]
        out["notes"].append("FreeToken reads quantized KV only with --attention-backend triton, and only for "
                            "models whose KV lives in the plain paged pool (MHAKVCache)")
    if k.name == "fp8_e4m3" and e in ("vllm", "sglang"):
        out["notes"].append("kvlab fp8_e4m3 is OCP e4m3fn (max 448); ROCm MI300 engines store e4m3fnuz (max 240), "
                            "whose bytes differ")
        if scales_file:
            if e == "sglang":
                out["flags"] += ["--quantization-param-path", scales_file]
            else:
                out["legacy_flags"] = ["--quantization-param-path", scales_file]
    return out
