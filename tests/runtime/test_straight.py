"""A net's straight-line code (`localcluster.runtime.straight`) against the
interpreter it replaces: drawn nets of every kind of op -- plain numpy
ops, ops with arguments, context ops, atomic ops, multi-output ops, Python
ops that return None, too many values or raise, ops with no output,
reads of blobs nothing wrote -- must leave the same blobs and fail with
the same error, naming the same op, under both; and faults, cancellation
and a slow node's accounting must reach the straight code too."""

import threading

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from localcluster import (NetBuilder, TaskFailedError, ops,
                          to_execution_step)
from localcluster.errors import Cancelled
from localcluster.kernels.registry import register_op
from localcluster.runtime import executor, straight
from localcluster.runtime.executor import RunContext, execute
from localcluster.runtime.workspace import Workspace

BLOBS = ("a", "b", "c", "v")


def _py_none(x):
    return None


def _py_pair(x):
    return x + 1, x - 1


def _py_raise(x):
    raise RuntimeError(f"planted failure at {float(np.sum(x))}")


def _py_scalar(x):
    return float(np.sum(x))


@register_op("StraightTestMaybeNone")
def _maybe_none(x):
    """A registered one-output op that returns None for a large input: an
    error the executor reports ("returned None for 1 output")."""
    return None if float(np.sum(x)) > 5 else x * 2


@register_op("StraightTestFloat")
def _a_float(x):
    """A registered op returning a Python float, stored as an array."""
    return float(np.sum(x))


#: (name, builder(inputs, output)) of the drawn ops
OPS = {
    "Add": lambda i, o: ops.Add(i[:2], [o]),
    "Sub": lambda i, o: ops.Sub(i[:2], [o]),
    "Mul": lambda i, o: ops.Mul(i[:2], [o]),
    "Scale": lambda i, o: ops.Scale([i[0]], [o], scale=1.5),
    "Sum": lambda i, o: ops.Sum(i[:2], [o]),
    "Copy": lambda i, o: ops.Copy([i[0]], [o]),
    "Reshape": lambda i, o: ops.Reshape([i[0]], [o], shape=[-1]),
    "Concat": lambda i, o: ops.Concat(i[:2], [o], axis=0),
    "Counter": lambda i, o: ops.CountUp(["counter"], [o]),
    "AtomicAdd": lambda i, o: ops.AtomicAdd(["acc", i[0]], []),
    "Append": lambda i, o: ops.AppendDataset(["rows", i[0]], ["rows"]),
    "PyNone": lambda i, o: ops.Python(_py_none)([i[0]], [o]),
    "PyPair": lambda i, o: ops.Python(_py_pair)([i[0]], [o, "pair_b"]),
    "PyScalar": lambda i, o: ops.Python(_py_scalar)([i[0]], [o]),
    "PyRaise": lambda i, o: ops.Python(_py_raise)([i[0]], [o]),
    "Missing": lambda i, o: ops.Add([i[0], "never_written"], [o]),
    "MaybeNone": lambda i, o: ops.StraightTestMaybeNone([i[0]], [o]),
    "Float": lambda i, o: ops.StraightTestFloat([i[0]], [o]),
}

_op = st.tuples(st.sampled_from(sorted(OPS)),
                st.lists(st.sampled_from(BLOBS), min_size=2, max_size=2),
                st.sampled_from(BLOBS))
#: weighted towards ops that succeed, so most nets run to their end
_net = st.lists(st.one_of(_op, _op.filter(lambda o: o[0] in (
    "Add", "Sub", "Mul", "Scale", "Copy", "Counter", "AtomicAdd"))),
    min_size=1, max_size=12)


def _step(drawn, repeats, name="drawn"):
    with NetBuilder(name) as nb:
        with ops.loop(repeats):
            for kind, inputs, output in drawn:
                OPS[kind](inputs, output)
    return to_execution_step(nb)


def _workspace(shapes):
    ws = Workspace("node_0")
    for name, shape in zip(BLOBS, shapes):
        ws.set(name, np.arange(1.0, 1.0 + np.prod(shape)).reshape(shape))
    ws.set("counter", np.array(0, dtype=np.int64))
    ws.set("acc", np.zeros(()))
    ws.set("rows", np.zeros((0,)))
    return ws


def _interpreted(monkeypatch):
    """Make every net take the interpreter, as before straight code."""
    monkeypatch.setattr(RunContext, "runner",
                        lambda self, net, repeats=1: (self.compiled(net),
                                                      executor._run_net))


def _outcome(step, shapes, runs=1):
    ws = _workspace(shapes)
    rc = RunContext("node_0", ws.lock)
    error = None
    try:
        for _ in range(runs):
            rc.begin()
            execute(step, ws, rc, task="t")
    except TaskFailedError as exc:
        error = (type(exc).__name__, str(exc), exc.op_type, exc.op_index,
                 exc.cause_type, exc.cause_message, exc.net, exc.step)
    blobs = {name: ws.get(name) for name in ws.names()}
    return blobs, error


def _same_blobs(mine, theirs):
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        a, b = mine[name], theirs[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        np.testing.assert_array_equal(a, b, err_msg=name)


_shapes = st.lists(st.sampled_from([(), (3,), (2, 3), (1,)]), min_size=4,
                   max_size=4)


@given(drawn=_net, shapes=_shapes, repeats=st.sampled_from([1, 2, 5]),
       runs=st.sampled_from([1, 3]))
@example(drawn=[("Add", ["a", "b"], "c"), ("MaybeNone", ["c", "c"], "c")],
         shapes=[(3,)] * 4, repeats=2, runs=1)
@example(drawn=[("Float", ["a", "b"], "c"), ("Concat", ["c", "v"], "b")],
         shapes=[(3,), (3,), (3,), (2, 3)], repeats=5, runs=1)
def test_straight_code_leaves_the_blobs_and_errors_of_the_interpreter(
        drawn, shapes, repeats, runs):
    step = _step(drawn, repeats)
    straight_blobs, straight_error = _outcome(step, shapes, runs)
    with pytest.MonkeyPatch.context() as mp:
        _interpreted(mp)
        plain_blobs, plain_error = _outcome(step, shapes, runs)
    assert straight_error == plain_error
    _same_blobs(straight_blobs, plain_blobs)


def _ran_straight(rc, net):
    return rc._entry(net)[4] is not None


def test_a_net_run_once_is_interpreted_and_a_repeated_one_runs_straight():
    with NetBuilder("once") as nb:
        ops.Add(["a", "b"], ["c"])
    once = to_execution_step(nb)
    looped = _step([("Add", ["a", "b"], "c")], 3)
    ws = _workspace([(3,)] * 4)
    rc = RunContext("node_0", ws.lock)
    rc.begin()
    execute(once, ws, rc)
    net = once.substeps[0].nets[0] if not once.nets else once.nets[0]
    assert not _ran_straight(rc, net)  # an init-like net: no code made
    execute(once, ws, rc)
    assert _ran_straight(rc, net)      # its second run: straight code
    execute(looped, ws, rc)
    loop_nets = [n for s in _walk(looped) for n in s.nets
                 if n.ops and n.ops[0].type == "Add"]
    assert loop_nets and all(_ran_straight(rc, n) for n in loop_nets)


def _walk(step):
    yield step
    for sub in step.substeps:
        yield from _walk(sub)


def test_the_failing_op_of_straight_code_is_named_with_the_users_line():
    drawn = [("Add", ["a", "b"], "c"), ("Concat", ["a", "v"], "c"),
             ("Mul", ["c", "c"], "c")]
    step = _step(drawn, 4)
    _, error = _outcome(step, [(3,), (3,), (3,), (2, 3)])
    assert error is not None
    assert (error[2], error[3]) == ("Concat", 1)
    assert "built at" in error[1] and "test_straight.py" in error[1]


def test_a_blob_nothing_wrote_is_named_by_straight_code():
    step = _step([("Copy", ["a", "a"], "c"), ("Missing", ["c", "c"], "b")],
                 3)
    _, error = _outcome(step, [(3,)] * 4)
    assert error[2:4] == ("Add", 1) and error[4] == "BlobNotFoundError"
    assert "never_written" in error[5]


def test_a_cancelled_run_stops_straight_code_at_the_next_pass():
    seen = []

    def count_then_cancel(x):
        seen.append(1)
        if len(seen) == 3:
            rc.cancelled.set()
        return x

    with NetBuilder("cancel") as nb:
        with ops.loop(1000):
            ops.Python(count_then_cancel)(["a"], ["a"])
    step = to_execution_step(nb)
    ws = _workspace([(3,)] * 4)
    rc = RunContext("node_0", ws.lock)
    rc.begin()
    with pytest.raises(Cancelled):
        execute(step, ws, rc)
    assert len(seen) == 3


def test_faults_fire_in_straight_code_as_in_the_interpreter():
    from localcluster import LocalSession, Node, Task, TaskGroup
    from localcluster.testing import FaultPlan, Kill, Op

    def group():
        with TaskGroup() as g, Node("node_0"), Task(name="t"):
            a = ops.ConstantFill([], ["a"], shape=[3], value=1.0)
            with ops.loop(5):
                ops.Add([a, a], ["c"])
                ops.Mul(["c", a], ["c"])
        return g

    outcomes = []
    for interpreted in (False, True):
        with pytest.MonkeyPatch.context() as mp:
            if interpreted:
                _interpreted(mp)
            plan = FaultPlan(Kill("node_0", Op("Mul", nth=3), how="raise"))
            session = LocalSession(faults=plan)
            try:
                with pytest.raises(TaskFailedError) as info:
                    session.run(group())
            finally:
                session.close()
            error = info.value
            outcomes.append((type(error).__name__,
                             getattr(error, "op_type", None),
                             getattr(error, "op_index", None),
                             len(plan.fired())))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1:] == ("Mul", 1, 1)


def test_a_slow_node_accounts_for_straight_code(monkeypatch):
    calls = []
    real = executor.run_net_slowed

    def counted(run_net, *args):
        calls.append(run_net)
        return real(run_net, *args)

    monkeypatch.setattr(executor, "run_net_slowed", counted)
    step = _step([("Add", ["a", "b"], "c")], 4)
    ws = _workspace([(3,)] * 4)
    rc = RunContext("node_0", ws.lock)
    rc.slowdown = 1.5
    rc.begin()
    execute(step, ws, rc)
    # the loop's net, paid for pass by pass on its straight code
    assert sum(getattr(c, "repeats", False) for c in calls) == 4
    np.testing.assert_array_equal(ws.get("c"), [2.0, 4.0, 6.0])


def test_blob_names_are_never_evaluated_as_code():
    name = "x'); import os; os._exit(3); ('"
    with NetBuilder("names") as nb:
        with ops.loop(2):
            ops.Copy(["a"], [name])
    ws = _workspace([(3,)] * 4)
    rc = RunContext("node_0", ws.lock)
    rc.begin()
    execute(to_execution_step(nb), ws, rc)
    np.testing.assert_array_equal(ws.get(name), ws.get("a"))


def test_threads_share_one_generated_function_per_net():
    step = _step([("Counter", ["a", "a"], "c")], 50)
    ws = _workspace([(3,)] * 4)
    rc = RunContext("node_0", ws.lock)
    rc.begin()
    threads = [threading.Thread(target=execute, args=(step, ws, rc))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert int(ws.get("counter")) == 200
    assert straight.STRAIGHT_AFTER >= 2


# -- under a schedule: the slices between switch points ----------------------

def _scheduled_outcome(step, shapes, cut, runs):
    """``(blobs, error, virtual end of each run)`` of ``runs`` runs of
    ``step`` as the one branch of a schedule whose switch points are
    before ops ``cut`` of every net: the slices between them run on the
    interpreter the first time, as straight-line code from then on."""
    from localcluster.runtime.scheduler import Scheduler
    from localcluster.testing import Schedule
    ws = _workspace(shapes)
    rc = RunContext("node_0", ws.lock)
    # one points object for every run: the slices are cached against it
    points = {"node_0": {id(net): frozenset(cut)
                         for s in _walk(step) for net in s.nets}}
    error, ends = None, []
    for _ in range(runs):
        sched = Scheduler(Schedule(0, op_seconds=0.001), points=points)
        branch = sched.add("node_0")
        failed = []

        def body():
            rc.begin(clock=sched)
            try:
                execute(step, ws, rc, task="t")
            except TaskFailedError as exc:
                failed.append(exc)

        thread = threading.Thread(target=sched.run_as, args=(branch, body))
        thread.start()
        sched.kick()
        thread.join()
        sched.close()
        ends.append(sched.end_ns())
        if failed:
            exc = failed[0]
            error = (type(exc).__name__, str(exc), exc.op_type, exc.op_index,
                     exc.cause_type, exc.cause_message, exc.net, exc.step)
            break
    blobs = {name: ws.get(name) for name in ws.names()}
    return blobs, error, ends


@given(drawn=_net, shapes=_shapes, repeats=st.sampled_from([1, 3]),
       cut=st.sets(st.integers(0, 11), max_size=4),
       runs=st.sampled_from([1, 3]))
@example(drawn=[("Add", ["a", "b"], "c"), ("Scale", ["c", "c"], "c"),
                ("Concat", ["a", "v"], "c"), ("Mul", ["c", "c"], "c")],
         shapes=[(3,), (3,), (3,), (2, 3)], repeats=3, cut={0, 2}, runs=3)
# fails on the second pass, in the straight code of the second slice
@example(drawn=[("Add", ["c", "a"], "c"), ("Scale", ["c", "c"], "c"),
                ("MaybeNone", ["c", "c"], "b")],
         shapes=[()] * 4, repeats=3, cut={1}, runs=1)
def test_slices_between_switch_points_run_straight_as_interpreted(
        drawn, shapes, repeats, cut, runs):
    step = _step(drawn, repeats)
    straight_run = _scheduled_outcome(step, shapes, cut, runs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executor, "_straight_segments",
                   lambda net, segments: segments)
        interpreted = _scheduled_outcome(step, shapes, cut, runs)
    # the same error (naming the same op of the net), the same virtual
    # time charged for the ops that ran, the same blobs
    assert straight_run[1:] == interpreted[1:]
    _same_blobs(straight_run[0], interpreted[0])


def test_a_sliced_net_runs_straight_from_its_second_run():
    step = _step([("Add", ["a", "b"], "c"), ("Scale", ["c", "c"], "c"),
                  ("Mul", ["c", "c"], "c")], 2)
    made = []
    real = executor._straight_segments

    def spy(net, segments):
        found = real(net, segments)
        made.append([type(s[3]).__name__ for s in found])
        return found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(executor, "_straight_segments", spy)
        _scheduled_outcome(step, [(3,)] * 4, {1}, 3)
    # each of the two nets (the constants', the loop's) is cut in two by
    # the point before its op 1: made once, on the net's second run, one
    # function per slice
    assert made == [["function", "function"]] * 2
