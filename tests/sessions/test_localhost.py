"""LocalHostScheduler specifics: processes, shared memory, faults, cleanup.

The shared suite (every test taking ``session``) already runs against this
scheduler; these tests cover what only a multi-process session has.
"""

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from localcluster import (LocalHostScheduler, Net, Node,
                          NodeFailedError, PlanError, RunTimeoutError, Task,
                          TaskFailedError, TaskGroup, WorkspaceType,
                          final_output, ops)
from localcluster.runtime import shm
from localcluster.sessions import _node
from localcluster.sessions import _protocol as P

from conftest import child_processes

# -- module-level op functions (they are pickled to the node processes) -----


def kill_self(_):
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)


def exit_3(_):
    os._exit(3)


def raise_value_error(_):
    raise ValueError("boom from the node")


def allocate_2_gib(_):
    return np.ones(2 * 2 ** 30 // 8)


def sleep_forever(_):
    time.sleep(3600)


def sleep_ms(ms):
    time.sleep(float(ms) / 1000.0)


def env_value(_):
    return np.array(len(os.environ.get("LC_TEST_VALUE", "")))


def print_hello(_):
    print("hello from the node")
    import logging
    logging.getLogger("user.job").warning("a warning from the node")


def own_pid(_):
    return np.array(os.getpid())


def _boom(*args):
    raise RuntimeError("this plan cannot be loaded here")


class LoadsNowhere:
    """A callable that pickles fine but cannot be unpickled."""

    def __call__(self, *xs):
        return None

    def __reduce__(self):
        return (_boom, ())


def _no_memory(*args):
    raise MemoryError()


class LoadsOutOfMemory(LoadsNowhere):
    """A callable whose unpickling in the node runs out of memory."""

    def __reduce__(self):
        return (_no_memory, ())


# -- helpers -----------------------------------------------------------------


def python_group(fn, node="victim", timeout_node=None):
    """A group where ``node`` runs ``fn`` and a bystander node loops a bit."""
    with TaskGroup() as tg:
        with Node(node), Task():
            ops.Python(fn)([ops.Const(1)], [])
        with Node("bystander"), Task():
            with ops.loop(3):
                ops.Python(sleep_ms)([ops.Const(5)], [])
    return tg


def small_group(nodes=("victim", "bystander")):
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        for node in nodes:
            with Node(node), Task():
                ops.Add([ops.Const(1.0), ops.Const(2.0)], ["three"])
                final_output("three")
    return tg


def assert_clean(session):
    """No child process and no segment of this session after close()."""
    prefix = session.shm_prefix
    session.close()
    assert not child_processes()
    assert not shm.segments(prefix)


# -- the fault table ---------------------------------------------------------

FAULTS = [
    # (case, group builder, node kwargs, run kwargs, error class, patterns)
    ("sigkill mid-run", lambda: python_group(kill_self), {}, {},
     NodeFailedError, ["'victim'", "SIGKILL"]),
    ("os._exit(3) mid-run", lambda: python_group(exit_3), {}, {},
     NodeFailedError, ["'victim'", "exit 3"]),
    ("an op raising", lambda: python_group(raise_value_error), {}, {},
     TaskFailedError, ["'victim'", "boom from the node"]),
    ("a plan that fails to unpickle", lambda: python_group(LoadsNowhere()),
     {}, {}, PlanError, ["'victim'", "could not be loaded"]),
    ("out of memory loading a plan",
     lambda: python_group(LoadsOutOfMemory()), {}, {}, NodeFailedError,
     ["'victim'", "memory", "while loading the plan it was sent",
      "fewer or smaller blobs, or more memory"]),
    ("exceeding memory_limit", lambda: python_group(allocate_2_gib),
     {"memory_limit": 256 * 2 ** 20}, {}, NodeFailedError,
     ["'victim'", "memory_limit"]),
    ("a hang past timeout", lambda: python_group(sleep_forever), {},
     {"timeout": 0.5}, RunTimeoutError, ["'victim'", "0.5 s", "killed"]),
]


@pytest.mark.parametrize("case,build,kwargs,run_kwargs,error,patterns",
                         FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_table(localhost, case, build, kwargs, run_kwargs, error,
                     patterns):
    session = localhost()
    with Node("victim", **kwargs):
        pass
    tg = build()
    started = time.monotonic()
    with pytest.raises(error) as info:
        session.run(tg, **run_kwargs)
    assert time.monotonic() - started < 15
    for pattern in patterns:
        assert pattern in str(info.value), (pattern, str(info.value))
    # the session stays usable: the next run works on both nodes
    again = small_group()
    session.run(again)
    assert [t.outputs()[0].fetch() for t in again.tasks()] == [3.0, 3.0]
    assert_clean(session)


def _out_of_memory(owner, name, when=lambda *args, result=None: True):
    """Patch ``owner.name`` to raise MemoryError in a node process (the
    nodes fork after the patch; the master never raises), once ``when``
    says so of its arguments (and, given ``result=``, what it returned)."""
    original, master = getattr(owner, name), os.getpid()

    def patched(*args, **kwargs):
        if os.getpid() == master:
            return original(*args, **kwargs)
        if "result" in when.__code__.co_varnames:
            result = original(*args, **kwargs)
            if when(*args, result=result):
                raise MemoryError()
            return result
        raise MemoryError()
    return owner, name, patched


#: a node no test gives a memory_limit (the cluster keeps Node options)
HUNGRY = ("hungry", "bystander")


def _fed(session):
    session.feed_blob("fed", np.arange(3), node="hungry")


def _run(session):
    session.run(small_group(HUNGRY[:1]))  # (the bystander would pack too)


def _fetched(session):
    session.run(small_group(HUNGRY))
    session.fetch_blob("three", node="hungry")


OUT_OF_MEMORY = [
    # (what runs out of memory, the patch, what the test does, the words)
    ("taking a fed blob", _out_of_memory(shm.ShmStore, "adopt"), _fed,
     "'hungry' ran out of memory while taking blob 'fed' fed to it"),
    ("packing a run's outputs", _out_of_memory(_node._Outbox, "pack"), _run,
     "'hungry' ran out of memory while running a plan, outside its ops"),
    ("reading a request", _out_of_memory(
        P.Reader, "recv", lambda reader, result=None: result[0] == P.FETCH),
     _fetched,
     "'hungry' died (exit 86) while handling fetch; it ran out of memory"),
]


@pytest.mark.parametrize("case,patch,action,words", OUT_OF_MEMORY,
                         ids=[c[0] for c in OUT_OF_MEMORY])
def test_a_node_out_of_memory_outside_its_ops_is_one_error_saying_so(
        localhost, monkeypatch, capfd, case, patch, action, words):
    monkeypatch.setattr(*patch)
    session = localhost()
    with pytest.raises(NodeFailedError) as info:
        action(session)
    assert words in str(info.value), str(info.value)
    assert "give it fewer or smaller blobs, or more memory" in \
        str(info.value)
    assert info.value.node == "hungry" and not info.value.last_log_lines
    # one error, no traceback printed -- by the node or for it
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err and "MemoryError" not in out + err
    monkeypatch.undo()
    assert_clean(session)


def test_a_node_not_ready_within_the_runs_timeout_fails_the_run_at_it(
        localhost, monkeypatch):
    from localcluster.sessions import _handle
    real = _handle.node_main

    def stopped(spec, conn, log_conn):   # a node stopped before it is ready
        if spec.name == "victim":
            os.kill(os.getpid(), signal.SIGSTOP)
        real(spec, conn, log_conn)

    monkeypatch.setattr(_handle, "node_main", stopped)   # forked: inherited
    session = localhost()
    started = time.monotonic()
    with pytest.raises(RunTimeoutError, match="'victim' did not start within"
                       " the run's timeout of 1 s") as caught:
        session.run(small_group(), timeout=1)
    assert time.monotonic() - started < 10   # not the 30 s of no timeout
    assert caught.value.starting and caught.value.nodes == ("victim",)
    assert "victim" not in session.node_pids()   # killed, not left stopped
    monkeypatch.setattr(_handle, "node_main", real)
    session.run(small_group(), timeout=30)   # it starts again
    assert session.fetch_blob("three", "victim") == 3.0
    assert_clean(session)


def test_a_dead_node_restarts_empty_and_the_others_keep_their_blobs(localhost):
    session = localhost()
    session.feed_blob("kept", np.arange(3), node="victim")
    session.feed_blob("kept", np.arange(3), node="bystander")
    with pytest.raises(NodeFailedError) as info:
        session.run(python_group(kill_self))
    assert info.value.node == "victim"
    assert info.value.signal_name == "SIGKILL"
    assert info.value.exitcode == -signal.SIGKILL
    session.run(small_group())
    assert not session.has_blob("kept", "victim")
    np.testing.assert_array_equal(
        session.fetch_blob("kept", "bystander"), np.arange(3))
    assert_clean(session)


def test_a_node_that_died_while_idle_fails_the_next_run_that_uses_it(
        localhost):
    """Its workspace is gone: the next run including it says so (once),
    instead of quietly running on an empty restart."""
    session = localhost()
    session.feed_blob("kept", np.arange(3), node="idle")
    with Node("busy"), Task() as busy:
        ops.Sleep([], seconds=0.3)
    session.run(busy)  # started
    os.kill(session.node_pids()["idle"], signal.SIGKILL)
    session.run(busy)  # notices the death while "idle" waits
    with Node("idle"), Task() as uses_it:
        ops.Const(1)
    with pytest.raises(NodeFailedError, match="'idle'.*while idle"):
        session.run(uses_it)
    session.run(uses_it)  # restarted, empty
    assert not session.has_blob("kept", "idle")
    assert_clean(session)


def test_an_op_error_cancels_the_other_nodes_without_killing_them(localhost):
    session = localhost()
    session.feed_blob("kept", np.arange(3), node="bystander")
    with TaskGroup() as tg:
        with Node("victim"), Task():
            ops.Python(sleep_ms)([ops.Const(50)], [])
            ops.Python(raise_value_error)([ops.Const(1)], [])
        with Node("bystander"), Task():
            with ops.loop():  # would never end without the cancel
                ops.stop_if(ops.Const(False))
    pids = None
    with pytest.raises(TaskFailedError) as info:
        pids = session.node_pids()
        session.run(tg, timeout=20)
    assert info.value.node == "victim"
    assert "boom from the node" in str(info.value.__cause__)
    assert session.node_pids()["bystander"] == \
        (pids or session.node_pids())["bystander"]
    np.testing.assert_array_equal(
        session.fetch_blob("kept", "bystander"), np.arange(3))
    assert_clean(session)


# -- the master dies ---------------------------------------------------------

MASTER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from localcluster import LocalHostScheduler
    session = LocalHostScheduler(nodes=["a", "b"])
    session.feed_blob("big", np.ones(1 << 20), node="a")
    session.feed_blob("big", np.ones(1 << 20), node="b")
    pids = session.node_pids()
    print(session.shm_prefix, pids["a"], pids["b"], flush=True)
    time.sleep(3600)
""")


THREAD_MASTER = textwrap.dedent("""
    import threading, time
    from localcluster import LocalHostScheduler
    def main():
        session = LocalHostScheduler(nodes=["a", "b"])
        print(session.shm_prefix, *session.node_pids().values(), flush=True)
        time.sleep(3600)
    threading.Thread(target=main, daemon=True).start()
    time.sleep(3600)
""")



@pytest.mark.parametrize("script", [MASTER, THREAD_MASTER],
                         ids=["main thread", "another thread"])
def test_nodes_exit_and_segments_are_swept_when_the_master_is_killed(script):
    master = subprocess.Popen([sys.executable, "-c", script],
                              stdout=subprocess.PIPE, text=True)
    try:
        prefix, *pids = master.stdout.readline().split()
        assert shm.segments(prefix), "the master made no segments"
        master.send_signal(signal.SIGKILL)
        master.wait(10)
        nodes = [psutil.Process(int(p)) for p in pids
                 if psutil.pid_exists(int(p))]
        _, alive = psutil.wait_procs(nodes, timeout=10)
        assert not alive, f"node processes outlived their master: {alive}"
        # the next scheduler on the machine removes the stale segments
        LocalHostScheduler().close()
        assert not shm.segments(prefix)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
        master.stdout.close()


CTRL_C = textwrap.dedent("""
    import faulthandler, time
    # a master still there after 20 s says where it is stuck (stderr)
    faulthandler.dump_traceback_later(20, exit=False)
    from localcluster import LocalHostScheduler, Node, Task, TaskGroup, ops
    import test_localhost as t
    session = LocalHostScheduler()
    with TaskGroup() as tg:
        for n in ("a", "b"):
            with Node(n), Task():
                ops.Python(t.sleep_forever)([ops.Const(1)], [])
    session.feed_blob("x", 1.0, node="a")
    print(session.shm_prefix, flush=True)
    session.run(tg)
""")


# once: in the run; three times: in the run, in its abort, in close()
@pytest.mark.parametrize("interrupts", [1, 3])
def test_ctrl_c_in_the_master_leaves_nothing_behind(interrupts):
    # the script imports this module, which imports the root conftest
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    master = subprocess.Popen([sys.executable, "-c", CTRL_C], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        prefix = master.stdout.readline().strip()
        time.sleep(0.5)  # let the run start on both nodes
        children = psutil.Process(master.pid).children(recursive=True)
        assert len(children) >= 2
        for _ in range(interrupts):
            master.send_signal(signal.SIGINT)
            time.sleep(0.3)
        try:
            _, err = master.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            master.kill()
            _, err = master.communicate(timeout=10)
            pytest.fail("the master did not end within 30 s of its "
                        f"SIGINT; its threads after 20 s:\n{err}")
        assert master.returncode != 0
        assert "KeyboardInterrupt" in err
        _, alive = psutil.wait_procs(children, timeout=10)
        assert not alive
        assert not shm.segments(prefix)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)


# -- leaks over many runs ----------------------------------------------------

def test_many_runs_leave_fds_segments_and_children_unchanged(localhost):
    session = localhost()
    me = psutil.Process()
    tg = small_group()
    for _ in range(10):
        session.run(tg)
    gc.collect()  # drop what earlier tests left for the collector
    before = (me.num_fds(), len(shm.segments(session.shm_prefix)),
              len(child_processes()))
    for _ in range(200):
        session.run(tg)
    gc.collect()
    after = (me.num_fds(), len(shm.segments(session.shm_prefix)),
             len(child_processes()))
    assert after == before
    assert_clean(session)


def test_close_releases_every_descriptor_at_once_not_at_collection(
        localhost):
    gc.collect()
    before = sorted(os.listdir("/proc/self/fd"))
    session = localhost()   # the fixture keeps it referenced: no collection
    session.run(small_group())
    session.close()
    assert sorted(os.listdir("/proc/self/fd")) == before


# -- node options ------------------------------------------------------------

def test_node_env_and_cpus_apply_to_the_node_process(localhost):
    session = localhost()
    cpu = sorted(os.sched_getaffinity(0))[0]
    with TaskGroup() as tg:
        with Node("pinned", cpus=[cpu],
                  env={"LC_TEST_VALUE": "four"}), Task():
            length = final_output(ops.Python(env_value)([ops.Const(0)]))
            pid = final_output(ops.Python(own_pid)([ops.Const(0)]))
    session.run(tg)
    assert length.fetch() == 4
    assert pid.fetch().shape == ()
    assert psutil.Process(int(pid.fetch())).cpu_affinity() == [cpu]
    assert "LC_TEST_VALUE" not in os.environ
    assert_clean(session)


def test_cpus_that_do_not_exist_are_a_plan_error(localhost):
    session = localhost()
    with TaskGroup() as tg:
        with Node("pinned", cpus=[4096]), Task():
            ops.Const(1)
    with pytest.raises(PlanError, match="4096"):
        session.run(tg)
    assert_clean(session)


def test_node_output_and_logging_reach_the_master_prefixed(localhost, capfd):
    session = localhost()
    with TaskGroup() as tg:
        with Node("talker"), Task():
            ops.Python(print_hello)([ops.Const(0)], [])
    session.run(tg)
    out, err = capfd.readouterr()
    assert "[talker] hello from the node" in out
    # the node's logging goes to its stderr, whatever the format
    assert any(line.startswith("[talker] ") and
               "a warning from the node" in line
               for line in err.splitlines())
    assert_clean(session)


# -- shared memory -----------------------------------------------------------

def test_zero_copy_fetch_is_a_read_only_view_and_copy_is_independent(
        localhost):
    session = localhost()
    session.feed_blob("w", np.arange(5.0), node="n")
    view = session.fetch_blob("w", "n", copy=False)
    copy = session.fetch_blob("w", "n")
    assert not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1.0
    copy[0] = 42.0
    np.testing.assert_array_equal(session.fetch_blob("w", "n"),
                                  np.arange(5.0))
    # a run that writes in place is seen through the view
    with TaskGroup() as tg:
        with Node("n"), Task():
            ops.Scale(["w"], ["w"], scale=2.0)
    session.run(tg)
    np.testing.assert_array_equal(view, np.arange(5.0) * 2)
    assert_clean(session)


def test_global_blobs_live_in_segments_of_the_session(localhost):
    session = localhost()
    before = set(shm.segments(session.shm_prefix))
    session.run(small_group())
    made = set(shm.segments(session.shm_prefix)) - before
    assert made, "no shared-memory segment holds the node's blobs"
    assert_clean(session)


def test_has_blob_on_a_node_that_never_ran_starts_nothing(localhost):
    session = localhost()
    assert session.has_blob("x", "ghost") is False
    assert session.blobs("ghost") == []
    assert not child_processes()
    assert_clean(session)


def test_nodes_start_eagerly_from_a_list(localhost):
    session = localhost(nodes=["a", "b", "c"])
    assert sorted(session.node_pids()) == ["a", "b", "c"]
    assert len(child_processes()) == 3
    assert_clean(session)


def test_a_function_that_cannot_be_pickled_is_named_before_anything_runs(
        localhost):
    session = localhost()
    with TaskGroup() as tg:
        with Node("n"), Task():
            ops.Python(lambda x: x)([ops.Const(1)])
    with pytest.raises(PlanError, match="lambda"):
        session.run(tg)
    assert not child_processes()
    assert_clean(session)


def test_close_is_idempotent_and_a_closed_session_refuses_runs():
    session = LocalHostScheduler(nodes=["a"])
    session.close()
    session.close()
    assert not session.is_open()
    assert not child_processes()


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_other_start_methods_run_the_same_group(localhost, start_method):
    session = localhost(start_method=start_method)
    tg = small_group()
    session.run(tg)
    assert [t.outputs()[0].fetch() for t in tg.tasks()] == [3.0, 3.0]
    with TaskGroup() as tg2:
        with Node("victim"), Task():
            ops.Python(sleep_ms)([ops.Const(1)], [])
    session.run(tg2)
    assert_clean(session)


def test_user_ops_registered_after_the_nodes_started_still_run(localhost):
    from localcluster import register_op
    session = localhost(nodes=["n"])
    register_op("LocalhostTestTwice")(_twice)
    net = Net("twice")
    net.LocalhostTestTwice([net.Const(21)], ["answer"])
    with Node("n"):
        session.run(Task(step=net))
    assert session.fetch_blob("answer", "n") == 42
    assert_clean(session)


def _twice(x):
    return x * 2


def _mapped_deleted_segments():
    with open("/proc/self/maps") as f:
        return sum(1 for line in f
                   if "/dev/shm/lc_" in line and "(deleted)" in line)


def test_fetching_a_replaced_blob_does_not_keep_old_segments_mapped(localhost):
    session = localhost()
    for i in range(20):
        # a new shape each time: the node makes a new segment
        session.feed_blob("w", np.ones(1000 + i), node="n")
        session.fetch_blob("w", "n")
    gc.collect()
    assert _mapped_deleted_segments() <= 2
    assert_clean(session)


# -- regressions found in review ---------------------------------------------

def die_soon(_):
    """Return normally; the node is killed 0.2 s later."""
    import threading
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
    return np.arange(4.0)


def sleep_then_one(_):
    time.sleep(1.0)
    return np.array(1.0)


def test_outputs_survive_a_node_dying_after_it_replied(localhost):
    session = localhost()
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node("a"), Task():
            early = final_output(ops.Python(die_soon)([ops.Const(1)]))
        with Node("b"), Task():
            late = final_output(
                ops.Python(sleep_then_one)([ops.Const(1)]))
    session.run(tg, timeout=20)
    np.testing.assert_array_equal(early.fetch(), np.arange(4.0))
    assert late.fetch() == 1.0
    assert_clean(session)


def a_lock(_):
    import threading
    return np.array(threading.Lock(), dtype=object)


def test_a_value_that_cannot_travel_fails_the_request_not_the_node(localhost):
    session = localhost()
    session.feed_blob("kept", np.arange(3), node="a")
    with TaskGroup(WorkspaceType.GLOBAL) as tg:
        with Node("a"), Task():
            ops.Python(a_lock)([ops.Const(1)], ["lock"])
    session.run(tg)
    with pytest.raises(Exception, match="pickle"):
        session.fetch_blob("lock", "a")
    np.testing.assert_array_equal(session.fetch_blob("kept", "a"),
                                  np.arange(3))
    assert_clean(session)


def start_helper_process(_):
    return np.array(subprocess.Popen(["sleep", "300"]).pid)


def test_processes_a_node_started_do_not_outlive_close():
    session = LocalHostScheduler()
    helper = None
    try:
        with TaskGroup() as tg:
            with Node("a"), Task():
                pid = final_output(
                    ops.Python(start_helper_process)([ops.Const(1)]))
        session.run(tg)
        helper = int(pid.fetch())
        session.close()
        gone, _ = psutil.wait_procs(
            [psutil.Process(helper)] if psutil.pid_exists(helper) else [],
            timeout=5)
        assert not psutil.pid_exists(helper) or \
            psutil.Process(helper).status() == psutil.STATUS_ZOMBIE
    finally:
        if helper and psutil.pid_exists(helper):
            try:
                os.kill(helper, signal.SIGKILL)
            except ProcessLookupError:
                pass
        assert_clean(session)


def test_a_plan_that_failed_to_load_fails_the_same_way_again(localhost):
    session = localhost()
    tg = python_group(LoadsNowhere())
    for _ in range(2):
        with pytest.raises(PlanError, match="could not be loaded"):
            session.run(tg)
    assert_clean(session)
