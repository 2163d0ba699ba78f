"""Starting nodes: the master's work per node does not grow with the nodes
already running, a forked node still holds no master-side pipe end, and
the master's descriptors do not grow with the nodes (their zygote holds
their sockets).

(No clock here: the growth is counted in calls and descriptors.)
"""

import gc
import os

import numpy as np

from localcluster import (Cluster, LocalHostScheduler, Node, Task,
                          TaskGroup, WorkspaceType, ops)
from localcluster.sessions import _plumbing


def frozen_objects(_):
    return np.array(gc.get_freeze_count())


def _link(pid, fd):
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def test_starting_nodes_polls_no_earlier_child(monkeypatch):
    """multiprocessing's Process.start polls every live child it knows
    (one waitpid each): with the nodes in that list, starting n nodes made
    n*(n-1)/2 calls."""
    calls = []
    real = os.waitpid

    def counting(pid, flags):
        calls.append(pid)
        return real(pid, flags)

    monkeypatch.setattr(os, "waitpid", counting)
    scheduler = LocalHostScheduler(nodes=[f"n{i}" for i in range(24)])
    try:
        started = len(calls)
    finally:
        monkeypatch.setattr(os, "waitpid", real)
        scheduler.close()
    assert started < 24, started


def test_forked_nodes_hold_no_master_side_end_and_close_forgets_them():
    before = set(_plumbing.MASTER_ENDS)
    scheduler = LocalHostScheduler(nodes=[f"n{i}" for i in range(6)])
    try:
        ends = _plumbing.MASTER_ENDS - before
        # the zygote's control socket and its nodes' output pipe, the
        # pump's own
        assert len(ends) >= 2
        ours = {_link("self", end.fileno()) for end in ends}
        ours -= {None, "anon_inode:[eventpoll]"}  # named alike in any process
        for name, pid in scheduler.node_pids().items():
            held = [_link(pid, fd) for fd in os.listdir(f"/proc/{pid}/fd")]
            # only the write ends of its batch's output and reply pipes
            # (a pipe's two ends are one inode)
            shared = [link for link in held if link in ours]
            assert len(shared) <= 2 and all(
                link.startswith("pipe:") for link in shared), (name, shared)
    finally:
        scheduler.close()
    assert _plumbing.MASTER_ENDS <= before


def test_the_mappings_a_node_inherits_do_not_grow_with_the_nodes():
    """The master maps the nodes' control words a page for many nodes: a
    node forked after others inherits no mapping per earlier node (each
    fork would copy more of them)."""
    scheduler = LocalHostScheduler(nodes=[f"n{i}" for i in range(8)])
    try:
        counts = {}
        for name, pid in scheduler.node_pids().items():
            with open(f"/proc/{pid}/maps") as f:
                counts[name] = sum(scheduler.shm_prefix in line for line in f)
        assert len(set(counts.values())) == 1, counts
    finally:
        scheduler.close()


def test_a_forked_node_does_not_collect_the_masters_heap():
    """What a forked node inherited is frozen: its collections neither
    copy the master's pages nor free the master's garbage (an mmap object
    freed there would unmap what the node mapped at its address)."""
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("n"), Task():
            ops.Python(frozen_objects)([ops.Const(0)], ["frozen"])
    scheduler = LocalHostScheduler()
    try:
        scheduler.run(group)
        assert int(scheduler.fetch_blob("frozen", "n")) > 1000
    finally:
        scheduler.close()


def test_the_masters_descriptors_do_not_grow_with_the_nodes():
    """20 or 200 instances of a prototype: the master holds as many
    descriptors either way (the zygote holds one per node)."""
    import psutil
    me = psutil.Process()

    def held(n):
        with Cluster(), TaskGroup() as group:
            with Node("w", num_instances=n), Task():
                ops.Add([ops.NodeIndex(), ops.Const(1)])
        scheduler = LocalHostScheduler()
        try:
            scheduler.run(group)
            return me.num_fds(), len(scheduler.node_pids())
        finally:
            scheduler.close()

    held(2)   # what a first scheduler opens for good (the pump's, ...)
    small, started = held(20)
    assert started == 20
    big, started = held(200)
    assert started == 200
    assert big == small, (small, big)


def test_an_idle_node_runs_three_threads():
    """Its main thread, the watcher (cancel signals and the master's
    hang-up, in one poll) and the output forwarder: each thread more is
    a stack and a clone for each of a thousand nodes to start, and a
    separate canceller thread was one."""
    import psutil
    with LocalHostScheduler(nodes=["a", "b"]) as scheduler:
        threads = {name: psutil.Process(pid).num_threads()
                   for name, pid in scheduler.node_pids().items()}
    assert threads == {"a": 3, "b": 3}
