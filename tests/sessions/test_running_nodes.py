"""``session.running_nodes()``: the nodes of the run in progress that are
still busy -- what the command line's live line shows an epoch waiting
on -- under every session."""

import threading
import time

import numpy as np

from localcluster import Node, Task, TaskGroup, ops


def _sleep(x):
    time.sleep(0.4)
    return x


def test_running_nodes_are_the_nodes_not_done_yet(session):
    with TaskGroup() as group:
        with Node("quick"), Task():
            ops.Const(np.ones(1))
        with Node("slow"), Task():
            ops.Python(_sleep)([ops.Const(np.ones(1))], 1)
    session.run(group)  # the processes are up: what follows is the run
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(tuple(session.running_nodes()))
            time.sleep(0.01)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        session.run(group)
    finally:
        stop.set()
        watcher.join(10)
    assert ("slow",) in seen  # quick finished, slow still ran
    busy = [s for s in seen if s]
    assert all(set(s) <= {"quick", "slow"} for s in busy)
    assert session.running_nodes() == []  # between runs: none
