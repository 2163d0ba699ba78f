"""Nets compiled into straight-line Python: one generated function per net.

The executor's plain loop (`localcluster.runtime.executor._run_net`)
walks a net's compiled ops -- ``(kernel, inputs, single output, outputs,
lenient, lock)`` tuples -- and for each one unpacks the tuple, tests which
kind of op it is and calls the kernel through ``*map(get, inputs)``.  For
the small arrays of a training loop that bookkeeping costs about as much
as numpy itself.  `generate` writes the same loop out for one net, op by
op, with each op's kind decided when the code is written::

    def run_net(net, code, get, put, ws, rc, task, step, repeats=1):
        is_set = rc.cancelled.is_set
        try:
            for _ in range(repeats):
                if is_set():
                    raise Cancelled(...)
                i = 0
                r = K0(get('total'), get('one'))
                if type(r) is not ndarray:
                    r = one_output(r)
                put('total', r)
                ...
        except Cancelled:
            raise
        except Exception as exc:
            op_failed(exc, i, net, code, ws, rc, task, step)

It has `_run_net`'s signature, and ``repeats`` runs the net that many
times over (a step's plain repetition, without a call per pass).  A run
does exactly what `_run_net` does for the whole net -- the same kernels
(faults and locks are already bound into them when the net is compiled),
the same reads in the same order, the same checks of what an op
returned, the same error (`op_failed` is the interpreter's own handler) -- so a slow node's accounting
(`localcluster.runtime.links.run_net_slowed`) takes either.  The
interpreter stays: a net's first run takes it (most nets of a job run
once: an init, a checkpoint save -- generating code for them would cost
more than it saves), and tests hold the two to the same results and
errors.  Under a schedule the switch points split a net into slices,
each generated alike (its ``op_failed`` told the slice's first op), so
the ops between two points run as straight-line code too.

Blob names enter the source as ``repr`` literals and the kernels as
closure variables, so nothing a user names is ever evaluated as code.
"""

import numpy as np

from ..errors import Cancelled

__all__ = ["generate", "LENDS"]

#: the "lock" of a lending op's compiled code (see `store_lent`)
LENDS = object()

#: a net runs on the interpreter until its run number ``STRAIGHT_AFTER``;
#: then its straight-line code is generated and used from there on
STRAIGHT_AFTER = 2


def _one_output(result):
    """What a single-output op returned, as the array it stores (the
    interpreter's check: None is an error, anything else an array)."""
    if result is None:
        raise ValueError("returned None for 1 output")
    return np.asarray(result)


def generate(net, code, op_failed, store, store_lent):
    """The straight-line function of ``net`` (see the module docstring);
    ``code``: the net's compiled ops; ``op_failed(exc, index, net, code,
    ws, rc, task, step)`` raises what op ``index``'s failure means."""
    lines = []
    emit = lines.append
    names = {"ndarray": np.ndarray, "one_output": _one_output,
             "Cancelled": Cancelled, "op_failed": op_failed,
             "store": store, "store_lent": store_lent}
    for k, (kernel, inputs, single, outputs, lenient, lock) in \
            enumerate(code):
        names[f"K{k}"] = kernel
        call = f"K{k}({', '.join(f'get({name!r})' for name in inputs)})"
        emit(f"i = {k}")
        if lock is LENDS:
            emit(f"store_lent({tuple(outputs)!r}, {call}, {lenient!r}, "
                 f"put, ws)")
        elif lock is not None:
            names[f"L{k}"] = lock
            emit(f"with L{k}:")
            emit(f"    store({tuple(outputs)!r}, {call}, {lenient!r}, put)")
        elif single is not None:
            emit(f"r = {call}")
            emit("if type(r) is not ndarray:")
            emit("    r = one_output(r)")
            emit(f"put({single!r}, r)")
        elif outputs:
            emit(f"store({tuple(outputs)!r}, {call}, {lenient!r}, put)")
        else:
            emit(call)
    body = "\n".join("                " + line for line in lines) or \
        "                pass"
    free = ", ".join(names)
    source = (
        f"def make({free}):\n"
        f"    def run_net(net, code, get, put, ws, rc, task, step, "
        f"repeats=1):\n"
        f"        is_set = rc.cancelled.is_set\n"
        f"        i = 0\n"
        f"        try:\n"
        f"            for _ in range(repeats):\n"
        f"                if is_set():\n"
        f"                    raise Cancelled(f'run on node {{rc.node!r}} "
        f"was cancelled')\n"
        f"{body}\n"
        f"        except Cancelled:\n"
        f"            raise\n"
        f"        except Exception as exc:\n"
        f"            op_failed(exc, i, net, code, ws, rc, task, step)\n"
        f"    return run_net\n")
    scope = {}
    exec(compile(source, f"<net {net.name!r}>", "exec"), scope)  # noqa: S102
    run_net = scope["make"](**names)
    run_net.repeats = True
    run_net.__qualname__ = run_net.__name__ = "run_net_straight"
    return run_net
