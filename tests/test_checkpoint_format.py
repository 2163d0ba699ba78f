"""The on-disk checkpoint format: atomic, verified, pickle-free."""

import os

import numpy as np
import pytest

from localcluster import CheckpointError
from localcluster.checkpoint.fileformat import (read_checkpoint,
                                                remove_partials,
                                                verify_checkpoint,
                                                write_checkpoint)

BLOBS = {
    "w": np.arange(12, dtype=np.float32).reshape(3, 4),
    "step": np.array(7),
    "trainer_0/names": np.array(["a", "bc"]),
    "flags": np.array([True, False]),
    "empty": np.zeros((0, 3)),
}


def same(a, b):
    return set(a) == set(b) and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and
        np.array_equal(a[k], b[k]) for k in a)


def test_what_is_written_reads_back_exactly(tmp_path):
    path = str(tmp_path / "sub" / "node.3")
    manifest = write_checkpoint(path, BLOBS, {"node": "node", "epoch": 3})
    assert manifest["epoch"] == 3 and len(manifest["blobs"]) == len(BLOBS)
    got_manifest, got = read_checkpoint(path)
    assert same(got, BLOBS) and got_manifest == manifest
    assert all(v.flags.writeable for v in got.values())
    _, some = read_checkpoint(path, ["w", "missing"])
    assert list(some) == ["w"]
    assert os.listdir(tmp_path / "sub") == ["node.3"]


def test_every_flipped_byte_is_caught_or_harmless(tmp_path):
    """Whatever byte of the file is damaged, a read either raises
    CheckpointError or returns exactly what was written -- never other
    values."""
    path = str(tmp_path / "node.1")
    write_checkpoint(path, BLOBS)
    good = open(path, "rb").read()
    caught = 0
    for position in range(len(good)):
        damaged = bytearray(good)
        damaged[position] ^= 0x5A
        open(path, "wb").write(bytes(damaged))
        try:
            _, got = read_checkpoint(path)
        except CheckpointError as exc:
            assert path in str(exc)
            caught += 1
            continue
        assert same(got, BLOBS), f"byte {position} changed what was read"
    assert caught > len(good) // 2


@pytest.mark.parametrize("keep", [0, 1, 30, -200, -22, -1])
def test_a_truncated_file_is_a_checkpoint_error(tmp_path, keep):
    path = str(tmp_path / "node.1")
    write_checkpoint(path, BLOBS)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:keep] if keep >= 0 else data[:keep])
    with pytest.raises(CheckpointError, match="torn or corrupted"):
        verify_checkpoint(path)


def test_a_missing_checkpoint_names_the_file(tmp_path):
    path = str(tmp_path / "node.9")
    with pytest.raises(CheckpointError, match="does not exist"):
        read_checkpoint(path)


def test_a_failed_write_leaves_nothing(tmp_path):
    path = str(tmp_path / "node.1")
    write_checkpoint(path, BLOBS)
    before = open(path, "rb").read()

    bad = dict(BLOBS, obj=np.array([object()], dtype=object))
    with pytest.raises(Exception):
        write_checkpoint(path, bad)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["node.1"]


def test_partials_of_killed_writers_are_removed(tmp_path):
    path = str(tmp_path / "node.2")
    for pid in (11, 12):
        open(f"{path}.partial-{pid}", "wb").write(b"half")
    open(str(tmp_path / "node.20.partial-1"), "wb").write(b"other epoch")
    assert sorted(remove_partials(path)) == ["node.2.partial-11",
                                                   "node.2.partial-12"]
    assert os.listdir(tmp_path) == ["node.20.partial-1"]


def test_two_writers_of_one_checkpoint_both_succeed(tmp_path):
    import threading
    path = str(tmp_path / "node.1")
    errors = []

    def write(value):
        try:
            for _ in range(20):
                write_checkpoint(path, {"w": np.full(50000, value)})
        except Exception as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    writers = [threading.Thread(target=write, args=(v,)) for v in (1, 2)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(60)
    assert not errors
    _, got = read_checkpoint(path)
    assert got["w"][0] in (1, 2) and len(set(got["w"].tolist())) == 1
    assert os.listdir(tmp_path) == ["node.1"]


def test_a_dtype_with_many_fields_reads_back(tmp_path):
    dtype = np.dtype([(f"field_{i}", "<f8") for i in range(3000)])
    path = str(tmp_path / "node.1")
    write_checkpoint(path, {"wide": np.zeros(2, dtype)})
    _, got = read_checkpoint(path)
    assert got["wide"].dtype == dtype
