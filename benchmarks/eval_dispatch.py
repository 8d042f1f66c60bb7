"""What one model-stage cell dispatches: torch ops and device syncs, counted on any device.

    python benchmarks/eval_dispatch.py --tokens 512 int2:g16:sym            # eval + passkey: ops, syncs, their sources
    python benchmarks/eval_dispatch.py --step int2:g16:sym "q4_0,window=128,sink=4"   # ops of one decode step

Counts every aten op with a TorchDispatchMode; a sync is an op that reads a value back to the host
(`_local_scalar_dense`: .item(), int(), bool(); `equal`; `nonzero`); `.tolist()` is no aten op and
goes uncounted (one per verification or continuation batch). Each sync waits for the device,
which for several processes time-sliced on one GPU means waiting for the others' turns
(sweeps/results/h200/README.md). Eval = PPL/KL/top-1 over 4 segments + 16 greedy tokens;
passkey = lengths (T, 2T). Reference passes are warmed first, as in a sweep worker.
"""
from __future__ import annotations

import argparse
import collections
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC = {"aten._local_scalar_dense.default", "aten.equal.default", "aten.nonzero.default"}


class Count(TorchDispatchMode):
    def __init__(self, where: bool = True):
        super().__init__()
        self.ops, self.syncs, self.where = 0, collections.Counter(), where

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        if str(func) in SYNC and self.where:
            fr = [f for f in traceback.extract_stack()[:-1] if "/kvlab/" in f.filename]
            self.syncs[" < ".join(f"{f.filename.split('/kvlab/')[1]}:{f.lineno}" for f in fr[-3:][::-1])] += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("schemes", nargs="+")
    ap.add_argument("--tokens", type=int, default=512, help="segment length and first passkey length")
    ap.add_argument("--step", action="store_true", help="count one decode step after a 200-token prefill")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    from kvlab.eval.faithful import DecodeFaithfulBackend
    from kvlab.eval.passkey import passkey
    from kvlab.eval.perplexity import evaluate_scheme
    from kvlab.model import load_model
    from kvlab.spec import scheme
    model, tok = load_model("smollm2", device=a.device, dtype=torch.float32)
    T = a.tokens
    for name in a.schemes:
        sch = scheme(name)
        if a.step:
            b = DecodeFaithfulBackend(sch, model.config.n_layers)
            model(torch.arange(100, 300, device=a.device)[None], backend=b, last=1)
            c = Count(where=False)
            with c:
                model(torch.tensor([[5]], device=a.device), backend=b, last=1)
            print(f"{name:40s} decode step: {c.ops} ops ({c.ops / model.config.n_layers:.0f} per layer)")
            continue
        jobs = {"eval": lambda: evaluate_scheme(model, tok, sch, n_tokens=T, n_segments=4, greedy_tokens=16),
                "passkey": lambda: passkey(model, tok, sch, lengths=(T, 2 * T))}
        for phase, job in jobs.items():
            job()  # warm the per-process reference caches
            c = Count()
            with c:
                job()
            print(f"{name:40s} {phase:8s} ops={c.ops:8d} syncs={sum(c.syncs.values()):6d}")
            for where, n in c.syncs.most_common(5):
                print(f"    {n:6d}  {where}")


if __name__ == "__main__":
    main()
