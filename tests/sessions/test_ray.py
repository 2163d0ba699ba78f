"""RaySession on one local Ray instance (per test module): the same runs,
errors, deaths and restarts as the other sessions, with each node a Ray
actor hosting the shared NodeRuntime."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import psutil
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

#: the module starts a Ray in this process (`ray_instance`)
pytestmark = pytest.mark.own_ray

from localcluster import (CheckpointError, CheckpointWarning,  # noqa: E402
                          Cluster, Job, JobRunner,
                          MultiNodeCheckpointManager, Node,
                          NodeFailedError, PlanError, Queue, RunTimeoutError,
                          Task, TaskFailedError, TaskGroup, WorkspaceType,
                          epoch_limiter, final_output, ops)
from localcluster.errors import BlobNotFoundError  # noqa: E402
from localcluster.sessions.ray import ActorPool, RaySession  # noqa: E402

from conftest import kill_and_wait, running  # noqa: E402


@pytest.fixture(scope="module")
def ray_instance():
    """One local Ray for the module; sessions connect to it and leave it
    running."""
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
             log_to_driver=False)
    # Ray's driver opens its connections to the cluster lazily, on the
    # first actor: made here, they are the module's, not a test's leak
    with RaySession() as warm:
        warm.feed_blob("x", np.ones(1), node="warm")
        warm.fetch_blob("x", "warm")
    yield
    ray.shutdown()


@pytest.fixture
def session(ray_instance):
    s = RaySession()
    yield s
    s.close()


def two_nodes():
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("a"), Task():
            x = final_output(ops.Const(np.arange(3.0), name="x"))
        with Node("b"), Task():
            ops.Scale([ops.Const(np.ones(2))], ["y"], scale=3.0)
    return group, x


def test_a_group_runs_on_actors_and_its_outputs_come_back(session):
    group, x = two_nodes()
    session.run(group)
    assert x.fetch().tolist() == [0.0, 1.0, 2.0]
    assert session.fetch_blob("y", "b").tolist() == [3.0, 3.0]
    pids = session.node_pids()
    assert sorted(pids) == ["a", "b"] and os.getpid() not in pids.values()
    session.run(group)                       # the plan is kept by the actor
    assert session.node_pids() == pids


def test_close_returns_once_the_killed_actors_processes_are_gone(
        ray_instance):
    """Ray kills an actor asynchronously; close() waits for the
    processes, so a caller (a leak check, a test's teardown) finds none
    running -- under load one ran seconds after close() returned."""
    session = RaySession()
    group, _ = two_nodes()
    session.run(group)
    procs = [psutil.Process(pid) for pid in session.node_pids().values()]
    session.close()
    assert [p.pid for p in procs if running(p)] == []


def test_blobs_feed_fetch_and_what_is_missing(session):
    assert not session.has_blob("z", "c")    # starts nothing
    assert "c" not in session.node_pids()
    session.feed_blob("z", np.arange(4), node="c")
    assert session.fetch_blob("z", "c").tolist() == [0, 1, 2, 3]
    view = session.fetch_blob("z", "c", copy=False)
    assert not view.flags.writeable
    assert session.blobs("c") == ["z"] and session.has_blob("z", "c")
    with pytest.raises(BlobNotFoundError, match="'nope'.*'c'"):
        session.fetch_blob("nope", "c")


def test_a_fed_blob_is_writable_by_the_nodes_ops(session):
    # Ray passes numpy arguments as read-only views of its object store
    session.feed_blob("count", np.array(0, dtype=np.int64), node="m")
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("m"), Task():
            ops.CountUp(["count"])
    session.run(group)
    session.run(group)
    assert int(session.fetch_blob("count", "m")) == 2


def boom(value):
    raise ValueError("boom")


def test_an_op_error_names_node_and_op_and_cancels_the_others(session):
    # boom is this test module's function: plans carry it by value
    with TaskGroup() as group:
        with Node("a"), Task():
            ops.Python(boom)([ops.Const(np.ones(1))], [])
        with Node("b"), Task():
            ops.Sleep([], [], seconds=60)
    start = time.monotonic()
    with pytest.raises(TaskFailedError, match="boom") as caught:
        session.run(group)
    assert time.monotonic() - start < 10
    assert caught.value.node == "a" and caught.value.op_type == "Python"
    group2, x = two_nodes()
    session.run(group2)                       # usable after it
    assert x.fetch().tolist() == [0.0, 1.0, 2.0]


def test_a_run_past_its_timeout_is_cancelled(session):
    with TaskGroup() as group:
        with Node("b"), Task():
            ops.Sleep([], [], seconds=60)
    start = time.monotonic()
    with pytest.raises(RunTimeoutError) as caught:
        session.run(group, timeout=0.5)
    assert time.monotonic() - start < 10
    assert caught.value.nodes == ("b",)


def test_a_prototypes_plan_is_packed_and_handed_to_ray_once(session,
                                                            monkeypatch):
    """Its N instances share one plan: packed once, put in Ray's object
    store once, and every instance actor gets the same reference -- not
    N copies of the bytes, one inlined in each actor call."""
    from localcluster.sessions import _prepare
    packed, shipped = [], []
    pack = _prepare.pack_plan

    def counting_pack(plan, dumps=None):
        packed.append(pack(plan, dumps))
        return packed[-1]

    def ours(value):
        return any(value is payload for payload in packed)

    put = ray.put

    def counting_put(value, *args, **kwargs):
        if ours(value):
            shipped.append("put")
        return put(value, *args, **kwargs)

    call = ray.actor.ActorMethod.remote

    def counting_call(method, *args, **kwargs):
        for arg in args:
            parts = arg if isinstance(arg, tuple) else (arg,)
            shipped.extend("inlined" for part in parts if ours(part))
        return call(method, *args, **kwargs)

    monkeypatch.setattr(_prepare, "pack_plan", counting_pack)
    monkeypatch.setattr(ray, "put", counting_put)
    monkeypatch.setattr(ray.actor.ActorMethod, "remote", counting_call)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("trainer", num_instances=4), Task() as task:
            ops.Add([ops.Mul([ops.NodeIndex(), ops.Const(np.int64(10))]),
                     ops.NodeCount()], ["mine"])
            out = task.add_output("mine")
    session.run(group)
    session.run(group)             # the actors keep it: nothing is sent
    assert len(packed) == 1
    assert shipped == ["put"]
    assert [int(v) for v in out.fetch()] == [4, 14, 24, 34]


def test_a_warm_run_is_one_call_of_raw_bytes_each_way_per_node(session,
                                                              monkeypatch):
    """A run of nodes that keep its plan and use no queue between nodes
    sends each actor one argument, its request pickled -- bytes, which
    Ray moves without its own serialization -- and a reply with small
    outputs comes back pickled too; a big output stays Ray's arrays."""
    calls = []
    call = ray.actor.ActorMethod.remote

    def recording_call(method, *args, **kwargs):
        ref = call(method, *args, **kwargs)
        if getattr(method, "_method_name", None) == "run":
            calls.append((args, ref))
        return ref

    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("a"), Task() as small:
            ops.ConstantFill([], ["s"], shape=[4], value=2.0)
            small.add_output("s")
        with Node("b"), Task() as big:
            ops.ConstantFill([], ["l"], shape=[1 << 14], value=3.0)
            out = big.add_output("l")
    session.run(group, timeout=60)   # sends the plans
    monkeypatch.setattr(ray.actor.ActorMethod, "remote", recording_call)
    session.run(group, timeout=60)
    assert len(calls) == 2
    assert all(len(args) == 1 and isinstance(args[0], bytes)
               for args, _ in calls)
    replies = sorted((type(ray.get(ref)) for _, ref in calls), key=str)
    assert replies == [bytes, tuple]
    assert float(out.fetch()[-1]) == 3.0


def test_a_killed_actor_is_a_node_failure_and_restarts_empty(session):
    group, _ = two_nodes()
    session.run(group)
    session.feed_blob("kept", np.ones(1), node="b")
    os.kill(session.node_pids()["b"], signal.SIGKILL)
    with pytest.raises(NodeFailedError, match="'b'") as caught:
        session.run(group)
    assert caught.value.node == "b"
    session.run(group)                        # a new, empty actor
    assert not session.has_blob("kept", "b")
    assert session.fetch_blob("y", "b").tolist() == [3.0, 3.0]


def die_once_in_epoch(epoch, marker):
    if int(epoch) == 3 and not os.path.exists(str(marker)):
        open(str(marker), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


def build_job(marker):
    with Job() as job:
        for i, node in enumerate(["t0", "t1"]):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(3, float(i + 1)), name="w")
                    ops.Const(np.array(0), name="epoch_no")
                    ops.Const(np.array(str(marker)), name="marker")
                with Task():
                    ops.Add(["epoch_no", ops.Const(np.array(1))],
                            ["epoch_no"])
                    ops.Scale(["w"], ["w"], scale=1.5)
                    if node == "t1":
                        ops.Python(die_once_in_epoch)(["epoch_no", "marker"],
                                                      [])
        with Node("t0"):
            epoch_limiter(job, 5)
    return job


def test_max_restarts_recovers_a_node_killed_in_epoch_3(session, tmp_path):
    never = tmp_path / "never"
    never.touch()
    with RaySession() as clean:
        JobRunner(build_job(never), MultiNodeCheckpointManager(
            str(tmp_path / "u"))).train(clean)
        expected = [clean.fetch_blob("w", n).tolist() for n in ("t0", "t1")]
    runner = JobRunner(build_job(tmp_path / "died"),
                       MultiNodeCheckpointManager(str(tmp_path / "r")),
                       max_restarts=1)
    assert runner.train(session) == 5
    assert [session.fetch_blob("w", n).tolist() for n in ("t0", "t1")] \
        == expected
    assert [epoch for epoch, _ in runner.result.restarts] == [2]


def test_a_kill_fault_ends_the_actor_and_restarts_recover(ray_instance,
                                                           tmp_path):
    from localcluster.testing import Epoch, FaultPlan, Kill
    never = tmp_path / "never"
    never.touch()
    with RaySession() as clean:
        JobRunner(build_job(never), MultiNodeCheckpointManager(
            str(tmp_path / "u"))).train(clean)
        expected = [clean.fetch_blob("w", n).tolist() for n in ("t0", "t1")]
    plan = FaultPlan(Kill("t0", at=Epoch(2)))
    with RaySession(faults=plan) as session:
        runner = JobRunner(build_job(never), MultiNodeCheckpointManager(
            str(tmp_path / "f")), max_restarts=1)
        runner.train(session)
        assert [session.fetch_blob("w", n).tolist()
                for n in ("t0", "t1")] == expected
        [(epoch, message)] = runner.result.restarts
        assert epoch == 1 and "Kill(node='t0'" in message
        assert [f.node for f in plan.fired()] == ["t0"]


def test_records_cross_nodes_through_a_queue_in_order(session):
    queue = Queue(2, name="across")
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("a"), Task():
            with ops.loop(5) as loop:
                writer = queue.writer()
                value = ops.Cast([loop.iter()], to="float64")
                writer.write_record(ops.net(), {"v": value})
            writer.commit(ops.net())
        with Node("b"), Task():
            ops.Const(np.array(0.0), name="total")
            ops.Const(np.array(0), name="seen")
            with ops.loop():
                stop, record = queue.reader().read_record(ops.net())
                ops.stop_if(stop)
                ops.Add(["total", record["v"]], ["total"])
                ops.CountUp(["seen"])
    for _ in range(2):     # the channel starts empty and open every run
        session.run(group, timeout=60)
        assert float(session.fetch_blob("total", "b")) == 10.0
        assert int(session.fetch_blob("seen", "b")) == 5


def test_a_reader_whose_writer_dies_fails_and_does_not_hang(session):
    queue = Queue(1, name="orphan")
    with TaskGroup() as group:
        with Node("a"), Task():
            ops.Python(die_now)([ops.Const(np.ones(1))], [])
            queue.writer().write_record(ops.net(), {"v": ops.Const(
                np.ones(1))})
        with Node("b"), Task():
            queue.reader().read_record(ops.net())
    start = time.monotonic()
    with pytest.raises(NodeFailedError, match="'a'"):
        session.run(group)
    assert time.monotonic() - start < 20


def die_now(value):
    os.kill(os.getpid(), signal.SIGKILL)


def test_close_leaves_no_actor_process(ray_instance):
    session = RaySession()
    group, _ = two_nodes()
    session.run(group)
    pids = list(session.node_pids().values())
    session.close()
    assert not wait_gone(pids)
    assert ray.is_initialized()   # a Ray it did not start stays up


def alive(pids):
    return [p for p in pids if psutil.pid_exists(p) and
            psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def wait_gone(pids, seconds=20):
    deadline = time.monotonic() + seconds
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def test_a_pool_gives_a_closed_sessions_actors_to_the_next_reset(
        ray_instance):
    with ActorPool() as pool:
        with RaySession(pool=pool) as first:
            first.feed_blob("kept", np.ones(2), node="a")
            pid = first.node_pids()["a"]
        assert len(pool) == 1 and pool.pids() == {pid}
        with RaySession(pool=pool) as second:
            with TaskGroup() as group:
                with Node("b"), Task():
                    ops.Python(boom)([ops.Const(np.ones(1))], [])
            with pytest.raises(TaskFailedError, match="node 'b'") as caught:
                second.run(group)
            # the same process, now node b, with nothing of node a's
            assert second.node_pids() == {"b": pid}
            assert caught.value.node == "b"
            assert second.blobs("b") == []
        assert len(pool) == 1
    assert not wait_gone([pid])          # closing the pool kills it


def test_a_pooled_actor_that_died_idle_is_replaced(ray_instance):
    with ActorPool() as pool:
        with RaySession(pool=pool) as first:
            first.feed_blob("x", np.ones(1), node="a")
            pid = first.node_pids()["a"]
        os.kill(pid, signal.SIGKILL)
        assert not wait_gone([pid])
        with RaySession(pool=pool) as second:
            second.feed_blob("x", np.arange(2), node="a")
            assert second.fetch_blob("x", "a").tolist() == [0, 1]
            assert second.node_pids()["a"] != pid


def agreeing_job():
    with Job() as job:
        with Node("a"):
            with job.init_group, Task():
                ops.Const(np.arange(3.0), name="w")
            with Task():
                ops.Scale(["w"], ["w"], scale=2.0)
            epoch_limiter(job, 2)
    return job


def test_the_job_checks_take_the_ray_kind(ray_instance):
    from localcluster.testing import restart_recovers, sessions_agree
    sessions_agree(agreeing_job, sessions=("local", "ray"))
    restart_recovers(agreeing_job, sessions=("ray",), max_examples=1)


def test_a_session_that_started_ray_leaves_nothing_at_close(tmp_path):
    # in a process of its own: this module's Ray is up in this one
    code = """if True:
        import os, sys, time, numpy as np, psutil, ray
        from localcluster.sessions.ray import RaySession
        from localcluster import Node, Task, TaskGroup, ops
        session = RaySession(num_cpus=1)
        with TaskGroup() as group:
            for name in ("a", "b"):
                with Node(name), Task():
                    ops.Const(np.ones(4), name="x")
        session.run(group)
        started = [p.pid for p in psutil.Process().children(recursive=True)]
        assert set(session.node_pids().values()) <= set(started)
        session.close()
        assert not ray.is_initialized()
        deadline = time.monotonic() + 30
        left = started
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if psutil.pid_exists(p) and
                    psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        print("left", left, len(started))
        print("shm", [n for n in os.listdir("/dev/shm")
                      if n.startswith(f"lc_{os.getpid()}_")])
        """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    left = next(line for line in lines if line.startswith("left"))
    assert left.startswith("left [] ") and not left.endswith(" 0"), left
    assert "shm []" in lines


def one_op_on(**options):
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("placed", **options), Task():
            ops.Const(np.ones(2), name="x")
    return group


def test_node_resources_are_the_actors_resources(session):
    session.start_nodes(["a"])        # holds no CPU unless asked
    assert ray.available_resources().get("CPU") == 2
    session.run(one_op_on(resources={"CPU": 2}))
    assert "CPU" not in ray.available_resources()
    session.close()
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU") != 2 and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert ray.available_resources().get("CPU") == 2


@pytest.mark.parametrize("options, named", [
    ({"resources": {"TPU": 4}}, "'TPU': 4"),
    ({"resources": {"CPU": 64}}, "'CPU': 64"),
    ({"placement": "0" * 56}, "no live Ray node has that id"),
    ({"placement": {"zone": "mars"}}, "no live Ray node has those labels"),
])
def test_a_node_no_ray_node_can_hold_is_a_plan_error(session, options,
                                                     named):
    with pytest.raises(PlanError, match=named) as caught:
        session.run(one_op_on(**options))
    assert "'placed'" in str(caught.value)
    assert session.node_pids() == {}          # no actor was started


def test_an_actor_ray_cannot_schedule_is_a_node_failure_naming_it(
        session, monkeypatch):
    # as when its Ray node leaves between the check and the start
    import localcluster.sessions.ray as ray_session
    monkeypatch.setattr(ray_session, "check_placeable", lambda *a: None)
    with pytest.raises(NodeFailedError) as caught:
        session.run(one_op_on(placement="0" * 56))
    assert caught.value.node == "placed"
    assert "could not start as a Ray actor" in str(caught.value)
    assert "not schedulable" in str(caught.value)
    assert session.node_pids() == {}


def test_a_node_placed_on_a_ray_node_runs_there(ray_instance):
    here = ray.get_runtime_context().get_node_id()
    for placement in (here, {"ray.io/node-id": here}):
        with RaySession() as placed:
            placed.run(one_op_on(placement=placement))
            assert placed.fetch_blob("x", "placed").tolist() == [1.0, 1.0]


class ElsewhereSession(RaySession):
    """Node t1's checkpoints land where the driver does not see them, as
    on a Ray node whose disk is its own."""

    manager = None

    def _run_plans(self, plans, timeout):
        results = super()._run_plans(plans, timeout)
        for epoch in range(10):
            path = self.manager.get_ckpt_db_name("t1", epoch)
            if os.path.exists(path):
                os.remove(path)
        return results


def test_a_checkpoint_the_driver_cannot_see_says_where_it_must_be(
        ray_instance, tmp_path):
    never = tmp_path / "never"
    never.touch()
    manager = MultiNodeCheckpointManager(str(tmp_path / "ck"))
    with ElsewhereSession() as session:
        session.manager = manager
        with pytest.warns(CheckpointWarning) as caught:
            JobRunner(build_job(never), manager).train(session)
        with pytest.raises(CheckpointError, match="shared filesystem"):
            JobRunner(build_job(never), manager,
                      on_checkpoint_error="raise").train(session)
    message = str(caught[0].message)
    assert "['t1'] wrote it where this process does not see it" in message
    assert "every Ray node and this driver reach" in message


def test_a_function_the_workers_cannot_import_is_a_plan_error_naming_it(
        session, tmp_path, monkeypatch):
    # a module installed on the driver only: pickled by reference, as an
    # installed package is, and missing where the actor looks
    installed = tmp_path / "site-packages"
    installed.mkdir()
    (installed / "lc_driver_only.py").write_text(
        "def twice(x):\n    return x * 2\n")
    monkeypatch.syspath_prepend(str(installed))
    import lc_driver_only
    monkeypatch.setitem(sys.modules, "lc_driver_only", lc_driver_only)
    with TaskGroup() as group:
        with Node("a"), Task():
            ops.Python(lc_driver_only.twice)([ops.Const(np.ones(1))],
                                             ["y"])
    with pytest.raises(PlanError) as caught:
        session.run(group)
    message = str(caught.value)
    assert "'a'" in message and "lc_driver_only.twice" in message
    assert "py_modules" in message
    monkeypatch.delitem(sys.modules, "lc_driver_only")


def test_node_stats_are_read_by_each_actor(session):
    session.start_nodes(["a"])
    real = session.node_pids()["a"]
    # as if the actor ran on another machine: no pid the driver could use
    session._nodes["a"].pid = None
    stats = session.node_stats()["a"]
    assert stats["pid"] == real and stats["rss_bytes"] > 0
    assert stats["peak_rss_bytes"] >= stats["rss_bytes"]


def test_a_nodes_output_reaches_the_driver_prefixed_with_its_name(tmp_path):
    # in a process of its own, with a Ray that sends workers' output to
    # the driver; the pooled actor was another node before.  The driver
    # stays up until the line has come through (Ray's log monitor
    # forwards it a moment later), or until the test's bound
    code = """if True:
        import sys, numpy as np
        from localcluster import Node, Task, TaskGroup, ops
        from localcluster.sessions.ray import ActorPool, RaySession
        with RaySession(num_cpus=1), ActorPool() as pool:
            with RaySession(pool=pool) as first:
                first.feed_blob("x", np.ones(1), node="first")
            with TaskGroup() as group:
                with Node("trainer_7"), Task():
                    ops.Print([ops.Const(np.array(42), name="answer")], [])
            with RaySession(pool=pool) as second:
                second.run(group)
                print("ran", flush=True)
                sys.stdin.readline()   # the test has seen the line
        """
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    bound = threading.Timer(45, proc.kill)
    bound.start()
    seen, lines = [], []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "answer: 42" in line:
                lines.append(line)
                proc.stdin.close()   # enough: the driver may end
        proc.wait(60)
    finally:
        bound.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, "".join(seen)[-3000:]
    assert lines and all("(trainer_7 pid=" in line for line in lines), \
        lines or "".join(seen)[-2000:]


def test_the_import_error_names_the_extra():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import localcluster\n"
            "try:\n"
            "    localcluster.RaySession\n"
            "except ImportError as exc:\n"
            "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=60)
    assert "pip install 'localcluster[ray]'" in done.stdout, done.stderr


def test_the_command_line_trains_the_example_to_the_localhost_loss():
    def run(*args):
        done = subprocess.run(
            [sys.executable, "-m", "localcluster.run", "--json", "--threads",
             "1", "--epochs", "2", *args], capture_output=True, text=True,
            timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        import json
        return json.loads(done.stdout)

    on_ray, here = run("--session", "ray"), run("--session", "localhost")
    assert on_ray["epochs"][-1]["metrics"]["loss"] == \
        here["epochs"][-1]["metrics"]["loss"]
    # per-node CPU and memory, as each actor reads its own process
    assert set(on_ray["node_usage"]) == set(here["node_usage"])
    for usage in on_ray["node_usage"].values():
        assert usage["peak_rss_bytes"] > 10 << 20
        assert usage["cpu_seconds"] > 0


RAY_DRIVER = textwrap.dedent("""
    import time
    import psutil
    from localcluster import Node, Task, TaskGroup, ops
    from localcluster.sessions.ray import RaySession

    session = RaySession(num_cpus=1, log_echo=False)   # starts its own Ray
    with TaskGroup() as group:
        with Node("a"), Task():
            ops.Sleep([], seconds=0.01)
    session.run(group)
    print(*[p.pid for p in psutil.Process().children(recursive=True)],
          flush=True)
    time.sleep(3600)
""")


@pytest.mark.timeout(240)
def test_a_ray_the_session_started_dies_with_its_killed_driver(tmp_path):
    """Ray ties its head processes to their driver, not its raylet's
    agents and workers: the session's watcher kills them all."""
    with open(tmp_path / "stderr", "w") as err:
        driver = subprocess.Popen([sys.executable, "-c", RAY_DRIVER],
                                  stdout=subprocess.PIPE, stderr=err,
                                  text=True, cwd=tmp_path)
    procs = []
    try:
        for pid in driver.stdout.readline().split():
            try:
                procs.append(psutil.Process(int(pid)))
            except psutil.NoSuchProcess:
                pass
        names = " ".join(p.name() for p in procs)
        assert "raylet" in names, (tmp_path / "stderr").read_text()[-3000:]
        took, left = kill_and_wait(driver, procs)
        assert not left, f"Ray's processes outlived their driver: {left}"
        assert took < 2, f"Ray's processes took {took:.2f} s to die"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        driver.stdout.close()
        for proc in procs:
            if running(proc):
                proc.kill()
