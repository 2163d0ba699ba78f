"""The master's handle on a node process: a clean exit is announced, so
any other exit -- also while shutting down -- is a crash."""

import logging
import multiprocessing
import os
import time

import pytest

from localcluster.sessions import _protocol as P
from localcluster.sessions._handle import NodeHandle, read_goodbyes


def answer_shutdown(conn, say_bye):
    kind, rid = P.recv(conn)
    assert kind == P.SHUTDOWN
    if say_bye:
        P.send(conn, (P.BYE, rid))
        os._exit(0)
    os._exit(3)  # gone without a word: a crash


@pytest.mark.parametrize("say_bye", [True, False])
def test_an_exit_without_goodbye_during_shutdown_is_a_crash(caplog,
                                                            say_bye):
    ctx = multiprocessing.get_context("fork")
    master, node_end = ctx.Pipe(duplex=True)
    process = ctx.Process(target=answer_shutdown, args=(node_end, say_bye))
    process.start()
    node_end.close()
    handle = NodeHandle("n", "unused_", {})
    handle.process, handle.conn, handle.pid = process, master, process.pid
    try:
        P.send(master, (P.SHUTDOWN, 9))
        with caplog.at_level(logging.WARNING,
                             logger="localcluster.sessions._handle"):
            read_goodbyes([handle], time.monotonic() + 10)
        process.join(10)
        crashes = [r.getMessage() for r in caplog.records
                   if "crashed while shutting down" in r.getMessage()]
        if say_bye:
            assert crashes == []
        else:
            assert crashes == ["node 'n' crashed while shutting down "
                               "(exit 3) before it said goodbye"]
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)
        master.close()


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
