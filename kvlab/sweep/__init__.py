"""kvlab.sweep: YAML grid -> cells -> executor (local, multi-GPU, Ray) -> results table -> Pareto frontier."""
from .cells import Cell, expand_cells
from .config import SweepConfig, load_config, parse_config

__all__ = ["Cell", "expand_cells", "SweepConfig", "load_config", "parse_config"]
