"""``metrics.jsonl``: the history of every run in a checkpoint directory.

``python -m localcluster.run`` appends one JSON object per line to
``<checkpoint dir>/metrics.jsonl`` as the run goes -- a line is written
whole with one ``write`` on an ``O_APPEND`` descriptor the moment it is
known, so a run that is killed (even the master, by SIGKILL) keeps every
line it wrote, and a resumed run appends after the runs before it.  The
report (``python -m localcluster.report``) and ``localcluster.ckpt ls``
read it back with `read_metrics`, which skips a line torn by a crash.

Every line has ``"kind"``, ``"run"`` (the id of the run that wrote it:
``<unix seconds>-<master pid>``) and ``"time"`` (unix seconds).  Kinds:

``run`` -- a run starts::

    {"kind": "run", "run": "1763900000.123-4242", "time": 1763900000.12,
     "job": "localcluster.examples.regression:build_job",
     "session": "localhost", "nodes": ["ps", "reader", "trainer_0"],
     "epochs": 5, "resumed_from": null, "master_pid": 4242,
     "host": "laptop", "version": "0.1.0",
     "options": {"nodes": 1, "epochs": 5, "seed": null, ...},
     "conditions": ["Slowdown('trainer_1', 4.0)"]}

``epoch`` -- an epoch and its checkpoint are done (written as soon as the
checkpoint is complete; a stop signal waits for the line, and one that
came while the checkpoint was written -- which then completed -- has the
epoch written before the ``end`` line, with ``checkpoint_seconds`` and
``records_per_s`` null and no ``processes``: so a Ctrl-C never leaves a
complete checkpoint without its epoch line, only a SIGKILL of the master
in that instant can)::

    {"kind": "epoch", "run": ..., "time": ..., "epoch": 3, "of": 5,
     "elapsed": 1.9,               # seconds since the run started
     "seconds": 0.41,              # the epoch group's run
     "checkpoint_seconds": 0.02,   # its checkpoint
     "simulated_seconds": null,    # virtual time (--simulate)
     "records_per_s": 15000.0,     # records / (seconds + checkpoint)
     "metrics": {"loss": 0.02},    # the job's metrics (null: not numeric)
     "restarts": 0,                # restarts of this run so far
     "checkpoint_error": null,
     "nodes": {"trainer_0": {"seconds": 0.4, "pid": 4250}},
     "processes": {"trainer_0": {"pid": 4250, "cpu_percent": 97.0,
                                 "rss_bytes": 71000000,
                                 "peak_rss_bytes": 72000000,
                                 "cpu_seconds": 1.9}}}

  ``processes`` is keyed by node, except where nodes share one process
  (``--session local``): that process is listed once as
  ``"(all nodes: this process)"``.

``restart`` -- nodes were restarted and every node resumed::

    {"kind": "restart", "run": ..., "time": ..., "resumed_from": 2,
     "error": "node 'trainer_1' died (SIGKILL) ..."}

``end`` -- the run ended (absent if it was killed)::

    {"kind": "end", "run": ..., "time": ..., "status": "ok",
     "last_epoch": 5, "seconds": 2.6, "error": null}

  ``status``: ``"ok"``, ``"error"`` or ``"interrupted"``.

Floats that are not finite are written as null (the file is strict JSON,
readable by any JSON parser).
"""

import json
import logging
import math
import os

__all__ = ["METRICS_FILE", "MetricsLog", "read_metrics", "json_safe"]

log = logging.getLogger("localcluster.run")

METRICS_FILE = "metrics.jsonl"


def json_safe(value):
    """``value`` with every float that is not finite as None, tuples as
    lists, and anything else JSON cannot hold as its ``str``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    try:
        return json_safe(float(value))  # numpy scalars
    except (TypeError, ValueError):
        return str(value)


class MetricsLog:
    """Appends lines to a directory's ``metrics.jsonl``.  A line that
    cannot be written (a full disk) is a warning once, never the run's
    failure: the metrics are a record of the run, not part of it."""

    def __init__(self, directory):
        self.path = os.path.join(directory, METRICS_FILE)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND |
                           os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        self._warned = False

    def write(self, record):
        if self._fd is None:
            return
        line = json.dumps(json_safe(record), separators=(",", ":"),
                          allow_nan=False) + "\n"
        data = line.encode()
        try:
            written = os.write(self._fd, data)
            if written != len(data):  # out of space part-way
                raise OSError(f"wrote {written} of {len(data)} bytes")
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("%s: a line was not written (%s); the run goes "
                            "on without it", self.path, exc)

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_metrics(path):
    """The records of a ``metrics.jsonl``, in order.  A line that is not a
    JSON object (torn by a crash, or not ours -- nested past what the
    parser can hold, say) is skipped."""
    records = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                record = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict) and "kind" in record:
                records.append(record)
    return records
