"""Shared memory at its limits: descriptors (a mapping keeps none, queue
waits work past fd 1024, a low ``ulimit -n``) and a full /dev/shm (an
error naming the blob, never a SIGBUS).

A full /dev/shm is never made for real here -- other processes share it.
Tests inject ENOSPC into ``os.posix_fallocate`` (forked nodes inherit the
patch), or ask for more than /dev/shm holds in all, which tmpfs refuses
before it allocates anything.
"""

import errno
import os
import resource
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from localcluster import (Node, Task, TaskFailedError, TaskGroup,
                          WorkspaceType, ops)
from localcluster.errors import Cancelled, SharedMemoryFullError
from localcluster.runtime import shm, shm_map
from localcluster.runtime.cancel import CancelEvent
from localcluster.runtime.shm_channel import ChannelParts, ShmChannel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def open_fds():
    return len(os.listdir("/proc/self/fd"))


# -- descriptors --------------------------------------------------------------

def test_segments_keep_no_descriptor_once_mapped():
    store = shm.ShmStore(shm.session_prefix() + "fds_")
    before = open_fds()
    maps = []
    try:
        for i in range(300):
            store.put(f"b{i}", np.full(4, float(i)))
        maps = [shm.map_segment(store.segment_of(f"b{i}"), inherit=False)
                for i in range(300)]
        assert open_fds() == before
        assert np.frombuffer(maps[123], count=4)[0] == 123.0
        store.put("b7", np.full(4, 70.0))  # in place: seen by the reader
        assert np.frombuffer(maps[7], count=4)[3] == 70.0
    finally:
        for mm in maps:
            mm.close()
        store.close()
    assert open_fds() == before


def _raise_soft_limit(needed):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return None
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return soft, hard


def test_queue_waits_work_on_descriptors_past_1024():
    saved = _raise_soft_limit(1200)
    fillers, parts, channel = [], None, None
    cancel = CancelEvent()
    try:
        # hold the low numbers so that the channel's FIFOs and the
        # cancellation fd are numbered past select()'s limit
        while not fillers or fillers[-1] < 1030:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        parts = ChannelParts(shm.session_prefix() + "qhigh_", 2)
        channel = ShmChannel(parts.desc)
        assert cancel.fileno() >= 1024
        for fd in fillers:
            os.close(fd)
        fillers = []
        # a consumer waits on the empty queue: a cancel wakes it ...
        threading.Timer(0.2, cancel.set).start()
        with pytest.raises(Cancelled):
            channel.get(1, cancelled=cancel)
        channel.begin()
        # ... and so does a record (the FIFO is in the same poll)
        awake = CancelEvent()
        awake.fileno()
        put = threading.Timer(0.2, channel.put, args=((np.ones(3),),))
        put.start()
        records, finished, done = channel.get(1, cancelled=awake)
        put.join(10)
        assert records[0][0].tolist() == [1.0, 1.0, 1.0] and not finished
        done()
        # a producer waits on a full queue alike
        assert channel.put((np.ones(3),)) and channel.put((np.ones(3),))
        threading.Timer(0.2, awake.set).start()
        with pytest.raises(Cancelled):
            channel.put((np.ones(3),), cancelled=awake)
        awake.close()
    finally:
        for fd in fillers:
            os.close(fd)
        cancel.close()
        if channel is not None:
            channel.release()
        if parts is not None:
            parts.close()
        if saved is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, saved)


def test_the_soft_limit_is_raised_before_descriptors_run_out(monkeypatch):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = open_fds() + 40
    if hard != resource.RLIM_INFINITY and hard < low + 200:
        pytest.skip("the hard limit leaves no headroom")
    monkeypatch.setattr(shm_map, "_fd_mark", None)  # judged anew
    made = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        prefix = shm.session_prefix() + "qlimit_"
        # two descriptors each: past 3/4 of the soft limit, not past it --
        # the limit is raised before anything (a pipe, a mapping's
        # duplicate descriptor) can meet it
        for i in range(15):
            made.append(ChannelParts(f"{prefix}{i}_", 1))
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > low
    finally:
        for parts in made:
            parts.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_open_that_meets_the_limit_raises_it_and_tries_again(
        monkeypatch):
    raised = []
    monkeypatch.setattr(shm_map, "_raise_fd_limit",
                        lambda: raised.append(1) or True)
    real_open = os.open
    failures = iter([OSError(errno.EMFILE, "Too many open files")])

    def emfile_once(path, flags, mode=0o777):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", emfile_once)
    fd = shm.open_fd(os.devnull, os.O_RDONLY)
    monkeypatch.undo()
    os.close(fd)
    assert raised == [1]


def test_out_of_descriptors_for_good_says_what_holds_them(monkeypatch):
    monkeypatch.setattr(shm_map, "_raise_fd_limit", lambda: False)
    real_open = os.open

    def emfile(path, flags, mode=0o777):
        if str(path).startswith(shm.SHM_DIR):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", emfile)
    prefix = shm.session_prefix() + "qemfile_"
    with pytest.raises(OSError, match="ulimit -n") as caught:
        ChannelParts(prefix, 1)
    assert caught.value.errno == errno.EMFILE
    monkeypatch.undo()
    assert not shm.segments(prefix)


def test_a_queue_out_of_descriptors_half_made_keeps_that_error(monkeypatch):
    # The control segment is made, then the FIFO's open meets the limit --
    # and with no descriptor left, a listing of /dev/shm fails as well:
    # the parts go by name and the error the user sees is the first one.
    monkeypatch.setattr(shm_map, "_raise_fd_limit", lambda: False)
    real_open = os.open

    def emfile(path, flags, mode=0o777):
        if str(path).endswith("free"):
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    def no_listing(path="."):
        raise OSError(errno.EMFILE, "Too many open files", path)

    monkeypatch.setattr(os, "open", emfile)
    monkeypatch.setattr(os, "listdir", no_listing)
    prefix = shm.session_prefix() + "qhalf_"
    with pytest.raises(OSError, match="ulimit -n"):
        ChannelParts(prefix, 1)
    monkeypatch.undo()
    assert not shm.segments(prefix)


MANY_UNDER_ULIMIT = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    from localcluster import (LocalHostScheduler, Node, Queue, Task,
                              TaskGroup, WorkspaceType, ops)

    session = LocalHostScheduler()
    print(session.shm_prefix, flush=True)
    with TaskGroup(WorkspaceType.GLOBAL) as blobs:
        with Node("many"), Task():
            for i in range(1100):
                ops.ConstantFill([], [f"b{i}"], shape=[2], value=float(i))
    session.run(blobs)
    assert session.fetch_blob("b1099", "many")[0] == 1099.0
    queues = [Queue(2, name=f"q{i}") for i in range(300)]
    with TaskGroup(WorkspaceType.GLOBAL) as handoff:
        with Node("src"), Task():
            ops.ConstantFill([], ["x"], shape=[2], value=5.0)
            for q in queues:
                writer = q.writer()
                writer.write_record(ops.net(), {"x": "x"})
                writer.commit(ops.net())
        with Node("dst"), Task():
            for i, q in enumerate(queues):
                _, record = q.reader().read_record(ops.net())
                ops.Copy([record["x"]], [f"got{i}"])
    for _ in range(2):
        session.run(handoff)
    assert session.fetch_blob("got299", "dst")[0] == 5.0
    session.close()
    print("ok", flush=True)
""")


def test_many_blobs_and_queues_work_under_ulimit_n_1024():
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", MANY_UNDER_ULIMIT],
                          capture_output=True, text=True, timeout=120,
                          env=env)
    lines = done.stdout.split()
    assert done.returncode == 0 and lines[-1:] == ["ok"], done.stderr[-3000:]
    assert not shm.segments(lines[0])


# -- a full /dev/shm ----------------------------------------------------------

@pytest.fixture
def shm_full_from(monkeypatch):
    """``os.posix_fallocate`` fails with ENOSPC from ``limit`` bytes on (in
    this process and the nodes it forks from now on)."""
    real = os.posix_fallocate

    def patch(limit):
        def fallocate(fd, offset, length):
            if length >= limit:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd, offset, length)
        monkeypatch.setattr(os, "posix_fallocate", fallocate)
    return patch


def test_a_full_dev_shm_is_an_error_naming_blob_size_and_free_space(
        shm_full_from):
    shm_full_from(1)
    store = shm.ShmStore(shm.session_prefix() + "full_")
    try:
        with pytest.raises(SharedMemoryFullError) as caught:
            store.put("weights", np.ones(128))
    finally:
        store.close()
    error = caught.value
    assert "'weights'" in str(error) and "1.0 KiB" in str(error)
    assert "free" in str(error)
    assert (error.blob, error.nbytes, error.errno) == \
        ("weights", 1024, errno.ENOSPC)
    assert error.free >= 0 and isinstance(error, OSError)
    assert not shm.segments(store.prefix)
    assert "weights" not in store


def test_a_segment_larger_than_dev_shm_is_refused_before_any_write():
    fs = os.statvfs(shm.SHM_DIR)
    total = fs.f_blocks * fs.f_frsize
    if not total:
        pytest.skip("/dev/shm has no size limit here")
    name = shm.session_prefix() + "huge"
    try:
        with pytest.raises(SharedMemoryFullError, match="it needs"):
            shm.create_segment(name, 2 * total)
        assert not os.path.exists(os.path.join(shm.SHM_DIR, name))
    finally:
        shm.unlink(name)


def test_a_full_dev_shm_fails_the_op_in_a_node_and_feed_blob_in_the_master(
        localhost, shm_full_from):
    shm_full_from(1 << 20)
    session = localhost(nodes=["n"])  # forked after the patch
    pid = session.node_pids()["n"]
    with TaskGroup(WorkspaceType.GLOBAL) as big:
        with Node("n"), Task():
            ops.ConstantFill([], ["big"], shape=[1 << 18], value=1.0)
    with pytest.raises(TaskFailedError) as caught:
        session.run(big)
    assert caught.value.cause_type == "SharedMemoryFullError"
    assert "'big'" in str(caught.value) and "2.0 MiB" in str(caught.value)
    with pytest.raises(SharedMemoryFullError, match="'w'"):
        session.feed_blob("w", np.zeros(1 << 18), node="n")
    # the node lives on (no SIGBUS) and keeps working
    session.feed_blob("w", np.arange(3.0), node="n")
    with TaskGroup(WorkspaceType.GLOBAL) as small:
        with Node("n"), Task():
            ops.Scale(["w"], ["w2"], scale=2.0)
    session.run(small)
    assert session.fetch_blob("w2", "n").tolist() == [0.0, 2.0, 4.0]
    assert session.node_pids()["n"] == pid
    assert "big" not in session.blobs("n")
