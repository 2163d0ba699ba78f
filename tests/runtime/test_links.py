"""A link's arithmetic and its two ends, on a clock the test moves."""

import math

import numpy as np
import pytest

from localcluster import Link, Slowdown
from localcluster.errors import Cancelled
from localcluster.plan.conditions import InLink, resolve
from localcluster.plan.faults import Epoch, Partition
from localcluster.runtime.links import (LinkedReader, LinkedWriter,
                                        LinkState, RunLinks)

MS = 1_000_000   # ns


class FakeClock:
    """A clock that moves only when a reader waits on it."""
    switches = True

    def __init__(self, ns=0):
        self.ns = ns
        self.waits = []

    def now_ns(self):
        return self.ns

    def wait(self, on, timeout=None, *, until=None, what=None):
        self.waits.append((timeout, what))
        if timeout == math.inf:
            return True   # held for good: as if the run were cancelled
        self.ns += int(round(timeout * 1e9))
        return False


class ListChannel:
    def __init__(self):
        self.records = []

    def put(self, record, cancelled=None, clock=None):
        self.records.append(tuple(record))
        return True

    def get(self, n, cancelled=None, clock=None):
        taken, self.records = self.records[:n], self.records[n:]
        return taken, False, None

    def close(self):
        pass

    def abort(self):
        pass


def state(latency=0.0, bandwidth=None, jitter=0.0, windows=(), start=0):
    return LinkState(InLink("w", "r", latency, bandwidth, jitter, "7:w->r",
                            windows), start)


def test_records_on_one_link_queue_behind_each_other():
    link = state(bandwidth=1e6)                 # 1 byte a us
    assert link.arrival(0, 1000) == (1000_000, None)
    # sent at once, it waits for the link to be free
    assert link.arrival(0, 1000) == (2000_000, None)
    # sent once the link is idle, it starts when sent
    assert link.arrival(10 * MS, 500) == (10 * MS + 500_000, None)


def test_latency_comes_after_the_transfer():
    link = state(latency=0.005, bandwidth=1e6)
    assert link.arrival(MS, 1000) == (MS + MS + 5 * MS, None)


def test_jitter_is_seeded_bounded_and_never_reorders():
    def dues():
        link = state(latency=0.001, jitter=0.004)
        return [link.arrival(i * 100_000, 8)[0] for i in range(200)]
    first = dues()
    assert first == dues()                                   # seeded
    assert first == sorted(first)                            # in order
    extra = [d - i * 100_000 - MS for i, d in enumerate(first)]
    assert min(extra) >= 0
    assert len(set(extra)) > 10        # the draws differ


def test_a_partition_holds_a_record_until_it_heals():
    text = "Partition(a|b)"
    link = state(latency=0.001, windows=((0.010, 0.050, text),), start=0)
    assert link.arrival(0, 8) == (MS, None)                  # before it
    assert link.arrival(20 * MS, 8) == (50 * MS, text)       # held
    assert link.arrival(21 * MS, 8)[0] == 50 * MS            # in order
    assert link.arrival(60 * MS, 8) == (61 * MS, None)       # healed


def test_a_partition_from_the_start_holds_records_sent_before_the_reader_began():
    # the writing node may begin its run (and send) before the reading
    # node notes the run's start: a partition from second 0 holds those too
    link = state(windows=((0.0, None, "P"),), start=100 * MS)
    due, holder = link.arrival(97 * MS, 8)
    assert (due, holder) == (math.inf, "P")


def test_the_reader_hands_a_record_over_only_once_it_arrived():
    clock = FakeClock()
    channel = ListChannel()
    writer = LinkedWriter(channel, clock.now_ns)
    reader = LinkedReader(channel, (state(latency=0.25),), clock.now_ns, "q")
    record = (np.arange(3.0), np.array([7]))
    writer.put(record, None, clock)
    records, finished, _ = reader.get(1, None, clock)
    assert clock.ns == 250 * MS
    assert [w for w, _ in clock.waits] == [pytest.approx(0.25)]
    assert "in flight on link w->r" in clock.waits[0][1]
    assert len(records) == 1 and not finished
    np.testing.assert_array_equal(records[0][0], record[0])
    np.testing.assert_array_equal(records[0][1], record[1])
    assert len(records[0]) == 2        # the sending time is taken off


def test_a_reader_held_by_a_partition_that_never_heals_names_it():
    clock = FakeClock()
    channel = ListChannel()
    writer = LinkedWriter(channel, clock.now_ns)
    reader = LinkedReader(channel, (state(windows=((0.0, None, "P(x)"),)),),
                          clock.now_ns, "q")
    writer.put((np.zeros(1),), None, clock)
    with pytest.raises(Cancelled, match="held by P\\(x\\)"):
        reader.get(1, None, clock)
    assert clock.waits[0][0] == math.inf


def test_run_links_wrap_only_the_queues_over_a_link():
    [(node, conditions)] = [
        (n, c) for n, c in resolve(_plans("w", "r"), [
            Link("w", "r", latency=0.1)], [], None,
            {"q": (("w",), ("r",))}).items() if n == "r"]
    links = RunLinks(conditions, 0, FakeClock().now_ns)
    plain = ListChannel()
    assert isinstance(links.wrap("q", plain), LinkedReader)
    assert links.wrap("other", plain) is plain


class _Plan:
    def __init__(self, node, **kwargs):
        self.node = node
        self.node_kwargs = kwargs


def _plans(*nodes, **slow):
    return [_Plan(n, **({"slowdown": slow[n]} if n in slow else {}))
            for n in nodes]


def test_resolve_later_conditions_win_and_same_node_queues_are_memory():
    found = resolve(_plans("reader", "trainer_1", "trainer_2"), [
        Link("*", "trainer_*", latency=0.1),
        Link("reader", "trainer_2", latency=0.3),
        Slowdown("trainer_*", 2), Slowdown("trainer_1", 4)],
        [], None, {"q1": (("reader",), ("trainer_1",)),
                   "q2": (("reader",), ("trainer_2",))})
    assert dict(found["reader"].outgoing) == {"q1": 0, "q2": 0}
    assert found["trainer_1"].slowdown == 4.0
    assert found["trainer_2"].slowdown == 2.0
    assert dict(found["trainer_1"].incoming)["q1"][0].latency == 0.1
    assert dict(found["trainer_2"].incoming)["q2"][0].latency == 0.3
    # no condition, no queue between nodes: nothing at all
    assert resolve(_plans("a", "b"), [], [], None, {}) is None


def test_resolve_takes_a_nodes_own_slowdown():
    found = resolve(_plans("a", "b", a=3.0), [], [], None, {})
    assert set(found) == {"a"} and found["a"].slowdown == 3.0


@pytest.mark.parametrize("epoch,windows", [
    (None, ()), (1, ()), (2, ((0.0, 0.5),)), (3, ())])
def test_an_epoch_partition_holds_only_its_epochs_runs(epoch, windows):
    p = Partition("w", "r", at=Epoch(2), heal_at=0.5)
    found = resolve(_plans("w", "r"), [], [(0, p)], epoch,
                    {"q": (("w",), ("r",))})
    got = () if found is None else tuple(
        (a, b) for a, b, _ in dict(found["r"].incoming)["q"][0].windows)
    assert got == windows


def test_a_partition_holds_both_directions_but_not_its_own_side():
    p = Partition(["a1", "a2"], "b", at=0.0, heal_at=1.0)
    found = resolve(_plans("a1", "a2", "b"), [], [(0, p)], None,
                    {"ab": (("a1",), ("b",)), "ba": (("b",), ("a2",)),
                     "aa": (("a1",), ("a2",))})
    assert set(dict(found["b"].incoming)) == {"ab"}
    assert set(dict(found["a2"].incoming)) == {"ba"}


def test_resolve_a_queue_several_nodes_write_each_over_its_own_link():
    """Fan-in over links: every writer stamps its records with its index,
    and the reader holds each record as the link from its writer says."""
    found = resolve(_plans("w0", "w1", "r"), [Link("w1", "r", latency=0.2)],
                    [], None, {"q": (("w0", "w1"), ("r",))})
    assert dict(found["w0"].outgoing) == {"q": 0}
    assert dict(found["w1"].outgoing) == {"q": 1}
    inlinks = dict(found["r"].incoming)["q"]
    assert [(i.src, i.latency) for i in inlinks] == [("w0", 0.0),
                                                     ("w1", 0.2)]


def test_records_from_two_writers_each_wait_for_their_own_link():
    clock = FakeClock()
    channel = ListChannel()
    fast = LinkedWriter(channel, clock.now_ns, 0)
    slow = LinkedWriter(channel, clock.now_ns, 1)
    reader = LinkedReader(channel, (state(latency=0.0),
                                    state(latency=0.5)), clock.now_ns, "q")
    fast.put((np.arange(2.0),), None, clock)
    records, _, _ = reader.get(1, None, clock)
    assert clock.ns == 0 and len(records[0]) == 1
    slow.put((np.arange(2.0),), None, clock)
    records, _, _ = reader.get(1, None, clock)
    assert clock.ns == 500 * MS and len(records[0]) == 1
