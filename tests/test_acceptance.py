"""The examples of the foundation issue, on every session kind."""

import time

import numpy as np

from localcluster import (NetBuilder, Node, Task, TaskGroup, final_output, ops,
                          to_execution_step, Net, WorkspaceType)


def test_loop_with_stop_if_counts_to_five(session):
    with NetBuilder() as nb:
        x = ops.Const(5)
        y = ops.Const(0)
        one, zero = ops.Const(1), ops.Const(0)
        with ops.loop():
            ops.stop_if(ops.EQ([x, zero]))
            ops.Sub([x, one], [x])
            ops.Add([y, one], [y])
    session.run(to_execution_step(nb))
    assert session.fetch_blob(y) == 5
    assert session.fetch_blob(x) == 0


def test_instances_share_a_counter_created_in_task_init(session):
    with TaskGroup() as tg:
        with Task(num_instances=10):
            with ops.task_init():
                counter = ops.CreateCounter([], ["global_counter"])
            with ops.loop(15):
                ops.CountUp(counter)
            with ops.task_exit():
                total = final_output(ops.RetrieveCount(counter))
    session.run(tg)
    assert total.fetch() == 150


def test_net_added_twice_runs_twice(session):
    inc = Net("inc")
    inc.Add(["acc", inc.Const(1)], ["acc"])
    with NetBuilder() as nb:
        ops.ConstantFill([], ["acc"], value=0, dtype="int64")
        ops.net(inc)
        ops.net(inc)
    session.run(to_execution_step(nb))
    assert session.fetch_blob("acc") == 2


def _if_else(x_value):
    x = ops.Const(x_value)
    y = ops.Const(0)
    with ops.If(ops.GT([x, ops.Const(50)])) as c:
        ops.Const(1, blob_out=y)
    with c.Else():
        ops.Const(2, blob_out=y)
    return y


def test_if_else_picks_the_right_branch(session):
    with NetBuilder() as nb:
        high = _if_else(75)
        low = _if_else(25)
    session.run(to_execution_step(nb))
    assert session.fetch_blob(high) == 1
    assert session.fetch_blob(low) == 2


def test_elif_chain_runs_exactly_one_branch(session):
    results = {}
    with NetBuilder() as nb:
        for value in (75, 30, 5):
            x = ops.Const(value)
            y = ops.Const(0)
            with ops.If(ops.GT([x, ops.Const(50)])) as c:
                ops.Const(1, blob_out=y)
            with c.Elif(ops.GT([x, ops.Const(20)])) as c:
                ops.Const(2, blob_out=y)
            with c.Else():
                ops.Const(3, blob_out=y)
            results[value] = y
    session.run(to_execution_step(nb))
    assert {v: int(session.fetch_blob(b)) for v, b in results.items()} == \
        {75: 1, 30: 2, 5: 3}


def test_stop_inside_if_ends_only_that_block(session):
    with NetBuilder() as nb:
        y = ops.Const(0)
        after = ops.Const(0)
        with ops.If(ops.Const(True)):
            ops.Const(3, blob_out=y)
            ops.stop()
            ops.Const(4, blob_out=y)
        ops.Const(7, blob_out=after)
    session.run(to_execution_step(nb))
    assert session.fetch_blob(y) == 3
    assert session.fetch_blob(after) == 7


def test_stop_guard_reports_whether_it_stopped(session):
    with NetBuilder() as nb:
        with ops.stop_guard() as stopped:
            ops.stop_if(ops.LT([ops.Const(3), ops.Const(5)]))
            ops.Const(1, blob_out="reached")
        with ops.stop_guard() as ran_through:
            ops.stop_if(ops.LT([ops.Const(10), ops.Const(5)]))
        with ops.stop_guard() as empty:
            pass
    session.run(to_execution_step(nb))
    assert session.fetch_blob(stopped.has_stopped())
    assert not session.has_blob("reached")
    assert not session.fetch_blob(ran_through.has_stopped())
    assert not session.fetch_blob(empty.has_stopped())


def test_loop_iter_counts_from_zero_and_loop_count_can_be_a_blob(session):
    with NetBuilder() as nb:
        seen = ops.ConstantFill([], ["seen"], value=0, dtype="int64")
        n = ops.Const(4)
        with ops.loop(n) as loop:
            ops.Add([seen, loop.iter()], [seen])
            ops.Copy(loop.iter(), ["last_iter"])
    session.run(to_execution_step(nb))
    assert session.fetch_blob("seen") == 0 + 1 + 2 + 3
    assert session.fetch_blob("last_iter") == 3


def wait_ms(ms):
    time.sleep(float(ms) / 1000.0)


def test_report_step_runs_after_the_task_beside_it(session):
    # Fed first, so the report step can read them from its first tick; a
    # PRIVATE group's writes to existing blobs persist.
    session.feed_blob("task_done", 0, node="worker")
    session.feed_blob("seen_done", 0, node="worker")
    with TaskGroup() as tg:
        with Node("worker"):
            with Task():
                ops.Python(wait_ms)([ops.Const(50)], [])
                ops.ConstantFill([], ["task_done"], value=1, dtype="int64")
            report = Net("report")
            report.Copy(["task_done"], ["seen_done"])
            tg.report_step(report, interval_ms=10)
    session.run(tg)
    # The report step ran at least once after the task finished.
    assert session.fetch_blob("seen_done", "worker") == 1


def test_task_reporter_runs_periodically_and_once_after(session):
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node("worker"), Task():
            with ops.task_init():
                reports = ops.CreateCounter([], ["reports"])
            with ops.task_reporter(interval_ms=10):
                ops.CountUp(reports)
            ops.Python(wait_ms)([ops.Const(100)], [])
    session.run(tg)
    # ~10 periodic runs in 100 ms plus the final one; bounded below loosely
    # because CI machines are slow.
    assert session.fetch_blob("reports", "worker") >= 2


def test_outputs_are_values_of_the_last_run(session):
    with TaskGroup() as tg:
        with Node("n"), Task():
            ops.Const(np.arange(3.0), blob_out="values")
            out = final_output("values")
    session.run(tg)
    np.testing.assert_array_equal(out.fetch(), [0.0, 1.0, 2.0])
