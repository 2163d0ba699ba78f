"""Queue channels between node processes are released when no plan the
session keeps names their queue any more -- in the master and in the
nodes -- and kept while one does."""

import gc
import os

import numpy as np
import psutil

from localcluster import Node, Queue, Task, TaskGroup, WorkspaceType, ops
from localcluster.runtime import shm


def handoff_group(name):
    """Node "src" sends one record through queue ``name`` to node "dst",
    which keeps it as blob "got"."""
    queue = Queue(2, name=name)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("src"), Task():
            ops.ConstantFill([], ["x"], shape=[3], value=7.0)
            writer = queue.writer()
            writer.write_record(ops.net(), {"x": "x"})
            writer.commit(ops.net())
        with Node("dst"), Task():
            _, record = queue.reader().read_record(ops.net())
            ops.Copy([record["x"]], ["got"])
    return group


def shm_fds(pid):
    """Descriptors of process ``pid`` open on /dev/shm (a channel's FIFOs;
    a node's cancellation eventfd, made on its first wait, is not one)."""
    found = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found += os.readlink(f"/proc/{pid}/fd/{fd}").startswith(
                shm.SHM_DIR + "/")
        except FileNotFoundError:
            pass
    return found


def footprint(session):
    """Descriptors of the master and its nodes on /dev/shm, and the
    session's segments and FIFOs there."""
    fds = shm_fds(os.getpid()) + sum(
        shm_fds(pid) for pid in session.node_pids().values())
    return fds, len(shm.segments(session.shm_prefix))


def run_once(session, name):
    session.run(handoff_group(name))
    np.testing.assert_array_equal(session.fetch_blob("got", "dst"),
                                  np.full(3, 7.0))


def test_channels_of_plans_that_are_gone_are_released_everywhere(localhost):
    session = localhost()
    for i in range(3):
        run_once(session, f"warm_{i}")
    gc.collect()
    run_once(session, "warm_last")  # releases what the collection freed
    before = footprint(session)
    # each run names a new queue; the groups (and plans) of earlier runs
    # are gone, so their channels must go too
    for i in range(40):
        run_once(session, f"fresh_{i}")
        gc.collect()
    run_once(session, "last")
    assert footprint(session) == before


def test_a_channel_stays_while_a_plan_names_its_queue(localhost):
    session = localhost()
    kept = handoff_group("kept")
    session.run(kept)
    channels = session._queues._parts   # queue id -> {(capacity, lock): parts}
    (queue,) = channels
    prefix = channels[queue][2, False].prefix
    for i in range(5):
        run_once(session, f"other_{i}")
        gc.collect()
    run_once(session, "last")
    assert channels[queue][2, False].prefix == prefix
    assert shm.segments(prefix), "the kept queue's channel was removed"
    session.run(kept)  # the same channel, reset: still works
    assert session.fetch_blob("got", "dst")[0] == 7.0
    del kept
    gc.collect()
    run_once(session, "after")
    assert queue not in channels
    assert not shm.segments(prefix)


def test_a_node_left_out_of_later_runs_drops_its_channels_when_it_runs(
        localhost):
    session = localhost()
    run_once(session, "once")
    dst = psutil.Process(session.node_pids()["dst"])
    gc.collect()
    with TaskGroup() as solo:
        with Node("src"), Task():
            ops.ConstantFill([], ["y"], shape=[1], value=1.0)
    fds = shm_fds(dst.pid)
    session.run(solo)  # "dst" takes no part: it keeps its end meanwhile
    assert shm_fds(dst.pid) == fds == 2
    with TaskGroup() as alone:
        with Node("dst"), Task():
            ops.ConstantFill([], ["y"], shape=[1], value=1.0)
    session.run(alone)
    assert shm_fds(dst.pid) == 0  # the released channel's two FIFOs
