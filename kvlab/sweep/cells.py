"""Cells: scheme x stage x shape, each with a stable id (so `--resume` can skip finished ones)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from .config import SweepConfig


class Skip(Exception):
    """A cell this device or scheme cannot run (reported as status 'skipped: ...')."""


@dataclass(frozen=True)
class Cell:
    index: int          # position in the sweep (the results table is ordered by it)
    scheme: str         # canonical scheme text
    name: str           # preset name or the text
    stage: str
    shape: str          # distribution, "text:tokens", or a speed shape tag like B32-L32768-Hq32-Hk8-D128-P16
    params: tuple       # sorted (key, value) items of the stage settings this cell runs with

    @property
    def id(self) -> str:
        blob = json.dumps([self.scheme, self.stage, self.shape, self.params], sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]

    def to_dict(self) -> dict:
        """Plain, picklable form handed to executors (`stages.run_cell`)."""
        return {"cell_id": self.id, "index": self.index, "scheme": self.scheme, "name": self.name,
                "stage": self.stage, "shape": self.shape,
                "params": json.dumps({k: json.loads(v) for k, v in self.params}, sort_keys=True),
                "params_items": json.dumps(list(self.params))}


def shape_tag(s: dict) -> str:
    return (f"B{s['batch']}-L{s['context']}-Hq{s['heads_q']}-Hk{s['heads_kv']}-D{s['head_dim']}"
            f"-P{s['page_size']}")


def expand_cells(cfg: SweepConfig, seed: int | None = None) -> list[Cell]:
    """All cells of a sweep, in a deterministic order (stage-major: cheap stages first)."""
    seed = cfg.seed if seed is None else seed
    cells = []
    for stage, params in cfg.stages.items():
        common = {k: v for k, v in params.items() if k not in ("distributions", "shapes")}
        common.update(seed=seed, model=cfg.model)
        if stage == "roundtrip":
            shapes = [(d, {**common, "distribution": d}) for d in params["distributions"]]
        elif stage == "speed":
            shapes = [(shape_tag(s), {**common, "shape": s}) for s in params["shapes"]]
        else:
            shapes = [(f"{params['text']}:{params['tokens']}", common)]
        for s in cfg.schemes:
            for tag, p in shapes:
                items = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in p.items()))
                cells.append(Cell(len(cells), str(s), s.name or str(s), stage, tag, items))
    return cells
