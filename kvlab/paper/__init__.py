"""kvlab.paper: the paper, regenerated from committed results (`python -m kvlab.paper`)."""
from .build import FILES, Paper
from .numbers import Numbers

__all__ = ["FILES", "Paper", "Numbers"]
