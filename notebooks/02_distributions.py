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
# # 02 · What real keys and values look like: SmolLM2's K and V
#
# Quantizers are designed for distributions. This notebook captures the keys (before and after RoPE) and
# values SmolLM2-135M-Instruct writes to its cache on the first pydoc tokens, and looks at what makes them
# hard: heavy-tailed channels (kurtosis), a few outlier key channels, the first token's role as an attention
# sink, and how the error of a scheme on real rows compares with the synthetic rows notebook 01 used.

# %% tags=["parameters"]
N_TOKENS = 1024     # pydoc tokens captured (2,048 is SmolLM2's evaluation length)
LAYERS = (0, 8, 15, 29)   # layers shown in the per-layer figures
SCHEMES = ("q8_0", "q4_0", "int4:g32:asym", "int4:g32:asym:rot=had", "int4:g32:chan:asym", "nf4", "mxfp4")

# %%
import numpy as np
import pandas as pd
import seaborn as sns
import torch
from scipy.stats import kurtosis

import kvlab
from kvlab.eval import rel_l1, sample
from kvlab.eval.perplexity import text_tokens
from kvlab.model import load_model

sns.set_theme(style="whitegrid", context="notebook")
torch.manual_seed(0)
model, tok = load_model("smollm2")
c = model.config
ids = text_tokens(tok, "pydoc")[:N_TOKENS]
with torch.no_grad():
    cap = model.capture(ids[None])
print(f"SmolLM2: {c.n_layers} layers, {c.n_heads} query heads, {c.n_kv_heads} KV heads, head_dim {c.head_dim}; "
      f"captured {ids.numel()} tokens")


# %%
def rows_of(t):
    """[1, Hk, T, D] -> [Hk * T, D] (one row per token and head)"""
    return t[0].reshape(-1, t.shape[-1])


# %% [markdown]
# ## Heavy tails per channel
# Excess kurtosis of each head-dim channel (0 for a Gaussian; larger means rarer, larger values that a
# group's scale must cover). RoPE rotates key channel pairs by position, so keys before and after RoPE have
# different tails: compare the rows of the table and the boxes per layer.

# %%
recs = []
for layer in range(c.n_layers):
    for name in ("k_pre", "k", "v"):
        kk = kurtosis(rows_of(cap[name][layer]).numpy(), axis=0)
        recs += [{"layer": layer, "tensor": {"k_pre": "K before RoPE", "k": "K after RoPE", "v": "V"}[name],
                  "channel": ch, "kurtosis": float(v)} for ch, v in enumerate(kk)]
kurt = pd.DataFrame(recs)
summary = kurt.groupby("tensor")["kurtosis"].describe(percentiles=[0.5, 0.9, 0.99])[["mean", "50%", "90%", "99%", "max"]]
summary.round(2)

# %%
g = sns.catplot(data=kurt[kurt["layer"].isin(LAYERS)], x="layer", y="kurtosis", hue="tensor", kind="box",
                height=4, aspect=2.2, fliersize=2)
g.set(yscale="symlog", title="excess kurtosis per channel (each box: the head-dim channels of one layer)")

# %% [markdown]
# ## Outlier channels
# Largest magnitude per channel divided by the median channel's, per layer, and how many channels exceed 4x
# the median. Channels much larger than the rest make a per-token group spend its range on them (the reason
# KIVI quantizes keys per channel); compare how strong this structure is in SmolLM2's K and V with the 7B
# models those methods were designed on.

# %%
recs = []
for layer in range(c.n_layers):
    for name in ("k", "v"):
        m = rows_of(cap[name][layer]).abs().amax(0)
        recs.append({"layer": layer, "tensor": name.upper(), "max/median channel": float(m.max() / m.median()),
                     "channels > 4x median": int((m > 4 * m.median()).sum())})
outl = pd.DataFrame(recs)
ax = sns.lineplot(data=outl, x="layer", y="max/median channel", hue="tensor", marker="o")
ax.set_yscale("log")
ax.set_title("largest channel magnitude / median channel, per layer")
outl.groupby("tensor")[["max/median channel", "channels > 4x median"]].describe().round(1)

# %% [markdown]
# ## Sink tokens
# Attention probability on the first token, averaged over query positions and heads, per layer. Layers that
# put a large share of their attention on token 0 read that one token's key and value on every step, which is
# why schemes can keep sink tokens in full precision.

# %%
recs = []
for layer in range(c.n_layers):
    q, k = cap["q"][layer][0], cap["k"][layer][0]   # [Hq, T, D], [Hk, T, D]
    k = k.repeat_interleave(q.shape[0] // k.shape[0], 0)
    s = (q @ k.transpose(-1, -2)) / c.head_dim ** 0.5
    T = s.shape[-1]
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf")).softmax(-1)
    recs.append({"layer": layer, "attention on token 0": float(s[:, 16:, 0].mean()),
                 "key norm of token 0 / median": float(cap["k"][layer][0, :, 0].norm(dim=-1).mean()
                                                     / cap["k"][layer][0].norm(dim=-1).median())})
sinks = pd.DataFrame(recs)
ax = sns.barplot(data=sinks, x="layer", y="attention on token 0", color="C0")
ax.set_title("mean attention probability on the first token (queries 16..T)")
ax.figure.set_size_inches(10, 3.5)
sinks.describe().round(3)

# %% [markdown]
# ## Real rows vs synthetic rows
# Round-trip error (rel-L1) of each scheme on the captured K and V of all layers, beside the same schemes on
# synthetic Student-t rows. Where the real-K column ranks schemes differently from the synthetic one (look at
# the channel-axis and rotated rows), synthetic error is the wrong guide for keys.

# %%
K = torch.cat([rows_of(cap["k"][i]) for i in range(c.n_layers)])
V = torch.cat([rows_of(cap["v"][i]) for i in range(c.n_layers)])
syn = sample("student_t4", 4096, c.head_dim, 0)
recs = []
for name in SCHEMES:
    s = kvlab.scheme(name)
    for label, x, spec in (("real K", K, s.k), ("real V", V, s.v), ("Student-t", syn, s.k)):
        n = x.shape[0] - x.shape[0] % (spec.group if spec.axis == "chan" else 1)
        xx = x[:n]
        if spec.axis == "chan":  # channel groups run over consecutive tokens of one head: keep rows in order
            xx = xx.reshape(-1, spec.group, x.shape[-1])
        y = kvlab.dequantize(kvlab.quantize(xx, spec))
        recs.append({"scheme": name, "data": label, "rel-L1": rel_l1(xx, y)})
rt = pd.DataFrame(recs).pivot(index="scheme", columns="data", values="rel-L1").loc[list(SCHEMES)]
rt.round(4)

# %%
ax = rt.plot.barh(figsize=(8, 4))
ax.set_xlabel("round-trip rel-L1")
ax.set_title("the same schemes on real SmolLM2 K/V and on synthetic rows")
