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
module's cluster, no test here takes the shared suite's ``session``
fixture, and the module is marked ``own_ray``, so conftest's shared Ray
(of the modules that run the ray kind) is down while it runs.  The
cluster keeps its files, and the address a plain ``ray.init()`` would
join, in a directory of its own (``RAY_TMPDIR``): another Ray on this
machine never sees it; and its processes die with this one however it
ends (the watcher a RaySession puts on a Ray it starts, `_raywatch`).
"""

import os
import shutil
import tempfile
import threading
import time

import numpy as np
import psutil
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from ray.cluster_utils import Cluster as RayCluster  # noqa: E402

from localcluster import (Cluster, Job, JobRunner,  # noqa: E402
                          LocalSession, MultiNodeCheckpointManager, Node,
                          NodeFailedError, PlanError, Queue, Task, TaskGroup,
                          WorkspaceType, epoch_limiter, ops)
from localcluster.sessions._raywatch import MARK, RayWatcher  # noqa: E402
from localcluster.sessions.ray import RaySession  # noqa: E402
from localcluster.testing.pytest_plugin import (Snapshot,  # noqa: E402
                                                leaks_since)

#: each test's bound (the first one starts the cluster too); the module
#: connects this process to a Ray of its own
pytestmark = [pytest.mark.timeout(120), pytest.mark.own_ray]

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
            # waited for below, with the module's patience (Ray's own
            # wait for one node is 30 s)
            self.cluster.add_node(wait=False, num_cpus=1,
                                  resources={"zone_b": 1},
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
def zones(ray_pool):
    # after conftest's ray_pool, which shuts the suite's shared Ray down
    # before an own_ray module (this fixture is asked for by the module's
    # autouse no_leaks: without the argument it could come first)
    if ray.is_initialized():
        pytest.fail("a Ray is initialised in this process already; this "
                    "module's driver connects to a cluster of its own",
                    pytrace=False)
    own = tempfile.mkdtemp(prefix="lcray")
    # every process of the cluster carries the watcher's mark: should this
    # process die first (a CI timeout, the OOM killer), they die with it
    watcher = RayWatcher().start()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", own)
        env.setenv(MARK, watcher.token)
        made = None
        try:
            made = Zones()
            watcher.tell(made.cluster.head_node.get_session_dir_path())
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
            watcher.stop()
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


def stall_once(index, epoch, where):
    """Instance 1, in epoch 2, writes the id of the Ray node it runs on to
    ``<where>/here`` and waits (a minute at most) to be removed with that
    Ray node -- unless ``<where>/go`` says to go on."""
    where = str(where)
    if int(index) != 1 or int(epoch) != 2 or \
            os.path.exists(os.path.join(where, "go")):
        return
    here = os.path.join(where, "here")
    with open(here + ".tmp", "w") as f:
        f.write(ray.get_runtime_context().get_node_id())
    os.replace(here + ".tmp", here)
    deadline = time.monotonic() + PATIENCE
    while not os.path.exists(os.path.join(where, "go")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not removed within {PATIENCE} s")
        time.sleep(0.02)


class Remover:
    """``with Remover(zones, where) as remover:`` -- a thread that, once
    `stall_once` says where instance 1 runs, removes that Ray node, then
    lets a run that passes there again go on; ``remover.removed()`` is the
    id of the Ray node it removed (its failure re-raised here).  Stopped
    and joined on leaving the block: never does it remove a Ray node
    after its test."""

    def __init__(self, zones, where):
        self.zones = zones
        self.where = str(where)
        self._stop = threading.Event()
        self._removed = self._error = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(PATIENCE)

    def _run(self):
        try:
            here = os.path.join(self.where, "here")
            deadline = time.monotonic() + PATIENCE
            while not os.path.exists(here):
                if self._stop.wait(0.02) or time.monotonic() > deadline:
                    raise TimeoutError("instance 1 never said where it runs")
            with open(here) as f:
                node_id = f.read()
            self.zones.remove(node_id)
            self._removed = node_id
            open(os.path.join(self.where, "go"), "w").close()
        except BaseException as exc:  # noqa: BLE001 - re-raised in removed
            self._error = exc

    def removed(self):
        self._thread.join(PATIENCE)
        assert not self._thread.is_alive(), "the remover is stuck"
        if self._error is not None:
            raise self._error
        return self._removed


def test_a_ray_node_removed_mid_run_fails_the_run_naming_the_instance(
        zones, tmp_path):
    with Cluster() as cluster, TaskGroup() as stalling:
        with Node("trainer", num_instances=2, resources={"zone_b": 1}), \
                Task():
            ops.Python(stall_once)([ops.NodeIndex(), ops.Const(np.int64(2)),
                                    ops.Const(np.array(str(tmp_path)))], [])
        with Node("ps", resources={"zone_a": 1}), Task():
            ops.Sleep([], [], seconds=PATIENCE)    # cancelled at the death
    group, out, _ = indexed(2, resources={"zone_b": 1})
    with cluster, RaySession() as session, \
            Remover(zones, tmp_path) as remover:
        start = time.monotonic()
        with pytest.raises(NodeFailedError) as caught:
            session.run(stalling, timeout=2 * PATIENCE)
        gone = remover.removed()
        assert time.monotonic() - start < PATIENCE
        assert caught.value.node == "trainer_1"
        assert "'trainer_1' died" in str(caught.value)
        assert sorted(session.node_pids()) == ["ps", "trainer_0"]
        survivor = session.node_pids()["trainer_0"]
        # the next run starts it again, on the zone_b Ray node left free
        session.run(group, timeout=PATIENCE)
        assert [int(v) for v in out.fetch()] == [2, 12]
        placed = session.ray_node_ids()
        assert placed["trainer_1"] != gone
        assert placed["trainer_1"] in zones.zone_b()
        assert session.node_pids()["trainer_0"] == survivor
        assert placed_as_processes_say(zones, session) == placed


def test_a_restart_pinned_to_a_ray_node_that_left_is_a_plan_error(
        zones, tmp_path):
    pinned_to = zones.zone_b()[0]
    with Cluster(), TaskGroup() as group:
        with Node("pinned", num_instances=2, placement=pinned_to), Task():
            ops.Python(stall_once)([ops.NodeIndex(), ops.Const(np.int64(2)),
                                    ops.Const(np.array(str(tmp_path)))], [])
    with RaySession() as session, Remover(zones, tmp_path) as remover:
        with pytest.raises(NodeFailedError) as caught:
            session.run(group, timeout=2 * PATIENCE)
        assert remover.removed() == pinned_to
        assert caught.value.node in ("pinned_0", "pinned_1")
        # its place is gone: said at once, not after the start timeout
        start = time.monotonic()
        with pytest.raises(PlanError, match="no live Ray node has that id"):
            session.run(group, timeout=PATIENCE)
        assert time.monotonic() - start < 20


def zoned_job(where, epochs=3):
    """Two trainer instances on zone_b Ray nodes each add 1 to their
    ``w`` (which starts at their index) per epoch and send it to ps, on
    the head, which sums what it gets; instance 1 stalls in epoch 2
    (`stall_once`)."""
    queue = Queue(4, name="to_ps")
    with Job() as job:
        with Node("trainer", num_instances=2, resources={"zone_b": 1}):
            with job.init_group, Task(name="w"):
                ops.Cast([ops.NodeIndex()], ["w"], to="float64")
                ops.Const(np.int64(0), name="epoch")
                ops.Const(np.array(str(where)), name="where")
            with Task(name="step"):
                ops.Add(["epoch", ops.Const(np.int64(1))], ["epoch"])
                ops.Python(stall_once)([ops.NodeIndex(), "epoch", "where"],
                                       [])
                ops.Add(["w", ops.Const(1.0)], ["w"])
                queue.writer().write_record(ops.net(), {"w": "w"})
        with Node("ps", resources={"zone_a": 1}):
            with job.init_group, Task(name="tot"):
                ops.ConstantFill([], ["tot"], value=0.0)
            with Task(name="gather"):
                with ops.loop(2):
                    _, record = queue.reader().read_record(ops.net())
                    ops.Add(["tot", record["w"]], ["tot"])
            epoch_limiter(job, epochs)
    return job


def results(session):
    return ([float(session.fetch_blob("w", f"trainer_{i}"))
             for i in range(2)], float(session.fetch_blob("tot", "ps")))


def test_a_job_restarts_the_instance_elsewhere_and_ends_as_uninterrupted(
        zones, tmp_path):
    calm = tmp_path / "calm"
    calm.mkdir()
    (calm / "go").touch()
    with LocalSession() as local:
        JobRunner(zoned_job(calm), MultiNodeCheckpointManager(
            str(tmp_path / "uninterrupted"))).train(local)
        expected = results(local)
    assert expected == ([3.0, 4.0], (1 + 2) + (2 + 3) + (3 + 4))
    stalls = tmp_path / "stalls"
    stalls.mkdir()
    runner = JobRunner(zoned_job(stalls), MultiNodeCheckpointManager(
        str(tmp_path / "ck")), max_restarts=1, timeout=2 * PATIENCE)
    with RaySession() as session, Remover(zones, stalls) as remover:
        assert runner.train(session) == 3
        gone = remover.removed()
        assert results(session) == expected
        [(epoch, message)] = runner.result.restarts
        assert epoch == 1 and "node 'trainer_1' died" in message
        placed = session.ray_node_ids()
        assert placed["trainer_1"] != gone
        assert placed["trainer_1"] in zones.zone_b()
        assert placed_as_processes_say(zones, session) == placed
