"""Every error path of the public API: the exception
class a user catches and a fragment of the message that tells them what
went wrong.

Runs go through the ``session`` fixture so every session kind must raise
the same errors.  A failure's cause is the original exception in-process
and its traceback text (`RemoteTraceback`) across processes;
`assert_caused_by` accepts either.
"""

import re
import time

import numpy as np
import psutil
import pytest

from localcluster import (BlobNotFoundError, CheckpointError, Net,
                          NetBuilder, Node, NodeFailedError, PlanError,
                          LocalClusterError, RunTimeoutError,
                          SessionClosedError, Task, TaskFailedError,
                          TaskGroup, errors, execution_step, ops,
                          to_execution_step)
from localcluster.errors import RemoteTraceback

RUN_TIMEOUT = 3.0


# -- helpers ------------------------------------------------------------------

def boom():
    raise ValueError("boom")


def fail_soon():
    time.sleep(0.05)
    raise ValueError("boom")


def fail_if_first(instance_id):
    if instance_id == 0:
        time.sleep(0.05)
        raise ValueError("boom")


def three_values():
    return np.zeros(1), np.zeros(1), np.zeros(1)


def one_array():
    return np.zeros(3)


def two_values():
    return np.zeros(1), np.zeros(1)


def assert_caused_by(err, exc_type, fragment):
    """``err.__cause__`` is an ``exc_type`` (or, from another process, the
    traceback text of one) whose text contains ``fragment``."""
    cause = err.__cause__
    assert cause is not None, f"{err!r} has no __cause__"
    if isinstance(cause, RemoteTraceback):
        assert exc_type.__name__ in str(cause)
    else:
        assert isinstance(cause, exc_type)
    assert fragment in str(cause)


def spin_forever():
    """Plan a loop that never stops on its own."""
    with ops.loop():
        ops.stop_if(ops.Const(False))


def trivial_net(name="trivial"):
    net = Net(name)
    net.Const(1, blob_out="trivial_out")
    return net


# -- a failing op -------------------------------------------------------------

def test_op_raising_in_a_node_is_a_task_failed_error_naming_where(session):
    with TaskGroup() as tg, Node("n"):
        net = Net("boom_net")
        net.Const(1)
        net.Const(2)
        net.Python(boom)([], [])
        Task(step=execution_step("explode", [net]), name="boomer")
    with pytest.raises(TaskFailedError) as info:
        session.run(tg, timeout=RUN_TIMEOUT)
    err = info.value
    assert (err.node, err.task, err.step, err.op_type, err.op_index) == (
        "n", "n/boomer", "explode", "Python", 2)
    message = str(err)
    for fragment in ("'n'", "n/boomer", "Python", "boom"):
        assert fragment in message
    assert_caused_by(err, ValueError, "boom")


def test_a_failing_builtin_op_names_the_line_that_built_it(session):
    """A built-in op's failure is raised in the library's kernel: the
    error names the user's line that built the op, in its message and as
    ``built_at``, under every session."""
    import inspect
    with TaskGroup() as tg, Node("n"), Task(name="shapes"):
        line = inspect.currentframe().f_lineno + 1
        ops.Div([ops.Const(np.array([1, 2])), ops.Const(np.array([1, 2, 3]))])
    with pytest.raises(TaskFailedError) as info:
        session.run(tg, timeout=RUN_TIMEOUT)
    here = (f"{__file__}:{line} in "
            "test_a_failing_builtin_op_names_the_line_that_built_it")
    assert info.value.op_type == "Div" and info.value.built_at == here
    assert f"built at {here})" in str(info.value)


@pytest.mark.parametrize("kind", ["net", "list", "step", "task", "group"])
def test_every_runnable_kind_reports_a_failing_op(session, kind):
    net = Net(f"fail_{kind}")
    net.Python(boom)([], [])
    runnable = {"net": net, "list": [net],
                "step": execution_step("step", [net]),
                "task": Task(step=net, node="local")}.get(kind)
    if kind == "group":
        with TaskGroup() as runnable:
            Task(step=net, node="local")
    with pytest.raises(TaskFailedError, match="boom") as info:
        session.run(runnable, timeout=RUN_TIMEOUT)
    assert (info.value.node, info.value.op_type, info.value.op_index) == (
        "local", "Python", 0)


def test_session_is_usable_after_a_task_failure(session):
    net = Net("fails")
    net.Python(boom)([], [])
    with pytest.raises(TaskFailedError):
        session.run(net, timeout=RUN_TIMEOUT)
    assert session.is_open()
    session.run(trivial_net(), timeout=RUN_TIMEOUT)
    assert int(session.fetch_blob("trivial_out")) == 1


def _failing_task_beside_a_spinning_one(same_node):
    with TaskGroup() as tg:
        with Task(node="n", name="spinner"):
            spin_forever()
        with Task(node="n" if same_node else "m", name="failer"):
            ops.Python(fail_soon)([], [])
    return tg, "n" if same_node else "m"


def _failing_instance_beside_spinning_ones():
    with TaskGroup() as tg, Node("n"):
        with Task(num_instances=3, name="failer"):
            instance_id = ops.CountUp(["instance_ids"])
            ops.Python(fail_if_first)([instance_id], [])
            spin_forever()
    return tg, "n"


@pytest.mark.parametrize("build", [
    lambda: _failing_task_beside_a_spinning_one(same_node=True),
    lambda: _failing_task_beside_a_spinning_one(same_node=False),
    _failing_instance_beside_spinning_ones,
], ids=["tasks_on_one_node", "tasks_on_two_nodes", "instances"])
def test_one_failure_cancels_the_siblings(session, build):
    tg, failing_node = build()
    session.feed_blob("instance_ids", np.array(0, dtype=np.int64), node="n")
    started = time.monotonic()
    with pytest.raises(TaskFailedError) as info:
        session.run(tg, timeout=RUN_TIMEOUT)
    assert time.monotonic() - started < 2
    err = info.value
    assert (err.node, err.task, err.op_type) == (
        failing_node, f"{failing_node}/failer", "Python")
    assert_caused_by(err, ValueError, "boom")
    assert session.is_open()


def test_reading_a_missing_blob_fails_the_task_with_a_key_error(session):
    with TaskGroup() as tg, Node("n"):
        with Task():
            ops.Copy(["never_written"], ["copy"])
    with pytest.raises(TaskFailedError, match="Copy") as info:
        session.run(tg, timeout=RUN_TIMEOUT)
    assert info.value.op_type == "Copy"
    assert_caused_by(info.value, BlobNotFoundError, "never_written")
    if not isinstance(info.value.__cause__, RemoteTraceback):
        assert isinstance(info.value.__cause__, KeyError)


@pytest.mark.parametrize("fn, outputs, fragment", [
    (three_values, 2, "returned 3 values for 2 outputs"),
    (one_array, 2, "for 2 outputs"),
    (two_values, 1, "returned 2 values for 1 output"),
    (two_values, 3, "returned 2 values for 3 outputs"),
])
def test_python_op_returning_the_wrong_number_of_outputs(
        session, fn, outputs, fragment):
    net = Net("wrong_outputs")
    net.Python(fn)([], outputs)
    with pytest.raises(TaskFailedError, match=fragment) as info:
        session.run(net, timeout=RUN_TIMEOUT)
    assert info.value.op_type == "Python"


# -- blobs --------------------------------------------------------------------

@pytest.mark.parametrize("node_ran", [True, False],
                         ids=["node_ran", "node_never_ran"])
def test_fetch_blob_of_a_missing_blob_is_a_key_error_naming_it(
        session, node_ran):
    if node_ran:
        session.run(trivial_net(), timeout=RUN_TIMEOUT)
    node = "local" if node_ran else "never_ran"
    with pytest.raises(BlobNotFoundError) as info:
        session.fetch_blob("ghost", node=node)
    assert isinstance(info.value, KeyError)
    assert "ghost" in str(info.value)
    assert node in str(info.value)


def test_fetching_a_blob_a_private_group_made_says_it_was_dropped_with_it(
        session):
    """A PRIVATE group's new blobs are written, then dropped with the
    group's workspace: the error says so (it said no run wrote it)."""
    with TaskGroup() as tg, Node("n"), Task(name="temps"):
        ops.Add([ops.Const(np.array(1)), ops.Const(np.array(2))], ["temp"])
    session.run(tg, timeout=RUN_TIMEOUT)
    with pytest.raises(BlobNotFoundError, match=re.escape(
            "blob 'temp' not found on node 'n'; op Add of net 'n/temps' "
            "writes it in a run of a PRIVATE group, whose new blobs are "
            "dropped with the group's workspace when the run ends; make it "
            "in a GLOBAL group")):
        session.fetch_blob("temp", node="n")
    with pytest.raises(BlobNotFoundError, match="no run on that node "
                                                "wrote it$"):
        session.fetch_blob("ghost", node="n")


def test_has_blob_on_a_node_that_never_ran_is_false_and_starts_nothing(
        session):
    children = psutil.Process().children(recursive=True)
    assert session.has_blob("anything", "never_ran") is False
    assert psutil.Process().children(recursive=True) == children


# -- timeouts and session lifecycle -------------------------------------------

def test_run_timeout_raises_and_leaves_the_session_usable(session):
    with NetBuilder(name="forever") as nb:
        spin_forever()
    started = time.monotonic()
    with pytest.raises(RunTimeoutError, match="0.2") as info:
        session.run(to_execution_step(nb), timeout=0.2)
    assert time.monotonic() - started < 2
    assert isinstance(info.value, TimeoutError)
    assert isinstance(info.value, LocalClusterError)
    assert session.is_open()
    session.run(trivial_net(), timeout=RUN_TIMEOUT)
    assert int(session.fetch_blob("trivial_out")) == 1


@pytest.mark.parametrize("call", [
    lambda s: s.run(trivial_net()),
    lambda s: s.fetch_blob("trivial_out"),
    lambda s: s.feed_blob("x", np.zeros(1)),
], ids=["run", "fetch_blob", "feed_blob"])
def test_using_a_closed_session_is_a_session_closed_error(session, call):
    session.close()
    assert not session.is_open()
    with pytest.raises(SessionClosedError, match="closed"):
        call(session)


def test_close_is_idempotent(session):
    session.close()
    session.close()
    assert not session.is_open()


def test_session_as_a_context_manager_closes(session_factory):
    with session_factory() as session:
        assert session.is_open()
        session.run(trivial_net(), timeout=RUN_TIMEOUT)
    assert not session.is_open()
    with pytest.raises(SessionClosedError):
        session.run(trivial_net())


@pytest.mark.parametrize("runnable, fragment", [
    (42, "int"),
    ("a_net_name", "str"),
    (None, "None"),
    ({"net": 1}, "dict"),
])
def test_invalid_runnable_is_a_plan_error(session, runnable, fragment):
    with pytest.raises(PlanError, match=fragment):
        session.run(runnable)


# -- the ops DSL --------------------------------------------------------------

def _loop_without_stop():
    with NetBuilder():
        with ops.loop():
            ops.Const(1)


def _has_stopped_inside_the_block():
    with NetBuilder():
        with ops.stop_guard() as guard:
            guard.has_stopped()


def _elif_after_else():
    with NetBuilder():
        cond = ops.Const(True)
        with ops.If(cond) as branch:
            ops.Const(1)
        with branch.Else() as otherwise:
            ops.Const(2)
        otherwise.Elif(cond)


def _else_after_else():
    with NetBuilder():
        with ops.If(ops.Const(True)) as branch:
            ops.Const(1)
        with branch.Else() as otherwise:
            ops.Const(2)
        otherwise.Else()


@pytest.mark.parametrize("build, fragment", [
    (_loop_without_stop, "stop"),
    (_has_stopped_inside_the_block, "has_stopped"),
    (_elif_after_else, "Elif"),
    (_else_after_else, "Else"),
], ids=["loop_without_stop", "has_stopped_early", "elif_after_else",
        "else_after_else"])
def test_invalid_control_flow_is_a_plan_error(build, fragment):
    with pytest.raises(PlanError, match=fragment):
        build()


@pytest.mark.parametrize("call", [
    lambda: ops.Const(1),
    lambda: ops.Add(["a", "b"]),
    lambda: ops.Python(boom),
    lambda: ops.net(),
    lambda: ops.stop(),
    lambda: ops.stop_if("flag"),
    lambda: ops.loop(3),
    lambda: ops.stop_guard(),
    lambda: ops.If("flag"),
    lambda: ops.task_init(),
    lambda: ops.task_exit(),
    lambda: ops.task_instance_init(),
    lambda: ops.task_instance_exit(),
    lambda: ops.local_init(),
    lambda: ops.local_exit(),
    lambda: ops.task_reporter(),
], ids=["Const", "Add", "Python", "net", "stop", "stop_if", "loop",
        "stop_guard", "If", "task_init", "task_exit", "task_instance_init",
        "task_instance_exit", "local_init", "local_exit", "task_reporter"])
def test_ops_without_a_current_builder_is_a_plan_error(call):
    with pytest.raises(PlanError, match="NetBuilder"):
        call()


# -- the hierarchy ------------------------------------------------------------

@pytest.mark.parametrize("cls, stdlib_base", [
    (PlanError, ValueError),
    (TaskFailedError, None),
    (NodeFailedError, None),
    (CheckpointError, None),
    (SessionClosedError, None),
    (RunTimeoutError, TimeoutError),
    (BlobNotFoundError, KeyError),
])
def test_every_error_derives_from_local_cluster_error(cls, stdlib_base):
    assert issubclass(cls, LocalClusterError)
    assert getattr(errors, cls.__name__) is cls
    if stdlib_base is not None:
        assert issubclass(cls, stdlib_base)
