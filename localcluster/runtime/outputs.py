"""Storing what an op returned into the workspace (the executor's side
of an op's outputs): plain results, and the records a lending op (a
queue read) hands out only until its ``done`` callback."""

import sys

import numpy as np

__all__ = ["store", "store_lent"]


def store(outputs, result, lenient, put):
    n_out = len(outputs)
    if result is None:
        if lenient:
            return
        raise ValueError(f"returned None for {n_out} outputs")
    if n_out == 1:
        if isinstance(result, (tuple, list)):
            if len(result) != 1:
                raise ValueError(f"returned {len(result)} values for 1 output")
            result = result[0]
        put(outputs[0], np.asarray(result))
        return
    if not isinstance(result, (tuple, list)) or len(result) != n_out:
        raise ValueError(f"returned {_describe(result)} for {n_out} outputs")
    for name, value in zip(outputs, result):
        put(name, np.asarray(value))


def store_lent(outputs, lent, lenient, put, ws):
    """Store what a lending op returned -- ``(outputs, done)`` -- copying
    the outputs (a node's shared-memory store copies anyway), then hand
    the memory back.  Elsewhere an output is copied into the array ``ws``
    holds for it if that has its layout and nothing else refers to it (no
    view, other blob or fetched result; references: the workspace's,
    ``current``, getrefcount's argument): no fresh memory per record."""
    result, done = lent
    try:
        if done is None or (ws.parent is None and ws.store.copies):
            store(outputs, result, lenient, put)
        else:
            own, lookup = ws.own, ws.get_or_none
            refcount, ndarray = sys.getrefcount, np.ndarray
            for name, value in zip(outputs, result):
                current = own.get(name)   # where a reader's outputs live
                if current is None:
                    current = lookup(name)
                if type(current) is ndarray and \
                        current.shape == value.shape and \
                        current.dtype == value.dtype and \
                        refcount(current) == 3:
                    flags = current.flags
                    if flags.owndata and flags.writeable:
                        current[...] = value
                        continue
                ws.set(name, np.array(value))
    finally:
        if done is not None:
            done()


def _describe(result):
    if isinstance(result, (tuple, list)):
        return f"{len(result)} values"
    return f"one {type(result).__name__}"
