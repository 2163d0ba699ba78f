"""Synthetic ``metrics.jsonl`` records for the report's tests, written
with the schema of `localcluster.cli.rundir.metrics` (test helper, not package
code): runs that end ok, fail, restart, or are killed (no ``end`` line),
over any number of nodes and epochs."""

import json
import math

T0 = 1763900000.0


def run_line(run_id, nodes, epochs, t, resumed_from=None, job=None,
             options=None):
    return {"kind": "run", "run": run_id, "time": t,
            "job": job or "localcluster.examples.regression:build_job",
            "session": "localhost", "nodes": list(nodes), "epochs": epochs,
            "resumed_from": resumed_from, "master_pid": 4242,
            "host": "laptop", "version": "0.1.0",
            "options": options or {"nodes": len(nodes), "epochs": epochs,
                                   "seed": 7, "threads": 2},
            "conditions": []}


def epoch_line(run_id, epoch, of, elapsed, nodes, t, restarts=0,
               metrics=None, simulated=None, checkpoint_error=None):
    loss = 5.0 * math.exp(-1.3 * epoch)
    return {
        "kind": "epoch", "run": run_id, "time": t, "epoch": epoch, "of": of,
        "elapsed": elapsed, "seconds": 0.3 + 0.01 * epoch,
        "checkpoint_seconds": 0.02 + 0.002 * epoch,
        "simulated_seconds": simulated,
        "records_per_s": 15000.0 + 300 * epoch,
        "metrics": metrics if metrics is not None else
        {"loss": loss, "train_loss_0": 2 * loss},
        "restarts": restarts, "checkpoint_error": checkpoint_error,
        "nodes": {n: {"seconds": 0.2 + 0.01 * i + 0.001 * epoch,
                      "pid": 5000 + i} for i, n in enumerate(nodes)},
        "processes": {n: {"pid": 5000 + i,
                          "cpu_percent": 20.0 + (7 * i + 3 * epoch) % 70,
                          "rss_bytes": (60 + i % 40 + epoch) * 2 ** 20,
                          "peak_rss_bytes": (62 + i % 40 + epoch) * 2 ** 20,
                          "cpu_seconds": 0.3 * epoch}
                      for i, n in enumerate(nodes)}}


def end_line(run_id, t, status="ok", last_epoch=None, seconds=1.0,
             error=None):
    return {"kind": "end", "run": run_id, "time": t, "status": status,
            "last_epoch": last_epoch, "seconds": seconds, "error": error}


def one_run(nodes=("reader", "trainer_0", "trainer_1", "ps"), epochs=5,
            run_id="1763900000.000-4242", end="ok", t=T0, first=1,
            **epoch_kw):
    """A run of ``epochs`` epochs from ``first``; ``end`` None: killed."""
    out = [run_line(run_id, nodes, first - 1 + epochs, t,
                    resumed_from=first - 1 if first > 1 else None)]
    for k in range(epochs):
        elapsed = 0.4 * (k + 1)
        out.append(epoch_line(run_id, first + k, first - 1 + epochs,
                              elapsed, nodes, t + elapsed, **epoch_kw))
    if end is not None:
        out.append(end_line(run_id, t + 0.4 * epochs + 0.1, end,
                            first - 1 + epochs, 0.4 * epochs + 0.1,
                            None if end == "ok" else "it failed"))
    return out


def resumed_history(nodes=("reader", "trainer_0", "trainer_1", "ps")):
    """Run 1 is killed after epoch 3; run 2 resumes from 3, restarts once
    (resuming from epoch 4) and ends ok at epoch 6."""
    first = one_run(nodes, 3, end=None)
    rid, t = "1763900100.000-4300", T0 + 100
    second = [run_line(rid, nodes, 6, t, resumed_from=3)]
    second.append(epoch_line(rid, 4, 6, 0.4, nodes, t + 0.4))
    second.append(epoch_line(rid, 5, 6, 0.8, nodes, t + 0.8))
    second.append({"kind": "restart", "run": rid, "time": t + 1.0,
                   "resumed_from": 4,
                   "error": "node 'trainer_1' died (SIGKILL)"})
    for k, epoch in enumerate((5, 6)):
        second.append(epoch_line(rid, epoch, 6, 1.4 + 0.4 * k, nodes,
                                 t + 1.4 + 0.4 * k, restarts=1))
    second.append(end_line(rid, t + 2.4, "ok", 6, 2.3))
    return first + second


def with_family(records, count, stem="train_loss"):
    """``records`` with each epoch's metrics ``loss`` and ``count``
    numbered ones, ``<stem>_<i>`` = loss * (1 + i / 10): member 0 the
    lowest, the last the highest."""
    for record in records:
        if record["kind"] == "epoch":
            loss = 5.0 * math.exp(-1.3 * record["epoch"])
            record["metrics"] = {"loss": loss, **{
                f"{stem}_{i}": loss * (1 + i / 10) for i in range(count)}}
    return records


def write(path, records):
    with open(path, "w") as f:
        for record in records:
            f.write(json.dumps(record) + "\n")
    return path
