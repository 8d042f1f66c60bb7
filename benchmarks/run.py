"""The one benchmark runner: a registry of cases, a correctness gate before timing, one header.

    python benchmarks/run.py --out sweeps/results/h200/runs/NAME [--cases decode,store] [--schemes q4_0,q8_0]
                             [--tuned sweeps/results/h200/tuned_configs.json] [--budget 420]

Every case times what a user gets: the public ops with default dispatch (`decode`, `store`, `extend`), planned and
replayed from a CUDA graph as an engine runs a decode step, beside peers in the same process (cuDNN and
flash SDPA on dense bf16 K/V). Decode rows come three times: `dispatch=tuned` (the tuned-config file given
with --tuned), `dispatch=default` (no tuned file and no environment variable: a new user, who gets the configs
shipped in kvlab/kernels/data and, for shapes they lack, the closest batch bucket or the dispatch heuristic)
and `dispatch=heuristic` (the shipped configs turned off: the heuristic alone). Before a scheme is timed, its default-dispatch
output is checked against the float32 reference on a small odd-shaped cache (`gate` columns); a scheme that
fails is reported, not timed; a store is checked byte for byte against the CPU oracle first (`store_gate`). Writes header.json (GPU, versions, commit, date, copy bandwidth), one CSV per
case, and the tuned configs the run used or found.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "kernels" / "decode"))
sys.path.insert(0, str(ROOT / "tests" / "kernels" / "store"))

SCHEMES = {"bf16": "bf16", "fp8_e4m3": "fp8_e4m3", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
           "int4_had": "int4:g32:asym:rot=had", "kivi4": "kivi4", "kivi2": "kivi2", "int3": "int3:g32:asym",
           "int2": "int2:g32:asym", "mxfp4": "mxfp4", "nvfp4": "nvfp4", "nf4": "nf4", "iq4nl": "iq4nl",
           "lm2": "lm2:rot=had", "lm3": "lm3:rot=had", "lm4": "lm4:rot=had"}  # (lm2 / lm3 / lm4: the Lloyd-Max codebooks the quality search picks;
# not in issue 16's list of decode.csv schemes)
SHAPES = {"b32": dict(batch=32, context=32768, heads_q=32, heads_kv=8, head_dim=128),
          "b1": dict(batch=1, context=32768, heads_q=32, heads_kv=8, head_dim=128),
          "b8": dict(batch=8, context=32768, heads_q=32, heads_kv=8, head_dim=128),
          "b128": dict(batch=128, context=16384, heads_q=32, heads_kv=8, head_dim=128),
          "smollm2": dict(batch=32, context=8192, heads_q=9, heads_kv=3, head_dim=64),
          "smollm2_b64": dict(batch=64, context=8192, heads_q=9, heads_kv=3, head_dim=64),
          "d256": dict(batch=32, context=8192, heads_q=8, heads_kv=4, head_dim=256),
          # Gemma 3 270M's shape: its sliding layers hold 512 tokens, its global ones the context
          "gemma512": dict(batch=32, context=512, heads_q=4, heads_kv=1, head_dim=256),
          "gemma8k": dict(batch=32, context=8192, heads_q=4, heads_kv=1, head_dim=256),
          "smollm2_512": dict(batch=32, context=512, heads_q=9, heads_kv=3, head_dim=64),
          # shapes no packaged config covers (the dispatch heuristic's ground): a batch bucket between the tuned ones,
          # Llama 3 70B's heads (Hq 64, Hk 8) and Qwen2.5 7B's (Hq 28, Hk 4)
          "b16": dict(batch=16, context=32768, heads_q=32, heads_kv=8, head_dim=128),
          "llama70b_b8": dict(batch=8, context=32768, heads_q=64, heads_kv=8, head_dim=128),
          "qwen7b_b8": dict(batch=8, context=32768, heads_q=28, heads_kv=4, head_dim=128)}
DECODE_COLUMNS = ["scheme", "dispatch", "batch", "context", "heads_q", "heads_kv", "head_dim", "page_size", "median_ms",
                  "kv_bytes", "achieved_tbps", "roofline_frac", "cudnn_bf16_ms", "speedup_vs_cudnn", "flash_bf16_ms",
                  "graph_ms", "roofline_frac_graph", "ratio_graph_vs_cudnn", "gate_rel_err", "config", "error"]
EXTEND_SHAPES = {"p8k_b1": dict(batch=1, prefix=8192, chunk=1024, heads_q=32, heads_kv=8, head_dim=128),
                 "p32k_b1": dict(batch=1, prefix=32768, chunk=1024, heads_q=32, heads_kv=8, head_dim=128),
                 "p8k_b8": dict(batch=8, prefix=8192, chunk=1024, heads_q=32, heads_kv=8, head_dim=128),
                 "p32k_b8": dict(batch=8, prefix=32768, chunk=1024, heads_q=32, heads_kv=8, head_dim=128),
                 "smollm2_p8k": dict(batch=1, prefix=8192, chunk=1024, heads_q=9, heads_kv=3, head_dim=64),
                 "d256_p8k": dict(batch=1, prefix=8192, chunk=1024, heads_q=8, heads_kv=4, head_dim=256)}
EXTEND_COLUMNS = ["scheme", "backend", "batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim", "page_size",
                  "median_ms", "cudnn_bf16_ms", "flash_bf16_ms", "ratio_vs_cudnn", "tflops", "gate_rel_err", "config",
                  "error"]
STORE_COLUMNS = ["scheme", "tokens", "graph_ms", "eager_ms", "bytes", "graph_gbps", "fraction_of_copy", "backend",
                 "config", "gate_bytes", "error"]
GATE_TOL = 2e-2  # bf16 / fp16 tensor-core dots against the float32 reference


def page_size(sch) -> int:
    return 32 if sch.k.axis == "chan" else 16


def header(out: Path, args) -> dict:
    import triton

    from kvlab.eval.speed import copy_bandwidth_tbps
    commit = os.environ.get("KVLAB_COMMIT")  # the device's copy of .git can lag the tree it was sent
    if not commit:
        try:
            commit = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True).strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    h = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
         "commit": commit, "date": datetime.datetime.now().isoformat(timespec="seconds"),
         "copy_tbps_read_plus_write": copy_bandwidth_tbps(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
         "command": "python benchmarks/run.py " + " ".join(sys.argv[1:]), "tuned_file": args.tuned}
    (out / "header.json").write_text(json.dumps(h, indent=1) + "\n")
    return h


def _writer(path: Path, columns):
    f = open(path, "w", newline="")
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()

    def emit(row):
        w.writerow({k: row.get(k, "") for k in columns})
        f.flush()
        print(path.stem, {k: row.get(k) for k in columns[:3] + ["graph_ms", "error"] if k in row}, flush=True)
    return emit, f


def gate(sch, D: int, Hq: int, Hk: int) -> float:
    """Max relative error of the default-dispatch decode against the reference on an odd-shaped, NaN-poisoned
    cache (lengths 1, 300, 517 or whole channel groups, fp tokens where the scheme keeps them)."""
    from kvlab.kernels.decode import decode
    from paged_cases import call_args, make_paged
    P = page_size(sch)
    lens = [32, 288, 512] if sch.k.axis == "chan" else [1, 300, 517]
    c = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=[3, 0, 100] if (sch.window or sch.sink) else None,
                   device="cuda")
    args, kw = call_args(c)
    q = torch.randn(3, Hq, D, device="cuda", dtype=torch.bfloat16)
    ref = decode(q.float(), *args, sch.k, sch.v, P, **kw, backend="reference")
    got = decode(q, *args, sch.k, sch.v, P, **kw).float()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).abs().max() / ref.abs().max()).item()


def store_gate(sch, D: int = 128, Hk: int = 8, T: int = 517, backend: str = "auto") -> int:
    """Bytes of the store's pages (codes, scales, zeros, ...; `backend`: the default dispatch, or "triton" to force
    the kernel, as the CPU tests do under the interpreter) that differ from the CPU oracle's (the reference store) on
    an odd write: T bf16 tokens (whole channel groups for channel-axis specs) into shuffled slots of poisoned pages,
    the scheme's keys. 0: bit-exact (the store's contract)."""
    from store_cases import as_bytes, make_input, run_store
    x, slots, lay, n_pages, kw = make_input(sch.k, T=T, Hk=Hk, D=D, P=page_size(sch), seed=5, dtype=torch.bfloat16)
    ref, _ = run_store(x, slots, lay, n_pages, sch.k, "reference", **kw)
    got, _ = run_store(x, slots, lay, n_pages, sch.k, backend, **kw)
    a, b = as_bytes(ref), as_bytes(got)
    return sum(int((a[k] != b[k]).sum()) for k in a if a[k] is not None)


def _sdpa_peers(q, k, v, bench) -> tuple[float | None, float | None, str]:
    """Median ms of cuDNN and flash SDPA (GQA) on dense q / k / v, timed by `bench(fn)`; a peer that does not run is
    reported in the error text."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res, err = [], ""
    for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        def fn(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        try:
            fn()
            res.append(bench(fn))
        except Exception as e:  # noqa: BLE001 - a peer that does not run here is reported
            res.append(None)
            err += f"{backend.name}: {type(e).__name__}: {str(e)[:120]}; "
    return res[0], res[1], err


def peers(shape) -> tuple[float | None, float | None, str]:
    """Median ms of cuDNN and flash SDPA decode on dense bf16 GQA K/V of the same shape (CUDA-graph replay)."""
    import triton
    B, L, Hq, Hk, D = (shape[k] for k in ("batch", "context", "heads_q", "heads_kv", "head_dim"))
    q = torch.randn(B, Hq, 1, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hk, L, D, device="cuda", dtype=torch.bfloat16)
    return _sdpa_peers(q, k, torch.randn_like(k),
                       lambda fn: triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median"))


def decode_plan(sch, shape: dict, num_splits: int | None = None, device: str = "cuda", max_kv_len: int | None = None):
    """(plan callable, resolved config) of the public decode with default dispatch over a synthetic cache of `sch`
    at `shape` (its window and sinks as bf16 tokens); num_splits and max_kv_len as decode's arguments."""
    from kvlab.eval.speed import fp_tokens_of
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.checks import check_prefix
    from kvlab.kernels.decode import api, decode
    from kvlab.kernels.key_fold import strip_key_fold
    B, L, Hq, Hk, D = (shape[k] for k in ("batch", "context", "heads_q", "heads_kv", "head_dim"))
    P = page_size(sch)
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, device)
    W = fp_tokens_of(sch)
    fp = dict(k_fp=None, v_fp=None, fp_len=None)  # in check_prefix's argument order
    if W:
        fp["k_fp"] = torch.randn(B, Hk, W, D, device=device, dtype=torch.bfloat16)
        fp["v_fp"] = torch.randn_like(fp["k_fp"])
        fp["fp_len"] = torch.full((B,), W, dtype=torch.int32, device=device)
    q = torch.randn(B, Hq, D, device=device, dtype=torch.bfloat16)
    args = (q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"], sch.k, sch.v, P)
    fn = decode(*args, **fp, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], plan=True, num_splits=num_splits,
                max_kv_len=max_kv_len)
    qs, kp, ks, _ = strip_key_fold(q, c["k_pages"], sch.k)  # what decode hands the dispatch (smoothed / permuted K)
    kv = check_prefix(qs, kp, *args[2:6], ks, *args[7:], *fp.values(), c["k_ts"], c["v_ts"], B)
    _, cfg = api.resolve(qs, kv, None, num_splits, max_kv_len)
    return fn, cfg


def decode_cell(sch, shape: dict, max_kv_len: int | None = None) -> tuple[float, float, str]:
    """(eager median ms, graph-replay median ms, config) through the public decode with default dispatch
    (max_kv_len: decode's bound on the sequences' tokens, as a model passes its sliding window)."""
    import triton
    fn, cfg = decode_plan(sch, shape, max_kv_len=max_kv_len)
    fn()
    ms = triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")
    g = triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")
    return ms, g, json.dumps(cfg.to_dict())


def case_decode(out: Path, h: dict, names, args) -> None:
    import kvlab
    from kvlab.eval.speed import fp_tokens_of, kv_bytes
    from kvlab.kernels import tuned
    emit, f = _writer(out / "decode.csv", DECODE_COLUMNS)
    bw = h["copy_tbps_read_plus_write"]
    t0 = time.time()
    for shape in (SHAPES[s] for s in args.shapes.split(",")):
        cudnn, flash, perr = peers(shape)
        for name in names:
            sch = kvlab.scheme(SCHEMES[name])
            B, L, Hq, Hk, D = (shape[k] for k in ("batch", "context", "heads_q", "heads_kv", "head_dim"))
            nbytes = kv_bytes(sch, B, L, Hk, D, fp_tokens_of(sch))
            base = dict(scheme=name, page_size=page_size(sch), kv_bytes=nbytes, cudnn_bf16_ms=cudnn, flash_bf16_ms=flash,
                        error=perr, **shape)
            try:
                tuned.set_cache_path(os.devnull)  # the gate runs what a new user gets
                base["gate_rel_err"] = gate(sch, D, Hq, Hk)
            except Exception as e:  # noqa: BLE001 - reported in the table
                emit({**base, "error": perr + f"gate: {type(e).__name__}: {str(e)[:200]}"})
                continue
            if not base["gate_rel_err"] <= GATE_TOL:
                emit({**base, "error": perr + f"gate failed: rel err {base['gate_rel_err']:.3g}; not timed"})
                continue
            for dispatch, path, pkg in (("tuned", args.tuned, "1"), ("default", os.devnull, "1"),
                                        ("heuristic", os.devnull, "0")):
                if (dispatch == "tuned" and not args.tuned) or dispatch not in args.dispatch.split(","):
                    continue
                os.environ["KVLAB_PACKAGED_CONFIGS"] = pkg  # read when set_cache_path clears the caches
                row = {**base, "dispatch": dispatch}
                if time.time() - t0 > args.budget:
                    emit({**row, "error": perr + "skipped: time budget"})
                    continue
                tuned.set_cache_path(path)
                try:
                    ms, g, cfg = decode_cell(sch, shape)
                    row.update(median_ms=ms, graph_ms=g, config=cfg, achieved_tbps=nbytes / g / 1e9,
                               roofline_frac=nbytes / (bw * 1e9) / ms, roofline_frac_graph=nbytes / (bw * 1e9) / g,
                               speedup_vs_cudnn=cudnn / ms if cudnn else None,
                               ratio_graph_vs_cudnn=g / cudnn if cudnn else None)
                except Exception as e:  # noqa: BLE001 - one failing cell must not end the run
                    row["error"] = perr + f"{type(e).__name__}: {str(e)[:300]}"
                emit(row)
                torch.cuda.empty_cache()
    os.environ.pop("KVLAB_PACKAGED_CONFIGS", None)
    tuned.set_cache_path(None)
    f.close()


def case_store(out: Path, h: dict, names, args) -> None:
    import triton

    import kvlab
    from kvlab.kernels import tuned
    from kvlab.kernels.autotune import store_write
    emit, f = _writer(out / "store.csv", STORE_COLUMNS)
    tuned.set_cache_path(str(out / "tuned_store.json"))  # the autotuner's picks land here (KVLAB_STORE_AUTOTUNE=1)
    from kvlab.kernels.configs import store_kernel_spec
    from kvlab.kernels.store import api as store_api
    fuses = store_api.fuses_rotation
    prerot = set(filter(None, (getattr(args, "store_prerot", "") or "").split(",")))
    runs = [(n, False) for n in names] + [(n, True) for n in names if n in prerot]
    for name, pre in runs:  # pre: a rotated spec with the rotation done by torch before the kernel (the old path)
        sch = kvlab.scheme(SCHEMES[name])
        row = {"scheme": name}
        # pre: the api rotates in torch first (its picks land under the unrotated spec's key, as the old path's did)
        store_api.fuses_rotation = (lambda spec, D: False) if pre else fuses
        try:
            row["gate_bytes"] = bad = store_gate(sch)
            if bad:  # reported (the except below), not timed
                raise RuntimeError(f"gate failed: {bad} bytes differ from the oracle's; not timed")
            w = store_write(sch.k, 32768, 8, 128, page_size(sch), "cuda")
            backend = w()  # the first launch compiles (and, with KVLAB_STORE_AUTOTUNE=1, autotunes) outside the timing
            g = triton.testing.do_bench_cudagraph(w, rep=30, return_mode="median")
            ms = triton.testing.do_bench(w, warmup=5, rep=30, return_mode="median")
            kspec = dataclasses.replace(sch.k, rotation="none") if pre else store_kernel_spec(sch.k, 128)
            walk = store_api.walk_of(kspec, 128, w.pages)  # a walk kernel (switched on) has a launch shape of its own
            cfg = None if walk else store_api.launch_config(kspec, 8, 128, w.tokens) or tuned.lookup(  # what the api
                tuned.store_key(kspec, 8, 128, w.tokens))  # launched, or the autotuner's recorded pick
            row.update(tokens=w.tokens, graph_ms=g, eager_ms=ms, bytes=w.bytes, graph_gbps=w.bytes / g / 1e6,
                       fraction_of_copy=w.bytes / g / 1e9 / h["copy_tbps_read_plus_write"],
                       backend=backend + ("_prerotated" if pre else ""),
                       config=json.dumps({"kernel": walk}) if walk else json.dumps(cfg.to_dict()) if cfg else "")
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        finally:
            store_api.fuses_rotation = fuses
        emit(row)
    tuned.export_configs(str(out / "tuned_store.json"))
    tuned.set_cache_path(None)
    f.close()


def extend_peers(shape) -> tuple[float | None, float | None, str]:
    """Median ms of cuDNN and flash SDPA prefill on dense bf16 GQA K/V: the chunk's queries [B, Hq, C, D] over
    prefix + chunk keys [B, Hk, L + C, D], non-causal (1.5% more scores than the causal chunk at a 32K prefix, 6% at
    8K: the peer does slightly more work than extend)."""
    import triton
    B, L, C, Hq, Hk, D = (shape[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
    q = torch.randn(B, Hq, C, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hk, L + C, D, device="cuda", dtype=torch.bfloat16)
    return _sdpa_peers(q, k, torch.randn_like(k),
                       lambda fn: triton.testing.do_bench(fn, warmup=5, rep=60, return_mode="median"))


def extend_gate(sch, Hq: int, Hk: int, D: int, backend: str) -> float:
    """Max relative error of extend (backend "auto", "triton", "dense" with 256-token buckets, or "onecall") against the
    float32 reference on an odd-shaped batch (prefixes 1000 / 4097 / 17 tokens; ragged chunks 64 / 40 / 3, or three of
    40 tokens for "onecall", which takes chunks of one length)."""
    from kvlab.kernels.extend import extend
    from paged_cases import call_args, make_paged
    P = page_size(sch)
    chan = sch.k.axis == "chan" or sch.v.axis == "chan"
    lens, cl = ([992, 4096, 32], [64, 40, 3]) if chan else ([1000, 4097, 17], [64, 40, 3])
    c = make_paged(lens, Hk, D, P, sch.k, sch.v, fp_lens=[3, 0, 20] if (sch.window or sch.sink or chan) else None,
                   device="cuda")
    args, kw = call_args(c)
    g = torch.Generator(device="cuda").manual_seed(0)
    if backend == "onecall":
        cl = [40, 40, 40]
    q, kn, vn = (torch.randn(sum(cl), h, D, device="cuda", generator=g, dtype=torch.bfloat16) for h in (Hq, Hk, Hk))
    qo = torch.tensor([0] + torch.tensor(cl).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    ref = extend(q.float(), kn.float(), vn.float(), qo, *args, sch.k, sch.v, P, **kw, backend="reference")
    got = extend(q, kn, vn, qo, *args, sch.k, sch.v, P, **kw, backend=backend,
                 out=torch.full_like(q, float("nan")), **({"dense_bucket": 256} if backend == "dense" else {})).float()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).abs().max() / ref.abs().max()).item()


def chunk_inputs(B: int, C: int, Hq: int, Hk: int, D: int, device: str = "cuda") -> tuple:
    """B chunks of C tokens on `device`, bf16: q [B C, Hq, D] (scaled by 0.3), k_new / v_new [B C, Hk, D], qo_indptr."""
    q = torch.randn(B * C, Hq, D, device=device, dtype=torch.bfloat16) * 0.3
    kn, vn = (torch.randn(B * C, Hk, D, device=device, dtype=torch.bfloat16) for _ in range(2))
    return q, kn, vn, torch.arange(0, B * C + 1, C, dtype=torch.int32, device=device)


def extend_cell(sch, shape: dict, backend: str, config=None, host: bool = False, graphs: bool = True) -> float:
    """Median ms of one extend call through the public API, repeated on one shape. host: the lengths passed on the
    host (`host_lens`, as the pool's prefill passes them), so the call never synchronizes; at batch 1 the default then
    replays the call's CUDA graph after two eager calls (`extend/graphs.py`); graphs=False keeps it eager."""
    import triton

    from kvlab.eval.speed import fp_tokens_of
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.extend import extend
    B, L, C, Hq, Hk, D = (shape[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
    P = page_size(sch)
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, "cuda")
    W = fp_tokens_of(sch)
    fp = dict(k_fp=None, v_fp=None, fp_len=None)
    if W:
        fp["k_fp"] = torch.randn(B, Hk, W, D, device="cuda", dtype=torch.bfloat16)
        fp["v_fp"] = torch.randn_like(fp["k_fp"])
        fp["fp_len"] = torch.full((B,), W, dtype=torch.int32, device="cuda")
    q, kn, vn, qo = chunk_inputs(B, C, Hq, Hk, D)
    out = torch.empty_like(q)
    hl = (qo.tolist(), c["kv_indptr"].tolist(), c["kv_last_page_len"].tolist()) if host else None

    def fn():
        return extend(q, kn, vn, qo, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"],
                      c["kv_last_page_len"], sch.k, sch.v, P, **fp, k_tensor_scale=c["k_ts"],
                      v_tensor_scale=c["v_ts"], max_qo_len=C, backend=backend, config=config, out=out, host_lens=hl,
                      graphs=graphs)
    fn()
    torch.cuda.synchronize()
    first = triton.testing.do_bench(fn, warmup=1, rep=20, return_mode="median")
    rep = min(400.0, max(40.0, 15 * first))  # at least ~15 calls, at most 0.4 s per cell
    return triton.testing.do_bench(fn, warmup=2, rep=rep, return_mode="median")


def extend_fresh(sch, shape: dict, n: int = 6) -> tuple[float, float]:
    """(first-call ms, mean wall ms of the next `n`) default-dispatch extend calls, each on a prefix length not seen
    before (L - 32 (i + 1) - 7), as a prefill's chunks are. The first call pays the dense attention's plan for its bucket
    (cuDNN builds one per shape); the next ones share that bucket and must not pay it again."""
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.extend import extend
    B, L, C, Hq, Hk, D = (shape[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
    P = page_size(sch)
    q, kn, vn, qo = chunk_inputs(B, C, Hq, Hk, D)
    tot, first = 0.0, None
    for i in range(0, n + 1):
        c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L - 32 * (i + 1) - 7 * (sch.k.axis != "chan"), "cuda", seed=i)
        torch.cuda.synchronize()
        t = time.perf_counter()
        extend(q, kn, vn, qo, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"],
               sch.k, sch.v, P, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], max_qo_len=C)
        torch.cuda.synchronize()
        if first is None:
            first = (time.perf_counter() - t) * 1e3
        else:
            tot += time.perf_counter() - t
    return first, tot / n * 1e3


def extend_fresh_host(sch, shape: dict, n: int = 12) -> tuple[float, float, dict]:
    """(first-call ms, mean wall ms of the next `n`, graph counts) of default-dispatch extend calls with host lengths
    over one pool's pages, each call on a prefix length not seen before within one bucket (L - 32 (i + 1) - 7, the
    block table cut to it), as a server's batch-1 prefills of similar lengths are: two eager calls, a capture, then
    replays."""
    from kvlab.kernels.autotune import synthetic_cache
    from kvlab.kernels.extend import extend, graphs
    B, L, C, Hq, Hk, D = (shape[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
    P = page_size(sch)
    q, kn, vn, qo = chunk_inputs(B, C, Hq, Hk, D)
    c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, "cuda", seed=1)
    graphs.clear()
    graphs.STATS.clear()
    walls = []
    for i in range(0, n + 1):
        Li = L - 32 * (i + 1) - 7 * (sch.k.axis != "chan")
        npg = -(-Li // P)
        host = (qo.tolist(), [0, npg], [Li - (npg - 1) * P])
        ind, last = (torch.tensor(h, dtype=torch.int32, device="cuda") for h in host[1:])
        torch.cuda.synchronize()
        t = time.perf_counter()
        extend(q, kn, vn, qo, c["k_pages"], c["v_pages"], ind, c["kv_indices"][:npg], last, sch.k, sch.v, P,
               k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], max_qo_len=C, host_lens=host)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
    first, rest = walls[0], walls[1:]
    return first, sum(rest) / n, dict(graphs.STATS, calls_ms=" ".join(f"{w:.1f}" for w in rest))


FUSED_SWEEP = [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=st)
               for bm, bn, w, st in ((64, 32, 4, 2), (128, 32, 8, 2), (128, 64, 8, 2), (128, 64, 8, 3),
                                     (64, 64, 4, 3), (128, 128, 8, 2), (256, 64, 8, 2))]


def case_extend(out: Path, h: dict, names, args) -> None:
    import kvlab
    from kvlab.kernels import tuned
    emit, f = _writer(out / "extend.csv", EXTEND_COLUMNS)
    tuned.set_cache_path(os.devnull)  # what a new user gets
    t0 = time.time()
    for sname in args.extend_shapes.split(","):
        shape = EXTEND_SHAPES[sname]
        cudnn, flash, perr = extend_peers(shape)
        B, L, C, Hq, Hk, D = (shape[k] for k in ("batch", "prefix", "chunk", "heads_q", "heads_kv", "head_dim"))
        flops = 4.0 * B * C * Hq * D * (L + C / 2)
        for name in names:
            sch = kvlab.scheme(SCHEMES[name])
            base = dict(scheme=name, page_size=page_size(sch), cudnn_bf16_ms=cudnn, flash_bf16_ms=flash, error=perr,
                        **shape)
            backends = [b for b in args.extend_backends.split(",") if b != "auto_flash" or name in ("bf16", "q4_0", "kivi4")]
            if sname == args.extend_sweep_shape and name in args.extend_sweep.split(","):
                backends += [json.dumps(c) for c in FUSED_SWEEP]
            for backend in backends:
                cfg = None
                if backend.startswith("{"):
                    cfg, backend = json.loads(backend), "triton"
                row = {**base, "backend": backend, "config": json.dumps(cfg) if cfg else ""}
                if time.time() - t0 > args.extend_budget:
                    emit({**row, "error": perr + "skipped: time budget"})
                    continue
                if backend == "auto_flash":  # the dense prefix through flash instead of cuDNN
                    os.environ["KVLAB_DENSE_ATTN"] = "flash"
                    backend = "auto"
                eager = backend.endswith("_eager")  # graphs=False: every call eager
                backend = backend[:-len("_eager")] if eager else backend
                host = backend.endswith("_host")  # the lengths on the host (no synchronization), as a pool passes them
                backend = backend[:-len("_host")] if host else backend
                try:
                    first_shape = sname == args.extend_shapes.split(",")[0]
                    if row["backend"] == "auto" and first_shape and name in args.fresh.split(","):
                        first, fresh = extend_fresh(sch, shape)
                        emit(dict(row, backend="auto_fresh", median_ms=fresh,
                                  config=f"mean of 6 new prefix lengths in one bucket; the first call {first:.1f} ms"))
                    if row["backend"] == "auto_host" and shape["batch"] == 1 and name in args.fresh.split(","):
                        first, fresh, st = extend_fresh_host(sch, shape)
                        emit(dict(row, backend="auto_host_fresh", median_ms=fresh, ratio_vs_cudnn=fresh / cudnn,
                                  config=f"mean of 12 new prefix lengths in one bucket of one pool's pages; the first "
                                  f"call {first:.1f} ms; graphs {st}"))
                    if cfg is None and first_shape:
                        row["gate_rel_err"] = extend_gate(sch, Hq, Hk, D, backend)
                        if backend == "auto":  # the gate's shapes are below auto's dense thresholds: check dense too
                            row["gate_rel_err"] = max(row["gate_rel_err"], extend_gate(sch, Hq, Hk, D, "dense"))
                        if not row["gate_rel_err"] <= GATE_TOL:
                            emit({**row, "error": perr + f"gate failed: rel err {row['gate_rel_err']:.3g}; not timed"})
                            continue
                    ms = extend_cell(sch, shape, backend, cfg, host=host, graphs=not eager)
                    row.update(median_ms=ms, ratio_vs_cudnn=ms / cudnn if cudnn else None, tflops=flops / ms / 1e9)
                except Exception as e:  # noqa: BLE001 - one failing cell must not end the run
                    row["error"] = perr + f"{type(e).__name__}: {str(e)[:300]}"
                finally:
                    os.environ.pop("KVLAB_DENSE_ATTN", None)
                emit(row)
                torch.cuda.empty_cache()
    tuned.set_cache_path(None)
    f.close()


CASES = {"decode": case_decode, "store": case_store, "extend": case_extend}


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--shapes", default="b32,b1", help=f"decode shapes, of {','.join(SHAPES)}")
    ap.add_argument("--store-prerot", default="", help="rotated schemes also stored with the rotation done by torch "
                    "before the kernel (backend triton_prerotated), beside the fused rotation")
    ap.add_argument("--tuned", default=str(ROOT / "sweeps/results/h200/tuned_configs.json"),
                    help="tuned-config file for the dispatch=tuned rows ('' to skip them)")
    ap.add_argument("--dispatch", default="tuned,default,heuristic",
                    help="decode rows per cell, of tuned (needs --tuned), default, heuristic")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds of decode timing before cells are skipped")
    ap.add_argument("--extend-shapes", default="p8k_b1,p32k_b1,p8k_b8,p32k_b8,smollm2_p8k,d256_p8k",
                    help=f"extend shapes, of {','.join(EXTEND_SHAPES)} (the first also runs the correctness gate)")
    ap.add_argument("--extend-sweep", default="bf16,q4_0,fp8_e4m3,kivi4",
                    help="schemes whose fused-kernel configs are swept (FUSED_SWEEP) at --extend-sweep-shape")
    ap.add_argument("--extend-sweep-shape", default="p32k_b1")
    ap.add_argument("--fresh", default="bf16,q4_0", help="schemes timed on prefixes of new lengths (auto_fresh rows)")
    ap.add_argument("--extend-backends", default="auto,auto_host,triton,auto_flash",
                    help="extend rows per scheme: auto (default dispatch), triton (the fused kernel alone), dense (the dense "
                         "prefix for every sequence), X_host (X with the lengths on the host), auto_flash "
                         "(the dense part through flash instead of cuDNN; bf16, q4_0, kivi4 only)")
    ap.add_argument("--extend-budget", type=float, default=420.0, help="seconds of extend timing before cells are skipped")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.schemes.split(",") if n]
    unknown = (sorted(set(names) - set(SCHEMES)) + sorted(set(args.cases.split(",")) - set(CASES))
               + sorted(set(args.shapes.split(",")) - set(SHAPES))
               + sorted(set(args.extend_shapes.split(",")) - set(EXTEND_SHAPES))
               + sorted(set(args.dispatch.split(",")) - {"tuned", "default", "heuristic"}))
    if unknown:
        raise SystemExit(f"unknown schemes / cases / shapes / dispatch {unknown}; allowed: {sorted(SCHEMES)} / "
                         f"{sorted(CASES)} / {sorted(SHAPES)} / ['default', 'heuristic', 'tuned']")
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(), "kvlab_triton_cache"))
    h = header(out, args)
    print("header", h, flush=True)
    for case in args.cases.split(","):
        CASES[case](out, h, names, args)
    return out


if __name__ == "__main__":
    main()
