"""Jobs, JobRunner and per-node checkpoints: the issue's acceptance cases,
on every session."""

import os
import warnings

import numpy as np
import pytest

from localcluster import (CheckpointError, CheckpointManager,
                          CheckpointWarning, Dataset, Job, JobRunner,
                          MultiNodeCheckpointManager, Net, Node, PlanError,
                          Queue, ReaderWithLimit, Task, TaskGroup,
                          UploadTaskGroupBuilder, epoch_limiter, ops, pipe)
from localcluster.testing import Epoch, FaultPlan, Kill

EXPECTED_TOTALS = [103, 115, 136, 145]


def build_pipeline(node_id):
    """On trainer_<id>: total = 100 + the values 0..9, three per epoch."""
    with Node(f"trainer_{node_id}"):
        with Job.current().init_group, Task():
            ds = Dataset({"val": np.arange(10)}, name=f"dataset:{node_id}")
            full_reader = ds.reader()
            total = ops.Const(np.array([100]))

        def inc_total(rec):
            ops.Add([total, rec["val"]], [total])

        epoch_reader = ReaderWithLimit(full_reader, num_iter=3)
        pipe(epoch_reader, processor=inc_total)
        Job.current().add_stop_condition(epoch_reader.data_finished())
    return [total]


def build_job(node_id=0):
    with Job() as job:
        outputs = build_pipeline(node_id)
    fetcher = Task(step=Net("empty"), outputs=outputs,
                   node=f"trainer_{node_id}")
    return job, fetcher


def fetch_total(session, fetcher):
    session.run(fetcher)
    return int(np.asarray(fetcher.outputs()[0].fetch()).ravel()[0])


@pytest.mark.parametrize("manager", ["single", "multi"])
def test_train_resume_and_load_give_the_expected_totals(
        session_factory, tmp_path, manager):
    def make():
        if manager == "single":
            return session_factory(), CheckpointManager(str(tmp_path),
                                                        "trainer_0")
        return session_factory(), MultiNodeCheckpointManager(str(tmp_path))

    session, checkpoint = make()
    job, fetcher = build_job()
    assert JobRunner(job, checkpoint).train(session) == len(EXPECTED_TOTALS)
    assert fetch_total(session, fetcher) == EXPECTED_TOTALS[-1]

    for initial_epoch in range(1, len(EXPECTED_TOTALS) + 1):
        fresh, checkpoint = make()
        # resuming from the epoch it stopped at runs no further epoch
        assert JobRunner(job, checkpoint, resume_from_epoch=initial_epoch) \
            .train(fresh) == len(EXPECTED_TOTALS)
        assert fetch_total(fresh, fetcher) == EXPECTED_TOTALS[-1]
        fresh.close()

    checkpoint.init(["trainer_0"])
    for epoch in range(1, len(EXPECTED_TOTALS) + 1):
        session.run(checkpoint.load(epoch))
        assert fetch_total(session, fetcher) == EXPECTED_TOTALS[epoch - 1]


def test_the_totals_after_each_epoch_are_reported(session, tmp_path):
    job, fetcher = build_job()
    seen = []
    runner = JobRunner(job, MultiNodeCheckpointManager(str(tmp_path)),
                       on_epoch=lambda report: seen.append(
                           (report.epoch, fetch_total(session, fetcher))))
    assert runner.train(session) == 4
    assert seen == list(zip(range(1, 5), EXPECTED_TOTALS))
    reports = runner.result.epochs
    assert [r.epoch for r in reports] == [1, 2, 3, 4]
    assert [r.stopped for r in reports] == [False, False, False, True]
    assert all(set(r.node_seconds) == {"trainer_0"} and r.seconds >= 0
               for r in reports)
    assert runner.result.last_epoch == 4
    assert not runner.result.checkpoint_errors


def test_each_node_checkpoints_separately(session, tmp_path):
    with Job() as job:
        for node_id in range(3):
            build_pipeline(node_id)
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    num_epochs = JobRunner(job, checkpoint).train(session)
    assert num_epochs == 4
    for node_id in range(3):
        for epoch in range(num_epochs + 1):
            path = checkpoint.get_ckpt_db_name(f"trainer_{node_id}", epoch)
            assert path == os.path.join(str(tmp_path),
                                        f"trainer_{node_id}.{epoch}")
            assert os.path.isfile(path)
    nodes = [f"trainer_{i}" for i in range(3)]
    for epoch in range(num_epochs + 1):
        assert checkpoint.load_blobs_locally(nodes, [], epoch, session)
    assert not checkpoint.load_blobs_locally(nodes, [], num_epochs + 1,
                                             session)
    assert checkpoint.get_resume_from_epoch_id() == num_epochs
    assert checkpoint.cp_accessible() and checkpoint.cp_accessible(2)
    assert not checkpoint.cp_accessible(num_epochs + 1)


def test_load_blobs_locally_loads_the_named_blobs(session, tmp_path):
    job, fetcher = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint).train(session)
    total = str(fetcher.outputs()[0].get())
    assert checkpoint.load_blobs_locally(["trainer_0"], [total, "nope"], 2,
                                         session)
    assert fetch_total(session, fetcher) == EXPECTED_TOTALS[1]


def test_download_group_copies_the_sum_everywhere(session):
    nodes = ["trainer_0", "trainer_1"]
    with Job() as job:
        for node in nodes:
            with job.init_group, Node(node), Task():
                for name in ["input1", "input2", "output", "download_result"]:
                    ops.ConstantFill([], [name], shape=[4], value=1.0)
            with Node(node), Task():
                ops.Add(["input1", "input2"], ["output"])
        for node in nodes:
            with job.download_group, Node(node), Task():
                ops.Copy(["output"], ["download_result"])
        epoch_limiter(job, 1)
    assert JobRunner(job).train(session) == 1
    for node in nodes:
        assert list(session.fetch_blob("output", node)) == [2.0] * 4
        assert list(session.fetch_blob("download_result", node)) == [2.0] * 4


def test_epoch_limiter_runs_exactly_n_epochs_and_resumes_the_rest(
        session_factory, tmp_path):
    def build():
        with Job() as job:
            with Node("trainer_0"):
                with job.init_group, Task():
                    ops.Const(np.array(0), name="epochs_run")
                with Task():
                    ops.Add(["epochs_run", ops.Const(np.array(1))],
                            ["epochs_run"])
                epoch_limiter(job, 5)
        return job

    session = session_factory()
    assert JobRunner(build(), MultiNodeCheckpointManager(
        str(tmp_path))).train(session) == 5
    assert int(session.fetch_blob("epochs_run", "trainer_0")) == 5
    resumed = session_factory()
    assert JobRunner(build(), MultiNodeCheckpointManager(str(tmp_path)),
                     resume_from_epoch=3).train(resumed) == 5
    assert int(resumed.fetch_blob("epochs_run", "trainer_0")) == 5


def test_upload_builder_runs_after_training_with_the_last_epoch(session,
                                                                tmp_path):
    seen = []

    class Upload(UploadTaskGroupBuilder):
        def build(self, epoch, checkpoint_manager):
            seen.append((epoch, checkpoint_manager))
            group = TaskGroup()
            with group, Node("trainer_0"), Task():
                ops.Const(np.array(epoch), name="uploaded_epoch")
            return group

    job, _ = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint, upload_task_group_builder=Upload()).train(
        session)
    assert seen == [(4, checkpoint)]


# -- checkpoint errors ------------------------------------------------------------

def test_an_unwritable_checkpoint_warns_and_training_goes_on(session,
                                                             tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    job, fetcher = build_job()
    runner = JobRunner(job, MultiNodeCheckpointManager(str(blocker / "ck")))
    with pytest.warns(CheckpointWarning, match="not written"):
        assert runner.train(session) == 4
    assert fetch_total(session, fetcher) == EXPECTED_TOTALS[-1]
    assert [e for e, _ in runner.result.checkpoint_errors] == [0, 1, 2, 3, 4]
    assert "trainer_0" in runner.result.checkpoint_errors[0][1]


def test_on_checkpoint_error_raise_makes_it_fatal(session, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    job, _ = build_job()
    runner = JobRunner(job, MultiNodeCheckpointManager(str(blocker / "ck")),
                       on_checkpoint_error="raise")
    with pytest.raises(CheckpointError, match="epoch 0"):
        runner.train(session)


def test_a_flipped_byte_is_a_checkpoint_error_naming_the_file(session,
                                                               tmp_path):
    job, fetcher = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint).train(session)
    path = checkpoint.get_ckpt_db_name("trainer_0", 2)
    data = bytearray(open(path, "rb").read())
    # a byte of the dataset's values, inside the archive
    data[data.index(np.arange(10).tobytes()) + 8] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(Exception) as info:
        session.run(checkpoint.load(2))
    assert path in str(info.value) and "CheckpointError" in str(info.value)
    # the workspace kept what it had: nothing half-loaded
    assert fetch_total(session, fetcher) == EXPECTED_TOTALS[-1]
    # and resume skips it only if it is the latest; here 4 is still good
    assert checkpoint.get_resume_from_epoch_id() == 4
    with pytest.raises(CheckpointError, match="epoch 2"):
        checkpoint.get_resume_from_epoch_id(2)


def test_a_truncated_checkpoint_is_skipped_when_resuming(session, tmp_path):
    job, _ = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint).train(session)
    path = checkpoint.get_ckpt_db_name("trainer_0", 4)
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    assert checkpoint.get_resume_from_epoch_id() == 3
    with pytest.raises(Exception, match="torn or corrupted"):
        session.run(checkpoint.load(4))


@pytest.mark.parametrize("values, epochs", [(12, 4), (10, 4), (3, 1)])
def test_data_that_ends_with_an_epoch_trains_no_empty_epoch(session, values,
                                                             epochs):
    """ReaderWithLimit.data_finished() turned true one empty epoch late
    when the data ended exactly at an epoch's limit: 4 epochs of data
    trained 5, the last reading nothing."""
    with Job() as job, Node("trainer_0"):
        with job.init_group, Task():
            reader = Dataset({"val": np.arange(values)}, name="d").reader()
            ops.Const(np.array([0]), name="read")
        limited = ReaderWithLimit(reader, num_iter=3)
        pipe(limited, processor=lambda rec: ops.Add(
            ["read", ops.Const(np.array([1]))], ["read"]) and None)
        job.add_stop_condition(limited.data_finished())
    assert JobRunner(job).train(session) == epochs
    assert session.fetch_blob("read", "trainer_0").tolist() == [values]


def test_bad_runner_arguments_are_refused():
    job, _ = build_job()
    with pytest.raises(PlanError, match="on_checkpoint_error"):
        JobRunner(job, on_checkpoint_error="ignore")
    with pytest.raises(PlanError, match="checkpoint_manager"):
        JobRunner(job, max_restarts=1)
    with pytest.raises(PlanError, match="checkpoint_manager"):
        JobRunner(job, resume_from_epoch=2)
    with pytest.raises(PlanError, match="num_epochs"):
        epoch_limiter(job, 0)
    with pytest.raises(PlanError, match="db_type"):
        MultiNodeCheckpointManager("/tmp/x", db_type="leveldb")


def test_job_context_and_nodes_to_checkpoint():
    with Job() as job:
        assert Job.current() is job
        assert TaskGroup.current() is job.epoch_group
        with Node("a"), job.init_group, Task():
            ops.Const(np.array(1))
        with Node("b"), Task():
            ops.Const(np.array(2))
    assert job.nodes_to_checkpoint() == ["a"]
    assert Job(nodes_to_checkpoint=["a", "b"]).nodes_to_checkpoint() == \
        ["a", "b"]
    with pytest.raises(PlanError):
        job.add_stop_condition(3)


def test_a_checkpoint_opens_with_numpy_and_holds_no_pickle(session,
                                                           tmp_path):
    job, _ = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint).train(session)
    with np.load(checkpoint.get_ckpt_db_name("trainer_0", 4),
                 allow_pickle=False) as npz:
        values = [npz[k] for k in npz.files if k != "__manifest__.json"]
    assert any(v.tolist() == list(range(10)) for v in values)
    assert any(v.tolist() == [145] for v in values)
    assert not [f for f in os.listdir(tmp_path) if "partial" in f]


def test_warnings_do_not_escape_a_clean_run(session, tmp_path):
    job, _ = build_job()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path))).train(
            session)


def test_a_job_without_a_stop_condition_is_refused(session):
    with Job() as job, Node("trainer_0"), Task():
        ops.Const(np.array(1))
    with pytest.raises(PlanError, match="no stop condition"):
        JobRunner(job).train(session)


def _reads_a_queue_the_init_group_writes(where):
    def bad(job):
        q = Queue(4, name="q")
        with Node("b"), job.init_group, Task():
            pipe(Dataset({"x": np.arange(3)}, name="d").reader(), q)
        with Node("b"), getattr(job, f"{where}_group"), Task():
            pipe(q, processor=lambda rec: None)
    bad.__name__ = f"the {where} group reads a queue only init writes"
    return bad


def _a_fault_names_a_node_the_job_lacks(job):
    return FaultPlan(Kill("trainer_9", Epoch(1)))


@pytest.mark.parametrize("bad, says", [
    *[(_reads_a_queue_the_init_group_writes(where),
       rf"the job's {where} group: queue 'queue/q' is read on node\(s\) "
       r"\['b'\] but no task of .* writes it")
      for where in ("epoch", "download", "exit")],
    (_a_fault_names_a_node_the_job_lacks,
     r"Kill\(node='trainer_9'.* names node 'trainer_9', which no group of "
     r"the job uses \(its nodes: a\), so it could never fire"),
], ids=["epoch", "download", "exit", "fault"])
def test_a_bad_job_is_refused_before_init_runs_or_epoch_0_is_saved(
        session_factory, tmp_path, bad, says):
    """Every group of the Job, and the session's faults, are validated
    before anything runs: a bad epoch group used to fail after the init
    group ran and epoch 0 was saved (a bad exit group: after training)."""
    with Job() as job:
        with Node("a"), job.init_group, Task():
            ops.Const(np.array([1]), name="made_by_init")
        with Node("a"):
            with Task():
                ops.Const(np.array([2]))
            epoch_limiter(job, 2)
        faults = bad(job)
    session = session_factory(faults=faults)
    with pytest.raises(PlanError, match=says):
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path)),
                  timeout=10).train(session)
    assert not session.has_blob("made_by_init", "a")
    assert os.listdir(tmp_path) == []
    assert session.is_open()


def test_resuming_from_an_epoch_never_saved_names_the_latest(session,
                                                            tmp_path):
    job, _ = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint).train(session)
    with pytest.raises(CheckpointError, match="epoch 9.*latest complete "
                                              "epoch there is 4"):
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path)),
                  resume_from_epoch=9).train(session)


def test_a_metadata_handler_hears_of_every_save_and_may_pick_the_epoch(
        session, tmp_path):
    from localcluster import MetadataHandler

    class Recorder(MetadataHandler):
        def __init__(self):
            self.saved, self.inits = [], []

        def init(self, db_prefix, db_type, node_names, retrieve_from_epoch):
            self.inits.append((node_names, retrieve_from_epoch))

        def save(self, db_prefix, db_type, node_names, epoch):
            self.saved.append(epoch)

        def get_resume_from_epoch_id(self, user_epoch):
            return 2 if self.saved else None

    handler = Recorder()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path),
                                            metadata_handler=handler)
    assert checkpoint.get_resume_from_epoch_id() is None  # no opinion yet
    job, _ = build_job()
    JobRunner(job, checkpoint).train(session)
    assert handler.saved == [0, 1, 2, 3, 4]
    assert handler.inits == [(["trainer_0"], None)]
    assert checkpoint.get_resume_from_epoch_id() == 2
    with pytest.raises(PlanError, match="MetadataHandler"):
        MultiNodeCheckpointManager(str(tmp_path), metadata_handler=object())


def test_resuming_from_a_torn_checkpoint_is_a_checkpoint_error(session,
                                                               tmp_path):
    job, _ = build_job()
    checkpoint = MultiNodeCheckpointManager(str(tmp_path))
    JobRunner(job, checkpoint).train(session)
    path = checkpoint.get_ckpt_db_name("trainer_0", 3)
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(CheckpointError, match="epoch 3.*torn or corrupted"):
        JobRunner(job, MultiNodeCheckpointManager(str(tmp_path)),
                  resume_from_epoch=3).train(session)


def test_files_that_are_not_checkpoints_are_no_nodes(session, tmp_path):
    job, _ = build_job()
    JobRunner(job, MultiNodeCheckpointManager(str(tmp_path))).train(session)
    for name in ("notes.txt", "train.log.1", "trainer_0.3.bak",
                 "trainer_0.3.1"):
        (tmp_path / name).write_text("not a checkpoint")
    fresh = MultiNodeCheckpointManager(str(tmp_path))  # no init: from files
    assert fresh.get_resume_from_epoch_id() == 4
    assert fresh.get_resume_from_epoch_id(3) == 3


def test_a_jobs_init_group_runs_in_the_global_workspace():
    from localcluster import WorkspaceType
    given = TaskGroup()
    job = Job(init_group=given)
    assert job.init_group is given
    assert given.workspace_type() is WorkspaceType.GLOBAL
    with pytest.raises(PlanError, match="init_group.*GLOBAL"):
        Job(init_group=TaskGroup(workspace_type=WorkspaceType.PRIVATE))


def test_an_upload_builder_must_implement_build():
    class Incomplete(UploadTaskGroupBuilder):
        pass

    with pytest.raises(TypeError, match="build"):
        Incomplete()


def _counting_job(nodes):
    """Every node of ``nodes`` adds 1 to its ``w`` each epoch, 3 epochs."""
    with Job() as job:
        for node in nodes:
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.zeros(2), name="w")
                with Task():
                    ops.Add(["w", ops.Const(np.ones(2))], ["w"])
        epoch_limiter(job, 3)
    return job


def test_resuming_checkpoints_of_another_set_of_nodes_is_refused(
        session, tmp_path):
    """A 2-trainer run's checkpoints resumed by a 1-trainer job would
    train a mix of the two jobs: a CheckpointError naming the difference,
    before anything is loaded or trained."""
    runner = JobRunner(_counting_job(["trainer_0", "trainer_1"]),
                       MultiNodeCheckpointManager(str(tmp_path)))
    runner.train(session)
    fewer = JobRunner(_counting_job(["trainer_0"]),
                      MultiNodeCheckpointManager(str(tmp_path)),
                      resume_from_epoch=2)
    with pytest.raises(CheckpointError,
                       match=r"not in this job: \['trainer_1'\]"):
        fewer.train(session)
    same = JobRunner(_counting_job(["trainer_0", "trainer_1"]),
                     MultiNodeCheckpointManager(str(tmp_path)),
                     resume_from_epoch=2)
    assert same.train(session) == 3
