"""Where a deterministic schedule decides: only before ops that can
interact with another branch (partial-order reduction).

An op that touches only blobs no concurrent branch of its node uses (or
that branches only read) commutes with whatever the others do, so it runs
without a switch point: no decision, no hand-over of the baton between
threads.  Queue, clock, sleep and Python ops, ops on a blob another
branch writes, and ops a fault names keep theirs.  The runs still see
every outcome a race can give, replay exactly and charge every op its
virtual time.
"""

import numpy as np

from localcluster import (LocalSession, Net, Node, Task, TaskGroup,
                          WorkspaceType, execution_step, ops)
from localcluster.plan.races import switch_points
from localcluster.runtime import scheduler as scheduler_module
from localcluster.runtime.faults import FaultBook, NodeFaults
from localcluster.testing import Delay, FaultPlan, Op, Schedule

#: ops of the local stretch each branch runs between its shared ops
LOCAL_OPS = 20


def _branch_net(name, shared="x"):
    """A long stretch on the branch's own temporaries, then one
    read-modify-write of ``shared``: two ops that need a point."""
    net = Net(name)
    mine = net.ConstantFill([], shape=[4], value=1.0)
    for _ in range(LOCAL_OPS):
        mine = net.Scale([mine], scale=1.5)
    seen = net.Copy([shared])
    net.Add([seen, net.ReduceSum([mine])], [shared])
    return net


def _racy_substeps():
    return execution_step("both", [
        execution_step(f"branch_{i}", [_branch_net(f"work_{i}")])
        for i in range(2)], concurrent_substeps=True)


def _init():
    net = Net("init")
    net.ConstantFill([], ["x"], shape=[], value=0.0)
    return net


def _run(schedule, step):
    with LocalSession(schedule=schedule) as session:
        session.run(_init())
        session.run(step)
        return (float(session.fetch_blob("x")), session.last_schedule,
                session.last_run_simulated_seconds)


def test_only_ops_on_a_blob_another_branch_writes_get_a_point():
    step = _racy_substeps()
    points = switch_points([("local", step)], {"local": {"x"}})["local"]
    for i, sub in enumerate(step.substeps):
        net = sub.nets[0]
        types = [net.ops[k].type for k in sorted(points[id(net)])]
        # the Copy reads x, the Add writes it: the local stretch (a fill,
        # 20 Scales, a ReduceSum) has none
        assert types == ["Copy", "Add"], (i, types)


def test_queue_clock_and_python_ops_always_get_a_point():
    with TaskGroup(WorkspaceType.GLOBAL) as group, Node("n"), Task():
        timer = ops.TimerBegin([])
        ops.Sleep([], [], seconds=0.01)
        ops.Python(np.negative)([ops.Const(np.array(1.0))], ["y"])
        ops.TimerGet([timer], ["t"])
        ops.Scale(["y"], ["z"], scale=2.0)
    plans = [(p.node, p.step) for p in group.node_plans()]
    points = switch_points(plans)["n"]
    net, = [n for n in plans[0][1].walk_nets() if id(n) in points]
    assert [net.ops[k].type for k in sorted(points[id(net)])] == [
        "TimerBegin", "Sleep", "Python", "TimerGet"]


def test_a_blob_only_read_by_concurrent_branches_needs_no_point():
    step = execution_step("both", [
        execution_step(f"b{i}", [_reader(f"r{i}")]) for i in range(2)],
        concurrent_substeps=True)
    assert switch_points([("local", step)], {"local": {"x"}}) == {}


def _reader(name):
    net = Net(name)
    net.Scale(["x"], scale=2.0)
    return net


def test_a_run_decides_only_at_its_points():
    _, decisions, _ = _run(Schedule(0), _racy_substeps())
    # two branches, two points each: at most four decisions (a point
    # before every op would give one per op of each: over forty)
    assert 0 < len(decisions) <= 4, decisions


def test_the_race_still_shows_and_replays():
    results = {}
    for seed in range(12):
        x, decisions, _ = _run(Schedule(seed), _racy_substeps())
        results[x] = decisions
        assert _run(Schedule.replay(decisions), _racy_substeps())[:2] == \
            (x, decisions)
    # both updates, or one lost: every outcome of the race
    total = float(np.sum(np.full(4, 1.5 ** LOCAL_OPS)))
    assert set(results) == {total, 2 * total}, sorted(results)


def test_ops_without_a_point_still_take_their_virtual_time():
    step = _racy_substeps()
    ops_per_branch = len(step.substeps[0].nets[0].ops)
    _, _, seconds = _run(Schedule(0, op_seconds=0.001), step)
    # each branch's clock runs through all its ops; they run side by side
    assert round(seconds, 9) == round(ops_per_branch * 0.001, 9)


def test_a_branch_running_local_ops_hands_the_baton_to_no_thread(
        monkeypatch):
    handed = []
    original = scheduler_module.Scheduler._pick

    def counting(self):
        before = self._current
        original(self)
        if self._current is not None and self._current is not before:
            handed.append(self._current.name)

    monkeypatch.setattr(scheduler_module.Scheduler, "_pick", counting)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for node in ("a", "b"):
            with Node(node), Task():
                mine = ops.Const(np.ones(4))
                for _ in range(LOCAL_OPS):
                    mine = ops.Scale([mine], scale=1.5)
    with LocalSession(schedule=Schedule(0)) as session:
        session.run(group)
        # which node starts: the one decision (a point before every op
        # would make one per op)
        assert len(session.last_schedule) == 1, session.last_schedule
    # each node's branch gets the baton once: nothing of two nodes' own
    # blobs needs a switch between them
    assert sorted(handed) == ["a", "b"], handed


def test_an_op_a_fault_names_gets_a_point():
    plan = FaultPlan(Delay("n", at=Op("Scale", 3), seconds=0.0))
    faults = NodeFaults("n", list(enumerate(plan.faults)),
                        FaultBook(np.zeros(1)))
    net = Net("w")
    net.Scale([net.ConstantFill([], shape=[], value=1.0)], scale=2.0)
    assert [faults.names(op) for op in net.ops] == [False, True]
