"""Memory safety of the GPU kernels: run every kernel once on small odd shapes, for compute-sanitizer.

    for t in memcheck racecheck initcheck; do
      compute-sanitizer --tool $t --error-exitcode 9 --log-file sanitizer/$t.log python benchmarks/sanitize.py
    done

Store (general and group-row tiles, channel axis, rotation, codebooks, e4m3 / e8m0 scales), Triton decode
(operand and rowfirst layouts, asm fast paths, splits, fp window, pages of 1 / 16 / 64, GQA 1..8), Gluon
decode (int4 / int8 / fp8 codecs, windows, splits), Triton extend (ragged chunks over a quantized prefix).
Pages are zero-filled, not torch.empty: the kernels read whole rows of a page past a sequence's end and mask
the result (a design choice, safe within the allocation), which initcheck would otherwise report as reads
of memory no one wrote. Prints one line per launch group and "sanitize: ok" at the end. SANITIZE_QUICK=1:
one of the three shapes per scheme (rotating), one Gluon shape.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kvlab  # noqa: E402
from kvlab.cache import KVPool  # noqa: E402
from kvlab.kernels import GluonDecodeConfig, TritonDecodeConfig  # noqa: E402
from kvlab.kernels.decode import decode  # noqa: E402
from kvlab.kernels.extend import extend  # noqa: E402
from kvlab.kernels.store import pool_store  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU (TRITON_INTERPRET=1) only smoke-tests the script
STORE_DECODE = ["q4_0", "q4_1", "q8_0", "fp8_e4m3", "int3:g32:asym", "int2:g16:asym", "int6:g32:sym:pack=ggml",
                "mxfp4", "nvfp4", "nf4", "iq4nl", "int4:g32:asym:rot=had", "kivi4", "kivi2", "bf16",
                "k=q8_0,v=int3:g32:asym,window=5,sink=2"]
GLUON = ["q4_0", "q8_0", "fp8_e4m3", "q4_1", "int4_had", "k=q8_0,v=q4_0,window=16"]


def _pool(name: str, D: int, Hk: int, P: int, lens, seed: int = 0) -> KVPool:
    """A one-layer pool filled through the Triton store kernel (prefill, then three decode steps)."""
    sch = kvlab.scheme(name)
    if sch.k.axis == "chan":
        P = max(P, sch.k.group)
    n_pages = sum(-(-(n + 3) // P) for n in lens) + 2
    pool = KVPool(sch, 1, Hk, D, n_pages=n_pages, page_size=P, max_seqs=len(lens), device=DEV, store=pool_store)
    for t in (*pool.k_pages[0].values(), *pool.v_pages[0].values()):
        if t is not None:
            t.view(torch.uint8).zero_()
    g = torch.Generator(device=DEV).manual_seed(seed)
    sids = [pool.add_sequence() for _ in lens]
    for sid, n in zip(sids, lens):
        pool.append(sid, 0, torch.randn(n, Hk, D, device=DEV, generator=g),
                    torch.randn(n, Hk, D, device=DEV, generator=g))
    for _ in range(3):
        pool.append_batch(sids, 0, torch.randn(len(sids), Hk, D, device=DEV, generator=g),
                          torch.randn(len(sids), Hk, D, device=DEV, generator=g))
    return pool


def _args(pool: KVPool):
    lc = pool.layer_cache(0)
    ids = pool.seq_ids
    bt, fp = pool.block_table(ids), pool.fp_buffer(0, ids)
    has_fp = fp.k.shape[2] > 0
    return ((lc.k_pages, lc.v_pages, bt.kv_indptr, bt.kv_indices, bt.kv_last_page_len, lc.k_spec, lc.v_spec,
             pool.page_size),
            dict(k_fp=fp.k if has_fp else None, v_fp=fp.v if has_fp else None, fp_len=fp.length if has_fp else None,
                 k_tensor_scale=lc.k_tensor_scale, v_tensor_scale=lc.v_tensor_scale))


def main() -> None:
    torch.manual_seed(0)
    shapes = ((64, 8, 2, 16, [1, 17, 63]), (128, 8, 8, 1, [5, 40]), (128, 32, 4, 64, [70, 3]))
    quick = os.environ.get("SANITIZE_QUICK") == "1"  # one shape a scheme (memcheck runs ~30x slower)
    for i, name in enumerate(STORE_DECODE):
        for D, Hq, Hk, P, lens in shapes[i % 3:i % 3 + 1] if quick else shapes:
            pool = _pool(name, D, Hk, P, lens)
            args, kw = _args(pool)
            q = torch.randn(len(lens), Hq, D, device=DEV, dtype=torch.bfloat16)
            for cfg in (TritonDecodeConfig(num_splits=3), TritonDecodeConfig(block_n=32, num_splits=1, asm=False),
                        TritonDecodeConfig(layout="rowfirst", num_splits=2)):
                decode(q, *args, **kw, config=cfg)
            C = [2, 5, 1][:len(lens)]
            qo = torch.tensor([0, *torch.tensor(C).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
            kn = torch.randn(sum(C), Hk, D, device=DEV, dtype=torch.bfloat16)
            extend(torch.randn(sum(C), Hq, D, device=DEV, dtype=torch.bfloat16), kn, kn.clone(), qo, *args, **kw)
        torch.cuda.synchronize() if DEV == "cuda" else None
        print(f"store + triton decode + extend: {name}", flush=True)
    for name in GLUON if DEV == "cuda" else []:
        for Hq, Hk, P, lens in ((32, 8, 16, [1, 17, 63, 300]), (16, 2, 64, [5, 130]))[:1 if quick else 2]:
            pool = _pool(name, 128, Hk, P, lens)
            args, kw = _args(pool)
            q = torch.randn(len(lens), Hq, 128, device=DEV, dtype=torch.bfloat16)
            for cfg in (GluonDecodeConfig(num_splits=3), GluonDecodeConfig(tokens_per_warp=32, num_splits=1),
                        GluonDecodeConfig(num_warps=8, tokens_per_warp=32, num_splits=2, transpose_o=False)):
                decode(q, *args, **kw, config=cfg)
        torch.cuda.synchronize() if DEV == "cuda" else None
        print(f"gluon decode: {name}", flush=True)
    print("sanitize: ok", flush=True)


if __name__ == "__main__":
    main()
