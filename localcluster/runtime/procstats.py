"""What a node's process has used, read where the process runs.

`process_stats` is read by a session on this host (from a pid) or by an
engine's worker about itself (RaySession's actors answer it remotely), so
the command line's per-node CPU and memory do not depend on where a node
runs.
"""

import os
import time

import psutil

__all__ = ["process_stats"]


def process_stats(pid=None):
    """``{"pid", "cpu_seconds", "rss_bytes", "peak_rss_bytes",
    "age_seconds"}`` of process ``pid`` (default: this one), or None if
    it is gone."""
    pid = os.getpid() if pid is None else pid
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            times = proc.cpu_times()
            rss = proc.memory_info().rss
            started = proc.create_time()
    except psutil.Error:
        return None
    return {"pid": pid, "cpu_seconds": times.user + times.system,
            "rss_bytes": rss, "peak_rss_bytes": _peak_rss(pid) or rss,
            "age_seconds": max(0.0, time.time() - started)}


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
