"""Runs in fresh Python processes: where the checks resume a job, so
state it keeps outside its checkpoints (a module's global, a cache of a
Python op) shows instead of surviving from an earlier run -- and where
they run independent cases side by side, one per core.

::

    with FreshProcesses() as fresh:
        token = fresh.submit(build, kind, session_kwargs, directory,
                             resume=2, max_restarts=0, max_epochs=None,
                             timeout=60)
        outcome = fresh.collect(token)   # a dict, or raises what it raised

One helper process is started with this process's ``sys.path`` (so
``build``'s module imports there as it does here; and OpenBLAS's idle
threads sleeping at once, `BLAS_THREAD_TIMEOUT`); it imports the
package and what a session imports in every run (numpy's lazy
submodules; a child then seeds numpy's global random state afresh, as
its own import would have) and nothing of the job, then forks one child
per request, which unpickles ``build`` (importing its module afresh),
trains and writes what it ended with -- or the exception it raised -- to
a file; the helper
reaps it and answers ``done <token>``.  The helper imports the module
``build`` comes from before it forks (once: as a fresh import leaves it,
since nothing of the job runs in the helper), so a child does not pay
for importing a test module and what it imports.  Forking the single-threaded
helper costs milliseconds where starting an interpreter costs most of a
second, and every child starts from the same clean state.  Requests are
framed (token, length, bytes) and unpickled only in the child.  Every
wait is bounded by the run's timeout; the helper ends when its pipe
closes, after its children, and `close` reaps it.

Most of what a run ends with is often what every run ends with (a
dataset drawn from a seed: megabytes, where the weights are bytes), and
pickling it back, writing, reading and unpickling it took a tenth of a
second a run.  So the checks give the helper the big arrays of their
uninterrupted runs (`FreshProcesses.know`, a frame of token 0, unpickled
in the helper); its children inherit them, and an array a child ends
with that is the same as one of them -- same type, dtype and shape, and
the same bytes, compared byte for byte, no digest -- comes back as the
number of that array, which `collect` replaces with a copy of the one
this process holds.  An array that differs in a single byte comes back
whole, so every verdict is on the values a run ended with.

A ``build`` that cannot be pickled (a lambda, a closure, a function of
``__main__``) cannot cross: `picklable` says so and the checks then run
in this process (what their result then notes).
"""

import importlib
import json
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

from ..sessions._watcher import reap

__all__ = ["FreshProcesses", "picklable", "Crossed", "type_name"]

#: seconds to wait for a child beyond its run's own timeout
GRACE = 30.0

#: seconds between looks for ended children where there are no process
#: descriptors to wait on
POLL = 0.02

#: children run at once (each case is single-threaded Python, mostly)
WIDTH = max(1, min(2, os.cpu_count() or 1))

#: the helper's ``OPENBLAS_THREAD_TIMEOUT`` (unless this process's
#: environment sets one): OpenBLAS's idle threads wait for work by
#: spinning 2**28 cycles (a tenth of a second) after every call it splits
#: between them, and with two runs on two cores that spinning took a
#: sixth of the checks' processor time from the other run.  2**4 cycles:
#: they sleep at once.  Only when they sleep changes -- not how many there
#: are, nor how a call is split, so not a bit of any result.
BLAS_THREAD_TIMEOUT = "4"

#: arrays smaller than this always come back whole (see the module
#: docstring): looking for them among the known ones would save little
KNOWN_BYTES = 64 << 10

#: the arrays the helper was given, as ``((dtype, shape), their bytes
#: as a uint8 array)`` in the order given (a child's answer names one by
#: its place here)
_KNOWN = []



def picklable(value):
    """Whether ``value`` can reach a fresh process: it pickles, and not
    by a reference to ``__main__`` (which is another module there)."""
    if getattr(value, "__module__", None) == "__main__":
        return False
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - any reason means "cannot cross"
        return False
    return True


class Crossed(Exception):
    """An exception raised in a fresh process that could not be pickled
    back: its type's name and its text."""

    def __init__(self, name, text):
        super().__init__(text)
        self.type_name = name


def type_name(exc):
    """The name of ``exc``'s type, also for a `Crossed` one."""
    return getattr(exc, "type_name", None) or type(exc).__name__


class Known:
    """In a child's answer: the array is, byte for byte, the known array
    ``index`` (see the module docstring)."""

    def __init__(self, index):
        self.index = index


def _comparable(value):
    """Whether ``value`` may be answered as a `Known` array: a plain,
    C-ordered array of plain numbers and big enough to matter."""
    return (type(value) is np.ndarray and value.nbytes >= KNOWN_BYTES and
            value.flags.c_contiguous and value.dtype.fields is None and
            value.dtype.subdtype is None and not value.dtype.hasobject and
            value.dtype.metadata is None)


def _key(value):
    return value.dtype.str, value.shape


class FreshProcesses:
    """The helper process of one check (see the module docstring)."""

    def __init__(self):
        self._proc = None
        self._tokens = iter(range(1, 1 << 62))
        self._pending = {}   # token -> (result file, deadline)
        self._finished = set()
        self._buffer = b""
        self._known = []     # the arrays the helper was given, in order
        #: bytes of the answers read (what crossing back cost)
        self.received = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _start(self):
        code = ("import sys, json, os; sys.path[:] = json.loads(os.environ."
                "pop('LOCALCLUSTER_CHECK_PATH')); from localcluster.testing."
                "_check_fresh import serve; serve()")
        env = dict(os.environ, LOCALCLUSTER_CHECK_PATH=json.dumps(
            [p for p in sys.path if isinstance(p, str)]))
        env.setdefault("OPENBLAS_THREAD_TIMEOUT", BLAS_THREAD_TIMEOUT)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, close_fds=True, env=env)

    def know(self, blobs):
        """Give the helper the big arrays of ``blobs`` (``{node: {name:
        array}}``) it does not hold yet: a run submitted after this that
        ends with one of them, byte for byte, answers with its number."""
        new = []
        for arrays in blobs.values():
            for value in arrays.values():
                if _comparable(value) and not any(
                        _key(k) == _key(value) and
                        _same_bytes(value, k.reshape(-1).view(np.uint8))
                        for k in self._known + new):
                    new.append(value.copy())   # kept as it is now
        if not new:
            return
        if self._proc is None:
            self._start()
        data = pickle.dumps(new, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._send(0, data)
        except OSError:
            raise RuntimeError("the checks' fresh-process helper ended "
                               "unexpectedly") from None
        self._known.extend(new)

    def _send(self, token, data):
        self._proc.stdin.write(struct.pack("<QQ", token, len(data)) + data)
        self._proc.stdin.flush()

    def busy(self):
        """How many requests are running."""
        return len(self._pending)

    def submit(self, build, kind, session_kwargs, directory, *, resume,
               max_restarts, max_epochs, timeout):
        """Start training ``build``'s job in a fresh process; a token for
        `collect`."""
        if self._proc is None:
            self._start()
        fd, out = tempfile.mkstemp(prefix="fresh-", suffix=".pkl",
                                   dir=os.path.dirname(directory))
        os.close(fd)
        token = next(self._tokens)
        # the result file's name first: the child answers there even if
        # the rest cannot be unpickled
        # the module ``build`` comes from (and those its ``fresh_imports``
        # name): the helper imports them once, before forking, as a fresh
        # import would leave them (nothing of the job runs there), so each
        # child need not import them again
        modules = [getattr(build, "replay_import", None) or getattr(
            build, "__module__", None) or ""]
        modules += list(getattr(build, "fresh_imports", ()))
        module = ",".join(name for name in modules if name)
        data = out.encode() + b"\0" + module.encode() + b"\0" + \
            pickle.dumps(
            (build, kind, session_kwargs, directory, resume, max_restarts,
             max_epochs, timeout, _warning_filters()))
        try:
            self._send(token, data)
        except OSError:
            os.unlink(out)
            raise RuntimeError("the checks' fresh-process helper ended "
                               "unexpectedly") from None
        self._pending[token] = (out, time.monotonic() + (timeout or 60) +
                                GRACE)
        return token

    def collect(self, token):
        """What the request ``token`` ended with: ``{"blobs", "last",
        "log", "switches", "preemptions"}``, or raise its exception."""
        if token not in self._pending:
            raise RuntimeError("the checks' fresh processes were closed "
                               "before this run was collected")
        out, deadline = self._pending[token]
        try:
            while token not in self._finished:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self._proc.stdout], [], [],
                                            max(left, 0))
                if not ready:
                    raise RuntimeError(
                        "a run in the checks' fresh process did not end "
                        "within its timeout")
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    raise RuntimeError("the checks' fresh-process helper "
                                       "ended unexpectedly")
                self._buffer += chunk
                *lines, self._buffer = self._buffer.split(b"\n")
                for line in lines:
                    self._finished.add(int(line.split()[1]))
            self._finished.discard(token)
            with open(out, "rb") as f:
                data = f.read()
            if not data:
                raise RuntimeError(
                    "a run in the checks' fresh process ended without a "
                    "result (killed? its stderr is above)")
            self.received += len(data)
            ok, value = pickle.loads(data)
        finally:
            del self._pending[token]
            try:
                os.unlink(out)
            except OSError:
                pass
        if ok:
            if value.get("blobs"):
                value["blobs"] = {
                    node: {name: self._known[v.index].copy()
                           if isinstance(v, Known) else v
                           for name, v in arrays.items()}
                    for node, arrays in value["blobs"].items()}
            return value
        raise value

    def close(self):
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for out, _ in self._pending.values():
            try:
                os.unlink(out)
            except OSError:
                pass
        self._pending.clear()
        reap(proc, GRACE)   # it ends once its children have
        proc.stdout.close()


# -- the helper's side ---------------------------------------------------------

def serve():
    """The helper: fork a child per request until stdin closes, answer
    ``done <token>`` as each ends.  It waits on stdin and on a process
    descriptor of each child at once (`os.pidfd_open`: readable when the
    child has ended), so a child's end is answered at once; where there
    are no process descriptors it looks every `POLL` seconds."""
    from ._check_train import train  # once, before forking
    del train
    _preload_numpy()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the owner's Ctrl-C ends it
    children = {}   # pid -> (token, its process descriptor or None)
    stdin = 0   # read unbuffered: select() must see what is unread
    open_ = True
    while open_ or children:
        watched = [fd for _, fd in children.values() if fd is not None]
        polled = len(watched) < len(children)
        if open_:
            watched.append(stdin)
        ready, _, _ = select.select(watched, [], [],
                                    POLL if polled else None)
        if open_ and stdin in ready:
            head = _exactly(stdin, 16)
            request = None
            if head is not None:
                token, size = struct.unpack("<QQ", head)
                request = _exactly(stdin, size)
            if request is None:
                open_ = False
            elif token == 0:
                _learn(request)
            else:
                _preload(request)
                pid = _fork(request, [fd for _, fd in children.values()
                                      if fd is not None])
                children[pid] = (token, _pidfd(pid))
        for pid, (token, fd) in list(children.items()):
            if fd is not None and fd not in ready:
                continue
            if os.waitpid(pid, 0 if fd is not None else os.WNOHANG)[0] == 0:
                continue
            del children[pid]
            if fd is not None:
                os.close(fd)
            sys.stdout.buffer.write(b"done %d\n" % token)
            sys.stdout.buffer.flush()


def _learn(request):
    """Keep the arrays of a `FreshProcesses.know` frame (the children
    forked after it inherit them)."""
    for value in pickle.loads(request):
        _KNOWN.append((_key(value), np.frombuffer(value.tobytes(),
                                                  np.uint8)))


#: bytes compared at a time: a run's array is not copied whole to be
#: compared (a child's new memory costs it page faults)
_CHUNK = 1 << 20


def _same_bytes(value, kept):
    """Whether the C-ordered ``value`` holds exactly the bytes ``kept``."""
    mine = value.reshape(-1).view(np.uint8)
    if mine.size != kept.size:
        return False
    for start in range(0, mine.size, _CHUNK):
        if not np.array_equal(mine[start:start + _CHUNK],
                              kept[start:start + _CHUNK]):
            return False
    return True


def _referred(blobs):
    """``blobs`` with each array that is, byte for byte, a known one
    (same dtype and shape) replaced by its `Known` number."""
    if not blobs or not _KNOWN:
        return blobs
    out = {}
    for node, arrays in blobs.items():
        out[node] = {}
        for name, value in arrays.items():
            if _comparable(value):
                key = _key(value)
                for index, (known, kept) in enumerate(_KNOWN):
                    if known == key and _same_bytes(value, kept):
                        value = Known(index)
                        break
            out[node][name] = value
    return out


def _pidfd(pid):
    """A descriptor that becomes readable when child ``pid`` ends, or
    None where the system has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


#: numpy's global random state as `_preload_numpy` left it: a child that
#: finds it so draws a fresh seed, as a fresh import would have
_NUMPY_STATE = None


def _preload_numpy():
    """Import what a session imports in each run (numpy's lazily loaded
    submodules, `localcluster.sessions._zygote.PRELOAD`: most of a run's
    imports, some 20 ms of each child's) once, before forking."""
    global _NUMPY_STATE
    from ..sessions._zygote import preload
    preload()
    if "numpy.random" in sys.modules:
        _NUMPY_STATE = np.random.get_state()


def _fresh_numpy_seed():
    """In a child: numpy's global random state seeded afresh from the
    system, as the import in a fresh process seeds it -- unless the
    module the helper imported for ``build`` set or drew from it (then
    the children find it as a fresh import of that module leaves it, as
    they always did)."""
    if _NUMPY_STATE is None:
        return
    state = np.random.get_state()
    if state[0] == _NUMPY_STATE[0] and state[2:] == _NUMPY_STATE[2:] and \
            np.array_equal(state[1], _NUMPY_STATE[1]):
        np.random.seed()


def _preload(request):
    """Import the modules a request's ``build`` comes from, once."""
    for name in request.split(b"\0", 2)[1].decode().split(","):
        if name and name not in sys.modules and name != "__main__":
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the child says what is wrong
                pass


def _exactly(fd, size):
    """``size`` bytes read from ``fd``, or None if it ends first: into one
    buffer (adding up the pipe's chunks copied a frame of megabytes over
    and over: its size squared over the chunk's)."""
    data = bytearray(size)
    view = memoryview(data)
    got = 0
    while got < size:
        n = os.readv(fd, [view[got:]])
        if not n:
            return None
        got += n
    view.release()
    return bytes(data)


def _fork(request, inherited=()):
    """Fork the child that runs ``request``; its pid.  ``inherited``: the
    helper's descriptors of the other children, which this one closes."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for fd in inherited:
            os.close(fd)
        # the job's prints must not reach the answers' pipe
        os.dup2(2, 1)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        _fresh_numpy_seed()
        _child(request)
        code = 0
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


def _child(request):
    import logging
    out, _, request = request.partition(b"\0")
    _, _, request = request.partition(b"\0")     # the module, preloaded
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    logging.getLogger("localcluster.job").setLevel(logging.ERROR)
    from ..sessions.kinds import installed_kinds
    from ._check_train import run_once
    try:
        (build, kind, session_kwargs, directory, resume, max_restarts,
         max_epochs, timeout, filters) = pickle.loads(request)
        warnings.filters[:] = filters   # what the caller silenced, silent
        got = run_once(build, lambda: installed_kinds()[kind](
            **session_kwargs), directory, resume=resume,
            max_restarts=max_restarts, max_epochs=max_epochs,
            timeout=timeout)
    except BaseException as exc:  # noqa: BLE001 - it crosses back
        got = {"blobs": None, "last": None, "error": exc, "log": None,
               "switches": None, "preemptions": 0}
    if got["error"] is not None:
        got["error"] = _crossing(got["error"])
    got["blobs"] = _referred(got["blobs"])
    result = (True, got)
    with open(out, "wb") as f:
        pickle.dump(result, f)


def _warning_filters():
    """This process's warning filters, as far as they pickle (a test's
    ``filterwarnings`` holds here: the runs are its runs)."""
    kept = []
    for entry in warnings.filters:
        try:
            pickle.dumps(entry)
        except Exception:  # noqa: BLE001 - a filter of an odd kind
            continue
        kept.append(entry)
    return kept


def _crossing(exc):
    """``exc`` if it pickles, else a `Crossed` with its type and text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        text = "".join(traceback.format_exception_only(type(exc), exc))
        return Crossed(type(exc).__name__, text.strip())
