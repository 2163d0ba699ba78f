"""Cluster conditions in the testing kit: `strategies.conditions` draws
valid Links and Slowdowns that shrink to none, and the job checks put
every run but their reference under ``conditions=`` -- a job whose result
does not depend on timing passes, one that counts the records arriving
before a timer fails `schedule_independent` naming the condition, with a
replay line that fails the same way."""

import tempfile

import numpy as np
import pytest
from hypothesis import find, given, settings, strategies as st
from hypothesis.errors import InvalidArgument

from localcluster import (Dataset, Job, JobRunner, LocalSession,
                          MultiNodeCheckpointManager, Node, ReaderWithLimit,
                          ReaderWithTimeLimit, Task, epoch_limiter, ops, pipe)
from localcluster.plan.conditions import check_patterns
from localcluster.testing import (Epoch, JobCheckFailed, Kill, Link,
                                  Partition, Schedule, Slowdown, check_job,
                                  checks, resume_equals_uninterrupted,
                                  restart_recovers, schedule_independent,
                                  sessions_agree)
from localcluster.testing import strategies
from localcluster.testing.strategies import conditions

pytestmark = pytest.mark.timeout(30)

#: the CI profile (bounded examples, no deadline), whatever profile runs
CI = settings.get_profile("ci")


# -- jobs ---------------------------------------------------------------------

def _feed(limit=None):
    """Node "a" sends 2 of its records 1..8 to node "b" per epoch, three
    epochs; "b" adds up what it receives -- in ``seen`` it counts them,
    with ``limit`` only those read within ``limit`` seconds of its pipe's
    start."""
    with Job() as job:
        with Node("a"), job.init_group, Task():
            reader = Dataset({"v": np.arange(1, 9, dtype=np.int64)},
                             name="data").reader()
        with Node("b"), job.init_group, Task():
            ops.ConstantFill([], ["total"], shape=[1], value=0,
                             dtype="int64")
            ops.ConstantFill([], ["seen"], shape=[1], value=0, dtype="int64")
        with Node("a"):
            queue = pipe(ReaderWithLimit(reader, 2), name="send", capacity=2)

        def receive(record):
            ops.AtomicAdd(["total", record["v"]])
            ops.AtomicAdd(["seen", ops.Const(np.array([1]))])
        with Node("b"):
            source = queue if limit is None else \
                ReaderWithTimeLimit(queue.reader(), limit)
            pipe(source, processor=receive, name="receive")
        with Node("a"):
            epoch_limiter(job, 3)
    return job


def fed_job():
    """What "b" ends with does not depend on when records arrive."""
    return _feed()


def arrivals_in_a_millisecond():
    """What "b" ends with is how many records arrived within 1 ms of its
    pipe's start: all of them on a schedule (ops take no virtual time),
    fewer over a link slower than that."""
    return _feed(limit=0.001)


def arrivals_in_30_us():
    """As `arrivals_in_a_millisecond`, within 30 us: all of them when ops
    take 1 us of virtual time (the pipes run some ten ops a record), fewer
    when node "b" is four times as slow."""
    return _feed(limit=0.00003)


SLOW_LINK = Link("a", "b", latency=0.002)


# -- the strategy -------------------------------------------------------------

NODE_LISTS = [1, 3, ["ps", "trainer_1", "trainer_2"], ["a*", "b[1]", "c?"]]


@settings(CI, max_examples=30)
@given(data=st.data(), nodes=st.sampled_from(NODE_LISTS))
def test_drawn_conditions_are_valid_and_within_their_bounds(data, nodes):
    names = strategies._node_names(nodes)
    drawn = data.draw(conditions(nodes, max_links=3))
    links = [c for c in drawn if isinstance(c, Link)]
    slow = [c for c in drawn if isinstance(c, Slowdown)]
    assert len(links) + len(slow) == len(drawn)
    assert len(links) <= 3 and len(slow) <= 2
    # every pattern matches a node: the session would raise PlanError
    check_patterns(drawn, [], names)
    for link in links:
        assert 0 <= link.latency <= 0.005 and 0 <= link.jitter <= 0.001
        assert link.bandwidth is None or 1e6 <= link.bandwidth <= 1e9
    assert all(s.factor in (1, 2, 3, 4) for s in slow)


@settings(CI, max_examples=8)
@given(drawn=conditions(["a", "b"]))
def test_drawn_conditions_run_and_change_no_timing_independent_result(
        drawn):
    with LocalSession(schedule=Schedule(0, op_seconds=1e-6),
                      conditions=drawn) as session, \
            tempfile.TemporaryDirectory() as directory:
        JobRunner(fed_job(), MultiNodeCheckpointManager(directory),
                  timeout=20).train(session)
        # three epochs of two records each
        assert session.fetch_blob("total", "b").tolist() == [21]


@settings(CI, max_examples=20)
@given(drawn=strategies.jobs(), data=st.data(), seed=strategies.schedules())
def test_drawn_jobs_train_to_their_model_under_drawn_conditions(drawn, data,
                                                                seed):
    # the drawn jobs are race-free by construction: no condition may
    # change what they end with
    conds = data.draw(conditions(list(drawn.nodes)))
    with LocalSession(schedule=Schedule(seed, op_seconds=1e-6),
                      conditions=conds) as session, \
            tempfile.TemporaryDirectory() as directory:
        JobRunner(drawn.build(), MultiNodeCheckpointManager(directory),
                  timeout=20).train(session)
        for node, blobs in drawn.expected.items():
            for name, value in blobs.items():
                np.testing.assert_array_equal(
                    session.fetch_blob(name, node), value, f"{node} {name}")


def test_without_options_nothing_but_the_nodes_is_drawn():
    drawn = find(conditions(["a", "b"], slowdowns=False, bandwidth=None,
                            jitter=(0, 0), latency=(0.001, 0.001)),
                 lambda c: len(c) == 2, settings=settings(database=None))
    assert all(c.latency == 0.001 and c.bandwidth is None and
               c.jitter == 0 for c in drawn)


@pytest.mark.parametrize("wanted, smallest", [
    (lambda c: True, []),
    (lambda c: any(isinstance(x, Link) for x in c),
     [Link("node_0", "node_1")]),
    (lambda c: any(isinstance(x, Slowdown) for x in c),
     [Slowdown("node_0", 1)]),
])
def test_conditions_shrink_towards_none(wanted, smallest):
    assert find(conditions(3), wanted,
                settings=settings(database=None)) == smallest


@pytest.mark.parametrize("kwargs, message", [
    ({"nodes": 0}, "nodes=0"),
    ({"nodes": 2, "max_links": -1}, "max_links=-1"),
    ({"nodes": 2, "slowdowns": "yes"}, "slowdowns='yes'"),
    ({"nodes": 2, "latency": (0.005, 0)}, r"latency=\(0.005, 0\)"),
    ({"nodes": 2, "jitter": 0.001}, "jitter=0.001"),
    ({"nodes": 2, "bandwidth": (0, 1e9)}, "0 < low"),
    ({"nodes": 2, "max_slowdown": 0}, "max_slowdown=0"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    with pytest.raises(InvalidArgument, match=message):
        conditions(**kwargs)


# -- the checks ---------------------------------------------------------------

def test_a_timing_independent_job_passes_every_check_under_conditions():
    check_job(fed_job, max_examples=2, max_kills=2, conditions=[
        Link("a", "b", latency=0.002, bandwidth=1e6, jitter=0.001, seed=1),
        Slowdown("b", 2)])


def test_a_result_that_depends_on_arrival_times_fails_naming_the_link():
    # without conditions every schedule agrees ...
    schedule_independent(arrivals_in_a_millisecond, max_examples=4)
    # ... but over a link slower than the timer, records come too late
    with pytest.raises(JobCheckFailed) as caught:
        check_job(arrivals_in_a_millisecond, checks=[schedule_independent],
                  conditions=[SLOW_LINK], max_examples=4)
    failed = caught.value
    assert failed.check == "schedule_independent"
    # the first seed fails, and the interleaving it takes is the one
    # without preemptions
    assert failed.counterexample == {
        "schedule": Schedule.switches([]), "preemptions": 0, "seed": 0,
        "interleavings": 2, "conditions": [SLOW_LINK]}
    assert repr(SLOW_LINK) in failed.message
    assert "schedule seed 0" in failed.message
    assert "'seen' on node 'b'" in failed.message
    assert "the result depends on the conditions" in failed.message
    assert f"conditions=[{SLOW_LINK!r}]" in failed.replay
    with pytest.raises(JobCheckFailed) as again:
        exec(failed.replay, {})
    assert_fails_alike(again.value, failed)


def assert_fails_alike(again, failed):
    """``again`` (what a replay line raised) is ``failed``'s failure: the
    same schedule, conditions and difference."""
    assert again.check == failed.check
    for key in ("schedule", "preemptions", "conditions"):
        assert again.counterexample[key] == failed.counterexample[key]
    assert again.replay == failed.replay
    assert again.message.split(" after ")[0] == \
        failed.message.split(" after ")[0]
    assert again.message.split("; ")[1:] == \
        failed.message.split(" -- shrunk")[0].split("; ")[1:]


def test_a_slow_node_matters_when_ops_take_virtual_time():
    slow = Slowdown("b", 4)
    schedule_independent(arrivals_in_30_us, conditions=[], max_examples=2)
    with pytest.raises(JobCheckFailed) as caught:
        schedule_independent(arrivals_in_30_us, conditions=[slow],
                             max_examples=2)
    assert repr(slow) in str(caught.value)
    # ops taking no virtual time, a slow node runs as fast as any
    schedule_independent(arrivals_in_30_us, conditions=[slow],
                         op_seconds=0, max_examples=2)


def test_a_strategy_is_drawn_per_seed_and_its_failure_shrunk():
    drawn = conditions(["a", "b"], max_links=2, slowdowns=True,
                       bandwidth=None, jitter=(0, 0))
    with pytest.raises(JobCheckFailed) as caught:
        schedule_independent(arrivals_in_a_millisecond, conditions=drawn,
                             max_examples=6)
    failed = caught.value
    found = failed.counterexample["conditions"]
    # one slow link is all it takes: the rest was shrunk away
    assert len(found) == 1 and isinstance(found[0], Link)
    assert found[0].latency > 0.001 and repr(found[0]) in failed.message
    with pytest.raises(JobCheckFailed) as again:
        exec(failed.replay, {})
    assert_fails_alike(again.value, failed)


def test_a_strategy_finds_nothing_wrong_with_a_timing_independent_job():
    check_job(fed_job, checks=[sessions_agree, schedule_independent],
              conditions=conditions(["a", "b"]), max_examples=3)


def test_conditions_reach_every_session_but_the_reference(monkeypatch):
    opened = []

    def spy(kind):
        def open_(**kwargs):
            opened.append((kind, kwargs.get("conditions")))
            return LocalSession(**kwargs)
        return open_
    # a kind the checks do not know runs in this process, where the spy
    # sees it; so does "local", replaced by a spy too
    monkeypatch.setitem(checks.SESSION_KINDS, "spy", spy("spy"))
    monkeypatch.setitem(checks.SESSION_KINDS, "local", spy("local"))
    link = Link("a", "b", latency=0.0001)

    # the reference: the scheduled run without preemptions
    sessions_agree(fed_job, sessions=("spy", "spy"), conditions=[link])
    assert opened == [("local", None), ("spy", [link]), ("spy", [link])]
    del opened[:]
    # references under Schedule(0) and spy, then a resume of each
    resume_equals_uninterrupted(fed_job, sessions=("spy",), epochs=[1],
                                conditions=link)
    assert opened == [("local", None), ("local", [link]), ("spy", None),
                      ("spy", [link])]
    del opened[:]
    # references; the kill under Schedule(0), its resume and the kill
    # with a restart
    restart_recovers(fed_job, sessions=("spy",),
                     faults=[Kill("b", at=Epoch(1))], conditions=[link])
    assert opened == [("local", None), ("spy", None), ("local", [link]),
                      ("spy", [link]), ("local", [link])]


def test_what_is_no_condition_is_refused_before_anything_runs():
    partition = Partition(["a"], ["b"], at=0.0)
    with pytest.raises(TypeError, match="Link and Slowdown") as caught:
        sessions_agree(fed_job, conditions=[partition])
    assert "Partition" in str(caught.value)
