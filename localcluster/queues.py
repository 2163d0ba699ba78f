"""Queues: bounded channels of records between tasks (and nodes).

A `Queue` is plan data -- an id unique in its build scope, a capacity and
how many records one read takes.  Its channel exists only while a run
executes (`localcluster.runtime.channels`), empty and open at the start of
every run.  Its writer enqueues each record it is given (blocking while
the queue is full) and turns the pipe's stop blob true once the queue is
closed; its reader dequeues ``num_dequeue_records`` records at a time,
concatenated along axis 0 (fewer once the queue is closed), and stops
when the queue is closed and empty.  A writing task ends its writing
when it ends (after all its instances), and the queue closes when the
*last* of its writers (pipes, tasks) has ended -- never when the first
does, which would drop the others' records
(`localcluster.plan.validate.queue_writers` counts them per run).  The
reading task closes it at once when it stops, so producers stop when
their consumer does (quietly: a writer of a closed queue just stops).
"""

from .context import build_scope
from .dataio import Reader, Writer
from .errors import PlanError
from .plan.net import Net

__all__ = ["Queue"]


class Queue:
    """``Queue(capacity, name='queue', num_dequeue_records=1)``."""

    def __init__(self, capacity, name="queue", num_dequeue_records=1):
        for what, value in (("capacity", capacity),
                            ("num_dequeue_records", num_dequeue_records)):
            if isinstance(value, bool) or not isinstance(value, int) or \
                    value < 1:
                raise PlanError(f"Queue {what} must be an int >= 1, got "
                                f"{value!r}")
        if num_dequeue_records > capacity:
            raise PlanError(
                f"Queue num_dequeue_records={num_dequeue_records} exceeds its "
                f"capacity={capacity}: a read would wait for more records "
                "than the queue can hold; raise the capacity")
        scope = build_scope()
        base = f"queue/{name}"
        self.id = scope.unique("queue", base) if scope else base
        self.name = name
        self.capacity = capacity
        self.num_dequeue_records = num_dequeue_records
        self._schema = None

    def __repr__(self):
        return f"Queue({self.id!r}, capacity={self.capacity})"

    def _args(self):
        return {"queue": self.id, "capacity": self.capacity}

    def reader(self):
        return QueueReader(self)

    def writer(self):
        return QueueWriter(self)

    def close(self, net, writer=False):
        """Close the queue from ``net``: at once (a reader that has what
        it needs), or -- ``writer`` -- once this and every other writer of
        the queue in the run have ended."""
        args = self._args()
        if writer:
            args["writer"] = True
        net.CloseQueue([], [], **args)


class QueueReader(Reader):
    def __init__(self, queue):
        super().__init__()
        self.queue = queue

    def schema(self):
        if self.queue._schema is None:
            raise PlanError(
                f"{self.queue!r} has no writer yet, so its fields are unknown;"
                " build the task that writes it before the one that reads it")
        return list(self.queue._schema)

    def setup_ex(self, init_net, finish_net):
        # The consumer is done: close the queue so producers stop too.
        self.queue.close(finish_net)

    def read(self, read_net):
        names = self.schema()
        outs = read_net.DequeueRecords(
            [], 1 + len(names), num_records=self.queue.num_dequeue_records,
            num_fields=len(names), **self.queue._args())
        return outs[0], list(outs[1:])


class QueueWriter(Writer):
    def __init__(self, queue):
        super().__init__(queue._schema)
        self.queue = queue
        self._committed = False

    def __repr__(self):
        return f"QueueWriter({self.queue.id!r})"

    def _check_open(self):
        # a write after commit would run after this writer counted itself
        # out: once the last writer has, the queue is closed and the
        # record dropped -- refused while the plan is built instead
        if self._committed:
            raise PlanError(
                f"{self!r}: a write after its commit; commit ends this "
                "writer's writing (the queue closes once its last writer "
                "has committed), so the record would be dropped -- write "
                "before commit, or take another writer (queue.writer())")

    def _fields(self, record):
        fields = super()._fields(record)
        if self.queue._schema is None:
            self.queue._schema = self.schema()
        elif self.queue._schema != self.schema():
            raise PlanError(
                f"{self.queue!r} carries fields {self.queue._schema}; this "
                f"writer writes {self.schema()}")
        return fields

    def write_ex(self, fields, local_init_net, local_finish_net,
                 stop_blob=None):
        self._check_open()
        net = Net("enqueue")
        closed = net.EnqueueRecord(list(fields), **self.queue._args())
        if stop_blob is not None:
            net.Or([stop_blob, closed], [stop_blob])
        return [net]

    def write(self, writer_net, fields):
        self._check_open()
        writer_net.EnqueueRecord(list(fields), **self.queue._args())

    def commit(self, finish_net):
        # one writer ends: the queue closes when its last writer has
        self._check_open()
        self._committed = True
        self.queue.close(finish_net, writer=True)
