"""README.md of an export directory: what is there, how to launch the engine, how to check bytes."""
from __future__ import annotations

import json


def _layout_lines(role: str, lay: dict) -> list[str]:
    return [f"- **{role}**: " + "; ".join(f"{k}: {v}" for k, v in lay.items())]


def readme(info: dict, meta: dict) -> str:
    e, files = info["engine"], info["files"]
    name = f" ({info['scheme_name']})" if info.get("scheme_name") not in (None, info["scheme"]) else ""
    out = [f"# kvlab export: `{info['scheme']}`{name} for {e}", "",
           f"kvlab {info['kvlab_version']}, head_dim {info['head_dim']}, "
           f"{info['bits_per_element']:.3f} stored bits per K/V element"
           + (f", model {info['model']}" if info.get("model") else "") + ".", ""]
    q = info.get("quality") or {}
    if q.get("cost"):
        c = q["cost"]
        out += ["## What it costs on a real model", "",
                f"Under {e}'s own arithmetic (engine profile `{q['profile']}`: channel order, rotations, scale "
                f"defaults, query rounding), on {c['model']}, decode-faithful: KL {c['kl']:.4f} +- {c['kl_sd']:.4f}, "
                f"PPL {c['ppl_delta_pct']:+.2f}% +- {c['ppl_delta_pct_sd']:.2f} (`{c['file']}`).", ""]
    elif q.get("profile"):
        out += ["## What it costs on a real model", "", f"Engine profile `{q['profile']}` is not in the committed "
                "table; `python -m kvlab.export options --profiles " + q["profile"] + "` scores it.", ""]
    sub = info.get("substitution")
    if sub:
        out += ["## Substitution", "", f"{e} cannot run `{sub['requested']}` ({'; '.join(sub['reasons'])}); "
                f"this directory exports the nearest scheme it can run, `{sub['chosen']}` ({sub['chosen_label']}). "
                "Measured cost (engine.json `substitution` has every number and the protocol):", "",
                "| | bits/elem | rel-L1 | SQNR dB |", "|---|---|---|---|"]
        for key in ("requested", "chosen"):
            r = sub["roundtrip"][key]
            out.append(f"| {key} `{sub[key]}` | {sub['bits_per_element'][key]:.2f} | {r['rel_l1']:.4f} | "
                       f"{r['sqnr_db']:.2f} |")
        p = sub["protocol"]
        out += ["", f"Round trip on {p['dist']} ({p['n']} x {p['d']}, seed {p['seed']}), K and V averaged."]
        if sub.get("model_eval"):
            me = sub["model_eval"]
            q = me["protocol"]
            out.append(f"On {q['model']} ({q['segments']} x {q['tokens']} tokens of {q['text']}, decode-faithful): "
                       f"KL {me['chosen']['kl']:.4f} vs {me['requested']['kl']:.4f}, PPL "
                       f"{me['chosen']['ppl_delta_pct']:+.2f}% vs {me['requested']['ppl_delta_pct']:+.2f}%.")
        out.append("")
    out += ["## Files", ""]
    desc = {"scheme": "the scheme as versioned JSON; `kvlab.scheme(\"scheme.json\")` reads it back",
            "conformance": "conformance vectors (inputs, expected bytes, decoded values), see below",
            "flags_sh": "shell snippet that sets the engine flags",
            "scales_json": "per-layer fp8 KV scales, vLLM/SGLang `--quantization-param-path` layout",
            "scales_safetensors": "the same scales as checkpoint tensors `model.layers.{i}.self_attn.k_scale/v_scale`",
            "tuned_configs": "tuned kvlab kernel configs for this scheme (GPU named inside)",
            "smoothing": "key smoothing factors `model.layers.{i}.self_attn.k_smooth` float32 [KV heads, head_dim]: "
                         "the cache stores k / k_smooth per channel and attention multiplies each query head by its "
                         "KV head's factors; `k_perm` int64 [KV heads, head_dim] for a `perm` K spec: the cache "
                         "stores k[..., k_perm] and attention reads queries in the same order (calibration text in "
                         "the metadata)",
            "engine": "everything below, machine-readable", "readme": "this file"}
    for key, fname in files.items():
        if fname:
            out.append(f"- `{fname}`: {desc.get(key, key)}")
    out.append("")
    if info.get("flags") or e != "json":
        out += ["## Engine flags", "", "```sh", info.get("command", " ".join(info.get("flags", []))), "```", ""]
        for n in info.get("notes", []):
            out.append(f"- {n}")
        if info.get("legacy_flags"):
            out.append(f"- older releases read the scales file with `{' '.join(info['legacy_flags'])}`")
        out.append("")
    if info.get("kv_scales"):
        s = info["kv_scales"]
        c = s["calibration"]
        out += ["## KV scales", "", f"{s['rule']}; calibrated on {c['tokens']} tokens of `{c['text']}` "
                f"({c['description']}, sha256 {c['sha256_12']}), no BOS.", "",
                "- `kv_cache_scales.json` has one factor per layer for K and V together (that format's loaders set "
                "k_scale = v_scale), so it holds max(k_scale, v_scale).",
                "- `kv_scales.safetensors` keeps K and V apart. vLLM/SGLang load such tensors from a checkpoint "
                "whose `config.json` declares a KV-cache quantization scheme, e.g. `quantization_config` "
                "with `\"kv_cache_scheme\": " + json.dumps(s["checkpoint_kv_cache_scheme"]) + "` "
                "(compressed-tensors); merge the tensors into the checkpoint's shards. Without any of these, "
                "the engines use scale 1.0 (vLLM can also estimate them with `--calculate-kv-scales`).", ""]
    if info.get("freetoken_spec"):
        out += ["## FreeToken KVQuantSpec", ""]
        out += [f"- {k}: {v}" for k, v in info["freetoken_spec"].items()]
        out += ["", "FreeToken builds differ between forks (some use absmax/8 for q4_0, two's-complement nibbles, "
                "or scale 1.0 for all-zero blocks); the conformance vectors say which bytes this spec means.", ""]
    out += ["## Conformance vectors", "",
            f"`{files['conformance']}` holds, for K and V, {sum(c['role'] == 'k' for c in meta['cases'])} input tensors of "
            f"{meta['rows']} rows x {meta['head_dim']} (synthetic heavy-tailed and edge rows; real captured K/V rows "
            "when a model was given). Inputs are exact in fp32, fp16 and bf16. Per case `{role}.{case}`:", "",
            "- `.input` float32 [T, D]; `.bytes` uint8: what the cache stores (`kvlab.encode`, blocks "
            "[scale][zero][code planes] in row order); `.decoded` float32: what those bytes mean (`kvlab.decode_bytes`)",
            "- `.codes` / `.scales` / `.zeros`: the payload and scale values split apart, for engines that keep "
            "scales in a separate tensor; `.scale`: a static per-tensor scale kept outside the rows", "",
            "Metadata key `kvlab` (JSON): specs, cases (source, seed, shapes) and the layouts below. Roles are "
            "`k`, `v` and `L<i>` for a per-layer override spec. There are no NaN/Inf inputs (GGML's reference "
            "leaves them undefined; kvlab's documented behaviour is tested in tests/quant).", "",
            "Check an encoder with kvlab:", "", "```python",
            "from kvlab.export import check_conformance",
            "def my_encode(x, info):          # x: float32 [T, D] numpy; info: role, case, spec, scale, ...",
            "    return my_engine_quantize(x)  # uint8 array, as many bytes as the stored .bytes",
            "report = check_conformance(\"DIR\", my_encode)   # optional decode_fn=(bytes, info) -> values",
            "assert report[\"ok\"], [c for c in report[\"cases\"] if not c[\"ok\"]]", "```", "",
            "or with numpy and safetensors only:", "", "```python",
            "from safetensors.numpy import load_file",
            "t = load_file(\"DIR/conformance.safetensors\")",
            "for key in [k[:-6] for k in t if k.endswith(\".input\")]:",
            "    assert (my_engine_quantize(t[key + \".input\"]).reshape(-1) == t[key + \".bytes\"].reshape(-1)).all(), key",
            "```", "", "### Byte layouts", ""]
    out += _layout_lines("K", meta["k_layout"]) + _layout_lines("V", meta["v_layout"])
    if info.get("sources"):
        out += ["", "## Sources for the engine names and formats", ""] + [f"- {s}" for s in info["sources"]]
    return "\n".join(out) + "\n"
