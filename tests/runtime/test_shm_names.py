"""Names in /dev/shm, which anyone may write to: the sweep of dead masters'
segments skips what it may not remove and judges owners exactly (a zombie
is dead, a reused pid is not the owner); the names a session makes cannot
be taken in advance."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from localcluster import Node, Queue, Task, TaskGroup, WorkspaceType, ops
from localcluster.runtime import shm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def shm_path(name):
    return os.path.join(shm.SHM_DIR, name)


def never_a_pid():
    with open("/proc/sys/kernel/pid_max") as f:
        return int(f.read()) + 1000


def start_ticks(pid):
    """A process's start time, clock ticks since boot."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return int(data[data.rindex(b")") + 2:].split()[19])


def state_of(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:].split()[0].decode()


def touch(name):
    with open(shm_path(name), "wb") as f:
        f.write(b"x")


def swept(name, removed):
    """Whether a sweep removed ``name`` -- this one, or another process's
    (any new scheduler on the machine sweeps this user's stale entries)."""
    return name in removed or not os.path.lexists(shm_path(name))


def remove(name):
    path = shm_path(name)
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)


@pytest.fixture
def zombie():
    """The pid of a child that exited and is not reaped yet (reaped at
    teardown).  Sweeps of older versions took a zombie for alive, so what
    is named after it here is left alone by any of them that runs on the
    machine meanwhile."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 20
        while state_of(child.pid) != "Z":
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        yield child.pid
    finally:
        child.wait(10)


# -- the sweep ----------------------------------------------------------------

def test_the_sweep_skips_directories_and_other_users_entries(localhost,
                                                             zombie):
    directory = f"lc_{never_a_pid()}_s1_0badc0de_dir"
    others = f"lc_{zombie}_s{start_ticks(zombie)}_0badc0de_other"
    os.mkdir(shm_path(directory), 0o700)
    touch(others)
    try:
        if os.geteuid() == 0:
            os.chown(shm_path(others), 65534, 65534)  # nobody's
        localhost()  # every new scheduler sweeps first
        done = subprocess.run(
            [sys.executable, "-m", "localcluster.run", "--cleanup"],
            capture_output=True, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=ROOT))
        assert done.returncode == 0, done.stderr
        assert os.path.isdir(shm_path(directory))
        if os.geteuid() == 0:
            # root may remove it, but a user's sweep is for its own
            assert os.path.exists(shm_path(others))
    finally:
        remove(directory)
        remove(others)


def test_a_segment_that_may_not_be_removed_is_skipped(monkeypatch):
    name = f"lc_{never_a_pid()}_s1_0badc0de_1"
    touch(name)
    real_unlink = os.unlink

    def refuse(path, *args, **kwargs):
        if os.path.basename(str(path)) == name:
            raise PermissionError(1, "Operation not permitted", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    try:
        # (no look at the file afterwards: another process's sweep may
        # remove it meanwhile -- it is a dead master's)
        assert name not in shm.sweep_stale()
    finally:
        monkeypatch.undo()
        remove(name)


def test_a_zombie_master_is_dead(zombie):
    name = f"lc_{zombie}_s{start_ticks(zombie)}_0badc0de_1"
    touch(name)
    try:
        assert swept(name, shm.sweep_stale())
    finally:
        remove(name)


def test_a_pid_taken_by_a_later_process_is_not_the_owner():
    later = subprocess.Popen([sys.executable, "-c",
                              "import time; time.sleep(60)"])
    names = []
    try:
        started = start_ticks(later.pid)
        # made by an earlier master under the same pid, a second before
        # this process started (the file itself is fresh)
        earlier = f"lc_{later.pid}_s{started - 100}_0badc0de_1"
        # and one the live process made itself: kept
        own = f"lc_{later.pid}_s{started}_0badc0de_2"
        names = [earlier, own]
        for name in names:
            touch(name)
        removed = shm.sweep_stale()
        assert swept(earlier, removed)
        assert own not in removed and os.path.exists(shm_path(own))
    finally:
        later.kill()
        later.wait(10)
        for name in names:
            remove(name)


def test_names_without_a_start_time_are_judged_by_their_mtime():
    live = subprocess.Popen([sys.executable, "-c",
                             "import time; time.sleep(60)"])
    old, new = (f"lc_{live.pid}_0badc0de_old", f"lc_{live.pid}_0badc0de_new")
    try:
        touch(old)
        touch(new)
        an_hour_ago = time.time() - 3600
        os.utime(shm_path(old), (an_hour_ago, an_hour_ago))
        removed = shm.sweep_stale()
        assert swept(old, removed) and new not in removed
    finally:
        live.kill()
        live.wait(10)
        remove(old)
        remove(new)


# -- names nobody can take first ----------------------------------------------

def test_a_taken_name_is_retried_with_another(monkeypatch):
    prefix = shm.session_prefix() + "taken_"
    tokens = iter(["aaaa", "aaaa", "bbbb"])
    monkeypatch.setattr(shm.secrets, "token_hex", lambda n: next(tokens))
    touch(prefix + "aaaa")
    try:
        name, mm = shm.create_unique(prefix, 16)
        assert name == prefix + "bbbb"
        mm.close()
    finally:
        shm.sweep(prefix)


def test_names_taken_in_advance_do_not_stop_a_session(localhost):
    session = localhost()
    prefix = session.shm_prefix
    # what a session made after its prefix was seen in /dev/shm: each
    # node's blobs, fed blobs, control word and outputs counted up,
    # channels counted up
    taken = ([f"{prefix}{node}_{i}" for node in (0, 1) for i in
              range(1, 20)] +
             [f"{prefix}{node}_ctl" for node in (0, 1)] +
             [f"{prefix}{node}_out{i}" for node in (0, 1) for i in (1, 2)] +
             [f"{prefix}{node}_m{i}" for node in (0, 1) for i in range(5)] +
             [f"{prefix}q{i}_{part}" for i in range(3)
              for part in ("ctl", "free", "full")])
    for name in taken[1:]:
        touch(name)
    os.mkdir(shm_path(taken[0]), 0o700)
    try:
        queue = Queue(2, name="taken")
        with TaskGroup(WorkspaceType.GLOBAL) as group:
            with Node("src"), Task():
                ops.Scale(["w"], ["x"], scale=3.0)
                writer = queue.writer()
                writer.write_record(ops.net(), {"x": "x"})
                writer.commit(ops.net())
            with Node("dst"), Task():
                _, record = queue.reader().read_record(ops.net())
                ops.Copy([record["x"]], ["got"])
        session.start_nodes(["src", "dst"])
        session.feed_blob("w", np.arange(4.0), node="src")
        session.run(group)
        assert session.fetch_blob("got", "dst").tolist() == [0, 3, 6, 9]
    finally:
        remove(taken[0])
        session.close()  # sweeps the files taken in its name, too
