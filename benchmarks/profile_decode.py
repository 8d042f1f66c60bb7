"""One decode launch per scheme for Nsight Compute (stall reasons, occupancy, DRAM and smem traffic).

    bash benchmarks/profile_decode.sh q4_0 q8_0 fp8_e4m3 bf16      # on the H200 (device call)

The driver builds the B=32 x 32K synthetic cache (Hq 32, Hk 8, D 128, page 16; 32 for channel-axis keys) and launches the
decode kernel three times with `--config` (the shell wrapper tunes in a separate process and
passes the winner; without --config the driver tunes itself, and ncu would see those launches
too); the wrapper has ncu skip the first two launches and profile the third.
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--config", help="JSON config instead of tuning (e.g. to profile one variant)")
    a = ap.parse_args()
    import json

    from kvlab.kernels.autotune import synthetic_cache, tune
    from kvlab.kernels.configs import config_from_dict
    from kvlab.kernels.decode import decode
    from kvlab.spec import scheme
    B, Hq, Hk, D, L = a.batch, 32, 8, 128, a.context
    for name in a.schemes:
        sch = scheme(name)
        P = 32 if sch.k.axis == "chan" else 16  # channel-axis keys (kivi4): a page holds a whole group
        shape = {"batch": B, "heads_q": Hq, "heads_kv": Hk, "head_dim": D, "page_size": P, "context": L}
        cfg = config_from_dict("decode", json.loads(a.config)) if a.config else tune(
            "decode", sch, shape, quick=True, save=False)[0]
        c = synthetic_cache(sch.k, sch.v, B, Hk, D, P, L, "cuda")
        q = torch.randn(B, Hq, D, device="cuda", dtype=torch.bfloat16)
        run = decode(q, c["k_pages"], c["v_pages"], c["kv_indptr"], c["kv_indices"], c["kv_last_page_len"], sch.k,
                     sch.v, P, k_tensor_scale=c["k_ts"], v_tensor_scale=c["v_ts"], config=cfg, plan=True)
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        print(f"profiled {name}: {cfg}", flush=True)


if __name__ == "__main__":
    main()
