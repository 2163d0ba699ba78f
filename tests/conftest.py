"""Shared fixtures: the session matrix, leak checks, hypothesis profiles.

Every test that takes the ``session`` fixture runs once per session kind
in ``SESSION_KINDS`` -- the shared suite that pins the semantics every
session must have.  The autouse ``no_leaks`` fixture fails a test that
leaves a child process or a shared-memory segment of ours behind.
"""

import os

import psutil
import pytest
from hypothesis import HealthCheck, settings

from localcluster import LocalHostScheduler, LocalSession

settings.register_profile(
    "ci", max_examples=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "dev", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get(
    "HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

#: name -> factory of every session kind the shared suite runs against
SESSION_KINDS = {
    "local": LocalSession,
    "localhost": LocalHostScheduler,
}

SHM_DIR = "/dev/shm"
SHM_PREFIX = "lc_"


def shm_segments():
    """Segments in /dev/shm of sessions this test process started (other
    processes on the machine may have theirs; tests that start a master in
    a subprocess check its prefix themselves)."""
    mine = f"{SHM_PREFIX}{os.getpid()}_"
    try:
        return {n for n in os.listdir(SHM_DIR) if n.startswith(mine)}
    except FileNotFoundError:
        return set()


def _is_helper(proc):
    """multiprocessing's own helpers (forkserver, resource tracker) live as
    long as the test process; they are not ours to reap."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return ("from multiprocessing.forkserver import" in cmdline or
            "from multiprocessing.resource_tracker import" in cmdline)


def child_processes():
    """Our live child processes (zombies and multiprocessing helpers aside)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not _is_helper(p):
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(params=sorted(SESSION_KINDS))
def session_factory(request):
    """A factory of sessions of one kind; every session it made is closed
    at teardown."""
    made = []

    def make(*args, **kwargs):
        s = SESSION_KINDS[request.param](*args, **kwargs)
        made.append(s)
        return s

    make.kind = request.param
    yield make
    for s in made:
        s.close()


@pytest.fixture
def session(session_factory):
    """An open session of each kind in SESSION_KINDS."""
    return session_factory()


def _closing_factory(cls):
    """A fixture body: ``make(**kwargs)`` -> ``cls(**kwargs)``; every
    session it made is closed at teardown (close() is idempotent, so a test
    may close one itself)."""
    made = []

    def make(*args, **kwargs):
        s = cls(*args, **kwargs)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def localhost():
    """A factory of `LocalHostScheduler`: ``localhost(**kwargs)``; every
    scheduler it made is closed at teardown."""
    yield from _closing_factory(LocalHostScheduler)


@pytest.fixture
def local():
    """A factory of `LocalSession`: ``local()``; every session it made is
    closed at teardown."""
    yield from _closing_factory(LocalSession)


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves child processes or shm segments behind."""
    before = shm_segments()
    yield
    left = child_processes()
    assert not left, f"child processes left behind: {left}"
    leaked = shm_segments() - before
    assert not leaked, f"shared-memory segments left behind: {leaked}"
