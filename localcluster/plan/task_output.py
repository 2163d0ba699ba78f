"""`TaskOutput`: what a task hands back from a run, by blob name."""

from ..errors import PlanError
from .net import BlobRef, blob_names

__all__ = ["TaskOutput"]


class TaskOutput:
    """An output of a Task: blob names now, fetched values after a run.

    ``get()`` returns the output's BlobRef (or list of them, or the record
    of them); ``fetch()`` returns the value(s) captured when the last run
    that included the task ended.
    """

    def __init__(self, blobs):
        self._schema = None
        if isinstance(blobs, dict):
            self._schema = list(blobs)
            self.names = [BlobRef(b) for b in blobs.values()]
            self._is_scalar = False
        elif isinstance(blobs, str):
            self.names = [BlobRef(blobs)]
            self._is_scalar = True
        else:
            self.names = [BlobRef(b) for b in blob_names(list(blobs),
                                                           "task outputs")]
            self._is_scalar = False
        self._values = None

    def __repr__(self):
        return f"TaskOutput({[str(n) for n in self.names]})"

    def _shape(self, items):
        if self._is_scalar:
            return items[0]
        if self._schema is not None:
            return dict(zip(self._schema, items))
        return list(items)

    def get(self):
        return self._shape(self.names)

    def set(self, values):
        """Called by sessions with the captured values, in name order."""
        if len(values) != len(self.names):
            raise ValueError(
                f"{self!r} expects {len(self.names)} values, got {len(values)}")
        self._values = list(values)

    def fetch(self):
        if self._values is None:
            raise PlanError(
                f"{self!r} has no value yet: run the task (or its group) in a"
                " session first")
        return self._shape(self._values)
