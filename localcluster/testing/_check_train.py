"""One training, as every run of a job check makes it: a fresh job from
``build``, trained by a `JobRunner` in a session, ending as the blobs of
the job's checkpointed nodes -- plain arrays, whichever session ran it.

Used where a run is made: by `._check_runs` in this process and by
`._check_fresh` in a fresh one.
"""

from ..checkpoint.manager import MultiNodeCheckpointManager
from ..context import fresh_names
from ..job import Job, JobRunner, epoch_limiter
from ..task import Node

__all__ = ["make_job", "final_blobs", "train", "run_once"]


def make_job(build, max_epochs):
    """``(job, options)`` from ``build()``, capped at ``max_epochs``; its
    generated names are those of a build in a fresh process, wherever it
    is built (so a run in this process and one in a fresh process name
    alike what they make)."""
    with fresh_names():
        return _make_job(build, max_epochs)


def _make_job(build, max_epochs):
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


def run_once(build, open_session, directory, *, resume=None,
             max_restarts=0, max_epochs=None, timeout=None):
    """One training in the session ``open_session()`` opens, as a dict:
    ``blobs`` and ``last`` (None if it raised ``error``) and, under a
    schedule, the session's ``log``, ``switches`` and ``preemptions``."""
    got = {"blobs": None, "last": None, "error": None, "log": None,
           "switches": None, "preemptions": 0}
    try:
        with open_session() as session:
            try:
                got["blobs"], got["last"], _ = train(
                    build, session, directory, resume=resume,
                    max_epochs=max_epochs, timeout=timeout,
                    max_restarts=max_restarts)
            finally:
                if getattr(session, "schedule", None) is not None:
                    got["log"] = [list(d) for d in session.schedule_log]
                    got["switches"] = list(session.schedule_switches)
                    got["preemptions"] = session.schedule_preemptions
    except Exception as exc:  # noqa: BLE001 - the check judges it
        got["error"] = exc
    return got
