"""python -m kvlab.export SCHEME --engine ENGINE --out DIR [options]
   python -m kvlab.export verify --engine llama.cpp [--types q4_0,q8_0] [--tokens 2048] [--segments 4] [--out CSV]
   python -m kvlab.export options [--engines llama.cpp,vllm,sglang,freetoken] [--tokens 2048] [--segments 4]

Export a KV-cache scheme for a serving engine. DIR receives:
  scheme.json               the scheme as versioned JSON (kvlab.scheme("DIR/scheme.json") reads it back)
  engine.json               engine, dtypes, flags, command line, notes, sources, substitution record
  <engine>.sh               shell snippet setting the flags (llama.cpp, vllm, sglang, freetoken)
  kv_cache_scales.json      vllm/sglang fp8_e4m3 with --model: per-layer scales (--quantization-param-path)
  kv_scales.safetensors     the same scales as model.layers.{i}.self_attn.k_scale / v_scale tensors
  conformance.safetensors   K/V inputs, expected bytes (kvlab.encode), decoded values, metadata
  README.md                 how to launch and how to check an engine's bytes against the vectors
  tuned_configs.json        tuned kernel configs for the scheme, when kvlab's tuning cache has any

Engines and their cache dtypes:
  json       any scheme (engine-neutral: spec + conformance vectors)
  llama.cpp  --cache-type-k/-v f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 (byte-exact with kvlab's GGML presets)
             and iq4_nl (same format; GGML's quantizer may pick other codes), + -fa on when quantized
  vllm       --kv-cache-dtype auto fp8_e4m3 (calibrated per-layer scales) fp8_e5m2
  sglang     --kv-cache-dtype auto bf16 fp8_e4m3 (calibrated scales) fp8_e5m2
  freetoken  --kv-cache-dtype auto q4_0 q6_0 q8_0 fp8_e4m3 (kvlab presets freetoken:*)

When the engine cannot run the scheme (a full-precision window, per-channel groups, rotation,
a format it lacks), the nearest scheme it can run (closest bits/element, then lowest round-trip
rel-L1 on student_t4) and its measured cost are printed, and the exit code is 3; with
--substitute that scheme is exported instead and the substitution is recorded in engine.json.

`verify` runs the engine itself (llama.cpp through the optional llama-cpp-python) on the same token ids as
kvlab's evaluation under the matching engine profile (`llama.cpp:q4_0`, ...) and writes per cache type and
rotation the two PPL deltas and their per-position NLL difference (kvlab.export.verify).

`options` scores every engine's cache option on SmolLM2 under its engine profile (KL, PPL delta, top-1, bits
per element, the engine command; kvlab.export.options) into sweeps/results/engines/options.csv.

Exit codes: 0 exported; 2 bad input (unknown scheme or engine, unwritable --out, bad model path,
head_dim mismatch); 3 the engine cannot run the scheme (see --substitute).
"""
from __future__ import annotations

import argparse
import sys

from .engines import ENGINE_NAMES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvlab.export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scheme", help="scheme text (k=int4:g32:chan:asym,v=int4:g32,window=128), a preset "
                                  "(q4_0, kivi4, fp8_e4m3, freetoken:q4_0, ...; see python -m kvlab) or a scheme.json")
    p.add_argument("--engine", required=True, choices=ENGINE_NAMES, help="target engine")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--model", help="smollm2 (embedded GGUF), a .gguf path or an HF directory: calibrates fp8 "
                                   "scales, adds captured K/V rows to the vectors, scores substitutions on text")
    p.add_argument("--calib-tokens", type=int, default=512, help="calibration tokens for fp8 scales (default 512)")
    p.add_argument("--calib-text", default="license", choices=["license", "pydoc"],
                   help="offline calibration text: license (numpy's LICENSE.txt, default) or pydoc (pydoc topics)")
    p.add_argument("--vectors", type=int, default=64, metavar="N",
                   help="rows per conformance input tensor (rounded up to whole channel groups; default 64)")
    p.add_argument("--head-dim", type=int, help="head_dim of the vectors without --model (default 128)")
    p.add_argument("--substitute", action="store_true",
                   help="if the engine cannot run SCHEME, export the nearest scheme it can (recorded in engine.json)")
    p.add_argument("--eval-tokens", type=int, default=256,
                   help="with --model: tokens per segment when scoring a substitution on pydoc text (0: skip)")
    p.add_argument("--eval-segments", type=int, default=2, help="segments for that score (mean +- sd; default 2)")
    p.add_argument("--tp-size", type=int, default=1, help="tensor-parallel ranks in kv_cache_scales.json (default 1)")
    p.add_argument("--tuned-configs", help="tuned-config JSON to copy from (default: kvlab's per-GPU cache)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic vectors and the round trip")
    p.add_argument("-q", "--quiet", action="store_true", help="print only errors and the final summary")
    return p


def verify_main(argv) -> int:
    p = argparse.ArgumentParser(prog="python -m kvlab.export verify",
                                description="Compare engine profiles with the running engine on the same tokens")
    p.add_argument("--engine", required=True, choices=["llama.cpp"])
    p.add_argument("--types", default="", help="comma-separated cache types (default: all of the engine's)")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default="sweeps/results/engines/llama_cpp_verify.csv")
    a = p.parse_args(argv)
    from .verify import verify_llama_cpp
    try:
        verify_llama_cpp([t for t in a.types.split(",") if t], a.tokens, a.segments, a.out, a.threads)
    except ValueError as e:
        print(f"python -m kvlab.export verify: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}")
    return 0


def options_main(argv) -> int:
    from .options import DEFAULT_OUT, score_options
    from ..spec.engines import all_profiles
    p = argparse.ArgumentParser(prog="python -m kvlab.export options",
                                description="Score every engine's KV-cache option on SmolLM2 under its engine profile")
    p.add_argument("--engines", default="llama.cpp,vllm,sglang,freetoken", help="comma-separated engines")
    p.add_argument("--profiles", default="", help="comma-separated profile names (default: every profile of --engines)")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--out", default=DEFAULT_OUT)
    a = p.parse_args(argv)
    engines = [e for e in a.engines.split(",") if e]
    names = [n for n in a.profiles.split(",") if n] or [n for n in all_profiles() if n.split(":")[0] in engines]
    try:
        score_options(names, a.tokens, a.segments, a.out)
    except ValueError as e:
        print(f"python -m kvlab.export options: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["verify"]:
        return verify_main(argv[1:])
    if argv[:1] == ["options"]:
        return options_main(argv[1:])
    a = build_parser().parse_args(argv)
    from .exporter import Unsupported, export
    log = (lambda m: None) if a.quiet else (lambda m: print(m, file=sys.stderr))
    try:
        info = export(a.scheme, a.engine, a.out, model=a.model, calib_tokens=a.calib_tokens, calib_text=a.calib_text,
                      vectors=a.vectors, substitute=a.substitute, head_dim=a.head_dim, seed=a.seed,
                      eval_tokens=a.eval_tokens, eval_segments=a.eval_segments, tp_size=a.tp_size,
                      tuned_path=a.tuned_configs, log=log)
    except Unsupported as e:
        print(str(e), file=sys.stderr)
        print(f"Re-run with --substitute to export {e.substitution.label} ({e.substitution.chosen}).", file=sys.stderr)
        return 3
    except ValueError as e:
        print(f"python -m kvlab.export: error: {e}", file=sys.stderr)
        return 2
    if info.get("substitution"):
        print(_sub_line(info["substitution"]), file=sys.stderr)
    name = info.get("scheme_name")
    shown = f"{name} ({info['scheme']})" if name and name != info["scheme"] else info["scheme"]
    print(f"exported {shown} for {info['engine']} to {a.out}: " + ", ".join(f for f in info["files"].values() if f))
    if info.get("command"):
        print(info["command"])
    return 0


def _sub_line(sub: dict) -> str:
    r = sub["roundtrip"]
    return (f"substituted {sub['chosen_label']} ({sub['chosen']}) for {sub['requested_name'] or sub['requested']}: "
            f"rel-L1 {r['chosen']['rel_l1']:.3f} vs {r['requested']['rel_l1']:.3f} on {sub['protocol']['dist']}")


if __name__ == "__main__":
    sys.exit(main())
