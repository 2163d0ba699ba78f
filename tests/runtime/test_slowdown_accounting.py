"""What a slow node owes, as the runtime accounts it -- exact, on a fake
clock, where a wall-clock ratio on a shared machine is not (the real-time
tests only check that a slowdown is applied, and applied once)."""

import threading
import types

import pytest

from localcluster.runtime import clock as clock_module
from localcluster.runtime import links


class FakeTime:
    """``perf_counter`` of a fake clock that only ops and waits move."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class FakeClock:
    def __init__(self, fake):
        self.fake = fake
        self.waits = []

    def wait(self, cancelled, seconds, what=""):
        self.waits.append(seconds)
        self.fake.now += seconds
        return False


@pytest.fixture
def fake(monkeypatch):
    fake = FakeTime()
    monkeypatch.setattr(links, "time", types.SimpleNamespace(
        perf_counter=fake.perf_counter))
    links._DEBT.seconds = 0.0
    yield fake
    links._DEBT.seconds = 0.0


def _rc(fake, slowdown):
    return types.SimpleNamespace(slowdown=slowdown, clock=FakeClock(fake),
                                 cancelled=threading.Event(), node="n")


def _net_of(fake, work, waited=0.0):
    """A fake op loop: ``work`` seconds of ops, and ``waited`` seconds of
    waiting for a record inside it (on the thread's wait meter)."""
    def run_net(*args):
        fake.now += work + waited
        clock_module._METER.seconds += waited
    return run_net


@pytest.mark.parametrize("slowdown", [2, 3, 4.5])
def test_a_slow_node_waits_slowdown_minus_1_times_its_ops_time(fake,
                                                               slowdown):
    rc = _rc(fake, slowdown)
    run_net = _net_of(fake, 0.001)
    for _ in range(200):
        links.run_net_slowed(run_net, None, None, None, None, None, rc,
                             None, None)
    owed = 200 * 0.001 * (slowdown - 1)
    paid = sum(rc.clock.waits)
    # paid in installments of PAY_AT or more; what is left is less
    assert owed - links.PAY_AT < paid <= owed + 1e-9
    assert all(w >= links.PAY_AT for w in rc.clock.waits)
    assert paid + links._DEBT.seconds == pytest.approx(owed)


def test_waits_for_records_are_not_slowed(fake):
    """A slow machine computes slowly; it does not wait longer for what
    another node sends: a net's waits are not part of what it owes."""
    rc = _rc(fake, 3)
    run_net = _net_of(fake, 0.001, waited=0.05)
    for _ in range(50):
        links.run_net_slowed(run_net, None, None, None, None, None, rc,
                             None, None)
    assert sum(rc.clock.waits) + links._DEBT.seconds == \
        pytest.approx(50 * 0.001 * 2)


def test_no_slowdown_owes_nothing(fake):
    rc = _rc(fake, 1.0)
    run_net = _net_of(fake, 0.01)
    for _ in range(20):
        links.run_net_slowed(run_net, None, None, None, None, None, rc,
                             None, None)
    assert rc.clock.waits == [] and links._DEBT.seconds == 0.0
