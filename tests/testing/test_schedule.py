"""Deterministic schedules: LocalSession(schedule=...).

One branch of a run at a time, picked by a seeded generator, on a virtual
clock: the same seed gives the same run, a replay repeats it, a race shows
up as results that depend on the seed, sleeps and timeouts take no wall
time, and a run whose branches all wait is a DeadlockError.
"""

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import localcluster
from localcluster import (Dataset, JobRunner, LocalHostScheduler,
                          LocalSession, MultiNodeCheckpointManager, Net,
                          Node, Queue, ReaderWithDelay, ReaderWithTimeLimit,
                          RunTimeoutError, Task, TaskFailedError, TaskGroup,
                          WorkspaceType, execution_step, ops, pipe)
from localcluster.examples import regression
from localcluster.testing import (DeadlockError, Schedule,
                                  ScheduleDivergedError)

#: wall seconds within which a run that sleeps for virtual seconds ends
FAST = 2.0


# -- a race: read-modify-write of one blob through two ops --------------------

def _increment(name):
    """``x = copy(x) + 1`` as two ops: another branch may write x between
    the Copy and the Add, and its increment is lost."""
    net = Net(name)
    one = net.ConstantFill([], shape=[], value=1.0)
    seen = net.Copy(["x"])
    net.Add([seen, one], ["x"])
    return net


def _atomic_increment(name):
    net = Net(name)
    net.AtomicAdd(["x", net.ConstantFill([], shape=[], value=1.0)], [])
    return net


def racy_step(how="instances", increment=_increment, iterations=3):
    """Two branches adding 1 to ``x`` ``iterations`` times each: task
    instances, or concurrent substeps."""
    if how == "instances":
        return execution_step("inc", [increment("rmw")],
                              num_iter=iterations,
                              num_concurrent_instances=2)
    return execution_step(
        "inc", [execution_step(f"branch_{i}", [increment(f"rmw_{i}")],
                               num_iter=iterations) for i in range(2)],
        concurrent_substeps=True)


def run_racy(schedule, how="instances", increment=_increment):
    """``(x, decisions)`` of the racy step in a fresh session."""
    init = Net("init")
    init.ConstantFill([], ["x"], shape=[], value=0.0)
    with LocalSession(schedule=schedule) as session:
        session.run(init)
        session.run(racy_step(how, increment))
        return float(session.fetch_blob("x")), session.last_schedule


@pytest.mark.parametrize("how", ["instances", "substeps"])
def test_the_same_seed_gives_the_same_decisions_and_result(how):
    x, decisions = run_racy(5, how)
    assert run_racy(5, how) == (x, decisions)
    assert decisions, "two branches ran, so the schedule chose between them"
    assert all(d.startswith("local/") for d in decisions), decisions


@pytest.mark.parametrize("how", ["instances", "substeps"])
def test_a_race_between_branches_gives_different_results_for_some_seeds(how):
    results = {run_racy(seed, how)[0] for seed in range(12)}
    assert len(results) > 1, results
    assert results <= {3.0, 4.0, 5.0, 6.0}


def test_an_atomic_increment_gives_one_result_for_every_seed():
    results = {run_racy(seed, increment=_atomic_increment)[0]
               for seed in range(8)}
    assert results == {6.0}


def test_different_seeds_interleave_differently():
    decisions = {tuple(run_racy(seed)[1]) for seed in range(6)}
    assert len(decisions) > 1


# -- replay -------------------------------------------------------------------

def test_replay_repeats_a_runs_decisions_and_result():
    x, decisions = run_racy(3)
    replayed = Schedule.replay(decisions)
    assert run_racy(replayed) == (x, decisions)


def test_a_seed_and_its_replay_give_the_same_run_in_a_fresh_process():
    here = os.path.dirname(os.path.abspath(__file__))
    code = ("import json, sys\n"
            f"sys.path.insert(0, {here!r})\n"
            "from test_schedule import run_racy\n"
            "from localcluster.testing import Schedule\n"
            "seeded = run_racy(6)\n"
            "replayed = run_racy(Schedule.replay(json.loads(sys.argv[1])))\n"
            "print(json.dumps([seeded, replayed]))\n")
    x, decisions = run_racy(6)
    assert run_racy(6) == (x, decisions)      # twice in a row
    done = subprocess.run([sys.executable, "-c", code, json.dumps(decisions)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    seeded, replayed = json.loads(done.stdout)
    assert seeded == replayed == [x, decisions]


def test_a_session_can_switch_to_a_replay_between_runs():
    x, decisions = run_racy(4)
    with LocalSession(schedule=11) as session:
        init = Net("init")
        init.ConstantFill([], ["x"], shape=[], value=0.0)
        session.run(init)
        session.schedule = Schedule.replay(decisions)
        session.run(racy_step())
        assert float(session.fetch_blob("x")) == x
        assert session.last_schedule == decisions
        with pytest.raises(ValueError, match="whole life"):
            session.schedule = None


@pytest.mark.parametrize("edit, message", [
    (lambda d: ["local/nowhere:0"] + d[1:], "'local/nowhere:0'"),
    (lambda d: d[:1], "needs more"),
])
def test_a_replay_that_does_not_fit_the_run_raises_diverged(edit, message):
    _, decisions = run_racy(3)
    init = Net("init")
    init.ConstantFill([], ["x"], shape=[], value=0.0)
    with LocalSession(schedule=Schedule.replay(edit(decisions))) as session:
        session.run(init)
        with pytest.raises(ScheduleDivergedError, match=message):
            session.run(racy_step(), timeout=30)
        assert session.is_open()
        session.run(init)  # still usable


# -- virtual time -------------------------------------------------------------

def timed_sleep(seconds):
    net = Net("nap")
    timer = net.TimerBegin([])
    net.Sleep([], [], seconds=seconds)
    net.TimerGet([timer], ["slept_ns"])
    return net


def test_a_sleep_takes_no_wall_time_and_moves_the_virtual_clock():
    with LocalSession(schedule=1) as session:
        start = time.monotonic()
        session.run(timed_sleep(10.0))
        assert time.monotonic() - start < FAST
        assert int(session.fetch_blob("slept_ns")) == 10_000_000_000


def test_op_seconds_charges_every_op_to_the_virtual_clock():
    # a switch point before the Sleep and one before TimerGet: 2 ops
    with LocalSession(schedule=Schedule(1, op_seconds=0.001)) as session:
        session.run(timed_sleep(10.0))
        assert int(session.fetch_blob("slept_ns")) == 10_002_000_000


def test_a_reporter_fires_on_virtual_time_then_once_more():
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("worker"), Task():
            with ops.task_init():
                reports = ops.CreateCounter([], ["reports"])
            with ops.task_reporter(interval_ms=100):
                ops.CountUp(reports)
            ops.Sleep([], [], seconds=1.05)
    with LocalSession(schedule=2) as session:
        start = time.monotonic()
        session.run(group)
        assert time.monotonic() - start < FAST
        # at 0.1, 0.2, ... 1.0 s, then once after the task
        assert int(session.fetch_blob("reports", "worker")) == 11


def test_a_time_limited_reader_stops_on_virtual_time():
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("n"), Task():
            source = Dataset({"v": np.arange(1000.0)}, name="src")
            dest = Dataset({"v": np.zeros(0)}, name="dst")
    with TaskGroup() as group:
        with Node("n"):
            pipe(ReaderWithTimeLimit(ReaderWithDelay(source.reader(), 0.1),
                                     duration=1.0), dest.writer())
    read = []
    for seed in (1, 2):
        with LocalSession(schedule=seed) as session:
            session.run(init)
            start = time.monotonic()
            session.run(group)
            assert time.monotonic() - start < FAST
            read.append(dest.fetch(session, "n")["v"])
    # reads begin at 0.0, 0.1, ... 1.0 s: not after 1 s
    np.testing.assert_array_equal(read[0], np.arange(11.0))
    np.testing.assert_array_equal(read[1], read[0])


def test_a_run_timeout_is_virtual():
    net = Net("long_nap")
    net.Sleep([], [], seconds=10.0)
    with LocalSession(schedule=3) as session:
        start = time.monotonic()
        with pytest.raises(RunTimeoutError, match="virtual"):
            session.run(net, timeout=5)
        assert time.monotonic() - start < FAST
        assert session.is_open()
        session.run(timed_sleep(1.0))  # and it goes on
        assert int(session.fetch_blob("slept_ns")) == 1_000_000_000


# -- deadlocks ----------------------------------------------------------------

def _with_fields(*queues):
    """Give each queue its fields (a writer built, never run)."""
    with TaskGroup():
        with Node("unused"), Task():
            for queue in queues:
                queue.writer().write_record(ops.net(), {"v": ops.Const(1.0)})


def test_reading_a_queue_nobody_writes_is_a_deadlock_naming_branch_and_queue():
    # (a queue no task of the group writes at all is refused before the
    # run: here its one writer never reaches its write)
    queue = Queue(1, name="empty")
    _with_fields(queue)
    with TaskGroup() as group:
        with Node("r"), Task(name="reader"):
            queue.reader().read_record(ops.net())
        with Node("w"), Task(name="writer"):
            with ops.If(ops.Const(False)):
                queue.writer().write_record(ops.net(),
                                            {"v": ops.Const(1.0)})
    with LocalSession(schedule=0) as session:
        start = time.monotonic()
        with pytest.raises(DeadlockError) as caught:
            session.run(group, timeout=30)
        assert time.monotonic() - start < FAST
        assert [branch for branch, _ in caught.value.waiting] == ["r"]
        assert "'queue/empty'" in caught.value.waiting[0][1]
        message = str(caught.value)
        assert "'r'" in message and "queue/empty" in message
        assert session.is_open()


def test_two_nodes_waiting_for_each_other_is_a_deadlock_naming_both():
    to_a, to_b = Queue(1, name="to_a"), Queue(1, name="to_b")
    _with_fields(to_a, to_b)
    with TaskGroup() as group:
        with Node("a"), Task(name="a"):
            _, rec = to_a.reader().read_record(ops.net())
            to_b.writer().write_record(ops.net(), {"v": rec["v"]})
        with Node("b"), Task(name="b"):
            _, rec = to_b.reader().read_record(ops.net())
            to_a.writer().write_record(ops.net(), {"v": rec["v"]})
    with LocalSession(schedule=0) as session, \
            pytest.raises(DeadlockError) as caught:
        session.run(group, timeout=30)
    waiting = dict(caught.value.waiting)
    assert sorted(waiting) == ["a", "b"]
    assert "queue/to_a" in waiting["a"] and "queue/to_b" in waiting["b"]


# -- failures -----------------------------------------------------------------

def explode(x):
    raise ValueError("boom")


def failing_group():
    never = Queue(1, name="never")
    _with_fields(never)
    with TaskGroup() as group:
        with Node("n"), Task(name="bad"):
            ops.Sleep([], [], seconds=0.05)
            ops.Python(explode)([ops.Const(1.0)], [])
        with Node("n"), Task(name="waits"):
            never.reader().read_record(ops.net())
        with Node("m"), Task(name="sleeps"):
            ops.Sleep([], [], seconds=30.0)
            with ops.If(ops.Const(False)):  # a writer that never writes
                never.writer().write_record(ops.net(),
                                            {"v": ops.Const(1.0)})
    return group


def _failure(schedule):
    with LocalSession(schedule=schedule) as session:
        with pytest.raises(TaskFailedError) as caught:
            session.run(failing_group(), timeout=30)
        assert session.is_open()
        error = caught.value
        return (error.node, error.task, error.step, error.op_type,
                error.op_index, error.cause_type, error.cause_message)


def test_a_failing_op_cancels_the_run_with_the_same_error_as_unscheduled():
    # the waiting branches would deadlock if the failure did not cancel them
    expected = _failure(None)
    assert expected[0] == "n" and expected[3] == "Python"
    assert _failure(4) == expected
    assert _failure(9) == expected


# -- the embedded example job -------------------------------------------------

def train_example(seed, directory):
    """Every checkpointed node's blobs after training the example job
    (hogwild trainers, 2 threads each) under ``schedule=seed``."""
    job, _ = regression.build(nodes=2, epochs=2, seed=0, threads=2,
                              samples=2048)
    with LocalSession(schedule=seed) as session:
        JobRunner(job, checkpoint_manager=MultiNodeCheckpointManager(
            str(directory))).train(session)
        return {node: {name: session.fetch_blob(name, node)
                       for name in session.blobs(node)}
                for node in job.nodes_to_checkpoint()}


def same_bits(a, b):
    return a.keys() == b.keys() and all(
        a[node].keys() == b[node].keys() and all(
            a[node][k].dtype == b[node][k].dtype and
            a[node][k].shape == b[node][k].shape and
            a[node][k].tobytes() == b[node][k].tobytes() for k in a[node])
        for node in a)


def test_the_example_job_is_bit_identical_for_one_seed(tmp_path):
    first = train_example(7, tmp_path / "a")
    assert {"reader", "trainer_0", "trainer_1", "ps"} <= set(first)
    assert same_bits(train_example(7, tmp_path / "b"), first)
    # hogwild threads interleave by the seed: another seed, other weights
    assert not same_bits(train_example(8, tmp_path / "c"), first)


# -- the session's side -------------------------------------------------------

def test_no_thread_is_left_after_scheduled_runs_and_close():
    before = set(threading.enumerate())
    run_racy(1)
    with LocalSession(schedule=1) as session, \
            pytest.raises(RunTimeoutError):
        session.run(timed_sleep(10.0), timeout=1)
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - before and \
            time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before


def test_schedule_arguments_are_checked():
    for bad in ("7", 1.5, True):
        with pytest.raises(TypeError, match="seed"):
            LocalSession(schedule=bad)
    with pytest.raises(ValueError, match="op_seconds"):
        Schedule(1, op_seconds=-1)
    with pytest.raises(TypeError, match="branch names"):
        Schedule.replay("local/x:0")
    assert Schedule(3) == Schedule(3) != Schedule(4)
    assert repr(Schedule.replay(["a"])) == "Schedule.replay(['a'])"


def test_localhost_scheduler_refuses_a_schedule_and_names_local_session():
    with pytest.raises(TypeError, match=r"LocalSession\(schedule="):
        LocalHostScheduler(schedule=1)


def test_deadlock_error_is_exported_from_errors_and_testing():
    assert localcluster.errors.DeadlockError is DeadlockError
    assert issubclass(DeadlockError, localcluster.LocalClusterError)
    assert issubclass(ScheduleDivergedError, localcluster.LocalClusterError)


def test_a_timed_out_run_stops_at_its_timeout_in_virtual_time():
    # the sleep would end at 10 s; the run's timeout comes at 1 s, and the
    # run's virtual time is the timeout's, not the sleep's end
    with LocalSession(schedule=1) as session:
        with pytest.raises(RunTimeoutError):
            session.run(timed_sleep(10.0), timeout=1.0)
        assert session.last_run_simulated_seconds == pytest.approx(1.0)
