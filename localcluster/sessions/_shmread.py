"""Reading node values out of shared memory, in the master.

A node answers a fetch or a run with descriptors -- ``{"segment",
"offset", "shape", "dtype"}`` or ``{"inline": array}`` for a value that
lives in no segment (object arrays) -- and the master maps the segment
(`SegmentReader.read`).  Mappings are cached by what they are (a node's
outbox, one of its blobs), so a replaced segment's mapping is dropped,
not kept next to the new one, and a dead node's go with it (`forget`).
"""

import numpy as np

from ..runtime import shm

__all__ = ["SegmentReader"]


class SegmentReader:
    def __init__(self):
        self._maps = {}   # (node, "outbox") / (node, "blob", name) -> map

    def read(self, key, desc, copy):
        """The value ``desc`` locates; ``key`` names what it is."""
        if "inline" in desc:
            return desc["inline"]
        segment = desc["segment"]
        cached = self._maps.get(key)
        if cached is not None and cached[0] == segment:
            mm = cached[1]
        else:
            mm = shm.map_segment(segment, inherit=False)
            if key[1] == "outbox" or not copy:
                self._maps[key] = (segment, mm)
            else:
                self._maps.pop(key, None)
        dtype = np.dtype(desc["dtype"])
        shape = tuple(desc["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        view = np.frombuffer(mm, dtype=dtype, count=count,
                             offset=desc.get("offset", 0)).reshape(shape)
        return np.array(view, copy=True) if copy else view

    def outputs(self, node, descriptors):
        """A run's outputs, copied out of ``node``'s outbox."""
        return {name: self.read((node, "outbox"), desc, copy=True)
                for name, desc in descriptors.items()}

    def forget(self, node):
        """Drop the mappings of ``node`` (it died)."""
        for key in [k for k in self._maps if k[0] == node]:
            del self._maps[key]

    def clear(self):
        self._maps.clear()
