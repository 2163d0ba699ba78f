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
  ``any_session``.
- The marker ``@pytest.mark.localcluster(leak_check=True, timeout=None)``.
  ``leak_check``: after the test and its fixtures are torn down, what it
  left that a session makes -- a child process (not a zombie, not one of
  multiprocessing's own helpers), a shared-memory segment of this process
  (``/dev/shm/lc_<pid>_*``), a descriptor on a pipe, socket, eventfd or
  /dev/shm file -- fails it, naming each.  Processes get a moment to
  exit; what leaked is then killed and unlinked (descriptors are named
  only: closing them could close what an object still holds), so one bad
  test does not spoil the next.  ``timeout``: the test fails once it has
  run that many seconds (pytest-timeout enforces it if installed, else a
  SIGALRM in the main thread).
"""

import os
import signal
import time

import psutil
import pytest

__all__ = ["session_kinds", "Snapshot", "leaks_since", "live_children"]

#: seconds a child process a test left gets to exit before it counts
EXIT_GRACE = 2.0
#: what a descriptor of a session points at
SESSION_FDS = ("pipe:", "socket:", "anon_inode:", "/dev/shm/")


# -- session kinds ------------------------------------------------------------

def _ray_session():
    from localcluster.sessions.ray import RaySession  # noqa: F401
    return RaySession


def session_kinds():
    """``{kind: factory}`` of every installed session kind."""
    from localcluster import LocalHostScheduler, LocalSession
    kinds = {"local": LocalSession, "localhost": LocalHostScheduler}
    try:
        kinds["ray"] = _ray_session()
    except ImportError:
        pass
    return kinds


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
        timeout = _options(marker)[1] if marker else None
        if timeout is not None:
            item.add_marker(pytest.mark.timeout(timeout))


# -- fixtures -----------------------------------------------------------------

def _open(kind):
    return session_kinds()[kind]()


@pytest.fixture
def local_session():
    """An open `LocalSession`, closed after the test."""
    session = _open("local")
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def localhost_scheduler():
    """An open `LocalHostScheduler`, closed after the test."""
    session = _open("localhost")
    try:
        yield session
    finally:
        session.close()


@pytest.fixture
def any_session(request):
    """An open session of each installed kind (``--localcluster-sessions``
    narrows them), closed after the test."""
    session = _open(request.param)
    try:
        yield session
    finally:
        session.close()


@pytest.fixture(autouse=True)
def _localcluster_marker(request):
    """The marker's checks.  Autouse, so it is set up before and torn down
    after the fixtures the test asks for: the sessions are closed by the
    time it looks."""
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
        found = leaks_since(before)
        if found:
            pytest.fail("the test left behind what a session makes:\n  "
                        + "\n  ".join(found), pytrace=False)


def _options(marker):
    """``(leak_check, timeout)`` of a ``localcluster`` marker."""
    unknown = set(marker.kwargs) - {"leak_check", "timeout"}
    if marker.args or unknown:
        raise pytest.UsageError(
            f"@pytest.mark.localcluster takes leak_check= and timeout=, got "
            f"{marker.args or ''}{sorted(unknown) or ''}")
    timeout = marker.kwargs.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or
                                not isinstance(timeout, (int, float)) or
                                timeout <= 0):
        raise pytest.UsageError(f"@pytest.mark.localcluster(timeout=) must "
                                f"be seconds > 0, got {timeout!r}")
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
    """multiprocessing's own helpers live as long as this process."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return True
    return ("multiprocessing.forkserver" in cmdline or
            "multiprocessing.resource_tracker" in cmdline)


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
        return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}
    except OSError:
        return set()


def _helper_fds():
    """The descriptors multiprocessing keeps to its own helpers (the
    resource tracker, the forkserver), made once for the process's life."""
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker
    found = {getattr(resource_tracker._resource_tracker, "_fd", None),
             getattr(forkserver._forkserver, "_forkserver_alive_fd", None)}
    return {fd for fd in found if isinstance(fd, int)}


def _fds():
    out = {}
    helpers = _helper_fds()
    for name in os.listdir("/proc/self/fd"):
        if int(name) in helpers:
            continue
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue   # the listing's own descriptor, or one just closed
        if target.startswith(SESSION_FDS):
            out[int(name)] = target
    return out


class Snapshot:
    """What a session makes that this process has now."""

    def __init__(self):
        self.children = set(_children())
        self.segments = _segments()
        self.fds = _fds()


def leaks_since(before):
    """Lines naming each child process, segment and descriptor made since
    ``before`` (a `Snapshot`) and still there; the processes are killed
    and the segments unlinked once named."""
    deadline = time.monotonic() + EXIT_GRACE
    children = {}
    while True:
        children = {pid: p for pid, p in _children().items()
                    if pid not in before.children}
        if not children or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    found = []
    for pid, proc in sorted(children.items()):
        try:
            what = " ".join(proc.cmdline()) or proc.name()
        except psutil.Error:
            what = "?"
        found.append(f"child process {pid}: {what}")
        try:
            proc.kill()
            proc.wait(EXIT_GRACE)
        except psutil.Error:
            pass
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
