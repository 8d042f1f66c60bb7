"""kvlab.generate: the decoder generating through a real paged pool and the kernels (`python -m kvlab.generate`)."""
from .backend import PagedBackend, StepBackend
from .batcher import Batcher, Request
from .run import generate

__all__ = ["PagedBackend", "StepBackend", "Batcher", "Request", "generate"]
