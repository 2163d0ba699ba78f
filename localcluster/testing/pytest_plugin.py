"""The pytest plugin: sessions as fixtures, and a marker that fails a test
which leaves a session's processes, segments or descriptors behind.

Installed with the package (the ``pytest11`` entry point), so a test file
anywhere can use::

    def test_my_group(any_session):            # once per session kind
        any_session.run(build_my_group())

    @pytest.mark.localcluster(leak_check=True, timeout=30)
    def test_my_job(localhost_scheduler): ...

- Fixtures ``local_session`` (a `LocalSession`), ``localhost_scheduler``
  (a `LocalHostScheduler`) and ``any_session`` (parametrised over every
  installed session kind: ``local``, ``localhost``, and ``ray`` when Ray
  is installed), each open for the test and closed after it, failed or
  not.  ``--localcluster-sessions local,localhost`` narrows
  ``any_session``.  Under ``ray``, a test module gets one Ray (started
  for it unless one runs already) and a pool of warm node actors its
  sessions share (`warm_ray`): an actor takes most of a second to start.
- The marker ``@pytest.mark.localcluster(leak_check=True, timeout=None)``.
  ``leak_check``: after the test and its fixtures are torn down, what it
  left that a session makes -- a child process (not a zombie, not one of
  multiprocessing's own helpers), a shared-memory segment of this process
  (``/dev/shm/lc_<pid>_*``), a descriptor on a pipe, socket, eventfd or
  /dev/shm file (but sockets while Ray is initialised here: its driver
  keeps channels to its workers as it pleases; and the pool's idle
  actors) -- fails it, naming each.  Processes get a moment to exit; what leaked is then killed and unlinked (descriptors are named
  only: closing them could close what an object still holds), so one bad
  test does not spoil the next.  ``timeout``: the test fails once it has
  run that many seconds (pytest-timeout enforces it if installed, else a
  SIGALRM in the main thread).
"""

import contextlib
import multiprocessing
import os
import select
import signal
import sys
import time

import psutil
import pytest

__all__ = ["session_kinds", "Snapshot", "leaks_since", "live_children",
           "warm_ray", "runs_ray", "on_ray"]

#: seconds a child process a test left gets to exit before it counts
EXIT_GRACE = 2.0
#: what a descriptor of a session points at
SESSION_FDS = ("pipe:", "socket:", "anon_inode:", "/dev/shm/")


# -- session kinds ------------------------------------------------------------

def session_kinds():
    """``{kind: factory}`` of every installed session kind, as the one
    registry (`localcluster.sessions.kinds`) lists them: an engine's kind
    when its module and the engine are there -- found, not imported:
    pytest starts without importing Ray.  (Loading the plugin imports
    nothing of the package: the registry is imported when first asked.)"""
    from localcluster.sessions.kinds import installed_kinds
    return installed_kinds()


def _selected(config):
    kinds = session_kinds()
    given = config.getoption("localcluster_sessions")
    if not given:
        return list(kinds)
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in kinds]
    if unknown or not names:
        raise pytest.UsageError(
            f"--localcluster-sessions: {', '.join(unknown) or repr(given)} "
            f"is no installed session kind; give a comma list of "
            f"{', '.join(kinds)}")
    return names


# -- hooks --------------------------------------------------------------------

def pytest_addoption(parser):
    group = parser.getgroup("localcluster")
    group.addoption("--localcluster-sessions", default=None,
                    metavar="KINDS",
                    help="session kinds any_session runs under, a comma "
                         "list (default: every installed one: "
                         "local,localhost[,ray])")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "localcluster(leak_check=True, timeout=None): fail the "
        "test if it leaves a session's child process, shared-memory "
        "segment or descriptor behind, or runs longer than timeout seconds")
    _selected(config)   # a bad --localcluster-sessions is a usage error


def pytest_generate_tests(metafunc):
    if "any_session" in metafunc.fixturenames:
        kinds = _selected(metafunc.config)
        metafunc.parametrize("any_session", kinds, indirect=True, ids=kinds)


def pytest_collection_modifyitems(config, items):
    """With pytest-timeout installed, it enforces the marker's timeout."""
    if not config.pluginmanager.hasplugin("timeout"):
        return
    for item in items:
        marker = item.get_closest_marker("localcluster")
        timeout = marker.kwargs.get("timeout") if marker else None
        if isinstance(timeout, (int, float)) and \
                not isinstance(timeout, bool) and timeout > 0:
            item.add_marker(pytest.mark.timeout(timeout))


# -- fixtures -----------------------------------------------------------------

def _open(kind):
    if kind == "ray":   # the module's warm actors (see _localcluster_ray)
        return session_kinds()[kind](pool=_RAY["pool"])
    return session_kinds()[kind]()


#: the warm actors of the module running now (see `warm_ray`)
_RAY = {"pool": None}


@contextlib.contextmanager
def warm_ray(**ray_init_kwargs):
    """Ray for a while (started here unless this process runs one; shut
    down after, if so) and an `ActorPool` of warm node actors for the
    sessions made meanwhile (``RaySession(pool=pool)``); the driver's
    connections to the cluster, which open on its first actor, are made
    here too, so they are not a test's leak."""
    from ..sessions.ray import ActorPool, RaySession, connect, shutdown
    owned = connect(**ray_init_kwargs)
    try:
        with ActorPool() as pool:
            with RaySession(pool=pool) as warm:
                warm.start_nodes(["warm"])
            yield pool
    finally:
        if owned:
            shutdown()


def runs_ray(module, items):
    """Whether a test of ``module`` among ``items`` is parametrised with
    the ray kind."""
    return any(getattr(item, "module", None) is module and on_ray(item)
               for item in items)


def on_ray(item):
    """Whether test ``item`` is parametrised with the ray kind."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and v == "ray" for v in params.values())


@pytest.fixture(scope="module")
def _localcluster_ray(request):
    """Ray and warm actors for a module whose tests take ``any_session``
    under the ray kind (module-scoped: set up before a test's leak check
    looks)."""
    if not runs_ray(request.module, request.session.items):
        yield None
        return
    with warm_ray() as pool:
        _RAY["pool"] = pool
        try:
            yield pool
        finally:
            _RAY["pool"] = None


def _pool_pids():
    pool = _RAY["pool"]
    return pool.pids() if pool is not None else ()


@pytest.fixture
def local_session(_localcluster_marker):
    """An open `LocalSession`, closed after the test."""
    session = _open("local")
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def localhost_scheduler(_localcluster_marker):
    """An open `LocalHostScheduler`, closed after the test."""
    session = _open("localhost")
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def any_session(request, _localcluster_ray, _localcluster_marker):
    """An open session of each installed kind (``--localcluster-sessions``
    narrows them), closed after the test."""
    session = _open(request.param)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(autouse=True)
def _localcluster_marker(request):
    """The marker's checks.  Autouse, and the session fixtures depend on
    it, so it is set up before and torn down after them: the sessions are
    closed by the time it looks."""
    marker = request.node.get_closest_marker("localcluster")
    if marker is None:
        yield
        return
    leak_check, timeout = _options(marker)
    before = Snapshot() if leak_check else None
    alarm = None
    if timeout is not None and \
            not request.config.pluginmanager.hasplugin("timeout"):
        alarm = _Alarm(timeout)
    try:
        yield
    finally:
        if alarm is not None:
            alarm.cancel()
    if before is not None:
        found = leaks_since(before, keep=_pool_pids())
        if found:
            pytest.fail("the test left behind what a session makes:\n  "
                        + "\n  ".join(found), pytrace=False)


def _options(marker):
    """``(leak_check, timeout)`` of a ``localcluster`` marker; a marker
    given something else fails its test (only), saying what it takes."""
    unknown = set(marker.kwargs) - {"leak_check", "timeout"}
    if marker.args or unknown:
        pytest.fail(f"@pytest.mark.localcluster takes leak_check= and "
                    f"timeout=, got {marker.args or ''}"
                    f"{sorted(unknown) or ''}", pytrace=False)
    timeout = marker.kwargs.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, (int, float)) or
                                timeout <= 0):
        pytest.fail(f"@pytest.mark.localcluster(timeout=) must be seconds "
                    f"> 0, got {timeout!r}", pytrace=False)
    return bool(marker.kwargs.get("leak_check", True)), timeout


class _Alarm:
    """Fail the test (in the main thread) once ``seconds`` have passed."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.old = None
        try:
            self.old = signal.signal(signal.SIGALRM, self._ring)
        except ValueError:   # not the main thread: nothing to interrupt
            return
        signal.setitimer(signal.ITIMER_REAL, seconds)

    def _ring(self, signum, frame):
        pytest.fail(f"the test ran longer than its "
                    f"@pytest.mark.localcluster(timeout={self.seconds})",
                    pytrace=True)

    def cancel(self):
        if self.old is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.old)
            self.old = None


# -- leaks --------------------------------------------------------------------

def _helper(proc):
    """multiprocessing's own helpers live as long as this process, and
    Ray keeps idle workers of its own while it runs."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return ("multiprocessing.forkserver" in cmdline or
            "multiprocessing.resource_tracker" in cmdline or
            cmdline.startswith("ray::IDLE"))


def live_children():
    """``{pid: psutil.Process}`` of this process's live descendants, but
    zombies and multiprocessing's own helpers."""
    return _children()


def _children():
    out = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and not _helper(proc):
                out[proc.pid] = proc
        except psutil.NoSuchProcess:
            pass
    return out


def _segments():
    mine = f"lc_{os.getpid()}_"
    try:
        return {n for n in os.listdir("/dev/shm")
                if n.startswith(mine) or n.startswith("sem." + mine)}
    except OSError:
        return set()


def _helper_targets():
    """What multiprocessing's own helpers (the resource tracker, the
    forkserver) hold open: this process's end of a pipe or socket to one
    of them is the helper's, made once for the process's life."""
    targets = set()
    for proc in psutil.Process().children():
        try:
            if not _helper(proc):
                continue
            for name in os.listdir(f"/proc/{proc.pid}/fd"):
                targets.add(os.readlink(f"/proc/{proc.pid}/fd/{name}"))
        except (OSError, psutil.Error):
            continue
    return targets


def _fds():
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue   # the listing's own descriptor, or one just closed
        if target.startswith(SESSION_FDS):
            out[int(name)] = target
    if out:
        helpers = _helper_targets()
        out = {fd: t for fd, t in out.items() if t not in helpers}
    if _ray_initialised():
        # Ray's driver opens and keeps gRPC channels to its workers as it
        # pleases: its sockets are Ray's, not a session's
        out = {fd: t for fd, t in out.items() if not t.startswith("socket:")}
    return out


def _ray_initialised():
    ray = sys.modules.get("ray")
    try:
        return ray is not None and ray.is_initialized()
    except Exception:  # noqa: BLE001 - a half-imported or stub module
        return False


def _still_running(children, seconds):
    """Those of ``{pid: Process}`` still running after up to ``seconds``:
    waits on process descriptors, which wake at an exit without reaping."""
    fds = {}
    for pid in children:
        try:
            fds[os.pidfd_open(pid)] = pid
        except OSError:
            pass    # gone already
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + seconds
        left = dict(fds)
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for fd, _ in poller.poll(remaining * 1000):
                poller.unregister(fd)
                left.pop(fd, None)
        running = {pid for fd, pid in left.items()}
    finally:
        for fd in fds:
            os.close(fd)
    return {pid: p for pid, p in children.items() if pid in running}


class Snapshot:
    """What a session makes that this process has now."""

    def __init__(self):
        self.children = set(_children())
        self.segments = _segments()
        self.fds = _fds()


def leaks_since(before, keep=()):
    """Lines naming each child process, segment and descriptor made since
    ``before`` (a `Snapshot`) and still there, but the processes in
    ``keep`` (pids: warm actors a pool keeps, say); the processes are
    killed and the segments unlinked once named."""
    children = {pid: p for pid, p in _children().items()
                if pid not in before.children and pid not in keep}
    children = _still_running(children, EXIT_GRACE)
    found = []
    for pid, proc in sorted(children.items()):
        try:
            what = " ".join(proc.cmdline()) or proc.name()
            proc.kill()
        except psutil.Error:
            what = "?"
        found.append(f"child process {pid}: {what}")
    _still_running(children, EXIT_GRACE)
    # let multiprocessing collect its own children (a psutil wait would
    # reap them under its feet: their Process objects would stay "alive")
    multiprocessing.active_children()
    for name in sorted(_segments() - before.segments):
        found.append(f"shared-memory segment /dev/shm/{name}")
        try:
            os.unlink(f"/dev/shm/{name}")
        except OSError:
            pass
    for fd, target in sorted(_fds().items()):
        if before.fds.get(fd) != target:
            found.append(f"file descriptor {fd}: {target}")
    return found
