"""Records, readers and writers, and in-workspace datasets.

A *record* is an ordered mapping of field name -> BlobRef (`Record`; a
plain dict is accepted wherever a record is).  A `Reader` builds the nets
that read one batch into a record, and says which bool blob turns true
when there is nothing left; a `Writer` builds the nets that write a
record.  Readers and writers only build plans: ``setup_ex(init_net,
exit_net)`` adds what runs once around the whole reading (or writing)
task, ``read_ex``/``write_ex`` what runs per batch, with per-instance
``local_init_net``/``local_finish_net``.

`Dataset` keeps its columns as blobs of the workspace that was current
where it was built; its reader's cursor is an int64 blob, so reading
continues across runs when the cursor lives in the node's global
workspace, and restarts when it is made by the reading task.
"""

import collections
import itertools

import numpy as np

from .context import build_scope
from .errors import PlanError
from .plan.builder import NetBuilder, ops
from .plan.net import BlobRef, Net
from .task import Node, Task, TaskGroup

__all__ = ["Record", "as_record", "Reader", "Writer", "Dataset",
           "ReaderWithLimit", "ReaderWithTimeLimit", "ReaderWithDelay",
           "CompositeReader", "CounterReader"]


class Record(collections.OrderedDict):
    """An ordered mapping of field name -> BlobRef."""

    def field_names(self):
        return list(self.keys())

    def field_blobs(self):
        return list(self.values())


def as_record(value, what="record"):
    """A `Record` from a Record, a dict or a list of (name, blob) pairs."""
    if isinstance(value, Record):
        return value
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)) and all(
            isinstance(p, tuple) and len(p) == 2 for p in value):
        items = value
    else:
        raise PlanError(
            f"{what} must be a mapping of field name -> blob, got "
            f"{type(value).__name__} {value!r}")
    out = Record()
    for name, blob in items:
        if not isinstance(blob, str):
            raise PlanError(f"{what}: field {name!r} is {blob!r}, not a blob")
        out[str(name)] = BlobRef(blob)
    return out


class Reader:
    """Builds the nets that read batches; subclasses implement `read`."""

    def __init__(self, schema=None):
        self._schema = list(schema) if schema is not None else None

    def schema(self):
        """The field names of the records this reader yields."""
        if self._schema is None:
            raise PlanError(
                f"{type(self).__name__} does not know its fields yet: a "
                "queue learns them from its first writer; build the writer "
                "first")
        return list(self._schema)

    def _record(self, fields):
        return Record(zip(self.schema(), fields))

    def setup_ex(self, init_net, finish_net):
        """Add what runs once around the reading task."""

    def read_ex(self, local_init_net, local_finish_net):
        """``(nets, should_stop, fields)`` reading one batch."""
        read_net = Net("read")
        should_stop, fields = self.read(read_net)
        return [read_net], should_stop, fields

    def read_record_ex(self, local_init_net, local_finish_net):
        nets, should_stop, fields = self.read_ex(local_init_net,
                                                 local_finish_net)
        return nets, should_stop, self._record(fields)

    def read(self, read_net):
        """Add ops reading one batch to ``read_net``; ``(stop, fields)``."""
        raise NotImplementedError

    def at_end(self, net):
        """Add ops to ``net`` telling, without reading, whether a read now
        would find nothing left: a bool blob, or None when this reader
        cannot tell without reading (a queue: whether more comes is its
        writers' business).  A limited reader asks it as its limit is
        reached, so data that ends with the limit counts as run out."""
        return None

    def read_record(self, read_net):
        should_stop, fields = self.read(read_net)
        return should_stop, self._record(fields)


class Writer:
    """Builds the nets that write records; subclasses implement `write`."""

    def __init__(self, schema=None):
        self._schema = list(schema) if schema is not None else None

    def schema(self):
        return None if self._schema is None else list(self._schema)

    def setup_ex(self, init_net, finish_net):
        """Add what runs once around the writing task."""

    def write_ex(self, fields, local_init_net, local_finish_net,
                 stop_blob=None):
        """Nets writing ``fields``; a writer that can refuse (a closed
        queue) ORs that into ``stop_blob``."""
        write_net = Net("write")
        self.write(write_net, fields)
        return [write_net]

    def write_record_ex(self, record, local_init_net, local_finish_net,
                        stop_blob=None):
        return self.write_ex(self._fields(record), local_init_net,
                             local_finish_net, stop_blob)

    def _fields(self, record):
        record = as_record(record)
        if self._schema is None:
            self._schema = record.field_names()
        missing = [f for f in self._schema if f not in record]
        if missing:
            raise PlanError(
                f"{type(self).__name__} writes fields {self._schema}; the "
                f"record has {record.field_names()} (missing {missing})")
        return [record[f] for f in self._schema]

    def write(self, writer_net, fields):
        """Add ops writing ``fields`` (blobs, in schema order)."""
        raise NotImplementedError

    def write_record(self, writer_net, record):
        self.write(writer_net, self._fields(record))

    def commit(self, finish_net):
        """Add what runs once the writing task is done."""


# -- datasets -------------------------------------------------------------------

class Dataset:
    """Columns of equal length kept as blobs; see the module docstring.

    Built where a task or builder is current (like ``ops.Const``): its data
    blobs are made by that task, on its node.
    """

    def __init__(self, fields, name=None):
        if NetBuilder.current(required=False) is None:
            raise PlanError(
                "Dataset(...) makes its data blobs in the current task or "
                "builder: build it inside 'with Task():' (an init group's "
                "task keeps it in the node's workspace)")
        if not isinstance(fields, dict) or not fields:
            raise PlanError("Dataset needs a non-empty dict of field name -> "
                            "array-like")
        scope = build_scope()
        base = name or "dataset"
        self.name = scope.unique("dataset", base) if scope else base
        self.node = str(Node.current())
        arrays = {f: np.asarray(v) for f, v in fields.items()}
        lengths = {f: (a.shape[0] if a.ndim else None)
                   for f, a in arrays.items()}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise PlanError(
                f"Dataset {self.name!r}: every field must be an array with a "
                f"first (record) axis of one length; got lengths {lengths}")
        self._content = Record(
            (f, ops.Const(a, blob_out=f"{self.name}/{f}"))
            for f, a in arrays.items())
        self._readers = 0

    def field_names(self):
        return list(self._content)

    def content(self):
        """The record of this dataset's data blobs."""
        return Record(self._content)

    def reader(self, init_net=None, batch_size=1):
        """A reader of ``batch_size`` records at a time (see the module
        docstring for where its cursor lives)."""
        self._readers += 1
        return _DatasetReader(self, init_net, batch_size, self._readers)

    def writer(self):
        """A writer appending records to this dataset."""
        return _DatasetWriter(self)

    def fetch(self, session, node=None):
        """``{field: array}`` of the dataset's data in ``session``."""
        node = node or self.node
        return {f: session.fetch_blob(b, node)
                for f, b in self._content.items()}


class _DatasetReader(Reader):
    def __init__(self, dataset, init_net, batch_size, number):
        super().__init__(dataset.field_names())
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) \
                or batch_size < 1:
            raise PlanError(f"reader batch_size must be an int >= 1, got "
                            f"{batch_size!r}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.cursor = BlobRef(f"{dataset.name}/cursor_{number}")
        self._cursor_made = True
        #: the group of the task that made the cursor (None: no task did)
        self._made_in = None
        if init_net is not None:
            init_net.ConstantFill([], [self.cursor], value=0, dtype="int64")
        elif NetBuilder.current(required=False) is not None:
            ops.CreateCursor([], [self.cursor])
            task = Task.current(required=False)
            self._made_in = task.group if task is not None else None
        else:
            self._cursor_made = False  # made when the reading task starts

    def setup_ex(self, init_net, finish_net):
        # A cursor made by a task of the group the reading task joins runs
        # concurrently with it: the reading task makes it too, before its
        # first read, and whichever of the two runs first makes it (once a
        # run: `CreateCursor`) -- never a task racing its reader.
        if not self._cursor_made or (
                self._made_in is not None and
                self._made_in is TaskGroup.current(required=False)):
            init_net.CreateCursor([], [self.cursor])

    def read(self, read_net):
        data = self.dataset.content().field_blobs()
        outs = read_net.ReadDataset([self.cursor] + data, 1 + len(data),
                                    batch_size=self.batch_size)
        return outs[0], list(outs[1:])

    def at_end(self, net):
        data = self.dataset.content().field_blobs()
        return net.CursorAtEnd([self.cursor, data[0]]) if data else None


class _DatasetWriter(Writer):
    def __init__(self, dataset):
        super().__init__(dataset.field_names())
        self.dataset = dataset

    def write(self, writer_net, fields):
        data = self.dataset.content().field_blobs()
        writer_net.AppendDataset(data + list(fields), data)


# -- reader wrappers --------------------------------------------------------------

class _Limited(Reader):
    """A reader that may stop before the one it wraps runs out."""

    def __init__(self, reader):
        super().__init__()
        self.reader = reader
        self._finished = BlobRef(_private_name("data_finished"))

    def schema(self):
        return self.reader.schema()

    def data_finished(self):
        """A bool blob: true only if the wrapped reader ran out."""
        return self._finished

    def setup_ex(self, init_net, finish_net):
        init_net.ConstantFill([], [self._finished], value=False, dtype=bool)
        self.reader.setup_ex(init_net, finish_net)
        self.setup_limiter(init_net)
        at_end = self.reader.at_end(finish_net)
        if at_end is not None:
            # the limit reached right where the data ends: the wrapped
            # reader ran out too -- said as the reading task ends, not by
            # one more, empty, run of it (asked once, not at every read)
            finish_net.AtomicOr([self._finished, at_end])

    def setup_limiter(self, init_net):
        pass

    def limit_reached(self, net):
        """Add ops to ``net``; returns a bool blob: stop now."""
        raise NotImplementedError

    def at_end(self, net):
        return self.reader.at_end(net)

    def read_ex(self, local_init_net, local_finish_net):
        check = Net("limit")
        should_stop = self.limit_reached(check)
        nets, finished, fields = self.reader.read_ex(local_init_net,
                                                     local_finish_net)
        done = Net("limit_done")
        # The stop blob is checked after every net: the limit was already
        # seen, so it can now carry whether the wrapped reader ran out.
        done.Copy([finished], [should_stop])
        done.AtomicOr([self._finished, finished])
        return [check] + nets + [done], should_stop, fields


_loose_names = itertools.count()


def _private_name(kind):
    """A reader's own blob name: deterministic within a build scope."""
    scope = build_scope()
    if scope is not None:
        return scope.unique("reader_blob", f"reader/{kind}")
    return f"reader/{kind}_loose{next(_loose_names)}"


class ReaderWithLimit(_Limited):
    """Reads at most ``num_iter`` batches in all (None: no limit; 0: none)."""

    def __init__(self, reader, num_iter=1):
        super().__init__(reader)
        if num_iter is not None and (isinstance(num_iter, bool) or
                                     not isinstance(num_iter, int) or
                                     num_iter < 0):
            raise PlanError(f"ReaderWithLimit num_iter must be None or an int "
                            f">= 0, got {num_iter!r}")
        self.num_iter = num_iter
        self.counter = (BlobRef(_private_name("limit_counter"))
                        if num_iter is not None else None)

    def setup_limiter(self, init_net):
        if self.counter is not None:
            init_net.CreateCounter([], [self.counter],
                                   init_count=int(self.num_iter))

    def limit_reached(self, net):
        if self.counter is None:
            return net.ConstantFill([], value=False, dtype=bool)
        return net.CountDown([self.counter])


class ReaderWithTimeLimit(_Limited):
    """Stops reading ``duration`` seconds after the task started (0: never)."""

    def __init__(self, reader, duration=0):
        super().__init__(reader)
        self.duration = float(duration)
        self.timer = BlobRef(_private_name("timer"))

    def setup_limiter(self, init_net):
        init_net.TimerBegin([], [self.timer])

    def limit_reached(self, net):
        if self.duration <= 0:
            return net.ConstantFill([], value=False, dtype=bool)
        elapsed = net.TimerGet([self.timer])
        return net.GT([elapsed, net.Const(int(self.duration * 1e9))])


class ReaderWithDelay(Reader):
    """Waits ``delay`` seconds before every read."""

    def __init__(self, reader, delay):
        super().__init__()
        self.reader = reader
        self.delay = float(delay)

    def schema(self):
        return self.reader.schema()

    def setup_ex(self, init_net, finish_net):
        self.reader.setup_ex(init_net, finish_net)

    def at_end(self, net):
        return self.reader.at_end(net)

    def read_ex(self, local_init_net, local_finish_net):
        wait = Net("delay")
        wait.Sleep([], [], seconds=self.delay)
        nets, should_stop, fields = self.reader.read_ex(local_init_net,
                                                        local_finish_net)
        return [wait] + nets, should_stop, fields


class CompositeReader(Reader):
    """Reads from several readers at once; fields are ``"<name>:<field>"``.
    Stops as soon as one of them stops."""

    def __init__(self, names, readers):
        if len(names) != len(readers) or not readers:
            raise PlanError("CompositeReader needs one name per reader")
        super().__init__([f"{n}:{f}" for n, r in zip(names, readers)
                          for f in r.schema()])
        self.names = list(names)
        self.readers = list(readers)

    def setup_ex(self, init_net, finish_net):
        for reader in self.readers:
            reader.setup_ex(init_net, finish_net)

    def at_end(self, net):
        # it stops as soon as one of its readers does
        found = None
        for reader in self.readers:
            end = reader.at_end(net)
            if end is not None:
                found = end if found is None else net.Or([found, end])
        return found

    def read_ex(self, local_init_net, local_finish_net):
        stop = local_init_net.ConstantFill([], value=False, dtype=bool)
        nets, fields = [], []
        for name, reader in zip(self.names, self.readers):
            sub, should_stop, sub_fields = reader.read_ex(local_init_net,
                                                          local_finish_net)
            copy = Net(f"{name}_stop")
            copy.Copy([should_stop], [stop])
            nets.extend(sub + [copy])
            fields.extend(sub_fields)
        return nets, stop, fields


class CounterReader(Reader):
    """Yields 0, 1, 2, ... (field ``iter``); never runs out by itself."""

    def __init__(self):
        super().__init__(["iter"])
        self.counter = BlobRef(_private_name("counter"))
        self.never = BlobRef(_private_name("never"))

    def setup_ex(self, init_net, finish_net):
        init_net.CreateCounter([], [self.counter], init_count=0)
        init_net.ConstantFill([], [self.never], value=False, dtype=bool)

    def read_ex(self, local_init_net, local_finish_net):
        net = Net("count")
        value = net.Reshape([net.CountUp([self.counter])], shape=[1])
        return [net], self.never, [value]  # a batch of one record
