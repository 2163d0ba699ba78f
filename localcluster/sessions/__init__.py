"""Sessions: where per-node plans run (see `base`)."""

from .base import Session, SessionState
from .local import LocalSession
from .localhost import LocalHostScheduler

__all__ = ["Session", "SessionState", "LocalSession", "LocalHostScheduler"]
