"""The Chrome trace of a ``python -m localcluster.run`` run (``--trace``).

`chrome_trace` turns the runner's epoch reports into Chrome trace-event
JSON (chrome://tracing, Perfetto): the runner and every node a track.

`TraceFile` writes it where ``--trace FILE`` says (an `OutputFile`:
checked before anything runs, written whole or not at all).
"""

import json

from ..outfile import OutputFile

__all__ = ["TraceFile", "chrome_trace"]


class TraceFile(OutputFile):
    """``--trace FILE``: checked when made, written by `write`."""

    def __init__(self, path):
        super().__init__("--trace", path)

    def write(self, trace):
        """Write ``trace`` (a JSON-able dict) to the file; `OSError` (its
        message one line naming the file) if it cannot be."""
        self.write_with(lambda f: json.dump(trace, f))


def chrome_trace(nodes, epochs, saves, os_pids=None):
    """Chrome trace-event JSON: the runner and every node a process (a
    track); epochs and checkpoints on the runner's, each node's part of an
    epoch and its steps (a thread per executor thread) on the node's.
    Epochs run under a deterministic schedule are drawn on its virtual
    clock -- what the run would take with a machine per node -- and the
    file says so (``otherData.clock``: "simulated"; else "wall").
    ``os_pids``: ``{node or "runner": pid}`` of the processes that ran
    them -- each track is labelled with its pid, and ``otherData.pids``
    maps them (the trace's own pids are track numbers)."""
    os_pids = os_pids or {}
    pids = {"runner": 0, **{node: i + 1 for i, node in enumerate(nodes)}}
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
               "ts": 0,
               "args": {"name": name}} for name, pid in pids.items()]
    events += [{"ph": "M", "name": "process_labels", "pid": pids[name],
                "tid": 0, "ts": 0, "args": {"labels": f"pid {pid}"}}
               for name, pid in os_pids.items()
               if name in pids and pid is not None]
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

    simulated = any(r.simulated_seconds is not None for r in epochs)
    for report in epochs:
        started, seconds, node_seconds = report.started, report.seconds, \
            report.node_seconds
        if simulated:
            # the virtual clock's timeline: the epoch from its first step
            started, node_seconds = _virtual_epoch(report)
            seconds = report.simulated_seconds or 0.0
        span(f"epoch {report.epoch}", "epoch", 0, 0, started,
             seconds, {"stopped": report.stopped})
        for node, seconds in node_seconds.items():
            if node in pids:
                span(f"epoch {report.epoch}", "task", pids[node], 0,
                     started, seconds)
        for node, spans in (report.trace or {}).items():
            if node not in pids:
                continue
            for name, task, thread, start, end in spans:
                span(name, "step", pids[node], tid(node, thread), start,
                     end - start, {"task": task})
    if not simulated:   # saves are timed in wall time only
        for epoch, started, seconds in saves:
            span(f"checkpoint {epoch}", "checkpoint", 0, 0, started,
                 seconds)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"clock": "simulated" if simulated else "wall",
                          "pids": {n: p for n, p in os_pids.items()
                                   if p is not None}}}


def _virtual_epoch(report):
    """(start, {node: seconds}) of a simulated epoch on the virtual
    timeline, from its step spans (virtual seconds)."""
    spans = report.trace or {}
    starts = [s[3] for node in spans.values() for s in node]
    start = min(starts) if starts else 0.0
    return start, {node: max(s[4] for s in node_spans) - start
                   for node, node_spans in spans.items() if node_spans}
