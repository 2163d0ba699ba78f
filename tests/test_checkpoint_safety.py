"""Checkpoints under wrong, missing and hostile files: a checkpoint of
another node or epoch is refused, the resume epoch is complete on every
node of the job, what is not a regular file never hangs a reader, and
what the writers create is private to the user."""

import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest

from localcluster import (CheckpointError, Job, JobRunner,
                          MultiNodeCheckpointManager, Node, Task,
                          epoch_limiter, ops)
from localcluster.checkpoint.fileformat import (read_checkpoint, read_manifest,
                                                verify_checkpoint,
                                                write_checkpoint)

NODES = ["trainer_0", "trainer_1"]
EPOCHS = 4
#: long enough for any read of these small files; short next to a hang
PATIENCE = 10


def build_job(nodes=NODES, epochs=EPOCHS):
    """Node i: w = 10 * (i + 1) + the epoch -- every node's checkpoint of
    every epoch holds something else."""
    with Job() as job:
        for i, node in enumerate(nodes):
            with Node(node):
                with job.init_group, Task():
                    ops.Const(np.full(3, 10.0 * (i + 1)), name="w")
                with Task():
                    ops.Add(["w", ops.Const(np.array(1.0))], ["w"])
        with Node(nodes[0]):
            epoch_limiter(job, epochs)
    return job


def w_of(session, node):
    return session.fetch_blob("w", node).tolist()


@pytest.fixture
def open_umask():
    """The usual umask (022) while the test runs: what stays private then
    is private because the writer made it so."""
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.fixture
def trained(session_factory, tmp_path):
    """``(session, manager, make_session)`` after training `build_job`
    into ``tmp_path/ck`` (epochs 0..4 of both nodes)."""
    session = session_factory()
    manager = MultiNodeCheckpointManager(str(tmp_path / "ck"))
    assert JobRunner(build_job(), manager).train(session) == EPOCHS
    return session, manager, session_factory


def path_of(manager, node, epoch):
    return manager.get_ckpt_db_name(node, epoch)


def edit_manifest(path, **changes):
    """Rewrite ``path`` with its manifest changed (None deletes a key) and
    every blob byte for byte as it was: a valid file, CRCs and all."""
    with zipfile.ZipFile(path) as zf:
        members = [(info.filename, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            if name == "__manifest__.json":
                manifest = json.loads(data)
                for key, value in changes.items():
                    if value is None:
                        manifest.pop(key, None)
                    else:
                        manifest[key] = value
                data = json.dumps(manifest).encode()
            zf.writestr(name, data)


def bounded(call, fifos=()):
    """``call()``'s result -- or the test fails if it has not returned
    within PATIENCE seconds, after releasing a reader blocked on one of
    ``fifos`` (a writer opening and closing it gives the reader EOF), so
    no thread stays stuck."""
    outcome = {}

    def run():
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 -- re-raised below
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PATIENCE)
    if thread.is_alive():
        while thread.is_alive():
            for fifo in fifos:
                try:
                    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass  # no reader on this one
            thread.join(0.1)
        pytest.fail(f"{call} blocked for {PATIENCE} s (opened a FIFO?)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def cli(*args, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "localcluster.run", "--session", "local",
         *args], capture_output=True, text=True, timeout=timeout)


# -- 10. a checkpoint of the wrong node or epoch ---------------------------------------

def test_another_nodes_checkpoint_is_refused_naming_both(trained):
    session, manager, make_session = trained
    shutil.copyfile(path_of(manager, "trainer_1", 4),
                    path_of(manager, "trainer_0", 4))
    with pytest.raises(Exception) as info:
        session.run(manager.load(4))
    message = str(info.value)
    assert "CheckpointError" in message
    assert "node 'trainer_1'" in message and "node 'trainer_0'" in message
    assert w_of(session, "trainer_0") == [14.0] * 3  # nothing loaded
    with pytest.raises(Exception, match="node 'trainer_1'"):
        manager.load_blobs_locally(["trainer_0"], ["w"], 4, session)
    # resuming skips it, and refuses it when asked for it
    assert manager.get_resume_from_epoch_id() == 3
    assert MultiNodeCheckpointManager(manager.db_prefix) \
        .get_resume_from_epoch_id() == 3
    with pytest.raises(CheckpointError, match="epoch 4"):
        manager.get_resume_from_epoch_id(4)
    with pytest.raises(CheckpointError,
                       match="cannot resume from epoch 4.*'trainer_1'"):
        JobRunner(build_job(), MultiNodeCheckpointManager(manager.db_prefix),
                  resume_from_epoch=4).train(make_session())


def test_an_older_epochs_checkpoint_is_refused_naming_both(trained):
    session, manager, _ = trained
    shutil.copyfile(path_of(manager, "trainer_0", 2),
                    path_of(manager, "trainer_0", 4))
    with pytest.raises(Exception) as info:
        session.run(manager.load(4))
    assert "epoch 2" in str(info.value) and "epoch 4" in str(info.value)
    assert w_of(session, "trainer_0") == [14.0] * 3
    assert manager.get_resume_from_epoch_id() == 3


def test_a_symlink_to_another_epoch_is_refused_one_to_the_same_loads(
        trained, tmp_path):
    """Decision: symlinks to regular files are followed (checkpoints kept
    elsewhere are fine); the manifest says whose file it really is."""
    session, manager, _ = trained
    target = path_of(manager, "trainer_0", 4)
    os.replace(target, target + ".elsewhere")
    os.symlink(path_of(manager, "trainer_0", 1), target)
    with pytest.raises(Exception) as info:
        session.run(manager.load(4))
    assert "epoch 1" in str(info.value) and "epoch 4" in str(info.value)
    assert manager.get_resume_from_epoch_id() == 3

    os.unlink(target)
    kept = tmp_path / "kept" / "trainer_0.4"
    kept.parent.mkdir()
    os.replace(target + ".elsewhere", kept)
    os.symlink(kept, target)
    session.run(manager.load(2))
    session.run(manager.load(4))
    assert w_of(session, "trainer_0") == [14.0] * 3
    assert manager.get_resume_from_epoch_id() == 4


@pytest.mark.parametrize("edit", [{"node": "trainer_1"}, {"epoch": 3},
                                  {"epoch": "4"}, {"epoch": True}])
def test_an_edited_manifest_is_refused(trained, edit):
    session, manager, _ = trained
    edit_manifest(path_of(manager, "trainer_0", 4), **edit)
    with pytest.raises(Exception, match="CheckpointError.*trainer_0"):
        session.run(manager.load(4))
    assert manager.get_resume_from_epoch_id() == 3


def test_a_manifest_naming_no_node_or_epoch_still_loads(trained):
    """Decision: a checkpoint written without its node and epoch (before
    they were recorded, or by write_checkpoint without them) cannot be
    checked for them and loads as before."""
    session, manager, _ = trained
    for node in NODES:
        edit_manifest(path_of(manager, node, 2), node=None, epoch=None)
    session.run(manager.load(2))
    assert w_of(session, "trainer_0") == [12.0] * 3
    assert w_of(session, "trainer_1") == [22.0] * 3
    assert manager.get_resume_from_epoch_id(2) == 2


def test_the_file_readers_check_the_node_and_epoch_asked_for(tmp_path):
    path = str(tmp_path / "a.3")
    write_checkpoint(path, {"w": np.arange(3)}, {"node": "a", "epoch": 3})
    for read in (read_checkpoint, verify_checkpoint, read_manifest):
        read(path, node="a", epoch=3)
        read(path)  # nothing asked, nothing checked
        with pytest.raises(CheckpointError,
                           match=r"a\.3 is of node 'a' epoch 3 .*not of "
                                 r"node 'b' epoch 3 that was to be loaded"):
            read(path, node="b", epoch=3)
        with pytest.raises(CheckpointError,
                           match="node 'a' epoch 3 .*not of epoch 7"):
            read(path, epoch=7)
    legacy = str(tmp_path / "a.4")
    write_checkpoint(legacy, {"w": np.arange(3)})
    assert read_checkpoint(legacy, node="b", epoch=9)[1]["w"].tolist() == \
        [0, 1, 2]


# -- 11. the resume epoch is complete on every node of the job ---------------------------

def test_a_node_that_never_wrote_leaves_no_epoch_to_resume(trained):
    session, manager, make_session = trained
    for epoch in range(EPOCHS + 1):
        os.unlink(path_of(manager, "trainer_1", epoch))
    fresh = MultiNodeCheckpointManager(manager.db_prefix)  # knows no nodes
    assert fresh.get_resume_from_epoch_id() is None
    with pytest.raises(CheckpointError, match="epoch 2.*'trainer_1'"):
        fresh.get_resume_from_epoch_id(2)
    assert manager.get_resume_from_epoch_id() is None  # init-ed: NODES
    with pytest.raises(CheckpointError,
                       match="'trainer_1'.*latest complete epoch there is "
                             "None"):
        JobRunner(build_job(), fresh, resume_from_epoch=3).train(
            make_session())


def test_the_resume_epoch_is_the_latest_complete_on_every_node(trained):
    _, manager, _ = trained
    for epoch in (3, 4):
        os.unlink(path_of(manager, "trainer_1", epoch))
    fresh = MultiNodeCheckpointManager(manager.db_prefix)
    assert fresh.get_resume_from_epoch_id() == 2
    assert manager.get_resume_from_epoch_id() == 2
    # the nodes a manager was init-ed with rule: here one never wrote
    manager.init(NODES + ["trainer_2"])
    assert manager.get_resume_from_epoch_id() is None


def test_the_command_line_offers_no_resume_that_fails_again(tmp_path):
    ckpt = str(tmp_path / "ck")
    first = cli("--epochs", "2", "--checkpoint-dir", ckpt)
    assert first.returncode == 0, first.stderr
    for name in os.listdir(ckpt):
        if name.startswith("ps."):
            os.unlink(os.path.join(ckpt, name))
    again = cli("--checkpoint-dir", ckpt, "--resume")
    assert again.returncode == 1, again.stderr
    assert "resume with" not in again.stdout + again.stderr


# -- 13. only regular files are read, never blocking -----------------------------------

def not_regular(tmp_path, kind):
    """A path named like a checkpoint that is no regular file."""
    path = str(tmp_path / f"{kind}.1")
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_to_fifo":
        os.mkfifo(str(tmp_path / "real_fifo"))
        os.symlink(str(tmp_path / "real_fifo"), path)
    else:
        os.mkdir(path)
    return path


@pytest.mark.parametrize("kind", ["fifo", "link_to_fifo", "directory"])
@pytest.mark.parametrize("read", [read_checkpoint, verify_checkpoint,
                                  read_manifest])
def test_what_is_no_regular_file_is_refused_at_once(tmp_path, kind, read):
    path = not_regular(tmp_path, kind)
    fifos = [path, str(tmp_path / "real_fifo")]
    with pytest.raises(CheckpointError, match="not a regular file") as info:
        bounded(lambda: read(path), fifos)
    assert path in str(info.value)
    if kind != "directory":
        assert "FIFO" in str(info.value)


def test_fifos_named_like_checkpoints_never_hang_a_resume(trained):
    session, manager, _ = trained
    fifos = []
    for node in NODES:  # a whole epoch 5 of FIFOs: the latest "complete"
        fifos.append(path_of(manager, node, 5))
        os.mkfifo(fifos[-1])
    fresh = MultiNodeCheckpointManager(manager.db_prefix)
    assert bounded(fresh.get_resume_from_epoch_id, fifos) == 4
    assert bounded(manager.get_resume_from_epoch_id, fifos) == 4
    with pytest.raises(CheckpointError, match="epoch 5"):
        bounded(lambda: fresh.get_resume_from_epoch_id(5), fifos)
    # a node asked to load one refuses it, it does not wait for a writer
    target = path_of(manager, "trainer_0", 3)
    os.unlink(target)
    os.symlink(fifos[0], target)
    with pytest.raises(Exception, match="FIFO, not a regular file"):
        bounded(lambda: session.run(manager.load(3), timeout=PATIENCE * 2),
                fifos)


def test_the_command_line_resume_past_fifos_does_not_hang(tmp_path):
    ckpt = str(tmp_path / "ck")
    first = cli("--epochs", "2", "--checkpoint-dir", ckpt)
    assert first.returncode == 0, first.stderr
    for name in os.listdir(ckpt):
        if name.endswith(".2"):
            os.mkfifo(os.path.join(ckpt, name[:-2] + ".3"))
    try:
        again = cli("--checkpoint-dir", ckpt, "--resume", timeout=PATIENCE * 3)
    except subprocess.TimeoutExpired:
        pytest.fail("--resume hung on the FIFOs")
    assert again.returncode == 0, again.stderr
    assert "resuming from epoch 2" in again.stdout


# -- 15. what the writers create is the user's alone -----------------------------------

def private(path, mode):
    return stat.S_IMODE(os.stat(path).st_mode) == mode


def test_write_checkpoint_creates_files_0600_and_directories_0700(
        open_umask, tmp_path):
    path = str(tmp_path / "made" / "here" / "node.1")
    write_checkpoint(path, {"w": np.arange(3)}, {"node": "node", "epoch": 1})
    assert private(path, 0o600)
    assert private(tmp_path / "made", 0o700)
    assert private(tmp_path / "made" / "here", 0o700)
    write_checkpoint(path, {"w": np.arange(4)})  # replaced: still private
    assert private(path, 0o600)


def test_a_jobs_checkpoints_are_private(open_umask, session_factory,
                                        tmp_path):
    manager = MultiNodeCheckpointManager(str(tmp_path / "ck" / "run"))
    JobRunner(build_job(), manager).train(session_factory())
    assert private(tmp_path / "ck", 0o700)
    assert private(manager.db_prefix, 0o700)
    names = os.listdir(manager.db_prefix)
    assert len(names) == len(NODES) * (EPOCHS + 1)
    for name in names:
        assert private(os.path.join(manager.db_prefix, name), 0o600), name
