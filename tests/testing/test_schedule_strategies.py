"""Schedules that explore: strategies, and a seed that drives a session.

``Schedule(seed, strategy, depth)``: "random" picks uniformly at each
decision, "pct" runs the branch of highest priority and lowers it at
depth - 1 change points, "mixed" cycles the two over consecutive seeds.
Each run of a session is seeded by (seed, run index), so the epochs of one
training interleave differently; ``session.schedule_log`` (every run's
decisions) and ``session.schedule_switches`` replay the whole training.
"""

import pickle
import tempfile

import numpy as np
import pytest

from localcluster import (JobRunner, LocalSession,
                          MultiNodeCheckpointManager, Node, Task, TaskGroup,
                          WorkspaceType, ops)
from localcluster.testing import Schedule, Slowdown, schedule_independent

import _corpus as corpus


def init_x():
    with TaskGroup(WorkspaceType.GLOBAL) as group, Node("n"), Task():
        ops.ConstantFill([], ["x"], shape=[], value=0.0)
    return group


def lost_update():
    """Two task instances of node "n" add 1 to ``x`` by a Copy and an Add,
    twice: an update is lost when they interleave between the two."""
    with TaskGroup(WorkspaceType.GLOBAL) as group, Node("n"), \
            Task(num_instances=2):
        with ops.loop(2):
            seen = ops.Copy(["x"])
            ops.Add([seen, ops.Const(np.array(1.0))], ["x"])
    return group


def run_once(schedule, **session_kwargs):
    """``(x, decisions, preemptions)`` of one run of `lost_update`."""
    with LocalSession(schedule=schedule, **session_kwargs) as session:
        session.run(init_x())
        session.run(lost_update())
        return (float(session.fetch_blob("x", "n")), session.last_schedule,
                session.last_preemptions)


def train(schedule):
    """``(schedule_log, schedule_switches, seen)`` of training the corpus's
    lost-update job (three epochs) under ``schedule``."""
    with tempfile.TemporaryDirectory() as directory, \
            LocalSession(schedule=schedule) as session:
        JobRunner(corpus.build_lost_update(),
                  MultiNodeCheckpointManager(directory),
                  timeout=10).train(session)
        return (session.schedule_log, session.schedule_switches,
                float(session.fetch_blob("seen", "worker_0")))


# -- the strategies -----------------------------------------------------------

@pytest.mark.parametrize("args, error, says", [
    ((0, "bogus"), ValueError, "'random', 'pct', 'mixed', got 'bogus'"),
    ((0, "PCT"), ValueError, "got 'PCT'"),
    ((0, "pct", 0), ValueError, "depth must be an int >= 1.*got 0"),
    ((0, "pct", -2), ValueError, "depth.*got -2"),
    ((0, "pct", 1.5), ValueError, "depth.*got 1.5"),
    ((0, "pct", True), ValueError, "depth.*got True"),
    ((0, "mixed", "3"), ValueError, "depth.*got '3'"),
    (("0", "pct"), TypeError, "seed must be an int"),
])
def test_a_bad_strategy_or_depth_is_refused_saying_what_is_allowed(
        args, error, says):
    with pytest.raises(error, match=says):
        Schedule(*args)


def test_pct_at_depth_1_runs_the_highest_priority_branch_until_it_ends():
    firsts = set()
    for seed in range(8):
        x, decisions, preemptions = run_once(Schedule(seed, "pct", depth=1))
        # no change point: a branch is never switched away from while it
        # can go on, so no update is lost
        assert (x, preemptions) == (4.0, 0), seed
        firsts.add(decisions[0])
    # the priorities are the seed's: either instance may go first
    assert len(firsts) == 2, firsts
    # a uniform random schedule preempts, and loses updates
    assert any(run_once(seed)[2] > 0 for seed in range(4))


def test_pct_at_a_greater_depth_preempts_at_its_change_points():
    preempted = [run_once(Schedule(seed, "pct", depth=3))[2]
                 for seed in range(8)]
    # at most depth - 1 change points: the running branch drops below
    # every other, at most twice
    assert all(p <= 2 for p in preempted) and any(preempted), preempted


def test_mixed_cycles_random_and_pct_depths_over_consecutive_seeds():
    assert [Schedule(seed, "mixed").kind() for seed in range(9)] == [
        ("random", 3), ("pct", 1), ("pct", 2), ("pct", 3)] * 2 + [
        ("random", 3)]
    assert [Schedule(seed, "mixed", depth=2).kind() for seed in range(6)] \
        == [("random", 2), ("pct", 1), ("pct", 2)] * 2
    assert Schedule(5).kind() == ("random", 3)
    assert Schedule(5, "pct", depth=2).kind() == ("pct", 2)
    # and it is what the checks explore with
    assert schedule_independent.__kwdefaults__["strategy"] == "mixed"


# -- a seed drives a whole session ----------------------------------------------

def test_each_run_of_a_session_makes_decisions_of_its_own():
    for seed in range(3):
        with LocalSession(schedule=seed) as session:
            session.run(init_x())
            session.run(lost_update())
            first = session.last_schedule
            session.run(lost_update())
            # the same plan, the same seed, another run: other choices
            assert session.last_schedule != first, seed


def test_a_training_replays_whole_from_its_log_and_from_its_switches():
    log, switches, seen = train(Schedule(3))
    # each epoch's run explored anew, and one of them lost an update
    epochs = [tuple(d) for d in log if d]
    assert len(set(epochs)) == len(epochs) >= 3, log
    assert seen < 6.0
    assert train(Schedule.replay(log)) == (log, switches, seen)
    assert train(Schedule.switches(switches)) == (log, switches, seen)


@pytest.mark.parametrize("strategy", ["random", "pct", "mixed"])
def test_the_same_seed_gives_the_same_log_twice(strategy):
    assert train(Schedule(6, strategy)) == train(Schedule(6, strategy))


def final_w(schedule, conditions):
    """``w`` after training the corpus's two-thread race (three ops then
    a read-modify-write on one thread, one op then one on the other)."""
    with tempfile.TemporaryDirectory() as directory, \
            LocalSession(schedule=schedule, conditions=conditions) as session:
        JobRunner(corpus.build_two_thread_race(),
                  MultiNodeCheckpointManager(directory),
                  timeout=10).train(session)
        return float(session.fetch_blob("w", "worker_0")[0])


def test_a_slowdown_of_1_keeps_the_interleavings_its_op_seconds_explore():
    # ops take virtual time, so the threads' clocks are rarely equal; every
    # branch within one op's cost of the earliest is the schedule's choice,
    # not only exact ties, so seeds still interleave them differently
    schedules = [Schedule(seed, op_seconds=1e-6) for seed in range(8)]
    slowed = [final_w(s, [Slowdown("worker_0", 1)]) for s in schedules]
    assert len(set(slowed)) > 1, slowed     # the race shows, or not
    assert slowed == [final_w(s, []) for s in schedules]


# -- schedules are values -------------------------------------------------------

#: schedules as a user writes them
SCHEDULES = [
    "Schedule(3)", "Schedule(3, 'pct')", "Schedule(3, 'pct', depth=2)",
    "Schedule(4, 'mixed')", "Schedule(4, 'mixed', depth=1)",
    "Schedule(5, op_seconds=1e-6)",
    "Schedule.replay(['a/b:0', 'a/b:1'])",
    "Schedule.replay([['a/b:0'], [], ['a/b:1', 'a/b:0']])",
    "Schedule.switches([])",
    "Schedule.switches([(5, 4, 'a/a:body:1'), (1, 0, 'a/a:body:0')], "
    "op_seconds=1e-6)",
]


@pytest.mark.parametrize("text", SCHEDULES)
def test_a_schedule_is_a_value_its_repr_makes_again(text):
    schedule = eval(text, {"Schedule": Schedule})
    again = eval(repr(schedule), {"Schedule": Schedule})
    assert again == schedule and hash(again) == hash(schedule)
    crossed = pickle.loads(pickle.dumps(schedule))
    assert crossed == schedule and repr(crossed) == repr(schedule)


def test_schedules_differ_by_every_part():
    made = {eval(text, {"Schedule": Schedule}) for text in SCHEDULES}
    assert len(made) == len(SCHEDULES)
    assert Schedule(3, "pct", depth=2) != Schedule(3, "pct", depth=3)
    assert repr(Schedule(3, "pct", depth=2)) == \
        "Schedule(3, strategy='pct', depth=2)"
    assert repr(Schedule(3, "random")) == "Schedule(3)"
    # switches are kept in order, whatever order they were given in
    assert Schedule.switches([(1, 0, "b"), (0, 2, "a")]) == \
        Schedule.switches([(0, 2, "a"), (1, 0, "b")])


@pytest.mark.parametrize("bad", [[(0, 1)], [("0", 1, "a")], [(0, -1, "a")],
                                 ["a"]])
def test_switches_are_run_decision_branch_triples(bad):
    with pytest.raises(TypeError, match=r"\(run, decision, branch\)"):
        Schedule.switches(bad)
