"""kvlab.export: ship a scheme to a serving engine.

    python -m kvlab.export q4_0 --engine llama.cpp --out exp/q4_0
    kvlab.export.export("fp8_e4m3", "vllm", "exp/fp8", model="smollm2")

Writes scheme.json (versioned spec), the engine's flags/config (engine.json, a shell snippet,
fp8 KV scales for vLLM/SGLang), conformance.safetensors (inputs, expected bytes, decoded values)
with a README, and tuned kernel configs when the tuning cache knows the scheme. When the engine
cannot run the scheme, `Unsupported` names the nearest scheme it can and the measured cost.
Nothing inside kvlab imports this package.
"""
from .conformance import check_conformance, kvlab_encode_fn, read_vectors, write_vectors
from .engines import ENGINE_NAMES, ENGINES, plan
from .exporter import Unsupported, export
from .spec_json import read_scheme_json, scheme_dict, write_scheme_json
from .substitute import Substitution, nearest

__all__ = ["export", "Unsupported", "check_conformance", "kvlab_encode_fn", "read_vectors", "write_vectors",
           "ENGINES", "ENGINE_NAMES", "plan", "nearest", "Substitution", "scheme_dict", "write_scheme_json",
           "read_scheme_json"]
