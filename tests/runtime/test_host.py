"""NodeRuntime hosted with no session: in a plain thread, and in a bare
process through the node-process adapter alone."""

import multiprocessing
import threading
import time

import numpy as np
import pytest

from localcluster import (Cluster, Dataset, Node, Queue, Task, TaskGroup,
                          WorkspaceType, final_output, ops, pipe)
from localcluster.errors import Cancelled
from localcluster.plan.packing import pack_plan
from localcluster.runtime import shm
from localcluster.runtime.host import NodeRuntime
from localcluster.sessions import _protocol as P
from localcluster.sessions._node import NodeSpec, node_main


def add_one(batch):
    return {"x": ops.Add([batch["x"], ops.Const(1)])}


def queue_plan():
    """One node: a task pipes 0..9 (+1) through a queue into a dataset;
    the sum of what arrived is an output."""
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("n"):
            with Task():
                src = Dataset({"x": np.arange(10)}, name="src")
                dst = Dataset({"x": np.zeros(0, np.int64)}, name="dst")
            with Task():
                q = pipe(src.reader(), processor=add_one)
                pipe(q, dst.writer())
    (plan,) = group.node_plans()
    return plan, dst


def blocked_plan():
    """A node that waits on a queue nobody writes to: only a cancel ends it."""
    queue = Queue(4, name="nobody_writes")
    with Cluster(), TaskGroup():  # gives the queue its fields; never run
        with Node("elsewhere"):
            with Task():
                src = Dataset({"x": np.arange(3)}, name="src")
            pipe(src.reader(), queue)
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("n"):
            pipe(queue, processor=add_one)
    (plan,) = group.node_plans()
    return plan


def in_thread(fn):
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def test_a_runtime_in_a_plain_thread_runs_a_queue_and_serves_fetches():
    plan, dst = queue_plan()
    runtime = NodeRuntime("n")
    try:
        thread, box = in_thread(lambda: runtime.run(1, plan))
        thread.join(30)
        assert not thread.is_alive() and "error" not in box, box
        got = runtime.fetch(dst.content()["x"])
        np.testing.assert_array_equal(np.sort(got), np.arange(1, 11))
        assert runtime.has(dst.content()["x"])
        assert str(dst.content()["x"]) in runtime.blobs()
        runtime.feed("fed", np.array([4.0]))
        assert runtime.fetch("fed")[0] == 4.0
    finally:
        runtime.close()


def test_a_cancel_wakes_a_queue_wait_at_once_in_a_plain_thread():
    plan = blocked_plan()
    runtime = NodeRuntime("n")
    try:
        thread, box = in_thread(lambda: runtime.run(7, plan))
        deadline = time.monotonic() + 10
        while runtime.running != 7 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # now it waits on the queue
        assert thread.is_alive()
        start = time.monotonic()
        runtime.cancel(7)
        thread.join(10)
        woke = time.monotonic() - start
        assert not thread.is_alive()
        assert isinstance(box.get("error"), Cancelled), box
        # woken by the cancel itself, not found by a poll of the queue
        assert woke < 0.15, woke
    finally:
        runtime.close()


def test_a_cancel_that_arrives_before_its_run_cancels_it_as_it_starts():
    plan = blocked_plan()
    runtime = NodeRuntime("n")
    try:
        runtime.cancel(3)
        with pytest.raises(Cancelled):
            runtime.run(3, plan)
        # a later run is not affected by the earlier cancel
        plan2, _ = queue_plan()
        runtime.run(4, plan2)
    finally:
        runtime.close()


def test_plans_are_kept_by_id_up_to_the_cache_size():
    plan, _ = queue_plan()
    runtime = NodeRuntime("n", plan_cache=2)
    try:
        for plan_id in (1, 2, 3):
            runtime.load(plan_id, plan)
        runtime.run(1, 3)   # by id
        with pytest.raises(KeyError):
            runtime.plan(1)  # evicted, oldest first
    finally:
        runtime.close()


def const_plan():
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("solo"), Task():
            ops.Add([ops.Const(np.arange(3.0)), ops.Const(1.0)], ["y"])
            final_output("y")
    (plan,) = group.node_plans()
    return plan


def test_a_runtime_in_a_bare_process_through_the_node_adapter():
    ctx = multiprocessing.get_context("fork")
    prefix = shm.session_prefix() + "bare_"
    shm.create_segment(prefix + "ctl", 8 * 4)   # one control slot
    master, node_end = ctx.Pipe(duplex=True)
    log_r, log_w = ctx.Pipe(duplex=False)
    spec = NodeSpec("solo", prefix, {}, master_pid=0, pdeathsig=False,
                    control=(prefix + "ctl", 0))
    process = ctx.Process(target=node_main, args=(spec, node_end, log_w))
    process.start()
    node_end.close()
    log_w.close()
    try:
        assert master.poll(30)
        kind, pid, problem = P.recv(master)
        assert (kind, pid, problem) == (P.READY, process.pid, None)
        P.send(master, (P.RUN, 1, 1, pack_plan(const_plan()), {}, {}))
        assert master.poll(30)
        reply = P.recv(master)
        assert reply[:2] == (P.OK, 1), reply
        desc = reply[2]["outputs"]["y"]
        mm = shm.map_segment(desc["segment"])
        y = np.frombuffer(mm, np.dtype(desc["dtype"]), count=3,
                          offset=desc["offset"])
        np.testing.assert_array_equal(y, [1.0, 2.0, 3.0])
        del y
        mm.close()
        P.send(master, (P.FETCH, 2, "y"))
        assert master.poll(30)
        assert P.recv(master)[:2] == (P.OK, 2)
        P.send(master, (P.SHUTDOWN, 3))
        assert master.poll(30)
        assert P.recv(master)[:2] == (P.BYE, 3)
        process.join(30)
        assert process.exitcode == 0
    finally:
        if process.is_alive():
            process.kill()
            process.join(5)
        master.close()
        log_r.close()
        shm.sweep(prefix)
