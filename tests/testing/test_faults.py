"""Fault plans under every session: a fault is data the node's runtime
fires -- a real SIGKILL or exit of a node process under
LocalHostScheduler, the same NodeFailedError under LocalSession -- once per
session, so JobRunner's restarts recover to the uninterrupted result."""

import os
import pickle
import time
import warnings

import numpy as np
import pytest

from localcluster import (Job, JobRunner, MultiNodeCheckpointManager, Node,
                          NodeFailedError, PlanError, RunTimeoutError, Task,
                          TaskFailedError, TaskGroup, WorkspaceType,
                          epoch_limiter, ops)
from localcluster.errors import CheckpointWarning
from localcluster.testing import (Delay, Epoch, FailCheckpoint, FaultPlan,
                                  Fired, Hang, Kill, Op, Step)

NODES = ("a", "b")


def build_job(epochs=4):
    """Each node: w <- 1.5 w + 1 per epoch."""
    with Job() as job:
        for i, node in enumerate(NODES):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(3, float(i + 1)), name="w")
                with Task():
                    ops.Scale(["w"], ["w"], scale=1.5)
                    ops.Add(["w", ops.Const(np.ones(3))], ["w"])
        with Node("a"):
            epoch_limiter(job, epochs)
    return job


def train(session, tmp_path, max_restarts=0, epochs=4):
    runner = JobRunner(build_job(epochs),
                       MultiNodeCheckpointManager(str(tmp_path / "ckpt")),
                       max_restarts=max_restarts)
    runner.train(session)
    return runner, {n: session.fetch_blob("w", n).tolist() for n in NODES}


def expected(epochs=4):
    out = {}
    for i, node in enumerate(NODES):
        w = float(i + 1)
        for _ in range(epochs):
            w = w * 1.5 + 1
        out[node] = [w] * 3
    return out


# -- the plan as a value ------------------------------------------------------

def test_a_fault_plan_is_a_printable_picklable_value():
    plan = FaultPlan(Kill("a", at=Epoch(2)),
                     Delay("b", at=Op("Add", nth=3), seconds=0.5),
                     Hang("b", at=Step("train")), FailCheckpoint("a", 0))
    assert eval(repr(plan)) == plan
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert plan.nodes() == ["a", "b"] and len(plan) == 4
    assert plan.fired() == []


@pytest.mark.parametrize("make, words", [
    (lambda: Kill("a", at=3), "Epoch(k)"),
    (lambda: Kill("a", at=Epoch(1), how="sigterm"), "sigkill"),
    (lambda: Kill("", at=Epoch(1)), "Kill(node)"),
    (lambda: Epoch(0), "Epoch(k)"),
    (lambda: Op("Add", nth=0), "Op(nth)"),
    (lambda: Delay("a", at=Epoch(1), seconds=-1), "Delay(seconds=)"),
    (lambda: FailCheckpoint("a", epoch=-1), "FailCheckpoint(epoch)"),
    (lambda: FaultPlan("kill a"), "FaultPlan takes"),
])
def test_bad_faults_are_plan_errors_naming_the_field(make, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(")
                       .replace(")", r"\)")):
        make()


# -- kills and restarts -------------------------------------------------------

@pytest.mark.parametrize("how, status", [("sigkill", "SIGKILL"),
                                         ("exit", 3)])
def test_a_kill_at_an_epoch_is_a_node_failure_restarts_recover(
        session_factory, tmp_path, how, status):
    plan = FaultPlan(Kill("b", at=Epoch(2), how=how))
    session = session_factory(faults=plan)
    if session_factory.kind in ("localhost", "ray"):
        session.start_nodes(list(NODES))
    pids = session.node_pids()
    runner, final = train(session, tmp_path, max_restarts=1)
    assert final == expected()
    assert [epoch for epoch, _ in runner.result.restarts] == [1]
    [fired] = plan.fired()
    assert (fired.fault, fired.node) == (plan.faults[0], "b")
    assert abs(fired.time - time.time()) < 60
    if session_factory.kind in ("localhost", "ray"):
        # the node process really died and a new one took its place
        assert session.node_pids()["b"] != pids["b"]
        assert session.node_pids()["a"] == pids["a"]


@pytest.mark.parametrize("how, status", [("sigkill", "SIGKILL"),
                                         ("exit", 3)])
def test_without_restarts_a_kill_raises_node_failed_naming_the_node(
        session_factory, tmp_path, how, status):
    plan = FaultPlan(Kill("b", at=Epoch(3), how=how))
    session = session_factory(faults=plan)
    with pytest.raises(NodeFailedError, match="'b'") as caught:
        train(session, tmp_path)
    error = caught.value
    assert error.node == "b"
    assert (error.signal_name if how == "sigkill" else error.exitcode) \
        == status
    assert "Kill(node='b'" in str(error)
    # the node's workspace went with it; the session lives on, and the
    # node runs again (restarted, empty) in the next run
    assert not session.has_blob("w", "b")
    assert session.fetch_blob("w", "a").shape == (3,)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("b"), Task():
            ops.Const(np.arange(2.0), name="again")
    session.run(group)
    assert session.fetch_blob("again", "b").tolist() == [0.0, 1.0]
    assert [f.node for f in plan.fired()] == ["b"]


def test_a_kill_that_raises_is_an_op_error_where_it_fired(session_factory):
    plan = FaultPlan(Kill("b", at=Op("Add", nth=2), how="raise"))
    session = session_factory(faults=plan)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("b"), Task():
            ops.Add([ops.Const(np.ones(2)), ops.Const(np.ones(2))], ["x"])
    session.run(group)          # the first Add of the node
    with pytest.raises(TaskFailedError) as caught:
        session.run(group)      # the second: counted across runs
    assert caught.value.node == "b" and caught.value.op_type == "Add"
    assert caught.value.cause_type == "InjectedFault"
    session.run(group)          # fired once: the node goes on
    assert [f.node for f in plan.fired()] == ["b"]


def test_a_fault_fires_once_per_session_and_per_plan_node_only(
        session_factory):
    # a step's name is what printer.to_string shows: node/task
    plan = FaultPlan(Kill("b", at=Step("b/only_b"), how="exit"),
                     Delay("nobody", at=Op("Add"), seconds=5))
    session = session_factory(faults=plan)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for node in NODES:
            with Node(node), Task(name=f"only_{node}"):
                ops.Add([ops.Const(np.ones(2)), ops.Const(np.ones(2))],
                        ["x"])
    with pytest.raises(NodeFailedError):
        session.run(group)
    start = time.monotonic()
    session.run(group)
    session.run(group)
    assert time.monotonic() - start < 4   # the Delay names no node here
    assert [f.fault for f in plan.fired()] == [plan.faults[0]]


# -- hangs, delays, checkpoints -----------------------------------------------

def test_a_hang_holds_the_node_until_the_run_times_out(session_factory):
    plan = FaultPlan(Hang("a", at=Op("Scale")))
    session = session_factory(faults=plan)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for node in NODES:
            with Node(node), Task():
                ops.Scale([ops.Const(np.ones(2))], ["y"], scale=2.0)
    with pytest.raises(RunTimeoutError) as caught:
        session.run(group, timeout=0.5)
    assert caught.value.nodes == ("a",)
    assert session.is_open()
    session.run(group, timeout=10)  # fired once: the next run goes through
    assert session.fetch_blob("y", "a").tolist() == [2.0, 2.0]


def test_a_hung_node_is_recovered_by_restarts_with_a_runner_timeout(
        session_factory, tmp_path):
    plan = FaultPlan(Hang("a", at=Epoch(2)))
    session = session_factory(faults=plan)
    runner = JobRunner(build_job(),
                       MultiNodeCheckpointManager(str(tmp_path / "ckpt")),
                       max_restarts=1, timeout=1.0)
    runner.train(session)
    assert {n: session.fetch_blob("w", n).tolist() for n in NODES} \
        == expected()
    assert len(runner.result.restarts) == 1


def test_a_delay_holds_the_node_for_its_seconds(session_factory):
    plan = FaultPlan(Delay("b", at=Step("b/slow"), seconds=0.4))
    session = session_factory(faults=plan)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("a"), Task():
            ops.Const(np.ones(1), name="fast")
        with Node("b"), Task(name="slow"):
            ops.Const(np.ones(1), name="late")
    session.run(group)
    assert session.last_run_seconds["b"] >= 0.4 > \
        session.last_run_seconds["a"]
    start = time.monotonic()
    session.run(group)
    assert time.monotonic() - start < 0.4


def test_a_failed_checkpoint_warns_and_training_goes_on(session_factory,
                                                        tmp_path):
    plan = FaultPlan(FailCheckpoint("a", epoch=2))
    session = session_factory(faults=plan)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner, final = train(session, tmp_path)
    assert final == expected()
    [(epoch, message)] = runner.result.checkpoint_errors
    assert epoch == 2 and "'a'" in message and "FailCheckpoint" in message
    assert any(issubclass(w.category, CheckpointWarning) for w in caught)
    cm = MultiNodeCheckpointManager(str(tmp_path / "ckpt"))
    assert not os.path.exists(cm.get_ckpt_db_name("a", 2))
    assert os.path.exists(cm.get_ckpt_db_name("a", 3))


def test_sessions_take_only_fault_plans(session_factory):
    with pytest.raises(PlanError, match="faults="):
        session_factory(faults=42)
    assert session_factory(faults=[Kill("a", at=Epoch(1))]).faults == \
        FaultPlan(Kill("a", at=Epoch(1)))


def test_fired_records_are_values():
    fired = Fired(Kill("a", at=Epoch(1)), "a", 1.5)
    assert eval(repr(fired)) == fired


# -- under a deterministic schedule -------------------------------------------

def test_under_a_schedule_a_delay_is_virtual_time_and_kills_recover(
        tmp_path):
    from localcluster import LocalSession
    plan = FaultPlan(Delay("a", at=Epoch(1), seconds=3600),
                     Kill("b", at=Epoch(2)))
    with LocalSession(schedule=5, faults=plan) as session:
        start = time.monotonic()
        runner, final = train(session, tmp_path, max_restarts=1)
        assert time.monotonic() - start < 30   # not an hour
    assert final == expected()
    assert [f.fault for f in plan.fired()] == list(plan.faults)


def test_under_a_schedule_a_hang_without_timeout_is_a_deadlock_naming_it():
    from localcluster import LocalSession
    from localcluster.testing import DeadlockError
    plan = FaultPlan(Hang("a", at=Op("Scale")))
    with LocalSession(schedule=1, faults=plan) as session:
        with TaskGroup(WorkspaceType.GLOBAL) as group:
            with Node("a"), Task():
                ops.Scale([ops.Const(np.ones(2))], ["y"], scale=2.0)
        with pytest.raises(DeadlockError, match="Hang") as caught:
            session.run(group)
        assert [branch for branch, _ in caught.value.waiting] == ["a"]
        session.run(group)   # fired once: the next run goes through
        assert session.fetch_blob("y", "a").tolist() == [2.0, 2.0]


def test_a_delay_at_an_atomic_op_is_virtual_and_blocks_no_branch_for_good():
    # the fault fires before the op takes the node's lock; under a
    # schedule the other instance's atomic ops go on while this one waits
    # virtual time, and the run ends with every increment
    from localcluster import LocalSession
    plan = FaultPlan(Delay("a", at=Op("AtomicAdd", nth=1), seconds=60))
    with LocalSession(schedule=2, faults=plan) as session:
        session.feed_blob("acc", np.array(0.0), node="a")
        with TaskGroup(WorkspaceType.GLOBAL) as group:
            with Node("a"), Task(num_instances=2):
                with ops.loop(3):
                    ops.AtomicAdd(["acc", ops.Const(np.array(1.0))], [])
        start = time.monotonic()
        session.run(group, timeout=600)
        assert time.monotonic() - start < 10
        assert float(session.fetch_blob("acc", "a")) == 6.0
    assert len(plan.fired()) == 1
