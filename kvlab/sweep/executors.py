"""Executors: run cells and hand each finished row to a callback (the parent writes results).

local: in this process (CPU, or one GPU); with several visible GPUs, one worker process per GPU.
ray:   each cell a Ray task (num_gpus=1 on GPU, num_cpus=1 on CPU), on a local or remote cluster.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

from .stages import run_cell, warm_cell

EXECUTORS = ("local", "ray")


_DEVICE = "cpu"
_COST = {"model": 3, "attention": 2, "roundtrip": 1}  # relative cell cost, for scheduling only
WARM_TIMEOUT_S = 900.0  # the pool's speed-cell compiles (about 100 s for the default GPU sweep)


def _worker_init(queue, device: str, threads: int) -> None:
    global _DEVICE
    _DEVICE = device
    slot = queue.get()
    if device == "cuda":
        os.environ["CUDA_VISIBLE_DEVICES"] = str(slot)  # before torch initialises CUDA in this process
    import torch
    torch.set_num_threads(threads)


def _run(cell: dict) -> dict:
    return run_cell(cell, _DEVICE)


def _warm(cell: dict) -> None:
    warm_cell(cell, _DEVICE)


def run_local(cells: list[dict], device: str, on_row: Callable[[dict], None], workers: int | None = None) -> None:
    """Run cells here (workers=1) or in `workers` processes; on CUDA the default is one worker per
    visible GPU. With several workers on CUDA: the pool compiles every speed cell's kernels and runs
    the short cells (roundtrip, attention); then this process times the speed cells one at a time
    while the pool is idle, so no timing shares the GPU; then the pool runs the model cells. A
    sweep cut short by a time limit therefore loses model cells (resumable), not the timings."""
    n_gpus = 0
    if device == "cuda":
        import torch
        n_gpus = torch.cuda.device_count()
    workers = workers or max(1, n_gpus)
    if workers <= 1:
        for c in cells:
            on_row(run_cell(c, device))
        return
    import multiprocessing as mp
    ctx = mp.get_context("spawn")  # CUDA needs spawn; each worker pins its GPU before importing torch
    q = ctx.Queue()
    for i in range(workers):
        q.put(i % max(1, n_gpus))
    threads = max(1, (os.cpu_count() or 1) // workers)
    timed = [c for c in cells if c["stage"] == "speed"] if device == "cuda" else []
    # longest cells first, so the pool does not end waiting on a few slow model cells
    rest = sorted((c for c in cells if c not in timed), key=lambda c: _COST.get(c["stage"], 0), reverse=True)
    with ctx.Pool(workers, initializer=_worker_init, initargs=(q, device, threads)) as pool:
        if timed:
            warm = pool.map_async(_warm, timed)  # compiles first (CPU-bound, untimed)
            for row in pool.imap_unordered(_run, [c for c in rest if c["stage"] != "model"]):
                on_row(row)
            warm.wait(WARM_TIMEOUT_S)  # a worker killed mid-compile never reports: go on, the timed run compiles
            for c in timed:
                on_row(_timed(c, device))
            rest = [c for c in rest if c["stage"] == "model"]
        for row in pool.imap_unordered(_run, rest):
            on_row(row)


def _timed(cell: dict, device: str, report_after_s: float = 60.0) -> dict:
    """run_cell for a speed cell; if it runs past report_after_s, every thread's stack goes to
    stderr (a compile the warm-up missed, or a hang, shows where it is)."""
    import faulthandler
    import sys
    try:
        faulthandler.dump_traceback_later(report_after_s, exit=False, file=sys.__stderr__ or sys.stderr)
        armed = True
    except (AttributeError, OSError, ValueError):  # no real file behind stderr (notebooks, captured output)
        armed = False
    try:
        return run_cell(cell, device)
    finally:
        if armed:
            faulthandler.cancel_dump_traceback_later()


def run_ray(cells: list[dict], device: str, on_row: Callable[[dict], None], address: str | None = None) -> None:
    try:
        import ray
    except ImportError:
        raise ValueError("--executor ray needs Ray: pip install 'kvlab[ray]'") from None
    started = False
    if not ray.is_initialized():
        kwargs = {"address": address} if address else {"num_cpus": os.cpu_count(), "include_dashboard": False}
        ray.init(ignore_reinit_error=True, log_to_driver=False, **kwargs)
        started = True
    try:
        opts = {"num_gpus": 1} if device == "cuda" else {"num_cpus": 1}
        task = ray.remote(**opts)(run_cell)
        pending = [task.remote(c, device) for c in cells]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                on_row(ray.get(ref))
    finally:
        if started:
            ray.shutdown()


def execute(cells: Iterable[dict], device: str, on_row, executor: str = "local", address: str | None = None,
            workers: int | None = None) -> None:
    """Run `cells` with `executor`, calling on_row(row) in this process for each finished cell."""
    cells = list(cells)
    if executor == "local":
        run_local(cells, device, on_row, workers)
    elif executor == "ray":
        run_ray(cells, device, on_row, address)
    else:
        raise ValueError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
