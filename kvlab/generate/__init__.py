"""kvlab.generate: the decoder generating through a real paged pool and the kernels (`python -m kvlab.generate`)."""
from .backend import PagedBackend
from .run import generate

__all__ = ["PagedBackend", "generate"]
