"""Kernels of the data layer: queues and datasets.

Queue ops find their channel in the node's resources (see
`localcluster.runtime.channels`); dataset ops keep a dataset's cursor and
data in ordinary blobs, updated under the node's lock so concurrent
readers never read one record twice and concurrent writers never lose one.
"""

import numpy as np

from ..errors import Cancelled
from . import registry
from .registry import register_op


def _hub(ctx, queue):
    hub = ctx.resources.get("queues")
    if hub is None:
        raise RuntimeError(
            f"queue {queue!r} has no channel on node {ctx.node!r}: this "
            "session does not provide queues")
    return hub


def _channel(ctx, queue, capacity):
    return _hub(ctx, queue).channel(queue, capacity)


#: the ``finished`` output of a read whose fields are lent: the executor
#: copies every output of a lent record, so one shared, read-only array
#: does (a fresh one is made only where the outputs are stored as they are)
_NOT_FINISHED = np.array(False)
_NOT_FINISHED.flags.writeable = False


@register_op("EnqueueRecord", context=True)
def enqueue_record(ctx, *fields, queue=None, capacity=1):
    """Queue the fields as one record; outputs True if the queue is closed
    (the writer should stop)."""
    queued = _channel(ctx, queue, capacity).put(fields, ctx.cancelled,
                                                ctx.clock)
    return np.array(not queued)


def _bind_enqueue(ctx, queue=None, capacity=1):
    """`enqueue_record` bound to its op: a writer's loop runs it per
    record, and a partial's keywords, the hub's lookup and the context's
    attributes cost about what putting a small record does."""
    resources, cancelled, run, array = ctx.resources, ctx.cancelled, \
        ctx.run, np.array

    def enqueue(*fields):
        hub = resources.get("queues")
        if hub is None:
            _hub(ctx, queue)   # raises: no queues here
        return array(not hub.channel(queue, capacity).put(
            fields, cancelled, run.clock))
    return enqueue


registry.bind("EnqueueRecord", _bind_enqueue)


@register_op("DequeueRecords", context=True, min_outputs=1, max_outputs=None,
             lends=True)
def dequeue_records(ctx, queue=None, capacity=1, num_records=1,
                    num_fields=0):
    """(finished, *fields): up to ``num_records`` records concatenated
    along axis 0; ``finished`` is true once the queue is closed and empty.

    A single record comes back as the channel lent it (views on a shared
    slot, say): the executor copies it into the workspace before handing
    the slot back."""
    records, finished, done = _channel(ctx, queue, capacity).get(
        num_records, ctx.cancelled, ctx.clock)
    if finished:
        empty = tuple(np.zeros(0) for _ in range(num_fields))
        return (np.array(True),) + empty, None
    if len(records) == 1:
        flag = _NOT_FINISHED if done is not None else np.array(False)
        return (flag,) + tuple(records[0]), done
    try:
        fields = tuple(np.concatenate(parts, axis=0)
                       for parts in zip(*records))
    finally:
        if done is not None:
            done()
    return (np.array(False),) + fields, None


@register_op("DrainRecords", context=True)
def drain_records(ctx, queue=None, capacity=1):
    """Take and drop every record the queue holds now, up to
    ``capacity`` (waiting for one); outputs True once the queue is closed
    and empty.  What a pipe reads when nothing looks at its records: one
    op, one channel call and no copy for all of them.

    A channel without ``drop_available`` (a link's reading end, which
    holds each record until it has arrived) gives one record a call, so
    per-record conditions hold as they did.
    A shared-memory channel makes no view on the records it drops."""
    channel = _channel(ctx, queue, capacity)
    drop = getattr(channel, "drop_available", None)
    if drop is not None:
        _, finished = drop(capacity, ctx.cancelled, ctx.clock)
        return np.array(bool(finished))
    records, finished, done = channel.get(1, ctx.cancelled, ctx.clock)
    if done is not None:
        done()
    return np.array(bool(finished))


@register_op("CloseQueue", num_outputs=0, context=True)
def close_queue(ctx, queue=None, capacity=1, writer=False):
    """Close the queue: at once (a reader's close), or -- ``writer`` --
    when this is the last of the run's writers of it to end."""
    if writer:
        _hub(ctx, queue).writer_ended(queue, capacity)
    else:
        _channel(ctx, queue, capacity).close()


@register_op("AtomicOr", num_outputs=0, context=True)
def atomic_or(ctx, acc, value):
    """``acc |= value`` in place, atomically across the node's threads."""
    with ctx.lock:
        np.logical_or(acc, value, out=acc)


@register_op("Sleep", num_outputs=0, context=True)
def sleep(ctx, seconds=0.0):
    """Wait ``seconds`` (of the run's clock: virtual under a schedule); a
    cancelled run ends the wait at once."""
    seconds = float(seconds)
    if ctx.clock.wait(ctx.cancelled, seconds, what=f"Sleep({seconds:g} s)"):
        raise Cancelled("sleep ended: the run was cancelled")


@register_op("CreateCursor", context=True, atomic=True, may_skip=True)
def create_cursor(ctx):
    """A dataset reader's cursor at 0 -- once per run: the task that built
    the reader and the task that reads it may both create it, whichever
    runs first; for the other it is made already, and it is left as it is
    (a second 0 would rewind a read in progress)."""
    made, name = ctx.run.made, ctx.op.outputs[0]
    if name in made:
        return None
    made.add(name)
    return np.zeros((), np.int64)


@register_op("ReadDataset", context=True, min_outputs=1, max_outputs=None)
def read_dataset(ctx, cursor, *data, batch_size=1):
    """(should_stop, *batch): the next ``batch_size`` records of the data
    blobs at ``cursor`` (advanced atomically); should_stop once exhausted."""
    with ctx.lock:
        start = int(cursor)
        total = len(data[0]) if data else 0
        end = min(start + int(batch_size), total)
        cursor[...] = max(start, end)
    if start >= total:
        return (np.array(True),) + tuple(d[:0].copy() for d in data)
    return (np.array(False),) + tuple(d[start:end].copy() for d in data)


@register_op("CursorAtEnd", context=True)
def cursor_at_end(ctx, cursor, data):
    """Whether a dataset read at ``cursor`` would find nothing left of
    ``data`` (its first column) -- asked without reading."""
    with ctx.lock:
        return np.array(int(cursor) >= len(data))


@register_op("AppendDataset", min_outputs=1, max_outputs=None, atomic=True)
def append_dataset(*data_and_fields):
    """New data blobs: each data blob with its field's rows appended.

    Atomic (the executor holds the node lock across the op and its
    writes), so concurrent writers never lose a record."""
    half = len(data_and_fields) // 2
    data, fields = data_and_fields[:half], data_and_fields[half:]
    out = tuple(np.concatenate([d, np.asarray(f, dtype=d.dtype)], axis=0)
                for d, f in zip(data, fields))
    return out if len(out) > 1 else out[0]
