"""What ``python -m localcluster.run`` shows while a job trains: each node
process's CPU and memory (`Usage`), the progress lines and the live line
on a terminal (`Progress`).  (Each epoch's line: `cli.train.epochs`; the
Chrome trace of a run: `cli.train.trace`.)
"""

import os
import threading
import time

import numpy as np

__all__ = ["Usage", "Progress", "scalar", "mib", "IN_PROCESS"]

#: what `Usage` reports under --session local, where nodes are threads
IN_PROCESS = "(all nodes: this process)"


# -- watching the nodes --------------------------------------------------------------

class Usage:
    """CPU and memory of every node process, sampled after each epoch
    (`Session.node_stats`: read where each node runs)."""

    def __init__(self, session, nodes):
        self.session, self.nodes = session, nodes
        self._last = {}          # node -> (pid, cpu seconds, wall time)
        self.cpu_seconds = {}    # per node process (or IN_PROCESS)
        self.peak_rss = {}

    def _stats(self):
        """``{node: process stats}`` to sample; nodes that run in this
        process (threads of an in-process session) are one process,
        reported once as `IN_PROCESS`."""
        own, out = os.getpid(), {}
        for node, stats in self.session.node_stats().items():
            out[IN_PROCESS if stats["pid"] == own else node] = stats
        return out

    def sample(self):
        """``{node: {"cpu_percent", "rss_bytes"}}`` since the last sample."""
        now, out = time.monotonic(), {}
        for node, stats in self._stats().items():
            pid, cpu = stats["pid"], stats["cpu_seconds"]
            last_pid, last_cpu, last_time = self._last.get(
                node, (None, 0.0, None))
            if last_pid != pid:  # new (or restarted): since it started
                last_cpu, last_time = 0.0, now - stats["age_seconds"]
            spent = cpu - last_cpu
            self.cpu_seconds[node] = self.cpu_seconds.get(node, 0.0) + spent
            self.peak_rss[node] = max(self.peak_rss.get(node, 0),
                                      stats["peak_rss_bytes"])
            wall = now - last_time
            out[node] = {"cpu_percent": (round(100 * spent / wall, 1)
                                         if wall > 0 else None),
                         "rss_bytes": stats["rss_bytes"]}
            self._last[node] = (pid, cpu, now)
        return out


def scalar(value):
    """A metric's value as one float: the value of a one-element array,
    the mean of a bigger one; None if it is empty or not numeric."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        return None
    if array.size == 0:
        return None
    return float(array.ravel()[0]) if array.size == 1 else \
        float(array.mean())


def mib(n):
    return f"{n / (1 << 20):.0f}M"


class Progress:
    """What the run prints: a header, a line per epoch, a live line on a
    terminal, and the summary (to stderr under ``--json``)."""

    def __init__(self, out, live, copy=None):
        self.out, self.live = out, live
        self.copy = copy   # also gets every line (``--log-dir``'s master.log)
        self._status, self._lock = "", threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def line(self, text):
        with self._lock:
            if self._status:
                self.out.write("\r\033[K")
                self._status = ""
            self.out.write(text + "\n")
            self.out.flush()
        if self.copy is not None:
            self.copy.write(text)

    def start_live(self, what):
        """Redraw ``what()`` as the live line four times a second."""
        if not self.live:
            return

        def tick():
            while not self._stop.wait(0.25):
                with self._lock:
                    self._status = f"  {what()}"
                    self.out.write("\r\033[K" + self._status)
                    self.out.flush()
        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()

    def clear_live(self):
        with self._lock:
            if self._status:
                self.out.write("\r\033[K")
                self.out.flush()
                self._status = ""

    def guard(self, stream):
        """``stream``, clearing the live line before anything else (node
        output, a warning) is written to it; the next tick redraws it."""
        return _Guarded(stream, self) if self.live else stream

    def stop_live(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(1)
        self.clear_live()


class _Guarded:
    """A text stream that clears the live line before each write."""

    def __init__(self, stream, progress):
        self._stream, self._progress = stream, progress

    def write(self, text):
        self._progress.clear_live()
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)
