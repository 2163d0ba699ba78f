"""Cluster conditions, end to end: slow nodes, thin links and partitions.

Real-time measurements are ratios or differences of the fastest runs against the
same group run without the condition, with tolerances that hold on a
noisy two-core machine; under a deterministic schedule the virtual clock
makes them exact.  Every group is built in a `Cluster` of its own: the
default cluster keeps a node's options (``slowdown`` among them) from one
group to the next.
"""


import numpy as np
import pytest

from localcluster import (Cluster, Link, Node, PlanError, Queue, Slowdown,
                          Task, TaskGroup, WorkspaceType, ops)
from localcluster.errors import RunTimeoutError
from localcluster.plan.conditions import parse_link, parse_slowdown
from localcluster.plan.faults import Epoch, FaultPlan, Partition
from localcluster.testing import DeadlockError, Schedule
from localcluster.testing.pytest_plugin import Snapshot, leaks_since
from localcluster import LocalHostScheduler, LocalSession

#: elements of a record's float64 field: 800 kB a record
SIZE = 100_000
#: bytes a numbered record carries over a link (its field and its number)
RECORD_BYTES = SIZE * 8 + 8


def transfer(n, size=SIZE, links=None, capacity=4, slowdown=None,
             reader="reader", trainer="trainer"):
    """A GLOBAL group: ``reader`` writes ``n`` numbered records of ``size``
    floats (record i holds i + 1) to a queue that ``trainer`` reads; the
    trainer keeps the numbers in order (``seen``), the sum of the values
    (``total``) and the ns from its start to its last record
    (``elapsed``)."""
    kwargs = {} if slowdown is None else {"slowdown": slowdown}
    with Cluster(links=links), TaskGroup(WorkspaceType.GLOBAL) as group:
        q = Queue(capacity, name="records")
        args = {"queue": q.id, "capacity": capacity}
        with Node(reader, **kwargs), Task():
            ones = ops.ConstantFill([], ["ones"], shape=[size], value=1.0)
            with ops.loop(n) as loop:
                i = loop.iter()
                number = ops.Add([ops.Cast([i], to="float64"),
                                  ops.Const(1.0)])
                data = ops.Mul([ones, number])
                ops.EnqueueRecord([data, i], ["closed"], **args)
            ops.CloseQueue([], [], **args)
        with Node(trainer), Task():
            timer = ops.TimerBegin([], ["timer"])
            ops.ConstantFill([], ["seen"], shape=[0], value=0, dtype="int64")
            ops.ConstantFill([], ["total"], value=0.0)
            with ops.loop(n):
                _, data, i = ops.DequeueRecords(
                    [], ["finished", "data", "number"], num_records=1,
                    num_fields=2, **args)
                ops.Concat(["seen", ops.Reshape([i], shape=[1])], ["seen"])
                ops.Add(["total", ops.Sum([data])], ["total"])
            ops.TimerGet([timer], ["elapsed"])
    return group


def expected_total(n, size=SIZE):
    return size * n * (n + 1) / 2


def run_transfer(session, group, timeout=30):
    """(elapsed seconds, seen, total) of a run of a `transfer` group."""
    session.run(group, timeout=timeout)
    return (session.fetch_blob("elapsed", "trainer") / 1e9,
            session.fetch_blob("seen", "trainer").tolist(),
            float(np.sum(session.fetch_blob("total", "trainer"))))


def work(iters=300, size=2 * SIZE, slowdown=None, node="worker"):
    """A GLOBAL group: ``node`` runs ``iters`` times three reductions of
    ``size`` floats (no BLAS: their time does not depend on threads
    waking up; no large result: a fresh array's page faults would make
    an op's time depend on the allocator's state) and keeps the ns they
    took (``elapsed``)."""
    kwargs = {} if slowdown is None else {"slowdown": slowdown}
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node(node, **kwargs), Task():
            x = ops.ConstantFill([], ["x"], shape=[size], value=1.5)
            timer = ops.TimerBegin([], ["timer"])
            with ops.loop(iters):
                ops.ReduceSum([x], ["s"])
                ops.ReduceMean([x], ["m"])
                ops.ReduceSum([x], ["m"])
            ops.TimerGet([timer], ["elapsed"])
    return group


def fastest(session, plain, conditioned, node, repeats=5):
    """The fastest ``elapsed`` seconds on ``node`` of ``plain`` and of
    ``conditioned`` runs, alternated so drifts hit both alike.  The
    fastest, not the median: a run of tens of ms on a shared 2-core box
    is often slowed by others (+-40% seen), and a condition adds what it
    adds to the run it is in -- a slowdown owes twice what each op really
    took -- so the fastest runs show the condition, undisturbed."""
    a, b = [], []
    for _ in range(repeats):
        for group, times in ((plain, a), (conditioned, b)):
            session.run(group, timeout=30)
            times.append(session.fetch_blob("elapsed", node) / 1e9)
    return min(a), min(b)


def slowed_about_3x(ratio):
    """A 3x slowdown seen in wall time on a shared 2-core box: applied
    (2x at least -- not applied is 1x) and applied once (7.5x at most --
    twice would be 9x).  Not closer: a slowed node's ops are charged what
    they really took, ops right after its waits run colder, and the
    fastest plain run of 50 ms varied from 47 to 82 ms within one full
    run here (3.1x to 5.0x seen).  The exact factor is checked on the
    virtual clock (`test_simulated_a_slowdown_of_4_...` below)."""
    return 2.0 <= ratio <= 7.5


def within(measured, expected, tolerance):
    return abs(measured - expected) <= tolerance * expected


def on_time(measured, expected):
    """A real-time figure of a link or a partition: never early (15% for
    the clock's own grain), and late by less than a bug would make it --
    a doubled latency, a record held twice.  On a loaded 2-core machine a
    0.25 s partition was measured at 0.31 s (+24%); the exact figures are
    checked on the virtual clock below."""
    return 0.85 * expected <= measured <= 1.6 * expected


# -- real time: LocalSession and LocalHostScheduler --------------------------

def test_a_link_of_bandwidth_b_moves_n_bytes_in_n_over_b(session_factory):
    n, bandwidth = 20, 80e6
    session = session_factory()
    plain = transfer(n)
    linked = transfer(n, links=[Link("reader", "trainer",
                                     bandwidth=bandwidth)])
    base, took = fastest(session, plain, linked, "trainer", repeats=3)
    expected = n * RECORD_BYTES / bandwidth           # 0.2 s
    assert on_time(took, expected), (took, expected, base)


def test_link_latency_adds_the_latency(session_factory):
    n, latency = 5, 0.2
    session = session_factory()
    # a queue that holds every record: none waits for a free slot
    plain = transfer(n, size=10, capacity=n)
    late = transfer(n, size=10, capacity=n,
                    links=[Link("reader", "trainer", latency=latency)])
    base, took = fastest(session, plain, late, "trainer", repeats=3)
    assert on_time(took - base, latency), (took, base)


def test_slowdown_3_makes_a_nodes_ops_take_3_times_as_long(session_factory):
    session = session_factory()
    base, slow = fastest(session, work(), work(slowdown=3), "worker")
    assert slowed_about_3x(slow / base), (slow, base)


def test_a_session_slowdown_condition_slows_the_nodes_it_matches(
        session_factory):
    plain = work()
    fast = session_factory()
    slowed = session_factory(conditions=[Slowdown("work*", 3)])
    times = {fast: [], slowed: []}
    for _ in range(7):
        for session in (fast, slowed):
            session.run(plain, timeout=30)
            times[session].append(session.fetch_blob("elapsed", "worker"))
    # the fastest run of each (see `fastest`)
    ratio = min(times[slowed]) / min(times[fast])
    assert slowed_about_3x(ratio), times


def test_a_partition_holds_records_and_releases_all_in_order_at_heal(
        session_factory):
    n, heal = 10, 0.25
    session = session_factory(faults=FaultPlan(
        Partition("reader", "trainer", at=0.0, heal_at=heal)))
    group, took = transfer(n, capacity=n), []
    for _ in range(3):    # a partition from 0 s holds every run
        elapsed, seen, total = run_transfer(session, group)
        assert seen == list(range(n))
        assert total == expected_total(n)
        took.append(elapsed)
    # the fastest run (see `fastest`): 0.43 s was seen for one run of
    # RaySession on a loaded machine
    assert on_time(min(took), heal), took


def test_conditions_change_no_result(session_factory):
    n = 12
    plain = session_factory()
    _, seen, total = run_transfer(plain, transfer(n, size=1000))
    conditioned = session_factory(
        conditions=[Slowdown("reader", 2),
                    Link("*", "train*", latency=0.002, jitter=0.003,
                         bandwidth=50e6, seed=5)],
        faults=FaultPlan(Partition(["read*"], ["trainer"], at=0.0,
                                    heal_at=0.05)))
    group = transfer(n, size=1000, capacity=3, slowdown=1.5)
    for _ in range(2):
        _, seen_c, total_c = run_transfer(conditioned, group)
        assert (seen_c, total_c) == (seen, total)
    assert seen == list(range(n)) and total == expected_total(n, 1000)
    assert conditioned.fetch_blob("ones", "reader").tolist() == \
        plain.fetch_blob("ones", "reader").tolist()


@pytest.mark.parametrize("kind", [LocalSession, LocalHostScheduler])
def test_a_partition_that_never_heals_ends_in_a_timeout_naming_it(kind):
    before = Snapshot()
    partition = Partition("reader", "trainer", at=0.0)
    session = kind(faults=FaultPlan(partition))
    try:
        with pytest.raises(RunTimeoutError) as caught:
            session.run(transfer(3, size=10), timeout=0.5)
        assert repr(partition) in str(caught.value)
        assert "held" in str(caught.value)
        # the session is fine after: a run without a partition goes on
        session.faults = None
    finally:
        session.close()
    assert not leaks_since(before)


@pytest.mark.localcluster(leak_check=True)
def test_conditioned_runs_leave_nothing_behind(localhost):
    session = localhost(conditions=[Link("reader", "trainer", latency=0.01),
                                    Slowdown("reader", 2)])
    _, seen, _ = run_transfer(session, transfer(4, size=10))
    assert seen == [0, 1, 2, 3]
    session.close()


# -- bad conditions are PlanErrors naming the value and the rule -------------

@pytest.mark.parametrize("conditions,words", [
    ([Link("reader", "nosuch")], ["'nosuch'", "matches no node"]),
    ([Link("reader", "nomatch_*")], ["'nomatch_*'", "pattern",
                                     "matches no node"]),
    ([Slowdown("ps*", 2)], ["'ps*'", "matches no node"]),
    ([Slowdown("trainer_99", 2)], [
        "Slowdown(node='trainer_99', factor=2): the node 'trainer_99' "
        "matches no node of the job"]),   # was "the node node 'trainer_99'"
    ([Slowdown("trainer_9*", 2)], ["the node pattern 'trainer_9*' matches"]),
])
def test_a_condition_naming_no_node_of_the_job_is_refused(local, conditions,
                                                          words):
    session = local(conditions=conditions)
    with pytest.raises(PlanError) as caught:
        session.run(transfer(2, size=10))
    for word in words:
        assert word in str(caught.value)
    assert "node node" not in str(caught.value)


def test_a_cluster_link_to_a_node_the_job_lacks_is_refused(local):
    with pytest.raises(PlanError, match="'nosuch'.*matches no node"):
        local().run(transfer(2, size=10, links=[Link("reader", "nosuch")]))


def test_a_partition_side_naming_no_node_is_refused(local):
    session = local(faults=FaultPlan(Partition("reader", "ghost*", 0.0)))
    with pytest.raises(PlanError, match="'ghost\\*'.*matches no node"):
        session.run(transfer(2, size=10))


@pytest.mark.parametrize("make,words", [
    (lambda: Link("a", "b", latency=-0.1), ["latency", "-0.1", ">= 0"]),
    (lambda: Link("a", "b", jitter=-1), ["jitter", ">= 0"]),
    (lambda: Link("a", "b", bandwidth=0), ["bandwidth", "> 0"]),
    (lambda: Link("a", "", latency=1), ["dst", "pattern"]),
    (lambda: Slowdown("a", 0.5), ["0.5", "factor >= 1"]),
    (lambda: Node("a", slowdown=0.9), ["0.9", "factor >= 1"]),
    (lambda: Partition(["a", "b"], ["b", "c"], at=0.0),
     ["['b']", "both sides"]),
    (lambda: Partition("a", "b", at=0.5, heal_at=0.2),
     ["0.5", "0.2", "heal after it starts"]),
    (lambda: Partition("a", "b", at=Epoch(3), heal_at=Epoch(3)),
     ["Epoch(k=3)", "m > k"]),
    (lambda: Partition("a", "b", at=-1), ["-1", "seconds >= 0"]),
])
def test_bad_conditions_are_plan_errors_naming_value_and_rule(make, words):
    with Cluster(), pytest.raises(PlanError) as caught:
        make()
    for word in words:
        assert word in str(caught.value)


def test_link_and_slowdown_text_forms_round_trip():
    link = parse_link("reader->trainer_*:latency=5ms,bandwidth=100MB/s,"
                      "jitter=1ms,seed=3")
    assert link == Link("reader", "trainer_*", latency=0.005,
                        bandwidth=100e6, jitter=0.001, seed=3)
    assert parse_link(str(link)) == link
    assert parse_link("a->b:bandwidth=1Gbit/s").bandwidth == 125e6
    assert parse_link("a->b:") == Link("a", "b")
    slow = parse_slowdown("trainer_*=3")
    assert slow == Slowdown("trainer_*", 3)
    assert parse_slowdown(str(slow)) == slow


def test_partition_text_form_round_trips():
    text = "partition a from b at epoch 2 heal at 0.5s"
    plan = FaultPlan.parse(text)
    assert plan.faults == (Partition("a", "b", at=Epoch(2), heal_at=0.5),)
    assert str(plan) == text
    assert FaultPlan.parse(str(plan)).faults == plan.faults
    two = FaultPlan.parse("partition a,b from c* at 0.1s heal at 0.3s")
    assert two.faults == (Partition(["a", "b"], ["c*"], 0.1, 0.3),)
    assert FaultPlan.parse(str(two)).faults == two.faults


@pytest.mark.parametrize("text,words", [
    ("reader trainer", ["SRC->DST"]),
    ("a->b:latency=fast", ["'fast'", "5ms"]),
    ("a->b:speed=1", ["'speed=1'", "SRC->DST"]),
    ("a->b:bandwidth=lots", ["'lots'", "100MB/s"]),
    ("a->b:seed=x", ["'x'", "int"]),
])
def test_bad_link_text_is_a_plan_error_naming_the_syntax(text, words):
    with pytest.raises(PlanError) as caught:
        parse_link(text)
    for word in words:
        assert word in str(caught.value)


@pytest.mark.parametrize("text", ["trainer", "trainer=fast", "=2"])
def test_bad_slowdown_text_is_a_plan_error_naming_the_syntax(text):
    with pytest.raises(PlanError, match="NODE=FACTOR|pattern"):
        parse_slowdown(text)


@pytest.mark.parametrize("text,words", [
    ("partition a from b at soon", ["'soon'", "epoch K"]),
    ("partition a to b at 1s", ["'from'", "partition NODES from NODES"]),
    ("partition a from b at 1s heal 2s", ["heal at"]),
    ("partition a from b", ["expected 'at'"]),
])
def test_bad_partition_text_is_a_plan_error_naming_the_syntax(text, words):
    with pytest.raises(PlanError) as caught:
        FaultPlan.parse(text)
    for word in words:
        assert word in str(caught.value)


# -- the virtual clock: exact ----------------------------------------------

def simulated(group, faults=None, conditions=None, op_seconds=1e-4, seed=3):
    session = LocalSession(schedule=Schedule(seed, op_seconds=op_seconds),
                           faults=faults, conditions=conditions)
    try:
        session.run(group)
        result = session.last_run_simulated_seconds
        seen = session.fetch_blob("seen", "trainer").tolist() \
            if session.has_blob("seen", "trainer") else None
    finally:
        session.close()
    return result, seen


def peers(slowdown=None, iters=50):
    """Two nodes doing the same work, ``a`` slowed by ``slowdown``."""
    kwargs = {} if slowdown is None else {"slowdown": slowdown}
    with Cluster(), TaskGroup() as group:
        for node, kw in (("a", kwargs), ("b", {})):
            with Node(node, **kw), Task():
                x = ops.ConstantFill([], shape=[10], value=1.0)
                with ops.loop(iters):
                    ops.Add([x, x], [x])
    return group


def test_simulated_a_slowdown_of_4_makes_the_run_4_times_as_long():
    plain, _ = simulated(peers())
    slow, _ = simulated(peers(slowdown=4))
    assert plain > 0
    assert within(slow / plain, 4.0, 0.15), (slow, plain)


def test_simulated_time_is_the_max_over_nodes_not_the_sum():
    with Cluster(), TaskGroup() as one:
        with Node("a"), Task():
            x = ops.ConstantFill([], shape=[10], value=1.0)
            with ops.loop(50):
                ops.Add([x, x], [x])
    alone, _ = simulated(one)
    both, _ = simulated(peers())
    assert alone > 0
    assert both == pytest.approx(alone, abs=1e-9)


def test_simulated_latency_adds_exactly_the_latency():
    n, latency = 5, 0.25
    plain, seen = simulated(transfer(n, size=10, capacity=n))
    late, seen_late = simulated(transfer(
        n, size=10, capacity=n,
        links=[Link("reader", "trainer", latency=latency)]))
    assert seen == seen_late == list(range(n))
    assert late - plain == pytest.approx(latency, abs=1e-9)


def test_simulated_bandwidth_moves_n_bytes_in_exactly_n_over_b():
    n, bandwidth = 20, 80e6
    took, seen = simulated(
        transfer(n, links=[Link("reader", "trainer", bandwidth=bandwidth)]),
        op_seconds=0.0)
    assert seen == list(range(n))
    assert took == pytest.approx(n * RECORD_BYTES / bandwidth, abs=1e-6)


def test_simulated_partition_releases_every_record_in_order_at_heal():
    n, heal = 10, 0.5
    took, seen = simulated(
        transfer(n, size=10, capacity=n),
        faults=FaultPlan(Partition("reader", "trainer", 0.0, heal)),
        op_seconds=0.0)
    assert seen == list(range(n))
    assert took == pytest.approx(heal, abs=1e-9)


def test_simulated_partition_from_an_epoch_holds_that_epochs_runs():
    session = LocalSession(schedule=Schedule(1, op_seconds=0.0), faults=[
        Partition("reader", "trainer", at=Epoch(2), heal_at=0.3)])
    try:
        group = transfer(4, size=10, capacity=4)
        for epoch, expected in ((1, 0.0), (2, 0.3), (3, 0.0)):
            session.current_epoch = epoch
            session.run(group)
            assert session.last_run_simulated_seconds == \
                pytest.approx(expected, abs=1e-9), epoch
            assert session.fetch_blob("seen", "trainer").tolist() == \
                [0, 1, 2, 3]
    finally:
        session.close()


def test_a_partition_that_never_heals_is_a_deadlock_naming_it():
    partition = Partition("reader", "trainer", at=0.0)
    session = LocalSession(schedule=Schedule(1), faults=[partition])
    try:
        with pytest.raises(DeadlockError) as caught:
            session.run(transfer(3, size=10))
    finally:
        session.close()
    assert repr(partition) in str(caught.value)


def test_a_never_healing_partition_under_a_schedule_with_timeout():
    partition = Partition("reader", "trainer", at=0.0)
    session = LocalSession(schedule=Schedule(1), faults=[partition])
    try:
        with pytest.raises(RunTimeoutError) as caught:
            session.run(transfer(3, size=10), timeout=2)
    finally:
        session.close()
    assert repr(partition) in str(caught.value)
