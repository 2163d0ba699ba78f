"""RaySession on a Ray cluster of several Ray nodes, all on this machine
(Ray's ``cluster_utils.Cluster``): where a prototype's instances run --
spread by their ``resources``, held by their ``placement`` -- what a run
says when a Ray node leaves under one of them, and how a job recovers.

The module's cluster, started once (`zones`)::

    head       zone_a: 100, label zone=a   the driver's Ray node
    3 workers  zone_b: 1,   label zone=b   one instance asking zone_b each

Every actor holds no CPU (unless its Node asks), so where one runs is
what its resources and placement say, or Ray's choice.  A test that
removes a Ray node has it replaced before the next test starts (`no_leaks`
below does it ahead of the leak check's snapshot: the new Ray node's
processes are the module's, not a leak of the next test).

Ray allows one ``ray.init`` per process: the driver here connects to this
module's cluster, and no test here takes the shared suite's ``session``
fixture, so conftest's ``ray_pool`` (the local Ray of a module that runs
the ray kind) stays down while this module runs.  The cluster keeps its
files, and the address a plain ``ray.init()`` would join, in a directory
of its own (``RAY_TMPDIR``): another Ray on this machine never sees it.
"""

import shutil
import tempfile
import time

import numpy as np
import psutil
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from ray.cluster_utils import Cluster as RayCluster  # noqa: E402

from localcluster import (Cluster, Node, PlanError, Queue,  # noqa: E402
                          Task, TaskGroup, WorkspaceType, ops)
from localcluster.sessions.ray import RaySession  # noqa: E402
from localcluster.testing.pytest_plugin import (Snapshot,  # noqa: E402
                                                leaks_since)

#: each test's bound: the first one starts the cluster too
pytestmark = pytest.mark.timeout(120)

#: worker Ray nodes with one zone_b each
ZONE_B = 3
#: seconds anything here may take to happen (a bound, never a pace)
PATIENCE = 60


class Zones:
    """The module's Ray cluster (see the module docstring)."""

    def __init__(self):
        self.cluster = RayCluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {"zone_a": 100},
            "labels": {"zone": "a"}, "include_dashboard": False})
        self.head = self.cluster.head_node.node_id

    @property
    def address(self):
        return self.cluster.address

    def zone_b(self):
        """The ids of the zone_b Ray nodes, sorted."""
        return sorted(n.node_id for n in self.cluster.worker_nodes)

    def restore(self):
        """Add zone_b Ray nodes until there are ZONE_B again, and wait
        until the cluster counts all of them."""
        while len(self.cluster.worker_nodes) < ZONE_B:
            self.cluster.add_node(num_cpus=1, resources={"zone_b": 1},
                                  labels={"zone": "b"})
        wait_for(lambda: ray.cluster_resources().get("zone_b") == ZONE_B,
                 f"{ZONE_B} zone_b in the cluster's resources")

    def remove(self, node_id):
        """Remove the worker Ray node ``node_id``: its raylet and every
        process of it end, as when a machine leaves the cluster."""
        [node] = [n for n in self.cluster.worker_nodes
                  if n.node_id == node_id]
        self.cluster.remove_node(node)

    def host_of(self, pid):
        """The id of the Ray node whose raylet started process ``pid``
        (a worker's parent), as the processes themselves say."""
        raylets = {n.all_processes["raylet"][0].process.pid: n.node_id
                   for n in self.cluster.list_all_nodes()}
        for parent in psutil.Process(pid).parents():
            if parent.pid in raylets:
                return raylets[parent.pid]
        raise AssertionError(f"process {pid} is no worker of a Ray node of "
                             "the cluster")

    def shutdown(self):
        self.cluster.shutdown()


def wait_for(condition, what, seconds=PATIENCE):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {seconds} s")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def zones():
    if ray.is_initialized():
        pytest.fail("a Ray is initialised in this process already; this "
                    "module's driver connects to a cluster of its own",
                    pytrace=False)
    own = tempfile.mkdtemp(prefix="lcray")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", own)
        made = None
        try:
            made = Zones()
            ray.init(address=made.address, include_dashboard=False,
                     configure_logging=False, log_to_driver=False)
            made.restore()
            # the driver opens its connections to the cluster lazily, on
            # its first actor: made here, they are the module's
            with RaySession() as warm:
                warm.feed_blob("x", np.ones(1), node="warm")
                warm.fetch_blob("x", "warm")
            yield made
        finally:
            ray.shutdown()
            if made is not None:
                made.shutdown()
            shutil.rmtree(own, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_leaks(zones):
    """conftest's leak check, once the cluster is whole again (a Ray node
    an earlier test removed is replaced before the snapshot)."""
    zones.restore()
    before = Snapshot()
    yield
    found = leaks_since(before)
    assert not found, "left behind:\n  " + "\n  ".join(found)


def indexed(count, **options):
    """A group whose prototype's instances each output ``10 * index +
    N``, a node ps on the head, that output, and the `Cluster` the group
    declared its nodes in."""
    with Cluster() as cluster, TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("trainer", num_instances=count, **options), Task() as task:
            out = task.add_output(ops.Add([
                ops.Mul([ops.NodeIndex(), ops.Const(np.int64(10))]),
                ops.NodeCount()]))
        with Node("ps", resources={"zone_a": 1}), Task():
            ops.Const(np.ones(1), name="x")
    return group, out, cluster


def placed_as_processes_say(zones, session):
    """``{node: Ray node id}`` from each actor's process: the raylet that
    started it."""
    return {node: zones.host_of(pid)
            for node, pid in session.node_pids().items()}


def test_instances_spread_over_the_ray_nodes_their_resources_fit(zones):
    group, out, _ = indexed(ZONE_B, resources={"zone_b": 1})
    with RaySession() as session:
        session.run(group)
        assert [int(v) for v in out.fetch()] == [3, 13, 23]
        placed = session.ray_node_ids()
        # zone_b: 1 each, and one zone_b on each worker: one instance each
        assert sorted(placed[f"trainer_{i}"] for i in range(ZONE_B)) == \
            zones.zone_b()
        assert placed["ps"] == zones.head
        assert placed_as_processes_say(zones, session) == placed


def test_instances_go_where_their_placement_says(zones):
    pinned_to = zones.zone_b()[1]
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("labelled", num_instances=3, placement={"zone": "b"}), \
                Task() as task:
            labelled = task.add_output(ops.NodeIndex())
        with Node("pinned", num_instances=2, placement=pinned_to), \
                Task() as task:
            pinned = task.add_output(ops.NodeIndex())
        with Node("ps", placement={"zone": "a"}), Task():
            ops.Const(np.ones(1), name="x")
    with RaySession() as session:
        session.run(group)
        assert [int(v) for v in labelled.fetch()] == [0, 1, 2]
        assert [int(v) for v in pinned.fetch()] == [0, 1]
        placed = session.ray_node_ids()
        assert {placed[f"labelled_{i}"] for i in range(3)} <= \
            set(zones.zone_b())
        assert placed["pinned_0"] == placed["pinned_1"] == pinned_to
        assert placed["ps"] == zones.head
        assert placed_as_processes_say(zones, session) == placed


def test_instances_that_together_ask_more_than_the_cluster_has_are_refused(
        zones):
    # each fits alone; the last would wait for a zone_b that never frees
    group, _, _ = indexed(ZONE_B + 1, resources={"zone_b": 1})
    with RaySession() as session:
        start = time.monotonic()
        with pytest.raises(PlanError) as caught:
            session.run(group)
        assert time.monotonic() - start < 20
        message = str(caught.value)
        assert f"{{'zone_b': {ZONE_B + 1}}}" in message
        assert f"{{'zone_b': {float(ZONE_B)}}} in all" in message
        assert "trainer_0, trainer_1" in message
        assert session.node_pids() == {}        # no actor was started


def test_the_queues_between_nodes_live_beside_the_driver(zones):
    """Each queue's channel actor runs on the driver's Ray node: a Ray
    node that leaves takes its own nodes with it, never the queues the
    others share."""
    queues = [Queue(2, name=f"q{i}") for i in range(4)]
    with Cluster(), TaskGroup() as group:
        with Node("trainer", num_instances=ZONE_B, resources={"zone_b": 1}), \
                Task():
            for queue in queues:
                queue.writer().write_record(ops.net(),
                                            {"i": ops.NodeIndex()})
        with Node("ps", resources={"zone_a": 1}), Task():
            for queue in queues:
                with ops.loop(ZONE_B):
                    queue.reader().read_record(ops.net())
    with RaySession() as session:
        session.run(group, timeout=PATIENCE)
        channels = [p.pid for p in psutil.Process().children(recursive=True)
                    if "ChannelActor" in " ".join(p.cmdline())]
        assert len(channels) == len(queues)
        assert {zones.host_of(pid) for pid in channels} == {zones.head}


def test_a_fed_instance_starts_where_its_prototype_says(zones):
    group, out, cluster = indexed(2, resources={"zone_b": 1})
    with cluster, RaySession() as session:
        session.feed_blob("seed", np.arange(3), node="trainer_1")
        pid = session.node_pids()["trainer_1"]
        assert zones.host_of(pid) in zones.zone_b()
        # it holds what its prototype asks for (an actor started without
        # it could land on a zone_b Ray node all the same)
        wait_for(lambda: ray.available_resources().get("zone_b") ==
                 ZONE_B - 1, "zone_b held by the fed instance")
        session.run(group)
        # the run found it where it belongs: the same actor, its blob kept
        assert session.node_pids()["trainer_1"] == pid
        assert session.fetch_blob("seed", "trainer_1").tolist() == [0, 1, 2]
        assert [int(v) for v in out.fetch()] == [2, 12]
