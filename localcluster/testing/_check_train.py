"""One training, as every run of a job check makes it: a fresh job from
``build``, trained by a `JobRunner` in a session, ending as the blobs of
the job's checkpointed nodes -- plain arrays, whichever session ran it.

Used where a run is made: by `._check_runs` in this process and by
`._check_fresh` in a fresh one.
"""

from ..checkpoint.manager import MultiNodeCheckpointManager
from ..job import Job, JobRunner, epoch_limiter
from ..task import Node

__all__ = ["make_job", "final_blobs", "train"]


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
