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
# # 05 · Pick the winner under a budget, see it, ship it
#
# The decision a user makes: the most accurate scheme that fits a byte budget (and a speed budget), on the
# bits x KL x decode-time view of the committed sweep; then what each serving engine's own options cost on
# the same model, and an export of the winner to an engine with conformance vectors, substituting the nearest
# option the engine runs when it cannot run the winner.

# %% tags=["parameters"]
SWEEP = "../sweeps/results/h200/default-gpu/schemes.csv"      # decode-faithful KL, H200 decode time
OPTIONS = "../sweeps/results/engines/options.csv"             # every engine option under its engine profile
BIT_BUDGET = 5.0          # effective bits per element
TIME_BUDGET_MS = 1.0      # decode time at B=32 x 32K on the H200 (cuDNN bf16: ~0.95 ms)
ENGINE = "llama.cpp"      # llama.cpp, vllm, sglang, freetoken or json
OUT = "export_demo"       # written next to the notebook (ignored by git)

# %%
import json
import shutil
from pathlib import Path

import pandas as pd
import seaborn as sns

import kvlab
from kvlab.export import exporter
from kvlab.export.conformance import check_conformance
from kvlab.report import family, pareto_panels

sns.set_theme(style="whitegrid", context="notebook")
table = pd.read_csv(SWEEP)
table = table[table["loss_metric"] == "kl"]

# %% [markdown]
# ## The winner under the budgets

# %%
fits = table[(table["eff_bits"] <= BIT_BUDGET) & (table["decode_ms"] <= TIME_BUDGET_MS)].sort_values("loss")
winner = fits.iloc[0]
bits_only = table[table["eff_bits"] <= BIT_BUDGET].sort_values("loss").iloc[0]
print(f"within {BIT_BUDGET} bits and {TIME_BUDGET_MS} ms: {winner['name']} ({winner['eff_bits']:.2f} bits, "
      f"KL {winner['loss']:.4f}, PPL {winner['ppl_delta_pct']:+.2f}%, {winner['decode_ms']:.3f} ms)")
print(f"within {BIT_BUDGET} bits alone:          {bits_only['name']} ({bits_only['eff_bits']:.2f} bits, "
      f"KL {bits_only['loss']:.4f}, PPL {bits_only['ppl_delta_pct']:+.2f}%, {bits_only['decode_ms']:.3f} ms)")
fits.head(8)[["name", "eff_bits", "loss", "ppl_delta_pct", "ppl_delta_pct_sd", "decode_ms"]]

# %%
fig = pareto_panels(table, title=f"default GPU sweep: budget {BIT_BUDGET} bits, {TIME_BUDGET_MS} ms",
                    time_label="decode time, ms (H200, B=32 x 32K, graph replay)")
a0, a1 = fig.axes[0], fig.axes[1]
for ax, x in ((a0, "eff_bits"), (a1, "decode_ms")):
    ax.scatter([winner[x]], [winner["loss"]], s=260, facecolors="none", edgecolors="red", lw=2, zorder=5)
a0.axvline(BIT_BUDGET, color="red", ls=":", lw=1)
a1.axvline(TIME_BUDGET_MS, color="red", ls=":", lw=1)
fig

# %% [markdown]
# ## What each engine's own options cost on this model
# Every cache option of llama.cpp, vLLM 0.33, SGLang and FreeToken, scored decode-faithfully under its engine
# profile (the engine's channel order, rotation, scale defaults, query rounding), 4 segments of 2,048 pydoc
# tokens on SmolLM2 (`python -m kvlab.export options`).

# %%
opts = pd.read_csv(OPTIONS)
opts["family"] = opts["profile"].map(family)
ax = sns.scatterplot(data=opts, x="bits_per_element", y="kl", hue="engine", style="engine", s=70)
ax.set_yscale("log")
ax.set_xlabel("bits per element (SmolLM2, head_dim 64)")
ax.set_ylabel("KL to the full-precision model")
ax.set_title("engine KV-cache options under their engine profiles")
opts[["profile", "bits_per_element", "kl", "ppl_delta_pct", "ppl_delta_pct_sd", "runs_on"]].sort_values(
    "kl").round(4)

# %% [markdown]
# ## Export the winner
# `kvlab.export` writes the scheme, the engine's flags and conformance vectors (inputs, expected bytes, decoded
# values). When the engine cannot run the scheme, it substitutes the nearest option it can (closest bits, then
# the lowest KL on the real model under the engine's profile) and records what that costs.

# %%
shutil.rmtree(OUT, ignore_errors=True)
info = exporter.export(winner["scheme"], ENGINE, OUT, substitute=True, log=print)
print(info.get("command", ""))
sub = info.get("substitution")
if sub:
    print(f"{ENGINE} cannot run {winner['name']}: {'; '.join(sub['reasons'])}")
    print(f"exported instead: {sub['chosen_label']} = {sub['chosen']}")
print(json.dumps(info.get("quality"), indent=1))

# %% [markdown]
# ## Check an engine's encoder against the vectors
# For llama.cpp's block types the `gguf` package holds GGML's reference quantizer: run it on the vectors'
# inputs and compare its bytes with the expected ones, case by case (other engines plug in their own encoder).

# %%
import gguf
import numpy as np

GGML = {"q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "iq4_nl": "IQ4_NL"}
if ENGINE == "llama.cpp" and info["k"]["engine_dtype"] in GGML and info["v"]["engine_dtype"] in GGML:
    def ggml_encode(x, case):
        dtype = info["k" if case["role"] == "k" else "v"]["engine_dtype"]
        return gguf.quants.quantize(np.asarray(x, np.float32), gguf.GGMLQuantizationType[GGML[dtype]])
    rep = check_conformance(OUT, ggml_encode)
    print("gguf's quantizer writes the expected bytes:", rep["ok"])
    display_rows = pd.DataFrame(rep["cases"])
else:
    display_rows = pd.DataFrame([{"note": f"no reference encoder for {ENGINE} in this notebook"}])
display_rows
