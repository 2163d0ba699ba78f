"""pipe(): a task that reads records, processes them and writes them.

::

    pipe(reader) --(record of BlobRefs)--> processor(record) --> writer
          |                                   (called once, while the
          +-- num_threads static copies,        plan is built; it may use
              or num_runtime_threads instances  the ops DSL)

``pipe(input, output=None, num_threads=1, processor=None, ...)`` builds
one Task on the current node: each copy of its loop reads a batch (the
reader's stop blob ends the loop), runs the processor's ops and writes
the processed record to ``output`` -- a Queue it creates (and returns) when
``output`` is None, a given Queue, a Dataset or any Writer.  The reader's and writer's
once-per-task setup runs before the first and after the last instance
(``task_init``/``task_exit``), so a pipe closes its output queue when it
ends.  A processor may return a record, ``(record, stop_blob)``, an
`Output(nets, record, should_stop)`, nets, or None (nothing to write).
"""

from .dataio import Dataset, Reader, Writer, as_record
from .errors import PlanError
from .plan.builder import NetBuilder
from .plan.net import Net
from .plan.setup import TASK_SETUP, SetupNets
from .plan.step import ExecutionStep, execution_step, to_execution_step
from .queues import Queue, QueueReader
from .task import Task

__all__ = ["pipe", "pipe_and_output", "Output", "ProcessingReader"]


class Output:
    """What a processor produced: nets to run, a record, a stop blob."""

    def __init__(self, nets=None, record=None, should_stop=None):
        if isinstance(nets, (Net, ExecutionStep)):
            nets = [nets]
        self.nets = None if nets is None else list(nets)
        self.record = None if record is None else as_record(
            record, "processor output")
        self.should_stop = should_stop


def _normalize(out):
    if out is None or isinstance(out, Output):
        return out or Output()
    if isinstance(out, (Net, ExecutionStep)):
        return Output(nets=[out])
    if isinstance(out, list) and out and all(
            isinstance(x, (Net, ExecutionStep)) for x in out):
        return Output(nets=out)
    if isinstance(out, tuple) and len(out) == 2 and \
            isinstance(out[0], dict) and isinstance(out[1], str):
        return Output(record=out[0], should_stop=out[1])
    return Output(record=out)


def _as_reader(source):
    if isinstance(source, Reader):
        return source
    if isinstance(source, (Queue, Dataset)):
        return source.reader()
    raise PlanError(
        f"pipe() reads from a Reader, a Queue or a Dataset, got "
        f"{type(source).__name__} {source!r}")


def _process(processor, record, name):
    """Call the processor inside its own builder; (Output, its step)."""
    with NetBuilder(name=name) as builder:
        out = processor(record) if processor is not None else record
    out = _normalize(out)
    children = builder.children
    if out.nets is not None:
        if children:
            raise PlanError(
                f"processor of {name!r} both used the ops DSL and returned "
                "nets; do one or the other")
        return out, out.nets
    if not builder.has_stop_blob and all(isinstance(c, Net)
                                         for c in children):
        # Plain nets join the pipe's loop as they are: one step of nets
        # runs much faster than a step per net.
        return out, list(children)
    return out, ([to_execution_step(builder)] if children else [])


class ProcessingReader(Reader):
    """A reader whose records go through ``processor`` as they are read
    (what ``pipe(..., num_threads=0)`` returns)."""

    def __init__(self, reader, processor):
        super().__init__()
        self.reader = reader
        self.processor = processor

    def setup_ex(self, init_net, finish_net):
        self.reader.setup_ex(init_net, finish_net)

    def at_end(self, net):
        return self.reader.at_end(net)

    def read_ex(self, local_init_net, local_finish_net):
        nets, should_stop, record = self.reader.read_record_ex(
            local_init_net, local_finish_net)
        out, parts = _process(self.processor, record, "processing_reader")
        if out.record is None:
            raise PlanError("a processing reader's processor must return a "
                            "record")
        self._schema = out.record.field_names()
        extra = []
        if out.should_stop is not None:
            stop = Net("processing_stop")
            stop.Or([should_stop, out.should_stop], [should_stop])
            extra.append(stop)
        return nets + parts + extra, should_stop, out.record.field_blobs()


#: records the Queue that pipe() makes holds when no capacity is given
DEFAULT_CAPACITY = 100


def _writer_for(output, capacity, name):
    """(writer, what pipe returns) for ``output``."""
    if output is None:
        # the job model this API follows gives a pipe's own queue room for
        # 100 records: a pipe nobody reads yet does not block at once
        queue = Queue(DEFAULT_CAPACITY if capacity is None else capacity,
                      name=name)
        return queue.writer(), queue
    if isinstance(output, Queue):
        return output.writer(), None
    if isinstance(output, Dataset):
        return output.writer(), None
    if isinstance(output, Writer):
        return output, None
    raise PlanError(
        f"pipe() writes to a Queue, a Dataset or a Writer, got "
        f"{type(output).__name__} {output!r}")


def _check_counts(num_threads, num_runtime_threads):
    for what, value in (("num_threads", num_threads),
                        ("num_runtime_threads", num_runtime_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise PlanError(f"pipe {what} must be an int >= 0, got {value!r}")
    if num_runtime_threads < 1:
        raise PlanError("pipe num_runtime_threads must be >= 1")
    if num_threads > 1 and num_runtime_threads > 1:
        raise PlanError(
            "pipe takes num_threads (static copies) or num_runtime_threads "
            "(task instances) above 1, not both")


def _drains(reader, out, parts, final_outputs):
    """Whether nothing looks at the records the pipe reads: it reads a
    Queue as it is, its processor made no op, no record and no stop blob,
    and no final outputs are captured.  Then reading a record alone buys
    nothing: the pipe drains what its queue holds in one op."""
    return (type(reader) is QueueReader and out.record is None
            and not parts and out.should_stop is None
            and final_outputs is None)


def _drain_net(queue, status, name):
    net = Net(f"{name}/drain")
    net.DrainRecords([], [status], **queue._args())
    return net


def _pipe_task(input, output, num_threads, processor, name, capacity, group,
               num_runtime_threads, final_outputs):
    _check_counts(num_threads, num_runtime_threads)
    reader = _as_reader(input)
    if num_threads == 0:
        if output is not None:
            raise PlanError("pipe(num_threads=0) returns a processing reader;"
                            " it cannot also write to an output")
        return ProcessingReader(reader, processor), None
    name = name or "processor"
    global_init, global_exit = Net(f"{name}/init"), Net(f"{name}/exit")
    reader.setup_ex(global_init, global_exit)
    writer, result = None, None
    threads, first_init = [], None
    for i in range(num_threads):
        local_init, local_exit = Net(f"{name}/local_init"), \
            Net(f"{name}/local_exit")
        first_init = first_init or local_init
        read_nets, status, record = reader.read_record_ex(local_init,
                                                          local_exit)
        local_init.ConstantFill([], [status], value=False, dtype=bool)
        out, parts = _process(processor, record, f"{name}/processor")
        if _drains(reader, out, parts, final_outputs):
            read_nets = [_drain_net(reader.queue, status, name)]
        body = list(read_nets) + list(parts)
        if out.should_stop is not None:
            stop = Net(f"{name}/stop")
            stop.Or([status, out.should_stop], [status])
            body.append(stop)
        if out.record is not None:
            if writer is None:
                writer, result = _writer_for(output, capacity, name)
                writer.setup_ex(global_init, global_exit)
            body.extend(writer.write_record_ex(out.record, local_init,
                                               local_exit, status))
        elif output is not None:
            raise PlanError(
                f"the processor of pipe {name!r} returned no record, so there"
                " is nothing to write to its output; return a record or pass "
                "output=None")
        loop = execution_step(f"{name}:loop", body, should_stop_blob=status)
        threads.append(execution_step(f"{name}:thread_{i}",
                                      [local_init, loop, local_exit]))
    if writer is not None:
        writer.commit(global_exit)
    exit_steps = [global_exit]
    outputs = None
    if final_outputs is not None:
        if callable(final_outputs):
            with NetBuilder(name=f"{name}/final") as final:
                outputs = final_outputs()
            exit_steps.append(to_execution_step(final))
        else:
            outputs = final_outputs
    first_init.add_attribute(
        TASK_SETUP, SetupNets(init_nets=[global_init], exit_nets=exit_steps))
    step = threads[0] if len(threads) == 1 else execution_step(
        name, threads, concurrent_substeps=True)
    task = Task(step=step, group=group, name=name,
                num_instances=num_runtime_threads
                if num_runtime_threads > 1 else None)
    if outputs is not None:
        task.add_outputs(outputs)
    return result, task


def pipe(input, output=None, num_threads=1, processor=None, name=None,
         capacity=None, group=None, num_runtime_threads=1):
    """Build a task that pipes records from ``input`` to ``output``.

    Returns the Queue it made when ``output`` is None and there is a record
    to write; otherwise None (keep your own reference to a Queue you pass);
    a `ProcessingReader` with ``num_threads=0``.
    """
    result, _ = _pipe_task(input, output, num_threads, processor, name,
                           capacity, group, num_runtime_threads, None)
    return result


def pipe_and_output(input, output=None, num_threads=1, processor=None,
                    name=None, capacity=None, group=None,
                    num_runtime_threads=1, final_outputs=None):
    """Like `pipe`, and returns ``(result, task outputs)``: ``final_outputs``
    (blobs, or a function building them with the ops DSL) are captured
    when the pipe's task ends."""
    if num_threads < 1:
        raise PlanError("pipe_and_output needs num_threads >= 1")
    result, task = _pipe_task(input, output, num_threads, processor, name,
                              capacity, group, num_runtime_threads,
                              final_outputs)
    outputs = None
    if final_outputs is not None:
        outputs = task.outputs()
        if not isinstance(final_outputs, (list, tuple)) and \
                len(outputs) == 1:
            outputs = outputs[0]
    return result, outputs
