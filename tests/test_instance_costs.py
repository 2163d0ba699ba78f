"""What each of many instances costs a run: the work a thousand nodes
would each repeat is done once (the master's imports, a checkpoint's
plan), and no node's save grows with the others' files."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from _protojob import build

from localcluster import (Cluster, JobRunner, LocalHostScheduler,
                          LocalSession, MultiNodeCheckpointManager, Node,
                          Task, TaskGroup, ops)
from localcluster.checkpoint import partials
from localcluster.checkpoint.fileformat import read_manifest, write_checkpoint

pytestmark = pytest.mark.timeout(120)

_LAZY = textwrap.dedent("""
    import sys
    import numpy as np
    from localcluster import (LocalHostScheduler, Node, Task, TaskGroup,
                              ops)

    def imported():
        return np.array("numpy.random" in sys.modules)

    if __name__ == "__main__":
        assert "numpy.random" not in sys.modules, "imported already"
        with LocalHostScheduler(start_method=sys.argv[1]) as session:
            with TaskGroup() as tg, Node("n", num_instances=2), Task() as t:
                ops.Python(imported)([], ["seen"])
                seen = t.add_output("seen")
            session.run(tg)
            print([bool(v) for v in seen.fetch()])
""")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_nodes_find_numpys_lazy_submodules_imported_before_they_start(
        tmp_path, method):
    # numpy imports numpy.random at its first use: once in each of a
    # thousand nodes, it took 4 of the 10 s of the 1000-trainer job's
    # first run (import and stat storms on 2 CPUs)
    script = tmp_path / "lazy.py"
    script.write_text(_LAZY)
    out = subprocess.run([sys.executable, str(script), method],
                         capture_output=True, text=True, timeout=90,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[True, True]"


def test_a_node_sweeps_dead_partials_once_not_at_every_save(tmp_path,
                                                            monkeypatch):
    listed = []
    real = os.listdir
    monkeypatch.setattr(partials.os, "listdir",
                        lambda d=".": listed.append(d) or real(d))
    # a dead writer's partial of another epoch of this node, one of
    # another node's: only the first is this node's to remove
    for name in ("a.3.partial-999999999-0", "b.3.partial-999999999-0"):
        (tmp_path / name).write_bytes(b"half")
    blobs = {"w": np.arange(4.0)}
    for epoch in range(1, 6):
        write_checkpoint(str(tmp_path / f"a.{epoch}"), blobs,
                         {"node": "a", "epoch": epoch})
    # one listing for five saves: a thousand nodes saving into one
    # directory listed it a thousand times an epoch
    assert listed == [str(tmp_path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.1", "a.2", "a.3", "a.4", "a.5", "b.3.partial-999999999-0"]


def test_a_restarted_node_sweeps_what_its_killed_incarnation_left(tmp_path):
    # the sweep is once per process: a restarted node is a new one
    blobs = {"w": np.arange(4.0)}
    write_checkpoint(str(tmp_path / "a.1"), blobs, {"node": "a", "epoch": 1})
    (tmp_path / "a.2.partial-999999999-0").write_bytes(b"half")
    code = textwrap.dedent(f"""
        import numpy as np
        from localcluster.checkpoint.fileformat import write_checkpoint
        write_checkpoint({str(tmp_path / 'a.2')!r}, {{"w": np.zeros(2)}},
                         {{"node": "a", "epoch": 2}})
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.1", "a.2"]


def _tasks(group):
    return [(t.node, t.name) for t in group.tasks()]


def test_a_prototypes_checkpoints_are_one_task_on_the_prototype(tmp_path):
    with Cluster():
        build(count=50)
        manager = MultiNodeCheckpointManager(str(tmp_path))
        manager.init(["trainer", "ps"])
        for group in (manager.save(1), manager.load(1), manager.init(
                ["trainer", "ps"], retrieve_from_epoch=1)):
            # one plan for fifty instances (it was fifty plans, each
            # pickled and sent on its own)
            assert sorted(_tasks(group)) == [
                ("ps", "ps/checkpoint"), ("trainer", "trainer/checkpoint")]


def test_instances_sharing_a_checkpoint_plan_each_write_and_load_their_own(
        tmp_path):
    with Cluster(), LocalHostScheduler() as session:
        job = build(count=5, epochs=2)
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path))).train(
            session)
        for i in range(5):
            manifest = read_manifest(str(tmp_path / f"trainer_{i}.2"),
                                     node=f"trainer_{i}", epoch=2)
            assert manifest["node"] == f"trainer_{i}"
        manager = MultiNodeCheckpointManager(str(tmp_path))
        manager.init(["trainer", "ps"])
        session.run(manager.load(1))   # each instance its own epoch 1
        with TaskGroup() as tg, Node("trainer"), Task() as task:
            out = task.add_output(ops.Copy(["w"]))
        session.run(tg)
        assert [float(v) for v in out.fetch()] == [1.0, 2.0, 3.0, 4.0, 5.0]


class _Named(MultiNodeCheckpointManager):
    """Files named its own way: each node's path is the manager's."""

    def get_ckpt_db_name(self, node_name, epoch):
        return os.path.join(self.db_prefix, f"ckpt-{epoch}-{node_name}")


def test_a_manager_naming_its_own_files_keeps_a_plan_per_instance(tmp_path):
    with Cluster(), LocalSession() as session:
        manager = _Named(str(tmp_path))
        JobRunner(build(count=3, epochs=1), manager).train(session)
        assert len(_tasks(manager.save(1))) == 4
    assert sorted(p.name for p in tmp_path.glob("ckpt-1-*")) == [
        "ckpt-1-ps", "ckpt-1-trainer_0", "ckpt-1-trainer_1",
        "ckpt-1-trainer_2"]


def test_nodes_asked_to_stop_get_time_in_proportion_to_their_number(
        monkeypatch, caplog):
    # thousands of nodes runnable at once starve their zygote of CPU: at
    # 4000 nodes it relayed nothing for 3 s, and all 4000 were sent
    # SIGTERM and SIGKILL as if hung.  Here a zygote stopped for 2.5 s
    # stands for the starved one (a shutdown gave it 2 s of silence); 50
    # nodes costing 1 s each to stop are given more than that.
    import signal
    import threading
    from localcluster.sessions import localhost
    monkeypatch.setattr(localhost, "STOP_COST", 1.0, raising=False)
    with Cluster():
        with TaskGroup() as tg, Node("n", num_instances=50), Task():
            ops.Const(0)
        session = LocalHostScheduler()
        try:
            session.run(tg)
            zygote = session._poller.links()[0].pid
        except BaseException:
            session.close()
            raise
        os.kill(zygote, signal.SIGSTOP)
        resume = threading.Timer(2.5, os.kill, (zygote, signal.SIGCONT))
        resume.start()
        try:
            session.close()
        finally:
            resume.join()
    assert not [r for r in caplog.records if "did not stop" in r.message]


_STOPPED_ZYGOTE = textwrap.dedent("""
    import os, signal, sys, time
    from localcluster import (LocalHostScheduler, Node, NodeFailedError,
                              RunTimeoutError, Task, TaskGroup, ops)

    # the first process the master forks -- the zygote of the batch --
    # stops before it starts a node (as one stopped with SIGSTOP would)
    FORKS = []
    os.register_at_fork(
        before=lambda: FORKS.append(1),
        after_in_child=lambda: len(FORKS) == 1 and os.kill(os.getpid(),
                                                           signal.SIGSTOP))
    with TaskGroup() as tg, Node("n", num_instances=8), Task():
        ops.Const(0)
    session = LocalHostScheduler()
    started = time.monotonic()
    try:
        session.run(tg, timeout=1)
    except (RunTimeoutError, NodeFailedError) as exc:
        print(type(exc).__name__, round(time.monotonic() - started, 1))
    finally:
        session.close()
""")


def test_a_stopped_zygote_is_killed_once_not_waited_for_per_node(tmp_path):
    # the nodes of a zygote that relays nothing were each waited for, then
    # killed through it, in turn: 2.5 s a node (8 nodes: 21 s); now its
    # first such node takes the zygote down, and the rest are dead with it
    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED_ZYGOTE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True,
                         text=True, timeout=90, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    kind, took = out.stdout.split()
    assert kind == "RunTimeoutError"
    assert float(took) < 12, out.stdout
