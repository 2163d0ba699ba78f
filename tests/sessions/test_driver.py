"""The run driver's rules, table-driven, with scripted events and a fake
clock: no thread, no process."""

import pytest

from localcluster.errors import (Cancelled, NodeFailedError, RunTimeoutError,
                                 TaskFailedError)
from localcluster.sessions import driver
from localcluster.sessions.driver import DIED, DONE, FAILED

GRACE = 1.0


class ScriptedIO(driver.RunIO):
    """``script``: one entry per wait -- (seconds it takes, events); a
    wait past the script's end takes its whole timeout and sees nothing.
    ``answers``: what each node does when cancelled (an event to emit on
    the next wait), absent for a node that ignores cancels."""

    def __init__(self, script, answers=None):
        self.script = list(script)
        self.answers = dict(answers or {})
        self.clock = 0.0
        self.queued = []
        self.cancelled, self.killed, self.waits = [], [], []

    def now(self):
        return self.clock

    def wait(self, timeout):
        self.waits.append(timeout)
        if self.queued:
            events, self.queued = self.queued, []
            return events
        if self.script:
            took, events = self.script.pop(0)
            self.clock += took if timeout is None else min(took, timeout)
            return events
        assert timeout is not None, "an unbounded wait with nothing coming"
        self.clock += timeout
        return []

    def cancel(self, nodes, rid):
        self.cancelled.append((tuple(nodes), rid))
        for node in nodes:
            if node in self.answers:
                self.queued.append(self.answers.pop(node))

    def kill(self, nodes):
        self.killed.extend(nodes)

    def timeout_error(self, timeout, late, killed):
        return RunTimeoutError(f"timeout {timeout} late={late} "
                               f"killed={killed}")


def op_error(node):
    return TaskFailedError(f"op failed on {node}", node=node)


def death(node):
    return NodeFailedError(f"node {node!r} died", node=node)


def run(nodes, io, timeout=None, unreported=None):
    state = driver.start(nodes, rid=5, now=io.now(), timeout=timeout)
    return driver.drive(state, io, GRACE, timeout, unreported)


CASES = [
    # (case, script, answers to a cancel, timeout, expected error or outputs,
    #  cancelled, killed)
    ("all done",
     [(0.1, [(DONE, "a", 1)]), (0.1, [(DONE, "b", 2), (DONE, "c", 3)])],
     {}, None, {"a": 1, "b": 2, "c": 3}, [], []),
    ("one op error while others run",
     [(0.1, [(FAILED, "a", op_error("a"))])],
     {"b": (FAILED, "b", Cancelled("b")), "c": (DONE, "c", 3)}, None,
     (TaskFailedError, "op failed on a"), [(("b", "c"), 5)], []),
    ("a death while others run",
     [(0.1, [(DIED, "b", death("b"))])],
     {"a": (FAILED, "a", Cancelled("a")), "c": (FAILED, "c", Cancelled("c"))},
     None, (NodeFailedError, "'b' died"), [(("a", "c"), 5)], []),
    ("a timeout; the late nodes stop when cancelled",
     [(0.1, [(DONE, "a", 1)])],
     {"b": (FAILED, "b", Cancelled("b")), "c": (FAILED, "c", Cancelled("c"))},
     2.0, (RunTimeoutError, "late=['b', 'c'] killed=[]"),
     [(("b", "c"), 5)], []),
    ("a timeout; a hung node is killed after the grace period",
     [], {"b": (FAILED, "b", Cancelled("b"))}, 2.0,
     (RunTimeoutError, "late=['a', 'b', 'c'] killed=['a', 'c']"),
     [(("a", "b", "c"), 5)], ["a", "c"]),
    ("a cancel that is not honoured in time: killed, the first error wins",
     [(0.1, [(FAILED, "c", op_error("c"))])],
     {"a": (FAILED, "a", Cancelled("a"))}, None,
     (TaskFailedError, "op failed on c"), [(("a", "b"), 5)], ["b"]),
    ("a cancellation never hides the real error that came after it",
     [(0.1, [(FAILED, "a", Cancelled("a"))]),
      (0.1, [(FAILED, "b", op_error("b"))])],
     {"c": (FAILED, "c", Cancelled("c"))}, None,
     (TaskFailedError, "op failed on b"), [(("b", "c"), 5)], []),
]


@pytest.mark.parametrize(
    "case,script,answers,timeout,expected,cancelled,killed", CASES,
    ids=[c[0] for c in CASES])
def test_run_driver_rules(case, script, answers, timeout, expected,
                          cancelled, killed):
    io = ScriptedIO(script, answers)
    if isinstance(expected, dict):
        assert run(["a", "b", "c"], io, timeout) == expected
    else:
        error, pattern = expected
        with pytest.raises(error, match=pattern.replace("[", r"\[")
                           .replace("]", r"\]")):
            run(["a", "b", "c"], io, timeout)
    assert io.cancelled == cancelled
    assert io.killed == killed
    # every wait was bounded once something was due
    if timeout is not None or cancelled:
        assert None not in io.waits[1:]


def test_a_death_after_its_reply_is_reported_by_the_next_run_once():
    unreported = {}
    io = ScriptedIO([(0.1, [(DONE, "a", 1), (DIED, "a", death("a"))]),
                     (0.1, [(DONE, "b", 2)])])
    assert run(["a", "b"], io, unreported=unreported) == {"a": 1, "b": 2}
    assert io.cancelled == []
    error = driver.take_unreported(unreported, ["b", "a"])
    assert isinstance(error, NodeFailedError) and error.node == "a"
    assert driver.take_unreported(unreported, ["a"]) is None


def test_an_idle_death_is_reported_on_the_next_run_that_uses_the_node():
    unreported = {}
    # the death of "z", a node outside the run, arrives while it runs
    io = ScriptedIO([(0.1, [(DIED, "z", death("z")), (DONE, "a", 1)])])
    assert run(["a"], io, unreported=unreported) == {"a": 1}
    assert driver.take_unreported(unreported, ["a"]) is None
    assert driver.take_unreported(unreported, ["a", "z"]).node == "z"


def test_an_interrupted_wait_cancels_then_kills_the_pending_nodes():
    class Interrupting(ScriptedIO):
        def wait(self, timeout):
            if not self.cancelled:
                raise KeyboardInterrupt
            return super().wait(timeout)

    io = Interrupting([], {"a": (FAILED, "a", Cancelled("a"))})
    with pytest.raises(KeyboardInterrupt):
        run(["a", "b"], io)
    assert io.cancelled == [(("a", "b"), 5)]
    assert io.killed == ["b"]


class _CountedName(str):
    """A node name that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other):
        _CountedName.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_run_of_many_nodes_costs_the_driver_linear_work():
    names = [_CountedName(f"n{i}") for i in range(300)]
    # the events name their nodes with equal, not identical, strings
    events = [(DONE, _CountedName(str(n)), n) for n in reversed(names)]
    state = driver.start(names, 1, 0.0, None)
    _CountedName.compared = 0
    result = driver.drive(state, ScriptedIO([(0.0, events)]), GRACE)
    assert list(result) == [str(n) for n in reversed(names)]
    assert _CountedName.compared < 10 * len(names), _CountedName.compared
