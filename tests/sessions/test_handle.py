"""The master's handle on a node process: a clean exit is announced, so
any other exit -- also while shutting down -- is a crash."""

import logging
import time

import pytest

from localcluster.sessions import _protocol as P
from localcluster.sessions._handle import DEATH, NodeHandle, read_goodbyes


@pytest.mark.parametrize("say_bye", [True, False])
def test_an_exit_without_goodbye_during_shutdown_is_a_crash(caplog,
                                                            say_bye):
    """What the node's zygote relayed: its goodbye then its exit, or its
    exit alone."""
    handle = NodeHandle("n", "unused_", {})
    if say_bye:
        handle.inbox.extend([(P.BYE, 9), DEATH])
        handle._exitcode = 0
    else:
        handle.inbox.append(DEATH)
        handle._exitcode = 3
    handle.gone = True
    with caplog.at_level(logging.WARNING,
                         logger="localcluster.sessions._handle"):
        read_goodbyes([handle], time.monotonic() + 10)
    crashes = [r.getMessage() for r in caplog.records
               if "crashed while shutting down" in r.getMessage()]
    if say_bye:
        assert crashes == []
    else:
        assert crashes == ["node 'n' crashed while shutting down "
                           "(exit 3) before it said goodbye"]


def test_a_scheduler_that_closes_cleanly_hears_every_goodbye(caplog,
                                                             localhost):
    from localcluster import Node, Task, TaskGroup, ops
    session = localhost()
    with TaskGroup() as tg:
        for node in ("a", "b"):
            with Node(node), Task():
                ops.Const(1.0)
    session.run(tg)
    with caplog.at_level(logging.WARNING, logger="localcluster"):
        session.close()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
