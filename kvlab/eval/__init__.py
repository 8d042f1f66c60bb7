"""kvlab.eval: distributions, error metrics, round trips; attention delta, perplexity/KL, speed."""
from .distributions import DISTRIBUTIONS, sample
from .metrics import all_metrics, max_abs, rel_l1, rel_l2, sqnr_db
from .roundtrip import roundtrip, roundtrip_scheme

__all__ = ["DISTRIBUTIONS", "sample", "all_metrics", "rel_l1", "rel_l2", "sqnr_db", "max_abs", "roundtrip",
           "roundtrip_scheme"]
