# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · A tour of kvlab: schemes in one line, what they cost in bytes, what each option changes
#
# A KV-cache quantization scheme is one line of text. This notebook writes a few, reads their byte cost,
# changes one option at a time to see what it buys, checks that the engine formats are byte-exact with
# GGUF's own quantizer, and lists the engine profiles (what llama.cpp, vLLM, SGLang and FreeToken do around
# their bytes). Everything runs on a CPU in seconds.

# %% tags=["parameters"]
HEAD_DIM = 128      # head size for byte accounting and the synthetic round trips
N_TOKENS = 4096     # synthetic rows per round trip
SEED = 0

# %%
import gguf
import numpy as np
import pandas as pd
import seaborn as sns
import torch

import kvlab
from kvlab.eval import roundtrip_scheme
from kvlab.spec import SCHEME_PRESETS, SPEC_PRESETS
from kvlab.spec.engines import all_profiles

pd.set_option("display.width", 160, "display.max_colwidth", 60)
sns.set_theme(style="whitegrid", context="notebook")

# %% [markdown]
# ## A scheme in one line
# `k=` and `v=` take one spec each; a spec is a format, a group, an axis and options joined by `:`.
# KIVI's recipe: keys quantized per channel over groups of 32 tokens, values per token, asymmetric, the 128
# most recent tokens kept in full precision.

# %%
s = kvlab.scheme("k=int4:g32:chan:asym,v=int4:g32:asym,window=128")
print(s)
print("K:", s.k, "| V:", s.v, "| window:", s.window)
print(f"{s.bits_per_element(HEAD_DIM):.3f} stored bits per element (codes + scales + zeros)")
print(f"{s.bits_per_element(HEAD_DIM, context=2048):.3f} effective bits at 2,048 tokens (the window amortized)")

# %% [markdown]
# ## Every preset and its bytes

# %%
rows = []
for name in [*SPEC_PRESETS, *SCHEME_PRESETS]:
    sch = kvlab.scheme(name)
    rows.append({"preset": name, "K": str(sch.k), "V": str(sch.v), "window": sch.window,
                 f"bits/el (D={HEAD_DIM})": round(sch.bits_per_element(HEAD_DIM), 3),
                 "bits/el (D=64)": round(sch.bits_per_element(64), 3)})
presets = pd.DataFrame(rows)
presets

# %% [markdown]
# ## What each option changes
# One base spec, one token changed at a time: stored bits and round-trip error (rel-L1, lower is better) on
# heavy-tailed synthetic rows (Student-t, 4 degrees of freedom) and on rows with a few outlier channels, the
# structure of real keys (notebook 02 measures the real ones).

# %%
base = "int4:g32:sym"
variants = {"base": base, "asym (zero point)": "int4:g32:asym", "group 64": "int4:g64:sym",
            "group 128": "int4:g128:sym", "bf16 scales": "int4:g32:sym:s=bf16", "MSE clipping": "int4:g32:sym:rule=mse",
            "Hadamard rotation": "int4:g32:sym:rot=had", "GGML signed max (q4_0)": "q4_0",
            "nf4 codebook": "nf4:g32", "5 bits": "int5:g32:sym", "3 bits": "int3:g32:sym"}
rows = []
for label, text in variants.items():
    r = {"option": label, "spec": str(kvlab.scheme(text).k), "bits/el": kvlab.scheme(text).bits_per_element(HEAD_DIM)}
    for dist in ("student_t4", "outlier_channels"):
        r[f"rel-L1 {dist}"] = roundtrip_scheme(text, dist, N_TOKENS, HEAD_DIM, SEED)["k_rel_l1"]
    rows.append(r)
options = pd.DataFrame(rows)
options.round(4)

# %%
long = options.melt(id_vars=["option", "bits/el"], value_vars=["rel-L1 student_t4", "rel-L1 outlier_channels"],
                     var_name="data", value_name="rel-L1")
ax = sns.barplot(data=long, y="option", x="rel-L1", hue="data", orient="h")
ax.set_title(f"round-trip error of one option changed (head_dim {HEAD_DIM})")
ax.figure.set_size_inches(8, 4.5)

# %% [markdown]
# ## Engine formats are byte-exact with GGUF
# `kvlab.encode` writes the bytes an engine stores. For the GGML block types, compare with the `gguf`
# package's own reference quantizer on the same rows.

# %%
x = torch.randn(64, HEAD_DIM, generator=torch.Generator().manual_seed(SEED)) * 2
rows = []
for name, qt in (("q8_0", "Q8_0"), ("q4_0", "Q4_0"), ("q4_1", "Q4_1"), ("q5_0", "Q5_0"), ("q5_1", "Q5_1")):
    ours = kvlab.encode(x, kvlab.scheme(name).k)
    theirs = gguf.quants.quantize(x.numpy().astype(np.float32), gguf.GGMLQuantizationType[qt])
    rows.append({"preset": name, "bytes per row": ours.shape[-1], "identical to gguf.quants": np.array_equal(ours, theirs)})
pd.DataFrame(rows)

# %% [markdown]
# ## Engine profiles: the arithmetic around the bytes
# A block format alone does not predict what an engine does: llama.cpp stores keys in the GGUF file's channel
# order and rotates Q/K/V by a Hadamard matrix when the cache is quantized; vLLM's FlashAttention-3 path rounds
# the query to fp8; turboquant keeps its first and last two layers in bf16. Each profile is a scheme, read from
# the engine's source (`kvlab.spec.engines`); notebook 05 shows what each costs on the real model.

# %%
rows = []
for name in all_profiles():
    p = kvlab.scheme(name).engine
    rows.append({"profile": name, "K bytes as": p.k_spec, "rotation": p.k_rot or p.v_rot or "",
                 "engine codec": p.k_codec or p.v_codec or "", "query rounded to": p.q_round or "",
                 "bf16 layers": f"first/last {p.boundary}" if p.boundary else "",
                 "bits/el (D=64, 30 layers)": round(kvlab.scheme(name).bits_per_element(64, n_layers=30), 3),
                 "byte-exact": p.exact})
pd.DataFrame(rows)
