"""The checks' fresh-process helper answers a child's end at once: it
waits on its requests and its children's process descriptors together,
never looking again after a fixed sleep."""

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import localcluster

#: runs the helper's loop with ``select.select`` watched, on one request
#: whose payload cannot be unpickled (the child answers with the error)
SERVE = """
import json, select, sys
real = select.select
timeouts = []
def watched(r, w, x, timeout=None):
    timeouts.append(timeout)
    return real(r, w, x, timeout)
select.select = watched
from localcluster.testing import _check_fresh
_check_fresh.serve()
print(json.dumps(timeouts), file=sys.stderr)
"""


def test_the_helper_waits_on_its_children_without_polling(tmp_path):
    out = tmp_path / "result.pkl"
    data = str(out).encode() + b"\0\0" + b"not a pickle"
    frame = struct.pack("<QQ", 7, len(data)) + data
    root = os.path.dirname(os.path.dirname(localcluster.__file__))
    env = dict(os.environ, PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", SERVE], input=frame,
                          capture_output=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == b"done 7\n"
    timeouts = json.loads(done.stderr.decode().strip().splitlines()[-1])
    # every wait is on descriptors: the request pipe and the child's
    assert timeouts and all(t is None for t in timeouts), timeouts
    assert out.stat().st_size > 0     # the child wrote its answer


# -- what a run's answer carries back -----------------------------------------

def _trained(fresh, build, directory):
    return fresh.collect(fresh.submit(
        build, "local", {}, str(directory), resume=None, max_restarts=0,
        max_epochs=None, timeout=60))


def test_an_array_the_helper_was_given_comes_back_as_its_number(tmp_path):
    from _jobs import table_job
    from localcluster.testing._check_fresh import KNOWN_BYTES, FreshProcesses
    with FreshProcesses() as fresh:
        first = _trained(fresh, table_job, tmp_path / "first")
        table = first["blobs"]["a"]["table"]
        assert table.nbytes >= KNOWN_BYTES
        fresh.know(first["blobs"])
        before = fresh.received
        again = _trained(fresh, table_job, tmp_path / "again")
        # the run's answer is its small blobs and a number, not the table
        assert fresh.received - before < table.nbytes // 8
        got = again["blobs"]["a"]["table"]
        assert got is not table and got.dtype == table.dtype
        assert got.tobytes() == table.tobytes()
        assert again["blobs"]["a"]["w"] == first["blobs"]["a"]["w"]
        got[:] = -1      # a copy of its own: what the helper holds is not
        third = _trained(fresh, table_job, tmp_path / "third")
        assert third["blobs"]["a"]["table"].tobytes() == table.tobytes()


def test_an_array_that_differs_in_one_byte_comes_back_whole(tmp_path):
    from _jobs import table_job
    from localcluster.testing._check_fresh import FreshProcesses
    with FreshProcesses() as fresh:
        first = _trained(fresh, table_job, tmp_path / "first")
        table = first["blobs"]["a"]["table"]
        near = table.copy()
        near.view(np.uint8)[-1] ^= 1     # its last byte, one bit
        fresh.know({"a": {"table": near}})
        before = fresh.received
        again = _trained(fresh, table_job, tmp_path / "again")
        assert fresh.received - before > table.nbytes
        assert again["blobs"]["a"]["table"].tobytes() == table.tobytes()


def test_the_checks_give_the_helper_their_uninterrupted_runs(tmp_path):
    from _jobs import table_job
    from localcluster.testing._check_runs import Runs
    runs = Runs(table_job)
    try:
        ref = runs.reference("local")
        before = runs.fresh.received
        out = runs.run("local", "again")
        assert runs.fresh.received - before < \
            ref.blobs["a"]["table"].nbytes // 8
        assert out.blobs["a"]["table"].tobytes() == \
            ref.blobs["a"]["table"].tobytes()
    finally:
        runs.close()


# -- reading requests ---------------------------------------------------------

def test_the_helper_reads_a_big_frame_into_one_buffer():
    """A frame of arrays is megabytes: read in pipe-sized chunks added
    up, it was copied hundreds of times (page faults: its size squared
    over the chunk's, where one buffer faults about its size once)."""
    import resource
    import threading
    from localcluster.testing._check_fresh import _exactly
    size = 16 << 20
    payload = bytes(range(256)) * (size // 256)
    r, w = os.pipe()

    def write():
        with os.fdopen(w, "wb") as f:
            f.write(payload)

    writer = threading.Thread(target=write)
    writer.start()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        got = _exactly(r, size)
    finally:
        writer.join()
        os.close(r)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert got == payload
    assert faults < 4 * size // 4096, faults


# -- the helper's environment -------------------------------------------------

def _helper_environ(fresh):
    import time
    fresh._start()
    deadline = time.monotonic() + 30
    while b"serve()" not in open(f"/proc/{fresh._proc.pid}/cmdline",
                                 "rb").read():   # not yet the helper
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with open(f"/proc/{fresh._proc.pid}/environ", "rb") as f:
        return dict(item.split(b"=", 1) for item in f.read().split(b"\0")
                    if b"=" in item)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_the_helper_tells_openblas_idle_threads_to_sleep_at_once(
        monkeypatch):
    """Its runs' idle BLAS threads spun a tenth of a second after every
    split call, taking the other run's core: the helper starts with a
    short OPENBLAS_THREAD_TIMEOUT, unless the caller chose one."""
    from localcluster.testing._check_fresh import FreshProcesses
    monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    with FreshProcesses() as fresh:
        assert _helper_environ(fresh)[b"OPENBLAS_THREAD_TIMEOUT"] == b"4"
    monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", "20")
    with FreshProcesses() as fresh:
        assert _helper_environ(fresh)[b"OPENBLAS_THREAD_TIMEOUT"] == b"20"


# -- what a child imports and draws -------------------------------------------

#: the helper's loop with every import of numpy.random logged with the pid
#: that made it
IMPORTS = """
import os, sys
class Logged:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy.random":
            print("imported", os.getpid(), file=sys.stderr, flush=True)
        return None
sys.meta_path.insert(0, Logged())
print("helper", os.getpid(), file=sys.stderr, flush=True)
from localcluster.testing import _check_fresh
_check_fresh.serve()
"""


def test_a_child_finds_numpys_random_imported_by_the_helper(tmp_path):
    import pickle
    from _jobs import global_draw_job
    from localcluster.testing._check_fresh import _warning_filters
    out = tmp_path / "result.pkl"
    data = str(out).encode() + b"\0_jobs\0" + pickle.dumps(
        (global_draw_job, "local", {}, str(tmp_path / "ckpt"), None, 0,
         None, 60, _warning_filters()))
    frame = struct.pack("<QQ", 3, len(data)) + data
    root = os.path.dirname(os.path.dirname(localcluster.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root, os.path.dirname(__file__)]))
    done = subprocess.run([sys.executable, "-c", IMPORTS], input=frame,
                          capture_output=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == b"done 3\n"
    ok, got = pickle.loads(out.read_bytes())
    assert got["error"] is None, got["error"]
    lines = [line.split() for line in done.stderr.decode().splitlines()]
    helper = [pid for word, pid in (l[:2] for l in lines if l)
              if word == "helper"]
    imported = [pid for word, pid in (l[:2] for l in lines if l)
                if word == "imported"]
    # once, before any fork: no run pays for it again
    assert imported == helper, lines


def test_each_child_draws_from_a_fresh_seed_unless_the_module_seeded(
        tmp_path):
    from _jobs import global_draw_job
    from _seeded_jobs import seeded_draw_job as seeded
    from localcluster.testing._check_fresh import FreshProcesses
    with FreshProcesses() as fresh:
        one = _trained(fresh, global_draw_job, tmp_path / "one")
        two = _trained(fresh, global_draw_job, tmp_path / "two")
    assert not np.array_equal(one["blobs"]["a"]["x"], two["blobs"]["a"]["x"])
    with FreshProcesses() as fresh:
        one = _trained(fresh, seeded, tmp_path / "s1")
        two = _trained(fresh, seeded, tmp_path / "s2")
    np.testing.assert_array_equal(one["blobs"]["a"]["x"],
                                  two["blobs"]["a"]["x"])


def test_bytes_are_compared_a_chunk_at_a_time_to_the_last_bit():
    from localcluster.testing._check_fresh import _CHUNK, _same_bytes
    value = np.random.default_rng(0).random((3 * _CHUNK + 24) // 8)
    kept = np.frombuffer(value.tobytes(), np.uint8)
    assert _same_bytes(value, kept)
    for at in (0, _CHUNK - 1, _CHUNK, 2 * _CHUNK + 5, value.nbytes - 1):
        near = value.copy()
        near.view(np.uint8)[at] ^= 0x80
        assert not _same_bytes(near, kept), at
    assert not _same_bytes(value[:-1], kept)
    nan = np.full(_CHUNK, np.nan)      # bytes, not values: NaN is NaN
    assert _same_bytes(nan, np.frombuffer(nan.tobytes(), np.uint8))


#: at the start of each Python process (the helper is one; its children
#: are forks): every import of $LOGGED is logged with the pid making it
LOGGING_SITE = """
import os, sys
class Logged:
    def find_spec(self, name, path=None, target=None):
        if name == os.environ.get("LOGGED"):
            print("imported", os.getpid(), file=sys.stderr, flush=True)
        return None
sys.meta_path.insert(0, Logged())
print("started", os.getpid(), file=sys.stderr, flush=True)
"""


def test_the_helper_imports_a_command_line_jobs_module_before_forking(
        tmp_path, monkeypatch, capfd):
    from localcluster.cli.check import CommandLineJob
    from localcluster.testing._check_fresh import FreshProcesses
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(LOGGING_SITE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("LOGGED", "localcluster.examples.regression")
    build = CommandLineJob("localcluster.examples.regression:build",
                           epochs=1, threads=1)
    with FreshProcesses() as fresh:
        for name in ("one", "two"):
            got = _trained(fresh, build, tmp_path / name)
            assert got["error"] is None, got["error"]
    lines = [line.split() for line in capfd.readouterr().err.splitlines()]
    started = [l[1] for l in lines if l[:1] == ["started"]]
    imported = [l[1] for l in lines if l[:1] == ["imported"]]
    # once, in the helper: not again in each run's child
    assert len(started) == 1 and imported == started, lines
    assert build.fresh_imports == ("localcluster.examples.regression",)
    file_job = CommandLineJob.__new__(CommandLineJob)
    file_job.spec = "jobs/mine.py:build"    # loaded afresh in every run
    assert file_job.fresh_imports == ()
