"""A blob that did not change since a node's earlier checkpoint is saved
once: later checkpoints refer to the file that holds it, loading follows
the reference, a prune keeps what a kept epoch refers to, and a referred
file gone or replaced is a CheckpointError naming both files."""

import json
import os
import shutil
import zipfile

import numpy as np
import pytest

from localcluster import (CheckpointError, Job, JobRunner,
                          MultiNodeCheckpointManager, Node, Task,
                          epoch_limiter, ops)
from localcluster.checkpoint.fileformat import (read_checkpoint,
                                                read_manifest,
                                                write_checkpoint)
from localcluster.checkpoint.reuse import MIN_BYTES, SavedBlobs
from localcluster.cli.rundir.prune import prune
from localcluster.cli.rundir.scan import scan

EPOCHS = 4
#: a table that never changes, and weights that change every epoch --
#: both big enough to be referred to
TABLE = np.arange(MIN_BYTES // 8 * 4, dtype=np.float64)
MOVING = np.zeros(MIN_BYTES // 8 * 2)


def build_job(epochs=EPOCHS):
    with Job() as job:
        with Node("a"):
            with job.init_group, Task():
                ops.Const(TABLE, name="table")
                ops.Const(MOVING, name="moving")
            with Task():
                ops.Add(["moving", ops.Const(np.array(1.0))], ["moving"])
            epoch_limiter(job, epochs)
    return job


def sizes(directory, node="a"):
    return {int(n.rsplit(".", 1)[1]): os.path.getsize(os.path.join(
        directory, n)) for n in os.listdir(directory)
        if n.startswith(node + ".")}


def refs(path):
    return {e["name"]: e["ref"]["file"]
            for e in read_manifest(path)["blobs"] if "ref" in e}


@pytest.fixture
def trained(session_factory, tmp_path):
    """``(manager, directory)`` after training `build_job` (epochs 0..4
    of node a)."""
    directory = str(tmp_path / "ck")
    manager = MultiNodeCheckpointManager(directory)
    assert JobRunner(build_job(), manager).train(session_factory()) == \
        EPOCHS
    return manager, directory


def test_an_unchanged_blob_is_saved_once_and_loads_from_there(
        trained, session_factory):
    manager, directory = trained
    size = sizes(directory)
    assert size[0] > TABLE.nbytes + MOVING.nbytes
    for epoch in range(1, EPOCHS + 1):
        # the changed weights are written, the table is referred to
        assert MOVING.nbytes < size[epoch] < MOVING.nbytes + MIN_BYTES
        assert refs(manager.get_ckpt_db_name("a", epoch)) == \
            {"table": "a.0"}
    _, blobs = read_checkpoint(manager.get_ckpt_db_name("a", EPOCHS))
    assert np.array_equal(blobs["table"], TABLE)
    assert np.array_equal(blobs["moving"], MOVING + EPOCHS)
    session = session_factory()
    session.run(manager.init(["a"], retrieve_from_epoch=2))
    session.run(manager.load(2))
    assert np.array_equal(session.fetch_blob("table", "a"), TABLE)
    assert np.array_equal(session.fetch_blob("moving", "a"), MOVING + 2)


def test_a_resumed_run_equals_an_uninterrupted_one_and_still_refers(
        trained, session_factory, tmp_path):
    manager, directory = trained
    for epoch in (3, 4):
        os.unlink(manager.get_ckpt_db_name("a", epoch))
    # a fresh node: what it loads tells it where the table is kept
    resumed = JobRunner(build_job(), manager, resume_from_epoch=2)
    assert resumed.train(session_factory()) == EPOCHS
    assert all(refs(manager.get_ckpt_db_name("a", e)) == {"table": "a.0"}
               for e in (3, 4))
    _, blobs = read_checkpoint(manager.get_ckpt_db_name("a", EPOCHS))
    assert np.array_equal(blobs["moving"], MOVING + EPOCHS)
    assert np.array_equal(blobs["table"], TABLE)


def test_a_blob_that_changed_anywhere_is_written_again(tmp_path):
    saved, table = SavedBlobs(), TABLE.copy()
    for epoch in range(3):
        path = str(tmp_path / f"a.{epoch}")
        if epoch == 2:
            table[-1] += 1  # one value, at the very end
        saved.record(path, write_checkpoint(
            path, {"table": table}, {"node": "a", "epoch": epoch},
            reuse=saved.candidates(path)))
    assert refs(str(tmp_path / "a.1")) == {"table": "a.0"}
    assert refs(str(tmp_path / "a.2")) == {}
    _, blobs = read_checkpoint(str(tmp_path / "a.2"))
    assert np.array_equal(blobs["table"], table)
    # a file is never referred to by its own successor
    path = str(tmp_path / "a.2")
    saved.record(path, write_checkpoint(
        path, {"table": table}, {"node": "a", "epoch": 2},
        reuse=saved.candidates(path)))
    assert refs(path) == {}
    _, blobs = read_checkpoint(path)
    assert np.array_equal(blobs["table"], table)


def test_a_referred_file_gone_or_replaced_is_an_error_naming_both(trained):
    manager, directory = trained
    held, later = (manager.get_ckpt_db_name("a", e) for e in (0, 3))
    shutil.move(held, held + ".moved")
    with pytest.raises(CheckpointError) as gone:
        read_checkpoint(later)
    assert later in str(gone.value) and held in str(gone.value)
    assert "does not exist" in str(gone.value)
    found = scan(directory)
    assert found.epochs[3].problems == {
        "a": "refers to a.0, which does not exist"}
    assert found.resume_epoch is None
    assert manager.latest_epoch_on_disk() is None
    # the same bytes written again are another writing of the file
    os.rename(held + ".moved", held)
    _, blobs = read_checkpoint(held)
    write_checkpoint(held, blobs, read_manifest(held))
    with pytest.raises(CheckpointError, match="another checkpoint now"):
        read_checkpoint(later)
    assert scan(directory, quick=True).resume_epoch == 0


def test_a_reference_out_of_its_directory_is_refused(trained):
    manager, _ = trained
    path = manager.get_ckpt_db_name("a", 2)
    with zipfile.ZipFile(path) as zf:
        members = [(i.filename, zf.read(i)) for i in zf.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members:
            if name == "__manifest__.json":
                manifest = json.loads(data)
                for entry in manifest["blobs"]:
                    if "ref" in entry:
                        entry["ref"]["file"] = "../ck/a.0"
                data = json.dumps(manifest).encode()
            zf.writestr(name, data)
    with pytest.raises(CheckpointError, match="no earlier checkpoint"):
        read_checkpoint(path)


def test_prune_keeps_the_epochs_a_kept_one_refers_to(trained,
                                                     session_factory):
    manager, directory = trained
    removed = prune(directory, 1, nodes=["a"])
    assert sorted(removed) == ["a.1", "a.2", "a.3"]
    assert sorted(sizes(directory)) == [0, EPOCHS]
    found = scan(directory)
    assert found.complete_epochs() == [0, EPOCHS]
    assert found.epochs[EPOCHS].refers == {0}
    assert prune(directory, 1, nodes=["a"]) == []
    session = session_factory()
    session.run(manager.init(["a"], retrieve_from_epoch=EPOCHS))
    session.run(manager.load(EPOCHS))
    assert np.array_equal(session.fetch_blob("table", "a"), TABLE)


def test_every_flipped_byte_of_a_referring_file_is_caught_or_harmless(
        tmp_path):
    saved, table = SavedBlobs(), TABLE.copy()
    blobs = {"table": table, "step": np.array(3)}
    for epoch in range(2):
        path = str(tmp_path / f"a.{epoch}")
        saved.record(path, write_checkpoint(
            path, blobs, {"node": "a", "epoch": epoch},
            reuse=saved.candidates(path)))
    assert refs(path) == {"table": "a.0"}
    good = open(path, "rb").read()
    caught = 0
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 0x5A
        open(path, "wb").write(bytes(damaged))
        try:
            _, got = read_checkpoint(path, node="a", epoch=1)
        except CheckpointError as exc:
            assert path in str(exc)
            caught += 1
            continue
        assert np.array_equal(got["table"], table) and got["step"] == 3, \
            f"byte {position} changed what was read"
    assert caught > len(good) // 2


def test_quick_verdicts_kept_between_prunes_are_read_again_when_files_change(
        trained, monkeypatch):
    from localcluster.checkpoint import state
    from localcluster.checkpoint.state import Verdicts
    _, directory = trained
    read = []
    real = state.read_manifest
    monkeypatch.setattr(state, "read_manifest",
                        lambda path, *a, **k: read.append(path) or
                        real(path, *a, **k))
    verdicts = Verdicts()

    def quick():
        return scan(directory, quick=True, nodes=["a"], about_run=False,
                    verdicts=verdicts)

    assert quick().complete_epochs() == list(range(EPOCHS + 1))
    assert read
    # a run's prune after each epoch: the files it judged are not read
    # again (at 1000 nodes, 2000-3000 manifests an epoch)
    read.clear()
    assert quick().complete_epochs() == list(range(EPOCHS + 1))
    assert read == []
    # a file a kept verdict refers to, written again: every file that
    # refers to it is judged again, and is no longer whole
    held = os.path.join(directory, "a.0")
    _, blobs = read_checkpoint(held)
    write_checkpoint(held, blobs, read_manifest(held))
    found = quick()
    assert found.complete_epochs() == [0]
    assert "another checkpoint now" in found.epochs[3].problems["a"]
    # a file cut short is judged again too
    later = os.path.join(directory, f"a.{EPOCHS}")
    with open(later, "r+b") as f:
        f.truncate(os.path.getsize(later) // 2)
    assert quick().epochs[EPOCHS].problems["a"]
    # and the verdicts of files pruned away are not kept for ever
    assert len(verdicts) == EPOCHS + 1
    os.unlink(later)
    quick()
    assert len(verdicts) == EPOCHS
