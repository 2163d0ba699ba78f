"""What ``python -m localcluster.run`` shows while a job trains: each node
process's CPU and memory (`Usage`), the progress lines and the live line
on a terminal (`Progress`), and the Chrome trace of a run (`chrome_trace`).
"""

import os
import threading
import time

import numpy as np
import psutil

__all__ = ["Usage", "Progress", "chrome_trace", "scalar", "mib",
           "IN_PROCESS"]

#: what `Usage` reports under --session local, where nodes are threads
IN_PROCESS = "(all nodes: this process)"


# -- watching the nodes --------------------------------------------------------------

def _peak_rss(pid):
    """Peak resident set size of ``pid`` in bytes (Linux VmHWM), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Usage:
    """CPU and memory of every node process, sampled after each epoch."""

    def __init__(self, session, nodes):
        self.session, self.nodes = session, nodes
        self._last = {}          # node -> (pid, cpu seconds, wall time)
        self.cpu_seconds = {}    # per node process (or IN_PROCESS)
        self.peak_rss = {}

    def _pids(self):
        """``{node: pid}`` to sample; nodes that run in this process
        (threads of an in-process session) are one process, reported once
        as `IN_PROCESS`."""
        own, pids = os.getpid(), {}
        for node, pid in self.session.node_pids().items():
            pids[IN_PROCESS if pid == own else node] = pid
        return pids

    def sample(self):
        """``{node: {"cpu_percent", "rss_bytes"}}`` since the last sample."""
        now, out = time.monotonic(), {}
        for node, pid in self._pids().items():
            try:
                proc = psutil.Process(pid)
                times = proc.cpu_times()
                cpu = times.user + times.system
                rss = proc.memory_info().rss
            except psutil.Error:
                continue
            last_pid, last_cpu, last_time = self._last.get(
                node, (None, 0.0, None))
            if last_pid != pid:  # new (or restarted): since it started
                last_cpu, last_time = 0.0, _started(proc, now)
            spent = cpu - last_cpu
            self.cpu_seconds[node] = self.cpu_seconds.get(node, 0.0) + spent
            self.peak_rss[node] = max(self.peak_rss.get(node, 0),
                                      _peak_rss(pid) or rss)
            wall = None if last_time is None else now - last_time
            out[node] = {"cpu_percent": (round(100 * spent / wall, 1)
                                         if wall else None),
                         "rss_bytes": rss}
            self._last[node] = (pid, cpu, now)
        return out


def _started(proc, now):
    """``proc``'s start on the time.monotonic clock (None if unknown)."""
    try:
        return now - max(0.0, time.time() - proc.create_time())
    except psutil.Error:
        return None


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

    def __init__(self, out, live):
        self.out, self.live = out, live
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


# -- the trace -------------------------------------------------------------------------

def chrome_trace(nodes, epochs, saves):
    """Chrome trace-event JSON: the runner and every node a process (a
    track); epochs and checkpoints on the runner's, each node's part of an
    epoch and its steps (a thread per executor thread) on the node's."""
    pids = {"runner": 0, **{node: i + 1 for i, node in enumerate(nodes)}}
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
               "ts": 0,
               "args": {"name": name}} for name, pid in pids.items()]
    tids = {}

    def tid(node, thread):
        key = (node, thread)
        if key not in tids:
            tids[key] = len([k for k in tids if k[0] == node]) + 1
            events.append({"ph": "M", "name": "thread_name", "ts": 0,
                           "pid": pids[node], "tid": tids[key],
                           "args": {"name": thread}})
        return tids[key]

    def span(name, cat, pid, thread_id, start, seconds, args=None):
        events.append({"name": name, "cat": cat, "ph": "X", "pid": pid,
                       "tid": thread_id, "ts": round(start * 1e6, 1),
                       "dur": round(max(seconds, 0) * 1e6, 1),
                       "args": args or {}})

    for report in epochs:
        span(f"epoch {report.epoch}", "epoch", 0, 0, report.started,
             report.seconds, {"stopped": report.stopped})
        for node, seconds in report.node_seconds.items():
            if node in pids:
                span(f"epoch {report.epoch}", "task", pids[node], 0,
                     report.started, seconds)
        for node, spans in (report.trace or {}).items():
            if node not in pids:
                continue
            for name, task, thread, start, end in spans:
                span(name, "step", pids[node], tid(node, thread), start,
                     end - start, {"task": task})
    for epoch, started, seconds in saves:
        span(f"checkpoint {epoch}", "checkpoint", 0, 0, started, seconds)
    return {"traceEvents": events, "displayTimeUnit": "ms"}
