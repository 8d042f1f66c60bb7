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

# %% [markdown] papermill={"duration": 0.006078, "end_time": "2026-12-03T13:14:11.895880+00:00", "exception": false, "start_time": "2026-12-03T13:14:11.889802+00:00", "status": "completed"}
# # 04 · Kernels on the H200: roofline, speedups, tuned configs, what limits each one
#
# Decode over a paged quantized cache reads every stored byte once per step, so its bound is memory
# bandwidth: time >= bytes of codes + scales + zeros / copy bandwidth. This notebook reads the committed H200
# tables (no GPU needed): how close each scheme's kernel gets to that bound, how it compares with cuDNN's bf16
# attention on dense K/V in the same process, what the tuned configs buy over a new user's defaults, the
# store kernels, and FlashInfer's fp8 decode on the same bytes. Each table names the file and the run it
# came from.

# %% papermill={"duration": 0.026243, "end_time": "2026-12-03T13:14:11.927303+00:00", "exception": false, "start_time": "2026-12-03T13:14:11.901060+00:00", "status": "completed"} tags=["parameters"]
RESULTS = "../sweeps/results/h200"
DECODE = f"{RESULTS}/decode.csv"          # benchmarks/run.py --cases decode (runs/s11-table-0a466a2), header.json
BEFORE = f"{RESULTS}/runs/final-b2961af/decode.csv"      # the table before the Gluon codecs of issue 16
STORE = f"{RESULTS}/store.csv"
FLASHINFER = f"{RESULTS}/flashinfer_fp8/flashinfer_fp8.csv"
TUNED = "../kvlab/kernels/data/tuned_nvidia_h200.json"  # the configs the package ships for the H200
PROFILE = f"{RESULTS}/runs/profile-4f1093e/summary.txt"
SASS = f"{RESULTS}/runs/codecs3-1ec2853/sm90_offline.txt"  # offline sm_90 loop counts of the Gluon codecs
MAIN = ["bf16", "fp8_e4m3", "q8_0", "q4_0", "q4_1", "int4_had", "kivi4", "kivi2", "int3", "int2", "mxfp4", "nvfp4",
        "nf4", "iq4nl"]

# %% papermill={"duration": 4.312918, "end_time": "2026-12-03T13:14:16.252180+00:00", "exception": false, "start_time": "2026-12-03T13:14:11.939262+00:00", "status": "completed"}
import json
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from kvlab.report import speedup_bars

sns.set_theme(style="whitegrid", context="notebook")
header = json.loads(Path(f"{RESULTS}/header.json").read_text())
print({k: header[k] for k in ("gpu", "torch", "triton", "commit", "date", "copy_tbps_read_plus_write")})
dec = pd.read_csv(DECODE)
dec = dec[dec["scheme"].isin(MAIN)]
both = dec  # default dispatch (the shipped configs) and the heuristic alone, one run
dec = dec[dec["dispatch"] == "default"]

# %% [markdown] papermill={"duration": 0.002928, "end_time": "2026-12-03T13:14:16.259155+00:00", "exception": false, "start_time": "2026-12-03T13:14:16.256227+00:00", "status": "completed"}
# ## The memory roofline at B=32 x 32K (Hq 32, Hk 8, D 128, page 16)
# Achieved bandwidth = stored bytes read / graph-replayed kernel time. The dashed line is the measured copy
# bandwidth of the same GPU (read + write); a kernel at the line is as fast as reading its bytes can be.

# %% papermill={"duration": 0.523265, "end_time": "2026-12-03T13:14:16.785267+00:00", "exception": false, "start_time": "2026-12-03T13:14:16.262002+00:00", "status": "completed"}
main = dec[(dec["batch"] == 32) & (dec["context"] == 32768)].drop_duplicates("scheme").set_index("scheme").loc[
    [s for s in MAIN if s in set(dec["scheme"])]]
main["bytes per element"] = main["kv_bytes"] / (32 * 32768 * 8 * 128 * 2)
main["TB/s (graph)"] = main["kv_bytes"] / main["graph_ms"] / 1e9
fig, ax = plt.subplots(figsize=(8, 4.5))
sns.scatterplot(data=main.reset_index(), x="bytes per element", y="TB/s (graph)", hue="scheme", s=80, ax=ax)
ax.axhline(header["copy_tbps_read_plus_write"], ls="--", color="0.3")
ax.text(0.45, header["copy_tbps_read_plus_write"] * 1.02, "copy bandwidth", color="0.3")
ax.set_ylim(0, header["copy_tbps_read_plus_write"] * 1.25)
ax.legend(bbox_to_anchor=(1.02, 1), loc="upper left", fontsize=8)
ax.set_title("decode: achieved bandwidth vs stored bytes per element")
before = pd.read_csv(BEFORE).query("batch == 32 and context == 32768").drop_duplicates("scheme").set_index("scheme")
main["before graph_ms"] = before["graph_ms"].reindex(main.index)
main["kernel"] = [json.loads(c).get("kernel") for c in main["config"]]
main[["graph_ms", "before graph_ms", "cudnn_bf16_ms", "ratio_graph_vs_cudnn", "roofline_frac_graph", "bytes per element",
      "kernel"]].round(3)

# %% [markdown] papermill={"duration": 0.006435, "end_time": "2026-12-03T13:14:16.797096+00:00", "exception": false, "start_time": "2026-12-03T13:14:16.790661+00:00", "status": "completed"}
# ## Speedup over cuDNN bf16 across batch, context and head size
# cuDNN SDPA on dense bf16 K/V of the same shape, in the same process (graph-replayed medians); above 1 the
# quantized cache is faster than the dense bf16 attention it replaces. D 64 is SmolLM2's shape (Hq 9, Hk 3),
# D 256 with Hk 4 Gemma-like (Hq 8), D 256 with Hk 1 Gemma 3 270M's own (Hq 4; its sliding layers hold 512 tokens).

# %% papermill={"duration": 0.983393, "end_time": "2026-12-03T13:14:17.788479+00:00", "exception": false, "start_time": "2026-12-03T13:14:16.805086+00:00", "status": "completed"}
ctx = [f"{c // 1024}K" if c >= 1024 else str(c) for c in dec["context"]]
dec["shape"] = ("B" + dec["batch"].astype(str) + " x " + pd.Series(ctx, index=dec.index) + ", D"
                + dec["head_dim"].astype(str) + ", Hk" + dec["heads_kv"].astype(str))
dec["speedup (graph)"] = dec["cudnn_bf16_ms"] / dec["graph_ms"]
sub = dec.drop_duplicates(["scheme", "shape"])
g = sns.catplot(data=sub, x="scheme", y="speedup (graph)", hue="shape", kind="bar", height=4, aspect=2.6,
                order=[s for s in MAIN if s in set(sub["scheme"])])
for ax in g.axes.flat:
    ax.axhline(1.0, ls="--", color="0.3")
g.set_axis_labels("", "cuDNN bf16 time / kvlab time")

# %% [markdown] papermill={"duration": 0.004242, "end_time": "2026-12-03T13:14:17.797971+00:00", "exception": false, "start_time": "2026-12-03T13:14:17.793729+00:00", "status": "completed"}
# ## The shipped configs vs the dispatch heuristic alone
# A new user with no tuned file gets the configs the package ships for this GPU ("default"); with those turned
# off (KVLAB_PACKAGED_CONFIGS=0) the dispatch heuristic picks the kernel's default tile ("heuristic"). One
# process, B=32 x 32K. Ratio below 1: faster than cuDNN bf16.

# %% papermill={"duration": 0.460852, "end_time": "2026-12-03T13:14:18.262935+00:00", "exception": false, "start_time": "2026-12-03T13:14:17.802083+00:00", "status": "completed"}
disp = both.query("batch == 32 and context == 32768")
speedup_bars(disp, value="ratio_graph_vs_cudnn", by="scheme", hue="dispatch",
             title="decode time / cuDNN bf16 (B=32 x 32K), shipped configs vs heuristic")
disp.pivot(index="scheme", columns="dispatch", values="ratio_graph_vs_cudnn").round(3)

# %% papermill={"duration": 0.027988, "end_time": "2026-12-03T13:14:18.296437+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.268449+00:00", "status": "completed"}
tuned = json.loads(Path(TUNED).read_text())["configs"]
pd.DataFrame([{"K spec": k.split("|")[1][2:][:40], "shape": "|".join(k.split("|")[3:]), **v}
              for k, v in tuned.items() if k.startswith("decode")]).head(12)

# %% [markdown] papermill={"duration": 0.009726, "end_time": "2026-12-03T13:14:18.315143+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.305417+00:00", "status": "completed"}
# ## Store: quantize + pack + scatter of a 32K-token write
# Fraction of the copy bandwidth reached (read the bf16 input, write the stored bytes).

# %% papermill={"duration": 0.395822, "end_time": "2026-12-03T13:14:18.716542+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.320720+00:00", "status": "completed"}
st = pd.read_csv(STORE)  # backend triton_prerotated: a rotated spec with the rotation done by torch first
ax = sns.barplot(data=st, x="scheme", y="fraction_of_copy", hue="backend")
ax.axhline(1.0, ls="--", color="0.3")
ax.tick_params(axis="x", rotation=45)
ax.set_title("store kernel: fraction of copy bandwidth (32K tokens)")
st[["scheme", "backend", "graph_ms", "graph_gbps", "fraction_of_copy", "config"]].round(3)

# %% [markdown] papermill={"duration": 0.005788, "end_time": "2026-12-03T13:14:18.728387+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.722599+00:00", "status": "completed"}
# ## FlashInfer's fp8 decode on the same bytes
# kvlab's fp8 decode, FlashInfer's XQA kernel and its decode wrappers, each against the float32 reference on
# the same e4m3 pages and scales (odd lengths, NaN-poisoned slots past the end), then timed.

# %% papermill={"duration": 0.036807, "end_time": "2026-12-03T13:14:18.775305+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.738498+00:00", "status": "completed"}
fi = pd.read_csv(FLASHINFER)
acc = fi[fi["test"] == "correctness"].pivot_table(index="impl", columns=["head_dim", "scales"],
                                                  values="max_rel_err_vs_fp32")
acc

# %% papermill={"duration": 0.024575, "end_time": "2026-12-03T13:14:18.805870+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.781295+00:00", "status": "completed"}
fi[fi["test"] == "timing"][["impl", "batch", "median_ms", "tb_per_s", "ratio_vs_cudnn", "ratio_vs_xqa"]].round(3)

# %% [markdown] papermill={"duration": 0.006326, "end_time": "2026-12-03T13:14:18.819619+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.813293+00:00", "status": "completed"}
# ## What limits each kernel
# Nsight Compute on the Triton kernels the slow families ran before the Gluon codecs (B=32 x 32K): DRAM
# throughput well under the roofline with few eligible warps and high register counts, i.e. dequantization, not
# memory, bounded them.

# %% papermill={"duration": 0.018663, "end_time": "2026-12-03T13:14:18.844836+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.826173+00:00", "status": "completed"}
print(Path(PROFILE).read_text())

# %% [markdown] papermill={"duration": 0.00635, "end_time": "2026-12-03T13:14:18.858789+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.852439+00:00", "status": "completed"}
# The Gluon kernel's main loop per 16-token tile per warp (4 warps; channel-axis keys 32 tokens), compiled
# for sm_90 offline (`python -m devtools.sm90_offline gluon:SCHEME`): instructions issued, registers, no
# shared memory in the loop. At B=32 x 32K the kernel is issue-bound: its time follows the loop's instruction
# count far more than the bytes it reads (int2 reads 3 bits per element and q4_0 4.5, at nearly the same time).

# %% papermill={"duration": 0.017214, "end_time": "2026-12-03T13:14:18.881844+00:00", "exception": false, "start_time": "2026-12-03T13:14:18.864630+00:00", "status": "completed"}
print(Path(SASS).read_text())

# %% [markdown]
# ## What limits each kernel today: Nsight Compute over the default dispatch
# Every row of the committed tables that misses its issue target, profiled through the public API's default
# dispatch on the H200 (`bash benchmarks/h200_run.sh close3`, `benchmarks/limits.py`): DRAM and issue
# utilisation of the main kernel, its busiest pipes, top stalls (cycles per issued instruction) and the limiter
# they point to. `table` is the value of the committed row when the profile ran.

# %%
LIMITS = sorted(Path(RESULTS, "runs").glob("close3*-51b9ae0/limits_*.csv"))
lim = pd.concat([pd.read_csv(p) for p in LIMITS], ignore_index=True)
print("from", ", ".join(str(p.relative_to(RESULTS)) for p in LIMITS))
print(lim[["case", "table", "target", "main_us", "dram_pct", "issue_pct", "regs", "top_pipes", "limiter"]]
      .to_string(index=False))

# %%
lim.groupby(lim.case.str.rsplit(":", n=1).str[0]).limiter.value_counts().unstack(fill_value=0)
