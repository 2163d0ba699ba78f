"""No node outlives its master by more than a moment -- whatever the start
method, whichever thread made the scheduler, and even while the node is
busy inside an op that never looks at its cancellation."""

import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from localcluster import LocalHostScheduler
from localcluster.runtime import shm

from conftest import kill_and_wait, running

BUSY_MASTER = textwrap.dedent("""
    import functools, threading, time
    from localcluster import (LocalHostScheduler, Node, Task, TaskGroup,
                              ops)

    def main():
        session = LocalHostScheduler({start_method!r}, nodes=["a", "b"])
        with TaskGroup() as tg:
            for n in ("a", "b"):
                with Node(n), Task():
                    # pickles by reference; deaf to cancels
                    ops.Python(functools.partial(time.sleep, 3600))([], [])
        print(session.shm_prefix, *session.node_pids().values(), flush=True)
        session.run(tg)

    if {in_thread}:
        threading.Thread(target=main, daemon=True).start()
        time.sleep(3600)
    else:
        main()
""")

#: BUSY_MASTER whose nodes each wait in a process of their own
#: (pickled by reference: ``subprocess.call`` reaches every start method)
CHILD_MASTER = BUSY_MASTER.replace(
    "functools.partial(time.sleep, 3600)",
    "functools.partial(__import__('subprocess').call, ['sleep', '3600'])")

def node_children(nodes, seconds=30):
    """The processes ``nodes`` started, once each started one."""
    children, deadline = [], time.monotonic() + seconds
    while len(children) < len(nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
        children = [c for n in nodes for c in n.children()]
    assert len(children) == len(nodes), "the nodes started no child"
    return children


CASES = [(method, in_thread) for method in ("fork", "forkserver", "spawn")
         for in_thread in (False, True)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method,in_thread", CASES,
                         ids=[f"{m}-{'thread' if t else 'main'}"
                              for m, t in CASES])
def test_busy_nodes_die_within_a_second_of_a_killed_master(start_method,
                                                           in_thread):
    script = BUSY_MASTER.format(start_method=start_method,
                                in_thread=in_thread)
    master = subprocess.Popen([sys.executable, "-c", script],
                              stdout=subprocess.PIPE, text=True)
    try:
        prefix, *pids = master.stdout.readline().split()
        nodes = [psutil.Process(int(p)) for p in pids]
        time.sleep(0.5)  # the run has started: both nodes sleep in the op
        took, alive = kill_and_wait(master, nodes)
        assert not alive, f"node processes outlived their master: {alive}"
        assert took < 1.5, f"the nodes took {took:.2f} s to die"
        LocalHostScheduler().close()  # sweeps the dead master's segments
        assert not shm.segments(prefix)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method,in_thread", CASES,
                         ids=[f"{m}-{'thread' if t else 'main'}"
                              for m, t in CASES])
def test_what_a_node_started_dies_with_a_killed_master(start_method,
                                                       in_thread):
    """A node's children share its process group: the node ends the group
    when its master dies, so none of them lives on, adopted by init."""
    script = CHILD_MASTER.format(start_method=start_method,
                                 in_thread=in_thread)
    master = subprocess.Popen([sys.executable, "-c", script],
                              stdout=subprocess.PIPE, text=True)
    children = []
    try:
        prefix, *pids = master.stdout.readline().split()
        nodes = [psutil.Process(int(p)) for p in pids]
        children = node_children(nodes)   # each node starts its sleep
        took, alive = kill_and_wait(master, nodes + children)
        assert not alive, f"outlived their master: {alive}"
        assert took < 2, f"they took {took:.2f} s to die"
        LocalHostScheduler().close()  # sweeps the dead master's segments
        assert not shm.segments(prefix)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
        master.stdout.close()
        for child in children:
            if running(child):
                child.kill()


GIL_MASTER = textwrap.dedent("""
    import subprocess
    from localcluster import (LocalHostScheduler, Node, Task, TaskGroup,
                              ops)

    def spin(*args):
        subprocess.Popen(["sleep", "3600"])
        # native code that holds the interpreter for minutes: nothing of
        # Python runs in this node until it returns
        sum(range(10 ** 12))

    session = LocalHostScheduler(nodes=["a", "b"])
    with TaskGroup() as tg:
        for n in ("a", "b"):
            with Node(n), Task():
                ops.Python(spin)([], [])
    print(session.shm_prefix, *session.node_pids().values(), flush=True)
    session.run(tg)
""")


@pytest.mark.timeout(120)
def test_nodes_in_native_code_and_their_children_die_with_a_killed_master():
    """A node inside a long native call runs no Python -- neither its
    parent-death handler nor its watcher thread -- until the call returns:
    the scheduler's watcher process kills its group from outside, and
    removes the master's segments, at once."""
    master = subprocess.Popen([sys.executable, "-c", GIL_MASTER],
                              stdout=subprocess.PIPE, text=True)
    children = []
    try:
        prefix, *pids = master.stdout.readline().split()
        nodes = [psutil.Process(int(p)) for p in pids]
        children = node_children(nodes)
        time.sleep(0.3)    # both spin in sum()
        took, alive = kill_and_wait(master, nodes + children)
        assert not alive, f"outlived their master: {alive}"
        assert took < 2, f"they took {took:.2f} s to die"
        gone = time.monotonic()
        while shm.segments(prefix) and time.monotonic() - gone < 5:
            time.sleep(0.01)
        assert not shm.segments(prefix)   # swept by the watcher
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
        master.stdout.close()
        for proc in children + [psutil.Process(int(p)) for p in pids
                                if psutil.pid_exists(int(p))]:
            if running(proc):
                proc.kill()
