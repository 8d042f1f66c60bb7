"""kvlab.report: the figures and tables the sweep report, the notebooks and the paper share, drawn from
result tables (pandas DataFrames read from sweeps/results/), so all three show the same picture."""
from .figures import FAMILY_ORDER, family, pareto_panels, speedup_bars

__all__ = ["FAMILY_ORDER", "family", "pareto_panels", "speedup_bars"]
