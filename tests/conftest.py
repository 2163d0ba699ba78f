"""Shared fixtures: the session matrix, leak checks, hypothesis profiles.

The suite uses the project's own pytest plugin (`localcluster.testing.
pytest_plugin`, which installing the package registers through its
``pytest11`` entry point -- README's test command installs it): its
session kinds make the matrix, and its leak check runs after every
test.  Every test that takes the ``session`` fixture runs once per
session kind -- the shared suite that pins the semantics every session
must have.  The autouse ``no_leaks`` fixture fails a test
that leaves a child process, a shared-memory segment or a session's
descriptor behind.  README's command runs the suite on two workers
(``-n 2``, pytest-xdist: `pytest_xdist_make_scheduler`); each worker is a
process of its own, with its own shared Ray, and the leak checks look at
the worker's own children, segments and descriptors.
"""

import contextlib
import functools
import os
import re
import time

import psutil
import pytest
from hypothesis import HealthCheck, settings

from localcluster import Cluster, LocalHostScheduler, LocalSession, context
from localcluster.testing.pytest_plugin import (Snapshot, leaks_since,
                                                live_children, on_ray,
                                                session_kinds, warm_ray)

pytest_plugins = ["pytester"]

settings.register_profile(
    "ci", max_examples=30, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "dev", max_examples=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get(
    "HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

#: the Ray session's warm actors for the module running now (see ray_pool)
RAY = {"pool": None, "own": set()}


def _ray_session(*args, **kwargs):
    from localcluster.sessions.ray import RaySession
    assert RAY["pool"] is not None, "a ray test outside the ray_pool fixture"
    return RaySession(*args, pool=RAY["pool"], **kwargs)


#: name -> factory of every session kind the shared suite runs against
#: (ray when the extra is installed: on one local Ray per test module,
#: its node actors kept warm between the module's sessions)
SESSION_KINDS = {k: v for k, v in session_kinds().items()
                 if k in ("local", "localhost")}
if "ray" in session_kinds():
    SESSION_KINDS["ray"] = _ray_session


def pytest_collection_modifyitems(config, items):
    """The ray leg of a test marked ``not_on_ray(reason)`` is not run (the
    list of such tests is short: grep for the marker, each says why)."""
    dropped = []
    for item in items:
        marker = item.get_closest_marker("not_on_ray")
        if marker is None or not on_ray(item):
            continue
        assert marker.kwargs.get("reason") or marker.args, \
            f"{item.nodeid}: not_on_ray needs a reason"
        dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in gone]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n N`` (README's command): each test is a unit of work the
    next free worker takes, but a module marked ``own_ray`` goes whole to
    one worker -- it starts a Ray of its own for the module, once.  (A
    worker starts the shared Ray of the ray kind for itself; two Rays
    started by ``ray.init`` never join each other.)  Another ``--dist``
    is xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = str(config.rootpath)

    class TestsOrWholeRayModules(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return module if _owns_ray(os.path.join(root, module)) \
                else nodeid

    return TestsOrWholeRayModules(config, log)


@functools.lru_cache(maxsize=None)
def _owns_ray(path):
    """Whether the test module at ``path`` is marked ``own_ray`` (read
    from its source: the workers' controller collects nothing)."""
    try:
        with open(path, encoding="utf-8") as f:
            return re.search(r"pytest\.mark\.own_ray\b", f.read()) \
                is not None
    except OSError:
        return False


#: one local Ray the modules that run the ray kind share: started by the
#: first of them, kept up for the next (a start takes about 3 s; one per
#: module was 23 starts a run), shut down before a module marked
#: ``own_ray`` (it calls ``ray.init`` in this process, which Ray allows
#: once) and at the end of the run
_SHARED = {"stack": None, "pool": None}


def _shared_ray():
    if _SHARED["stack"] is None:
        stack = contextlib.ExitStack()
        _SHARED["pool"] = stack.enter_context(
            warm_ray(num_cpus=2, log_to_driver=False))
        _SHARED["stack"] = stack
    return _SHARED["pool"]


def _stop_shared_ray():
    stack = _SHARED["stack"]
    _SHARED["stack"] = _SHARED["pool"] = None
    if stack is not None:
        stack.close()


@pytest.fixture(scope="session", autouse=True)
def _shared_ray_ends():
    yield
    _stop_shared_ray()


@pytest.fixture(scope="module", autouse=True)
def ray_pool(request):
    """The shared local Ray (`_SHARED`) while a module runs, if it is up,
    and its pool of warm node actors the sessions take and give back
    (starting an actor takes most of a second); it is started by the
    module's first test under the ray kind (`ray_for_test`) and stopped
    before a module marked ``own_ray``.  While it is up, Ray's processes
    and the pool's actors are no test's leak, in any module.  (A module
    whose commands start a Ray in a child process needs no mark: that Ray
    is the child's, and ``ray.init`` never joins another by itself.)"""
    if request.node.get_closest_marker("own_ray") is not None:
        _stop_shared_ray()
    _expose(_SHARED["pool"])
    try:
        yield
    finally:
        _expose(None)


def _expose(pool):
    RAY["pool"] = pool
    RAY["own"] = set(live_children()) if pool is not None else set()


@pytest.fixture(autouse=True)
def ray_for_test(request, ray_pool):
    """Start the shared Ray for a test under the ray kind, if it is not up
    (before the test's leak check looks: see `no_leaks`).  Started here,
    not for every module that has such tests: a run that selects none of
    a module's ray leg (``-k``, a node id) starts no Ray for it."""
    if on_ray(request.node) and RAY["pool"] is None:
        _expose(_shared_ray())


def child_processes():
    """Our live child processes (zombies, multiprocessing's helpers, the
    module's Ray and its pool's idle actors, and each open scheduler's
    node watcher and zygotes aside: a test counts node processes)."""
    pool = RAY["pool"]
    keep = RAY["own"] | (pool.pids() if pool is not None else set())
    return [p for pid, p in live_children().items()
            if pid not in keep and not _watcher(p) and not zygote(p)]


def running(proc):
    """Not gone, and not a zombie waiting for whoever adopted it."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_and_wait(master, procs, bound=10):
    """SIGKILL ``master``; ``(seconds until none of procs ran, those still
    running after ``bound`` seconds)``."""
    master.kill()
    master.wait(10)
    start = time.monotonic()
    alive = list(procs)
    while alive and time.monotonic() - start < bound:
        alive = [p for p in alive if running(p)]
        time.sleep(0.01)
    return time.monotonic() - start, alive


def zygote(proc):
    """A LocalHostScheduler's zygote: the parent of a batch of nodes."""
    try:
        # joined: a title longer than the process's first arguments is
        # read back split at its spaces
        return " ".join(proc.cmdline()).startswith("localcluster zygote")
    except psutil.Error:
        return False


def _watcher(proc):
    """A LocalHostScheduler's node watcher (gone with its scheduler: the
    plugin's leftover check still counts it)."""
    try:
        return any(arg.endswith("_groupwatch.py") for arg in proc.cmdline())
    except psutil.Error:
        return False


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
def own_cluster():
    """Every test builds its nodes in a Cluster of its own: the default
    Cluster is the process's, and remembers every node declared in it --
    one test's ``Node("trainer", num_instances=3)`` or ``resources=``
    would make the next test's ``Node("trainer")`` a prototype that asks
    for them too (as one job's declarations do for the rest of that job).
    (Not ``with Cluster():``, which would make the whole test one build
    scope, so that a job built twice would not get the same names.)"""
    defaults = context._local.defaults
    kept = defaults.pop(Cluster, None)
    try:
        yield
    finally:
        defaults.pop(Cluster, None)
        if kept is not None:
            defaults[Cluster] = kept


@pytest.fixture(autouse=True)
def no_leaks(ray_for_test):
    """Fail a test that leaves child processes, shm segments or session
    descriptors behind (the plugin's leak check, after every test; taken
    after the shared Ray, if the test needs it, is up)."""
    before = Snapshot()
    yield
    pool = RAY["pool"]
    found = leaks_since(before, keep=pool.pids() if pool else ())
    assert not found, "left behind:\n  " + "\n  ".join(found)
