"""Sessions: where per-node plans run (see `base`)."""

from .base import Session, SessionState
from .local import LocalSession

__all__ = ["Session", "SessionState", "LocalSession"]
