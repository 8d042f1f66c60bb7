# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · From attention error to perplexity
#
# Three questions on SmolLM2-135M: how much of a scheme's attention error comes from its keys and how much
# from its values; how the model's KL and perplexity grow as bits shrink (the committed sweep, decode-faithful:
# every token read back from the quantized cache as a decoding engine reads it); and which layers hurt most
# when quantized alone.

# %% tags=["parameters"]
N_TOKENS = 512       # tokens for the live attention and per-layer measurements
SCHEMES = ("q8_0", "q4_0", "q4_1", "int4:g32:asym:rot=had", "kivi4", "int3:g32:asym", "kivi2", "nf4")
LAYER_SPEC = "int3:g32:asym"   # the spec each layer gets alone in the sensitivity scan
SCAN_LAYERS = None             # layers scanned (None: every layer)
SWEEP = "../sweeps/results/h200/default-gpu/schemes.csv"   # committed decode-faithful results (4 x 2,048 tokens)

# %%
import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
import torch
import torch.nn.functional as F

import kvlab
from kvlab.eval.attention import attention_delta, capture_qkv
from kvlab.eval.faithful import DecodeFaithfulBackend
from kvlab.eval.perplexity import text_tokens
from kvlab.model import load_model
from kvlab.report import FAMILY_ORDER, family

sns.set_theme(style="whitegrid", context="notebook")
model, tok = load_model("smollm2")
n_layers = model.config.n_layers
ids = text_tokens(tok, "pydoc")[:N_TOKENS]
cap = capture_qkv(model, ids)

# %% [markdown]
# ## Attention error split into its K and V parts
# Relative L2 error of every layer's attention output when only K is quantized, only V, and both (decode-faithful
# causal attention on the captured q, k, v), averaged over layers.

# %%
recs = []
for name in SCHEMES:
    d = attention_delta(model, cap, name)
    recs.append({"scheme": name, "bits/el": kvlab.scheme(name).bits_per_element(model.config.head_dim),
                 "K only": d["k"], "V only": d["v"], "K and V": d["kv"]})
att = pd.DataFrame(recs).set_index("scheme")
att.round(4)

# %%
ax = att[["K only", "V only"]].plot.barh(stacked=False, figsize=(8, 4))
ax.set_xlabel("attention-output rel-L2 (mean over layers)")
ax.set_title("where the attention error comes from")

# %% [markdown]
# ## KL and perplexity vs effective bits (the committed sweep)
# Effective bits amortize scales, zeros and the full-precision window over 2,048 tokens. Each point is one
# scheme of the default sweep on the H200 (4 segments of 2,048 pydoc tokens, mean; error bars: sd).

# %%
sweep = pd.read_csv(SWEEP)
sweep = sweep[sweep["loss_metric"] == "kl"].copy()
sweep["family"] = sweep["scheme"].map(family)
sweep = sweep[sweep["family"] != "float"]  # bf16 / fp16 caches: KL ~1e-10, off any useful log axis
order = [f for f in FAMILY_ORDER if f in set(sweep["family"])]
colors = dict(zip(order, sns.color_palette("tab10", len(order))))
fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
for ax, y, sd, log in ((axes[0], "loss", "loss_sd", True), (axes[1], "ppl_delta_pct", "ppl_delta_pct_sd", True)):
    q = sweep[sweep[y] > 0]
    sns.scatterplot(data=q, x="eff_bits", y=y, hue="family", hue_order=order, palette=colors, ax=ax, s=30,
                    legend=ax is axes[1])
    ax.errorbar(q["eff_bits"], q[y], yerr=q[sd], fmt="none", ecolor="0.75", zorder=0)
    ax.set_yscale("log" if log else "linear")
    ax.set_xlabel("effective bits per element")
axes[0].set_ylabel("KL to the full-precision model")
axes[1].set_ylabel("PPL increase, %")
axes[1].legend(fontsize=8, bbox_to_anchor=(1.02, 1), loc="upper left")
fig.tight_layout()

# %%
best = {}
for budget in (2.5, 3.5, 4.5, 6.0, 8.5):
    q = sweep[sweep["eff_bits"] <= budget].sort_values("loss")
    if len(q):
        r = q.iloc[0]
        best[budget] = {"best scheme": r["name"], "eff bits": r["eff_bits"], "KL": r["loss"],
                        "PPL +%": r["ppl_delta_pct"], "PPL sd": r["ppl_delta_pct_sd"]}
pd.DataFrame(best).T.rename_axis("bit budget")

# %% [markdown]
# ## Per-layer sensitivity
# Quantize one layer at a time with `LAYER_SPEC` (every other layer stays bf16) and measure the KL to the
# full-precision model over the captured text: the layers with the largest KL are the ones a mixed-precision
# scheme should protect.

# %%
with torch.no_grad():
    ref = F.log_softmax(cap["logits"][0, :-1].float(), -1)
    recs = []
    for layer in (range(n_layers) if SCAN_LAYERS is None else SCAN_LAYERS):
        sch = f"bf16,L{layer}={LAYER_SPEC}"
        lg = model(ids[None], backend=DecodeFaithfulBackend(sch, n_layers))[0, :-1].float()
        lp = F.log_softmax(lg, -1)
        recs.append({"layer": layer, "KL": float((ref.exp() * (ref - lp)).sum(-1).mean())})
sens = pd.DataFrame(recs)
ax = sns.barplot(data=sens, x="layer", y="KL", color="C3")
ax.set_yscale("log")
ax.set_title(f"KL when only one layer's K and V are {LAYER_SPEC}")
ax.figure.set_size_inches(11, 3.5)
sens.sort_values("KL", ascending=False).head(6)
