"""What a job check runs: fresh jobs, trained in the sessions it opens,
and the blobs they end with.

The checks (`localcluster.testing.checks`) call these, then compare what
comes back (`._check_verdicts`).  ``build`` is the user's: each call
makes a fresh Job, or ``(job, options)``, so every run trains from
scratch; a run ends as ``{node: {blob: array}}`` of the job's
checkpointed nodes -- plain arrays, whichever session ran it, so runs
under different kinds, seeds and conditions compare as values.

A check's runs share one `Scratch`: a temporary directory for their
checkpoints, removed with the check, and the sessions it opens by kind
name from `SESSION_KINDS` -- the installed kinds of the one registry,
`localcluster.sessions.kinds`, in a dict of this module's own that
tests may add a kind to.  The Ray sessions of one check share one Ray
and a pool of warm actors: starting an actor takes most of a second,
and a check opens many sessions.
"""

import itertools
import os
import shutil
import tempfile

from ..sessions.kinds import installed_kinds
from ._check_train import final_blobs, make_job, run_once, train

__all__ = ["SESSION_KINDS", "make_job", "final_blobs", "train", "Scratch",
           "Runs", "Outcome"]

#: session kind -> factory of a session taking ``faults=`` (ray: when
#: the extra is installed; a check's Ray sessions share warm actors)
SESSION_KINDS = installed_kinds()

#: the kinds a fresh process makes alike (a kind a test put in
#: `SESSION_KINDS` in their place, and Ray's shared actors, run here)
FRESH_KINDS = {kind: SESSION_KINDS[kind] for kind in ("local", "localhost")
               if kind in SESSION_KINDS}


class Scratch:
    """What one check uses and ends with it: a temporary directory for
    checkpoints, and -- for ray sessions -- Ray (started here unless it
    runs already) with a pool of warm actors the check's sessions share
    (starting an actor takes most of a second)."""

    def __enter__(self):
        self.path = tempfile.mkdtemp(prefix="localcluster-check-")
        self._made = itertools.count()
        self._ray = None
        return self

    def __exit__(self, *exc):
        if self._ray is not None:
            pool, owned = self._ray
            pool.close()
            if owned:
                from ..sessions.ray import shutdown
                shutdown()
        shutil.rmtree(self.path, ignore_errors=True)

    def session(self, kind, **kwargs):
        """A new session of ``kind``."""
        try:
            factory = SESSION_KINDS[kind]
        except KeyError:
            raise ValueError(f"unknown session kind {kind!r}; known: "
                             f"{sorted(SESSION_KINDS)}") from None
        if kind == "ray":
            if self._ray is None:
                from ..sessions.ray import ActorPool, connect
                owned = connect()
                self._ray = (ActorPool(), owned)
            kwargs["pool"] = self._ray[0]
        return factory(**kwargs)

    def sub(self, label):
        """A new directory name under the scratch directory."""
        return os.path.join(self.path, f"{label}-{next(self._made)}")


class Outcome:
    """How one run of a check ended: ``blobs`` and ``last`` (None when it
    raised ``error``); under a schedule, the session's ``log``,
    ``switches`` and ``preemptions``."""

    __slots__ = ("label", "blobs", "last", "error", "log", "switches",
                 "preemptions", "directory")

    def __init__(self, label, directory):
        self.label = label
        self.directory = directory
        self.blobs = self.last = self.error = None
        self.log = self.switches = None
        self.preemptions = 0

    def fill(self, got):
        """Take what `._check_train.run_once` returns; ``self``."""
        self.blobs, self.last, self.error = got["blobs"], got["last"], \
            got["error"]
        self.log, self.switches = got["log"], got["switches"]
        self.preemptions = got["preemptions"]
        return self

    def key(self):
        """The interleaving, as a value (two runs with one key ran alike)."""
        return tuple(map(tuple, self.log or ()))


class Runs:
    """What the checks of one `check_job` call share: the scratch space,
    the fresh-process helper, the job's options and truth, and the
    uninterrupted runs each check compares with (made once)."""

    def __init__(self, build, *, max_epochs=None, timeout=60,
                 allow_nonfinite=False, invariant=None, expected=None):
        from ._check_fresh import FreshProcesses, picklable
        from ._check_verdicts import Truth
        self.build = build
        self.max_epochs = max_epochs
        self.timeout = timeout
        self.scratch = Scratch().__enter__()
        self.fresh = FreshProcesses() if picklable(build) else None
        job, self.options = make_job(build, max_epochs)
        self.nodes = job.nodes_to_checkpoint()
        self.truth = Truth(self.options, allow_nonfinite, invariant, expected)
        self._references = {}
        self.count = 0

    def close(self):
        try:
            if self.fresh is not None:
                self.fresh.close()
        finally:
            self.scratch.__exit__(None, None, None)

    def job(self):
        """A fresh job of ``build``, capped at ``max_epochs``."""
        return make_job(self.build, self.max_epochs)[0]

    def run(self, kind, label, **kwargs):
        """Train once; an `Outcome` (what the run raised is kept in it)."""
        return self.start(kind, label, **kwargs)()

    def start(self, kind, label, *, schedule=None, conditions=None,
              faults=None, resume=None, directory=None, max_restarts=0):
        """Start a run (see `run`); a function returning its `Outcome`.

        Every run is made in a fresh process (`._check_fresh`) when
        ``build`` can cross and the kind is one of `FRESH_KINDS`: no run sees what
        another left in this process's memory, and this process can start
        the next run meanwhile; else it runs here, now."""
        from ._check_conditions import session_kwargs
        self.count += 1
        directory = directory or self.scratch.sub(kind)
        out = Outcome(label, directory)
        kwargs = session_kwargs(conditions)
        if schedule is not None:
            kwargs["schedule"] = schedule
        if faults is not None:
            kwargs["faults"] = faults
        if self.fresh is not None and kind in FRESH_KINDS and \
                SESSION_KINDS.get(kind) is FRESH_KINDS[kind]:
            token = self.fresh.submit(
                self.build, kind, kwargs, directory, resume=resume,
                max_restarts=max_restarts, max_epochs=self.max_epochs,
                timeout=self.timeout)
            return lambda: out.fill(self.fresh.collect(token))
        out.fill(run_once(
            self.build, lambda: self.scratch.session(kind, **kwargs),
            directory, resume=resume, max_restarts=max_restarts,
            max_epochs=self.max_epochs, timeout=self.timeout))
        return lambda: out

    def reference(self, kind, schedule=None):
        """The uninterrupted run of ``kind`` (under ``schedule``), made
        once per check_job."""
        key = (kind, schedule)
        if key not in self._references:
            if schedule is None:
                label = f"the uninterrupted run ({kind})"
            elif schedule.switched == ():
                label = "the run without preemptions"
            else:
                label = f"the uninterrupted run ({kind} under {schedule!r})"
            out = self._references[key] = self.run(kind, label,
                                                   schedule=schedule)
            if self.fresh is not None and out.blobs is not None:
                # what most runs end with too: its big arrays need not
                # cross back again (`._check_fresh`)
                self.fresh.know(out.blobs)
        return self._references[key]


