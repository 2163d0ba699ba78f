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

from ..checkpoint.manager import MultiNodeCheckpointManager
from ..job import Job, JobRunner, epoch_limiter
from ..sessions.kinds import installed_kinds
from ..task import Node

__all__ = ["SESSION_KINDS", "make_job", "final_blobs", "train", "Scratch",
           "reference"]

#: session kind -> factory of a session taking ``faults=`` (ray: when
#: the extra is installed; a check's Ray sessions share warm actors)
SESSION_KINDS = installed_kinds()


def make_job(build, max_epochs):
    """``(job, options)`` from ``build()``, capped at ``max_epochs``."""
    made = build()
    job, options = made if isinstance(made, tuple) else (made, {})
    if not isinstance(job, Job) or not isinstance(options, dict):
        raise TypeError(f"build() must return a Job or (job, options), got "
                        f"{made!r}")
    if max_epochs is not None:
        with Node(job.nodes_to_checkpoint()[0]):
            epoch_limiter(job, max_epochs)
    return job, options


def final_blobs(session, job):
    """``{node: {blob: array}}`` of the job's checkpointed nodes."""
    out = {}
    for node in job.nodes_to_checkpoint():
        out[node] = {}
        for name in session.blobs(node):
            value = session.fetch_blob(name, node)
            if not value.dtype.hasobject:
                out[node][name] = value
    return out


def train(build, session, directory, *, max_epochs=None, timeout=None,
          resume=None, max_restarts=0):
    """Train a fresh job; ``(final blobs, last epoch, options)``."""
    job, options = make_job(build, max_epochs)
    runner = JobRunner(job, MultiNodeCheckpointManager(directory),
                       resume_from_epoch=resume, max_restarts=max_restarts,
                       on_checkpoint_error=options.get("on_checkpoint_error",
                                                       "warn"),
                       timeout=timeout)
    last = runner.train(session)
    return final_blobs(session, job), last, options



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


def reference(build, scratch, kind, **kw):
    """``(final blobs, last epoch, options, checkpoint dir)`` of an
    uninterrupted run under ``kind``."""
    directory = scratch.sub(f"reference-{kind}")
    with scratch.session(kind) as session:
        return train(build, session, directory, **kw) + (directory,)
