"""Drawn plans as plain specs, and how each is built.

`GroupSpec` and `JobSpec` are frozen data -- what `strategies` draws --
and `build_group` / `build_job` turn one into a fresh TaskGroup or Job,
in a build scope of its own, so a rebuild has the same names (and blob
names are explicit: ``t0_a``, ``count``, ``q0_sum``...).  Node fields are
indices into the spec's ``nodes``.

A task group (GLOBAL, so what it makes stays in the nodes' workspaces)::

    node N: task tI [k instances]      registers tI_a, tI_b.. := constants;
              [local_init: count, acc]   then its program (`._vocab`)
    node P: pipe qJ_send   CounterReader limited to r records -> Scale(s)
                  |  Queue(capacity)
    node C: pipe qJ_recv   AtomicAdd into qJ_sum, CountUp qJ_count
              [local_init: qJ_sum, qJ_count]

(the first task on a node that uses a shared blob makes it, in a
``local_init``, which runs before any task of the node starts).

A job::

    init group (GLOBAL), one task "init" per node: the persistent registers
        tI_w, tI_x.., count, acc, Dataset qJ_data and its reader (so the
        cursor persists), qJ_sum, qJ_count, stop_ticks
    epoch group (PRIVATE: what it makes vanishes with the epoch):
        tasks tI: temporaries tI_a.. := constants; program; `Update`s
        pipes qJ_send (per_epoch records of qJ_data, scaled) -> qJ_recv
        epoch_limiter, or task "stop": stop_ticks += 1, stop once
        stop_ticks >= epochs
"""

import dataclasses

import numpy as np

from ..dataio import CounterReader, Dataset, ReaderWithLimit
from ..job import Job, epoch_limiter
from ..pipeline import pipe
from ..plan.builder import ops
from ..task import Node, Task, TaskGroup, WorkspaceType
from ._vocab import ACC, COUNT, floats, register_names, uses

__all__ = ["TaskSpec", "ChannelSpec", "GroupSpec", "EpochTaskSpec",
           "FeedSpec", "JobSpec", "group_nodes", "job_nodes", "build_group",
           "build_job", "STATE_LETTERS"]

#: the letters of an epoch task's persistent registers (t0_w, t0_x ...);
#: its temporaries are t0_a, t0_b ...
STATE_LETTERS = "wxyz"


# -- specs --------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """A task on ``nodes[node]``: registers start at ``init`` (one tuple
    of ints each), then ``program`` runs, in each of ``instances``."""
    node: int
    instances: int
    init: tuple
    program: tuple


@dataclasses.dataclass(frozen=True)
class ChannelSpec:
    """``records`` records (0, 1, ...) * ``scale`` from ``nodes[src]`` to
    ``nodes[dst]`` through a queue of ``capacity``; ``readers`` instances
    of the receiving pipe."""
    src: int
    dst: int
    records: int
    scale: int
    capacity: int
    readers: int


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    nodes: tuple
    width: int
    tasks: tuple
    channels: tuple = ()


@dataclasses.dataclass(frozen=True)
class EpochTaskSpec:
    """An epoch task: persistent registers start at ``state`` (made by the
    init group; none for a task of several instances, whose writes would
    race), temporaries at ``temps`` every epoch; then ``program`` on the
    temporaries and ``updates`` of the persistent registers."""
    node: int
    instances: int
    state: tuple
    temps: tuple
    program: tuple
    updates: tuple


@dataclasses.dataclass(frozen=True)
class FeedSpec:
    """A Dataset of ``data`` on ``nodes[src]``, read ``per_epoch`` records
    an epoch (the cursor persists), scaled and summed on ``nodes[dst]``."""
    src: int
    dst: int
    data: tuple
    per_epoch: int
    scale: int
    capacity: int


@dataclasses.dataclass(frozen=True)
class JobSpec:
    nodes: tuple
    width: int
    tasks: tuple
    feeds: tuple
    epochs: int
    stop: str        # "limiter" or "blob"
    stop_node: int


def _used(spec, parts):
    """Node names ``spec`` uses, in order of first use."""
    seen = []
    for index in parts:
        name = spec.nodes[index]
        if name not in seen:
            seen.append(name)
    return tuple(seen)


def group_nodes(spec):
    return _used(spec, [t.node for t in spec.tasks] +
                 [n for c in spec.channels for n in (c.src, c.dst)])


def job_nodes(spec):
    return _used(spec, [t.node for t in spec.tasks] +
                 [n for f in spec.feeds for n in (f.src, f.dst)] +
                 [spec.stop_node])


# -- building -----------------------------------------------------------------

def _instances(n):
    return n if n > 1 else None


def _make_shared(names, width):
    for name in sorted(names):
        if name == COUNT:
            ops.CreateCounter([], [COUNT])
        else:
            ops.ConstantFill([], [ACC], shape=[width], value=0.0,
                             dtype="float64")


def _send(scale):
    def processor(record):
        return {"v": ops.Scale(record["iter"], scale=scale)}
    return processor


def _receive(j, make):
    """Add each record to ``qJ_sum`` and count it; with ``make``, the
    receiving node makes the two blobs first (``local_init``)."""
    total, count = f"q{j}_sum", f"q{j}_count"

    def processor(record):
        if make:
            with ops.local_init():
                _make_sum(total, count)
        ops.AtomicAdd([total, record["v"]])
        ops.CountUp([count])
    return processor


def _make_sum(total, count):
    ops.ConstantFill([], [total], shape=[1], value=0, dtype="int64")
    ops.CreateCounter([], [count])


def build_group(spec):
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        made = set()
        for i, task in enumerate(spec.tasks):
            node = spec.nodes[task.node]
            with Node(node), Task(name=f"t{i}",
                                  num_instances=_instances(task.instances)):
                needed = {n for n in uses(task.program)
                          if (node, n) not in made}
                if needed:
                    with ops.local_init():
                        _make_shared(needed, spec.width)
                    made |= {(node, n) for n in needed}
                regs = register_names(f"t{i}", len(task.init))
                for name, values in zip(regs, task.init):
                    ops.Const(floats(values), blob_out=name)
                for item in task.program:
                    item.build(regs)
        for j, ch in enumerate(spec.channels):
            with Node(spec.nodes[ch.src]):
                queue = pipe(ReaderWithLimit(CounterReader(), ch.records),
                             processor=_send(ch.scale), name=f"q{j}_send",
                             capacity=ch.capacity)
            with Node(spec.nodes[ch.dst]):
                pipe(queue, processor=_receive(j, True), name=f"q{j}_recv",
                     num_runtime_threads=ch.readers)
    return group


def _build_init(job, spec, node):
    """The init task of ``node``: everything the epochs keep there."""
    readers = {}
    with job.init_group, Node(node), Task(name="init"):
        shared = set()
        for i, task in enumerate(spec.tasks):
            if spec.nodes[task.node] != node:
                continue
            shared |= uses(task.program)
            state = register_names(f"t{i}", len(task.state), STATE_LETTERS)
            for name, values in zip(state, task.state):
                ops.Const(floats(values), blob_out=name)
        _make_shared(shared, spec.width)
        for j, feed in enumerate(spec.feeds):
            if spec.nodes[feed.src] == node:
                data = Dataset({"v": np.array(feed.data, dtype=np.int64)},
                               name=f"q{j}_data")
                readers[j] = data.reader()
            if spec.nodes[feed.dst] == node:
                _make_sum(f"q{j}_sum", f"q{j}_count")
        if spec.stop == "blob" and spec.nodes[spec.stop_node] == node:
            ops.Const(floats([0]), blob_out="stop_ticks")
    return readers


def _build_epoch_task(i, task):
    temps = register_names(f"t{i}", len(task.temps))
    state = register_names(f"t{i}", len(task.state), STATE_LETTERS)
    for name, values in zip(temps, task.temps):
        ops.Const(floats(values), blob_out=name)
    for item in task.program:
        item.build(temps)
    for update in task.updates:
        update.build(state, temps)


def build_job(spec):
    with Job() as job:
        readers = {}
        for node in job_nodes(spec):
            readers.update(_build_init(job, spec, node))
        for i, task in enumerate(spec.tasks):
            with Node(spec.nodes[task.node]), Task(
                    name=f"t{i}", num_instances=_instances(task.instances)):
                _build_epoch_task(i, task)
        for j, feed in enumerate(spec.feeds):
            with Node(spec.nodes[feed.src]):
                queue = pipe(ReaderWithLimit(readers[j], feed.per_epoch),
                             processor=_send_values(feed.scale),
                             name=f"q{j}_send", capacity=feed.capacity)
            with Node(spec.nodes[feed.dst]):
                pipe(queue, processor=_receive(j, False), name=f"q{j}_recv")
        with Node(spec.nodes[spec.stop_node]):
            if spec.stop == "limiter":
                epoch_limiter(job, spec.epochs)
            else:
                with Task(name="stop"):
                    ops.Add(["stop_ticks", ops.Const(floats([1]))],
                            ["stop_ticks"])
                    stop = ops.GE(["stop_ticks",
                                   ops.Const(floats([spec.epochs]))])
                job.add_stop_condition(stop)
    return job


def _send_values(scale):
    def processor(record):
        return {"v": ops.Scale(record["v"], scale=scale)}
    return processor
