"""Store kernel speed: one 32K-token prefill write per scheme (Hk=8, D=128, fp16 input).

    python benchmarks/bench_store.py            # prints the table, writes sweeps/results/<gpu>/bench_store.json
    from benchmarks.bench_store import run; rows = run("cuda")

Per scheme: first a bit-exactness check of the Triton store against the oracle (the reference
store on the CPU, which is the GGML-exact one) on the first 1024 tokens, then
`triton.testing.do_bench(..., return_mode="median")` of the kernel launch (`kernel_ms`, tokens
already rotated for int4_had) and of the whole checked `store()` call (`api_ms`: input checks,
Hadamard rotation in torch), and of the kernel launch replayed from a CUDA graph (`graph_ms`:
no Python launch path, which a ~30 us write would otherwise wait on); for specs on the group-row
path also `general_graph_ms`, the same write through the general tile path. Bytes moved = fp16 input
read + codes/scales/zeros written; `achieved_gbps` = bytes / kernel time. Pages: 16 tokens (32 for kivi4's channel-grouped keys),
filled in a shuffled page order, as a prefill into a fresh pool would.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys

import torch

SCHEMES = [("bf16", "bf16"), ("q8_0", "q8_0"), ("fp8_e4m3", "fp8_e4m3"), ("q4_0", "q4_0"), ("q4_1", "q4_1"),
           ("int4_had", "int4_had"), ("kivi4", "kivi4"), ("int3", "int3:g32:asym"), ("int2", "int2:g32:asym"),
           ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4")]


def _case(text: str, T: int, Hk: int, D: int, device, seed: int = 0):
    import kvlab
    from kvlab.cache.layout import PageLayout
    from kvlab.cache.paging import calibrate
    spec = kvlab.scheme(text).k  # kivi4: its channel-grouped K spec (the interesting one)
    P = 32 if spec.axis == "chan" else 16
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(T, Hk, D, generator=g).to(device=device, dtype=torch.float16)
    n_pages = T // P
    order = torch.randperm(n_pages, generator=g).to(device)
    slots = (order[:, None] * P + torch.arange(P, device=device)).reshape(-1)  # [T] int64
    scale, ts = calibrate(x, spec)
    kw = {k: v.reshape(1) for k, v in (("scale", scale), ("tensor_scale", ts)) if v is not None}
    return spec, PageLayout(spec, D, P, Hk), x, slots, kw


def _check_exact(spec, lay, x, kw, n: int = 1024) -> None:
    """Triton pages == reference pages (CPU oracle) for the first n tokens, else AssertionError."""
    from kvlab.kernels.store import store
    P = lay.page_size
    xs, slots = x[:n], torch.arange(n, device=x.device)
    got = lay.allocate(n // P, x.device)
    store(xs, got, slots, spec, backend="triton", **kw)
    want = lay.allocate(n // P, "cpu")
    store(xs.cpu(), want, slots.cpu(), spec, backend="reference", **{k: v.cpu() for k, v in kw.items()})
    for key, t in want.items():
        if t is not None:
            same = torch.equal(t.view(torch.uint8), got[key].cpu().view(torch.uint8))
            assert same, f"{spec}: Triton store differs from the oracle in {key}"


def _moved_bytes(lay, x) -> int:
    from kvlab.cache.capacity import layout_page_bytes
    T, Hk, D = x.shape
    return x.numel() * x.element_size() + layout_page_bytes(lay) * T // lay.page_size


def run(device="cuda", tokens: int = 32768, n_kv_heads: int = 8, head_dim: int = 128, check: bool = True) -> list[dict]:
    """Time a `tokens`-token prefill write for every scheme in SCHEMES -> rows
    {scheme, spec, tokens, median_ms, achieved_gbps, api_ms, bytes, exact}."""
    import triton.testing

    from kvlab.cache.paging import prerotate
    from kvlab.kernels.store import store
    from kvlab.kernels.store.triton import kernel_params, store_triton
    rows = []
    for name, text in SCHEMES:
        spec, lay, x, slots, kw = _case(text, tokens, n_kv_heads, head_dim, device)
        if check:
            _check_exact(spec, lay, x, kw)
        pages = lay.allocate(tokens // lay.page_size, device)
        xr, spec_r = prerotate(x, spec)
        kernel = lambda: store_triton(xr, pages, slots, spec_r, lay.page_size, scale=kw.get("scale"),  # noqa: E731
                                      tensor_scale=kw.get("tensor_scale"))
        api = lambda: store(x, pages, slots, spec, backend="triton", check_slots=False, **kw)  # noqa: E731
        ms = triton.testing.do_bench(kernel, return_mode="median")
        api_ms = triton.testing.do_bench(api, return_mode="median")
        nbytes = _moved_bytes(lay, x)
        row = {"scheme": name, "spec": str(spec), "tokens": tokens, "median_ms": ms,
               "achieved_gbps": nbytes / (ms * 1e-3) / 1e9, "api_ms": api_ms, "bytes": nbytes, "exact": bool(check)}
        try:  # the launch replayed from a CUDA graph: kernel time without the Python launch path
            gms = triton.testing.do_bench_cudagraph(kernel, return_mode="median")
            row.update(graph_ms=gms, graph_gbps=nbytes / (gms * 1e-3) / 1e9)
        except Exception as e:  # noqa: BLE001
            row["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if kernel_params(spec_r, head_dim)["FLAT"]:  # the same write through the general tile path, for comparison
            general = lambda: store_triton(xr, pages, slots, spec_r, lay.page_size, scale=kw.get("scale"),  # noqa: E731
                                           tensor_scale=kw.get("tensor_scale"), flat=False)
            try:
                row["general_graph_ms"] = triton.testing.do_bench_cudagraph(general, return_mode="median")
            except Exception as e:  # noqa: BLE001
                row["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        rows.append(row)
    return rows


def main() -> None:
    import triton
    if not torch.cuda.is_available():
        sys.exit("bench_store needs a CUDA GPU")
    from kvlab.sweep.speed import copy_bandwidth_tbps
    copy_tbps = copy_bandwidth_tbps()
    rows = run("cuda")
    for r in rows:
        if "graph_ms" in r:
            r["graph_frac_of_copy"] = r["graph_gbps"] / (copy_tbps * 1e3)
    print(f"copy bandwidth (read + write) {copy_tbps:.2f} TB/s")
    print(f"{'scheme':10s} {'tokens':>7s} {'kernel ms':>10s} {'GB/s':>8s} {'graph ms':>9s} {'GB/s':>8s} {'frac':>5s} "
          f"{'general':>8s} {'api ms':>8s}  spec")
    for r in rows:
        print(f"{r['scheme']:10s} {r['tokens']:7d} {r['median_ms']:10.4f} {r['achieved_gbps']:8.1f} "
              f"{r.get('graph_ms', float('nan')):9.4f} {r.get('graph_gbps', float('nan')):8.1f} "
              f"{r.get('graph_frac_of_copy', float('nan')):5.2f} {r.get('general_graph_ms', float('nan')):8.4f} "
              f"{r['api_ms']:8.4f}  {r['spec']} {r.get('graph_error', '')}")
    gpu = torch.cuda.get_device_name()
    try:
        commit = os.environ.get("KVLAB_COMMIT") or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                                  text=True).stdout.strip()
    except OSError:
        commit = None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = os.path.join(root, "sweeps", "results", "".join(c if c.isalnum() else "_" for c in gpu), "bench_store.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    meta = {"gpu": gpu, "copy_tbps_read_plus_write": copy_tbps, "torch": torch.__version__, "triton": triton.__version__, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "rows": rows}
    with open(out, "w") as f:
        json.dump(meta, f, indent=1)
    # store.csv: median_ms is the kernel replayed from a CUDA graph (eager_ms includes the launch path)
    import pandas as pd
    df = pd.DataFrame(rows).rename(columns={"median_ms": "eager_ms", "achieved_gbps": "eager_gbps"})
    if "graph_ms" in df:
        df["median_ms"], df["achieved_gbps"] = df["graph_ms"], df["graph_gbps"]
    cols = ["scheme", "tokens", "median_ms", "achieved_gbps", "graph_frac_of_copy", "general_graph_ms", "eager_ms",
            "api_ms", "bytes", "exact", "spec"]
    df[[c for c in cols if c in df]].to_csv(os.path.join(os.path.dirname(out), "store.csv"), index=False)
    print("wrote", out, "and store.csv")


if __name__ == "__main__":
    main()
