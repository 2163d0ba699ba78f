"""How RaySession's small values cross Ray: as pickled bytes.

Ray serializes every argument and reply of an actor call on its own
general path (msgpack, then cloudpickle with each numpy array an
out-of-band buffer), which for a few small values costs more per call
than the call's own work -- a run's request and reply, a queue's small
records.  A ``bytes`` value Ray moves as a raw buffer, skipping that
path; pickled here (the standard library's pickle, which takes
localcluster's own classes and numpy arrays) and unpickled at the other
end, the same values cost a few microseconds.  Values holding more than
`SMALL` bytes of arrays stay Ray's: its out-of-band buffers spare them
the copies pickling would add.
"""

import pickle

__all__ = ["SMALL", "pack", "unpack", "array_bytes"]

#: bytes of arrays a value may hold and still travel pickled
SMALL = 64 * 1024


def array_bytes(values):
    """Bytes of the numpy arrays (and other buffers) among ``values``."""
    return sum(getattr(v, "nbytes", 0) for v in values)


def pack(value):
    """``value`` as the bytes Ray moves as they are."""
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def unpack(value):
    """What `pack` packed (a value that was not packed, as it is)."""
    if isinstance(value, bytes):
        return pickle.loads(value)
    return value
