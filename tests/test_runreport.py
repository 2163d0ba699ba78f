"""What the command line reports of each node process, from any session
that says where its nodes run (``node_pids``, read by the base session's
``node_stats``)."""

import multiprocessing
import os

from localcluster.cli.train.progress import IN_PROCESS, Usage
from localcluster.sessions.base import Session


class Pids:
    """A session as `Usage` sees it: ``node_pids()``, and the base
    session's ``node_stats()`` over them."""

    node_stats = Session.node_stats

    def __init__(self, pids):
        self.pids = pids

    def node_pids(self):
        return dict(self.pids)


def test_nodes_in_this_process_are_one_process_reported_once():
    usage = Usage(Pids({"a": os.getpid(), "b": os.getpid()}), ["a", "b"])
    sample = usage.sample()
    assert list(sample) == [IN_PROCESS]
    assert sample[IN_PROCESS]["rss_bytes"] > 0


def test_node_processes_are_reported_each_by_node():
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    child = ctx.Process(target=stop.wait, args=(30,))
    child.start()
    try:
        usage = Usage(Pids({"a": child.pid}), ["a"])
        sample = usage.sample()
        assert list(sample) == ["a"]
        assert sample["a"]["rss_bytes"] > 0
        assert usage.peak_rss["a"] > 0
    finally:
        stop.set()
        child.join(10)
