"""Figures from result tables: the Pareto view (bits x KL x decode time) and kernel speed bars.

`pareto_panels(table)`: two panels sharing the KL axis, effective bits vs KL and decode time vs KL, colored
by scheme family, each panel's frontier drawn, frontier points numbered and named in a table beside the
panels (names never overlap the data). KL values under `floor` (float caches, ~1e-10) are drawn at the floor
with an open marker instead of stretching the log axis.
"""
from __future__ import annotations

import math

import pandas as pd

FAMILY_ORDER = ("float", "fp8", "int, token groups", "int + fp window", "KIVI (channel keys)", "Hadamard-rotated",
                "pre-RoPE keys", "fp4 (mx / nv)", "codebook (nf4 / iq4nl)", "engine profile", "other",
                "Lloyd-Max codebook")  # appended: the families before it keep their colors


def family(text: str) -> str:
    """The scheme family of scheme text (one of FAMILY_ORDER)."""
    from ..spec import as_scheme
    try:
        s = as_scheme(text)
    except ValueError:
        return "other"
    if s.engine is not None and (s.engine.rotate or s.engine.k_codec or s.engine.q_round):
        return "engine profile"
    k, v = s.k, s.v
    if k.is_float_storage and v.is_float_storage:
        return "float"
    fmts = {k.fmt, v.fmt}
    if fmts & {"lm2", "lm3", "lm4"}:
        return "Lloyd-Max codebook"
    if k.axis == "chan":
        return "KIVI (channel keys)"
    if "had" in (k.rotation, v.rotation):
        return "Hadamard-rotated"
    if k.pre_rope:
        return "pre-RoPE keys"
    if fmts & {"fp4_e2m1"}:
        return "fp4 (mx / nv)"
    if fmts & {"nf4", "iq4nl"}:
        return "codebook (nf4 / iq4nl)"
    if fmts & {"fp8_e4m3", "fp8_e5m2"}:
        return "fp8"
    if s.window or s.sink:
        return "int + fp window"
    return "int, token groups"


def pareto_frontier(df: pd.DataFrame, x: str, y: str = "loss") -> pd.DataFrame:
    """Rows not beaten on both x and y (lower is better on each), sorted by x."""
    d = df.dropna(subset=[x, y]).sort_values([x, y])
    keep, best = [], math.inf
    for i, r in d.iterrows():
        if r[y] < best:
            keep.append(i)
            best = r[y]
    return d.loc[keep]


def label(scheme: str, name) -> str:
    """A row's display name: its preset name while that name still means the row's scheme text (a preset
    redefined since the run, as freetoken:q4_0 was, shows the text it was measured with)."""
    from ..spec import as_scheme
    if not isinstance(name, str) or name == scheme:
        return scheme
    try:
        return name if as_scheme(name) == as_scheme(scheme) else scheme
    except ValueError:
        return scheme


def pareto_panels(table: pd.DataFrame, path=None, title: str = "", floor: float = 1e-5, max_named: int = 26,
                  time_ref: tuple[str, float] | None = None, time_label: str = "decode time, ms"):
    """Draw the two-panel Pareto view of a scheme table (columns scheme, name, eff_bits, loss, loss_sd,
    decode_ms; loss = KL). Saves to `path` when given; returns the matplotlib Figure. `time_ref`: a
    (label, ms) vertical line on the time panel (e.g. cuDNN bf16 in the same run)."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(style="whitegrid", context="paper")
    t = table.copy()
    t["family"] = t["scheme"].map(family)
    t["shown"] = t["loss"].clip(lower=floor)
    fams = [f for f in FAMILY_ORDER if f in set(t["family"])]
    pal = dict(zip(fams, sns.color_palette("tab10", len(fams))))
    has_time = "decode_ms" in t and t["decode_ms"].notna().any()
    fig = plt.figure(figsize=(15 if has_time else 10.5, 5.6))
    gs = fig.add_gridspec(1, 3 if has_time else 2, width_ratios=[1, 1, 0.8] if has_time else [1, 0.8], wspace=0.08)
    panels = [("eff_bits", "effective bits per K/V element\n(scales, zeros, fp window amortized)")]
    if has_time:
        panels.append(("decode_ms", time_label))
    named: dict = {}
    axes = []
    for j, (x, xlabel) in enumerate(panels):
        ax = fig.add_subplot(gs[0, j], sharey=axes[0] if axes else None)
        axes.append(ax)
        for f in fams:
            g = t[t["family"] == f]
            low = g["loss"] < floor
            ax.scatter(g.loc[~low, x], g.loc[~low, "shown"], s=22, color=pal[f], label=f, alpha=0.85, zorder=2)
            ax.scatter(g.loc[low, x], g.loc[low, "shown"], s=40, facecolors="none", edgecolors=pal[f], zorder=2)
        front = pareto_frontier(t.assign(loss=t["shown"]), x)
        ax.step(front[x], front["shown"], where="post", color="0.25", lw=1.1, zorder=1)
        for _, r in front.iterrows():
            if r["scheme"] not in named and len(named) < max_named:
                named[r["scheme"]] = len(named) + 1
            if r["scheme"] in named:
                ax.annotate(str(named[r["scheme"]]), (r[x], r["shown"]), xytext=(4, 3), textcoords="offset points",
                            fontsize=8, fontweight="bold")
        if x == "decode_ms" and time_ref:
            ax.axvline(time_ref[1], color="0.4", ls="--", lw=1)
            ax.text(time_ref[1], 1.0, f" {time_ref[0]}", fontsize=8, color="0.3", transform=ax.get_xaxis_transform(),
                    va="top")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        if j == 0:
            ax.set_ylabel(f"KL to the full-precision model (log; < {floor:g} drawn at {floor:g}, open marker)")
        else:
            ax.tick_params(labelleft=False)
    axes[0].legend(fontsize=7.5, loc="upper right", title="family", title_fontsize=8)
    tab = fig.add_subplot(gs[0, -1])
    tab.axis("off")
    rows = t.set_index("scheme").loc[list(named)]
    lines = [f"{i:>2d}  {label(s, r['name'])[:38]:38s} {r['eff_bits']:5.2f} {r['loss']:8.1e}"
             + (f" {r['decode_ms']:6.3f}" if has_time and not pd.isna(r["decode_ms"]) else "")
             for i, (s, r) in zip(named.values(), rows.iterrows())]
    head = f"{'#':>2s}  {'frontier scheme':38s} {'bits':>5s} {'KL':>8s}" + (f" {'ms':>6s}" if has_time else "")
    tab.text(0, 1, "\n".join([head] + lines), family="monospace", fontsize=6.6, va="top")
    fig.suptitle(title or "bits x KL x decode time", fontsize=11)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.14, top=0.91)
    if path is not None:
        fig.savefig(path, dpi=130)
        plt.close(fig)
    return fig


def speedup_bars(df: pd.DataFrame, path=None, value: str = "ratio_vs_cudnn", by: str = "scheme",
                 hue: str | None = "dispatch", title: str = "", ref: float = 1.0):
    """Bar chart of a per-scheme ratio (e.g. decode time / cuDNN bf16), a line at `ref`."""
    import matplotlib
    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    sns.set_theme(style="whitegrid", context="paper")
    fig, ax = plt.subplots(figsize=(9, 4))
    sns.barplot(data=df, x=by, y=value, hue=hue, ax=ax)
    ax.axhline(ref, color="0.3", ls="--", lw=1)
    ax.set_ylabel(value.replace("_", " "))
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=45)
    ax.set_title(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
        plt.close(fig)
    return fig
