"""Executors: run cells and hand each finished row to a callback (the parent writes results).

local: in this process (CPU, or one GPU); with several visible GPUs, one worker process per GPU.
ray:   each cell a Ray task (num_gpus=1 on GPU, num_cpus=1 on CPU), on a local or remote cluster.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

from .stages import run_cell

EXECUTORS = ("local", "ray")


def _worker_init(queue) -> None:
    gpu = queue.get()
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)


def _run_on_gpu(cell: dict) -> dict:
    return run_cell(cell, "cuda")


def run_local(cells: list[dict], device: str, on_row: Callable[[dict], None]) -> None:
    n_gpus = 0
    if device == "cuda":
        import torch
        n_gpus = torch.cuda.device_count()
    if n_gpus <= 1:
        for c in cells:
            on_row(run_cell(c, device))
        return
    import multiprocessing as mp
    ctx = mp.get_context("spawn")  # CUDA needs spawn; each worker pins one GPU before importing torch
    q = ctx.Queue()
    for i in range(n_gpus):
        q.put(i)
    with ctx.Pool(n_gpus, initializer=_worker_init, initargs=(q,)) as pool:
        for row in pool.imap_unordered(_run_on_gpu, cells):
            on_row(row)


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


def execute(cells: Iterable[dict], device: str, on_row, executor: str = "local", address: str | None = None) -> None:
    """Run `cells` with `executor`, calling on_row(row) in this process for each finished cell."""
    cells = list(cells)
    if executor == "local":
        run_local(cells, device, on_row)
    elif executor == "ray":
        run_ray(cells, device, on_row, address)
    else:
        raise ValueError(f"unknown executor {executor!r}; allowed: {', '.join(EXECUTORS)}")
