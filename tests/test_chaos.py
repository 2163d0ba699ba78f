"""Chaos: the command line under random signals, as a user's CI would see it.

Each run trains the embedded job (``--threads 1``: bit-repeatable) while a
seeded generator picks the trouble: SIGKILL or SIGTERM to random node
processes during a ``--max-restarts`` run, and SIGINT, SIGTERM or SIGHUP to
the master at start-up or just after it lost a node (while it restarts
one).  Every run must end with the uninterrupted run's result (exit 0), or
interrupted with the documented exit status (130, or 128 + the signal) --
and then ``--resume`` must reach that same result -- with nothing left
behind: no node process, no shared-memory segment, no partial checkpoint.

A few runs in CI; ``LOCALCLUSTER_CHAOS_RUNS=200`` runs more, and
``LOCALCLUSTER_CHAOS_SEED`` picks another sequence (a failure prints its
seed).
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

RUNS = int(os.environ.get("LOCALCLUSTER_CHAOS_RUNS", "3"))
SEED = int(os.environ.get("LOCALCLUSTER_CHAOS_SEED", "20261122"))
JOB = ["--threads", "1", "--json"]
EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def start(directory, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "localcluster.run", *JOB, "--checkpoint-dir",
         str(directory), *extra], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def finish(master, timeout=90):
    out, err = master.communicate(timeout=timeout)
    return master.returncode, out, err


def summary(out):
    return json.loads(out)


def weights(directory, epoch):
    """Every blob of every node's checkpoint of ``epoch``."""
    found = {}
    for name in sorted(os.listdir(directory)):
        node, _, number = name.rpartition(".")
        if number == str(epoch) and "partial" not in name:
            with np.load(os.path.join(directory, name)) as data:
                found[node] = {k: data[k].copy() for k in data.files
                               if not k.startswith("__")}
    return found


def assert_same_weights(a, b):
    assert sorted(a) == sorted(b)
    for node in a:
        assert sorted(a[node]) == sorted(b[node]), node
        for blob in a[node]:
            np.testing.assert_array_equal(a[node][blob], b[node][blob],
                                          err_msg=f"{node}/{blob}")


def nodes_of(master):
    """The master's node processes (children of its zygotes; not the
    zygotes, nor its group watcher)."""
    try:
        found = psutil.Process(master.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    nodes = []
    for proc in found:
        try:
            title = " ".join(proc.cmdline()).strip()
        except psutil.Error:
            continue
        if title.startswith("localcluster: "):
            nodes.append(proc)
    return nodes


def assert_nothing_left(master_pid, directory, children):
    _, alive = psutil.wait_procs(children, timeout=5)
    alive = [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"node processes left behind: {alive}"
    segments = [n for n in os.listdir("/dev/shm")
                if n.startswith(f"lc_{master_pid}_")]
    assert not segments, f"segments left behind: {segments}"
    partial = [n for n in os.listdir(directory) if ".partial-" in n]
    assert not partial, f"partial checkpoints left behind: {partial}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    code, out, err = finish(start(directory))
    assert code == 0, err
    last = summary(out)["last_epoch"]
    return summary(out)["epochs"][-1]["metrics"]["loss"], \
        weights(directory, last), last


def assert_uninterrupted(out, directory, uninterrupted):
    loss, expected, last = uninterrupted
    result = summary(out)
    assert result["last_epoch"] == last
    if result["epochs"]:
        assert result["epochs"][-1]["metrics"]["loss"] == loss
    else:
        # the signal came after the last epoch was saved (a 5-epoch run
        # can end within the test's window): resumed, nothing was left to
        # run -- the weights below are what the run ended with
        assert result["resumed_from"] == last, result
    assert_same_weights(weights(directory, last), expected)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("run", range(RUNS))
def test_random_node_signals_end_as_the_uninterrupted_run(
        run, tmp_path, uninterrupted):
    rng = random.Random(SEED + run)
    master = start(tmp_path, "--max-restarts", "8")
    children = []
    begun = time.monotonic()
    for at in sorted(rng.uniform(0.2, 1.2) for _ in range(rng.randint(1, 3))):
        time.sleep(max(0.0, at - (time.monotonic() - begun)))
        nodes = nodes_of(master)
        children.extend(nodes)
        if nodes:
            victim = rng.choice(nodes)
            sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
            try:
                victim.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
    code, out, err = finish(master)
    assert code == 0, f"seed {SEED + run}: exit {code}\n{err[-3000:]}"
    assert_uninterrupted(out, tmp_path, uninterrupted)
    assert_nothing_left(master.pid, tmp_path, children)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("run", range(RUNS))
def test_signals_to_the_master_at_start_up_and_restarts_stop_it_cleanly(
        run, tmp_path, uninterrupted):
    rng = random.Random(SEED + 1000 + run)
    sig = rng.choice(sorted(EXIT))
    master = start(tmp_path, "--max-restarts", "4")
    children = []
    # A signal before the interpreter has even imported site is Python's
    # own fatal error, not ours: wait for the first node to be forked.
    deadline = time.monotonic() + 30
    while not nodes_of(master) and master.poll() is None and \
            time.monotonic() < deadline:
        time.sleep(0.002)
    if rng.random() < 0.5:
        time.sleep(rng.uniform(0.0, 0.1))   # start-up: nodes being forked
    else:
        time.sleep(rng.uniform(0.1, 0.6))   # a node dies; then, restarting
        nodes = nodes_of(master)
        children.extend(nodes)
        if nodes:
            rng.choice(nodes).kill()
        time.sleep(rng.uniform(0.0, 0.05))
    children.extend(nodes_of(master))
    master.send_signal(sig)
    code, out, err = finish(master)
    context = f"seed {SEED + 1000 + run}, {sig.name}: exit {code}\n" \
              f"{err[-3000:]}"
    # 128 + N, or killed by N before the command line could handle it: a
    # shell reports both as 128 + N
    assert code in (0, EXIT[sig], -sig), context
    assert_nothing_left(master.pid, tmp_path, children)
    if code == 0:  # it had finished before the signal came
        assert_uninterrupted(out, tmp_path, uninterrupted)
        return
    if complete_epochs(tmp_path, uninterrupted):
        directory, again = tmp_path, start(tmp_path, "--resume")
    else:  # stopped before any epoch was saved on every node: start over
        directory = tmp_path / "again"
        again = start(directory)
    code, out, err = finish(again)
    assert code == 0, f"{context}\nresume: exit {code}\n{err[-3000:]}"
    assert_uninterrupted(out, directory, uninterrupted)


def complete_epochs(directory, uninterrupted):
    """Epochs with a checkpoint file of every node of the job."""
    nodes = set(uninterrupted[1])
    by_epoch = {}
    for name in os.listdir(directory):
        node, _, epoch = name.rpartition(".")
        if epoch.isdigit():
            by_epoch.setdefault(int(epoch), set()).add(node)
    return sorted(e for e, found in by_epoch.items() if found >= nodes)
