"""The zygote that starts a batch of node processes and relays for them:
a death it reports names the node and how it died, nothing outlives the
master, the zygote itself is reaped, and a prototype's plan reaches its
instances once."""

import errno
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from localcluster import (Cluster, LocalHostScheduler, Node, NodeFailedError,
                          Task, TaskFailedError, TaskGroup, WorkspaceType,
                          ops)
from localcluster.runtime import shm
from localcluster.sessions import _bell, _handle
from localcluster.sessions import _protocol as P

from conftest import child_processes, kill_and_wait, running, zygote


def prototype_group(count, seconds=0.0):
    with Cluster(), TaskGroup() as group:
        with Node("trainer", num_instances=count), Task():
            ops.Add([ops.NodeIndex(), ops.Const(1)])
            if seconds:
                ops.Sleep([], seconds=seconds)
    return group


def record_commands(monkeypatch):
    """The commands the master writes to its zygotes, as they go -- and
    the runs it posts on its board: ``(None, "board", [node ids], data)``
    for each message written there (each run's after a ``(None,
    "clear", None, None)``)."""
    commands = []
    real = _handle.ZygoteLink.command
    real_put, real_clear = _handle.Board.put, _handle.Board.clear
    real_ring = _handle.Board.ring
    posted = {}

    def recording(link, kind, ids, arg):
        commands.append((link, kind, ids, arg))
        return real(link, kind, ids, arg)

    def put(board, data):
        offset = real_put(board, data)
        if offset is not None:
            posted[offset] = entry = (None, "board", [], bytes(data))
            commands.append(entry)
        return offset

    def clear(board):
        commands.append((None, "clear", None, None))
        return real_clear(board)

    def ring(board, handles, where=None):
        for handle, (offset, _) in zip(handles, where or ()):
            posted[offset][2].append(handle.id)
        return real_ring(board, handles, where)

    monkeypatch.setattr(_handle.ZygoteLink, "command", recording)
    monkeypatch.setattr(_handle.Board, "put", put)
    monkeypatch.setattr(_handle.Board, "clear", clear)
    monkeypatch.setattr(_handle.Board, "ring", ring)
    return commands


def run_commands(commands):
    """Of ``commands``, those that send runs: each a list of ``(number
    of nodes, message)``, one for each distinct message it carries (a
    command to a zygote, or a run's messages on the board)."""
    runs, board = [], None
    for _, kind, ids, arg in commands:
        if kind == "clear":
            board = None
            continue
        if kind == "board":
            msg = pickle.loads(arg)
            if msg[0] != P.RUN:
                continue
            if board is None:
                board = []
                runs.append(board)
            board.append((len(ids), msg))
            continue
        sends = [(ids, arg)] if kind == "send" else \
            arg if kind == "sends" else []
        sends = [(len(ids), pickle.loads(raw[4:])) for ids, raw in sends]
        sends = [(n, msg) for n, msg in sends if msg[0] == P.RUN]
        if sends:
            runs.append(sends)
    return runs


def zygotes():
    return [p for p in psutil.Process().children() if zygote(p)]


def test_the_nodes_of_a_run_have_one_zygote_for_parent():
    scheduler = LocalHostScheduler()
    try:
        scheduler.run(prototype_group(6))
        [parent] = zygotes()
        pids = scheduler.node_pids()
        assert sorted(pids) == [f"trainer_{i}" for i in range(6)]
        assert {psutil.Process(p).ppid() for p in pids.values()} == \
            {parent.pid}
        assert " ".join(parent.cmdline()).strip() == \
            f"localcluster zygote ({os.getpid()})"
    finally:
        scheduler.close()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_an_instance_killed_mid_run_is_named_with_its_signal(sig):
    scheduler = LocalHostScheduler()
    try:
        group = prototype_group(8, seconds=0.5)
        scheduler.run(prototype_group(8))   # started
        victim = scheduler.node_pids()["trainer_5"]
        # a master-side kill (not through the zygote): what a user or the
        # OOM killer does
        timer = threading.Timer(0.2, os.kill, (victim, sig))
        timer.start()
        with pytest.raises(NodeFailedError) as info:
            scheduler.run(group, timeout=30)
        timer.join()
        assert info.value.node == "trainer_5"
        assert info.value.signal_name == sig.name
        assert info.value.exitcode == -sig
        assert f"node 'trainer_5' died ({sig.name}" in str(info.value)
        # it restarts (from a zygote of its own) and the others kept theirs
        scheduler.run(prototype_group(8))
        assert scheduler.node_pids()["trainer_5"] != victim
    finally:
        scheduler.close()


def test_close_reaps_every_zygote():
    scheduler = LocalHostScheduler(nodes=["a", "b"])
    scheduler.run(prototype_group(4))   # a second batch: a second zygote
    found = zygotes()
    assert len(found) == 2
    scheduler.close()
    for parent in found:
        assert not parent.is_running()   # reaped, not a zombie
    assert not zygotes() and not child_processes()


def test_a_zygote_whose_nodes_all_died_exits_and_is_reaped():
    with Cluster(), TaskGroup() as group:
        with Node("a"), Task():
            ops.Const(1)
    scheduler = LocalHostScheduler(nodes=["a"])
    try:
        [parent] = zygotes()
        os.kill(scheduler.node_pids()["a"], signal.SIGKILL)
        with pytest.raises(NodeFailedError, match="'a'.*SIGKILL"):
            scheduler.run(group)
        scheduler.run(group)   # restarted: the old zygote is reaped by now
        assert not parent.is_running()
        [new] = zygotes()
        assert new.pid != parent.pid
    finally:
        scheduler.close()


def test_a_prototypes_plan_is_sent_to_its_zygote_once(monkeypatch):
    """Its instances inherit it: no run message carries its bytes, and
    the instances given the same message get it in one write (on the
    run board, or in one command to their zygote)."""
    commands = record_commands(monkeypatch)
    scheduler = LocalHostScheduler()
    try:
        group = prototype_group(12)
        scheduler.run(group)
        scheduler.run(group)
    finally:
        scheduler.close()
    runs = run_commands(commands)
    assert [len(sends) for sends in runs] == [1, 1]   # one command per run
    runs = [sends[0] for sends in runs]
    assert [n for n, _ in runs] == [12, 12]   # for all twelve
    assert all(msg[3] is None for _, msg in runs)   # no plan bytes


def test_instances_started_before_get_their_plan_in_one_command(
        monkeypatch):
    """Started up front (no plan to inherit): the plan's bytes still go to
    their zygote once, for all of them."""
    commands = record_commands(monkeypatch)
    scheduler = LocalHostScheduler(
        nodes=[f"trainer_{i}" for i in range(12)])
    try:
        scheduler.run(prototype_group(12))
    finally:
        scheduler.close()
    runs = run_commands(commands)
    assert len(runs) == 1 and len(runs[0]) == 1
    runs = runs[0]
    assert runs[0][0] == 12
    assert runs[0][1][3] is not None   # the plan's bytes, once


def _four_plans():
    """``(names, group)``: four nodes, each of its own plan (node i fills
    ``x`` with i)."""
    names = [f"worker_{i}" for i in range(4)]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for i, name in enumerate(names):
            with Node(name), Task():
                ops.ConstantFill([], ["x"], shape=[1], value=float(i))
    return names, group


def test_a_run_reaches_the_nodes_of_a_zygote_in_one_command(monkeypatch):
    """Four nodes of four plans started together (one zygote): each run
    writes each node's message once (one command to the zygote, or the
    run board) and still reaches each node with its own plan."""
    commands = record_commands(monkeypatch)
    names, group = _four_plans()
    scheduler = LocalHostScheduler(nodes=names)
    try:
        del commands[:]
        for _ in range(3):
            scheduler.run(group)
        got = [float(scheduler.fetch_blob("x", name)[0]) for name in names]
    finally:
        scheduler.close()
    runs = run_commands(commands)
    assert len(runs) == 3   # one command per run ...
    for sends in runs:     # ... with each node's message, once
        assert sorted(n for n, _ in sends) == [1, 1, 1, 1]
        assert len({msg[2] for _, msg in sends}) == 4   # four plans
    assert got == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.skipif(not _bell.AVAILABLE, reason="no futex here: runs go "
                    "through the zygote")
def test_a_run_reaches_its_nodes_with_one_wake_up_and_no_zygote(
        monkeypatch):
    """A run of a kept plan is posted on the board and all its nodes are
    woken with one system call: nothing goes through the zygote either
    way -- the answers come on the batch's reply pipe."""
    commands = record_commands(monkeypatch)
    wakes, replies = [], []
    real_wake, real_read = _bell.wake, _handle.ZygoteLink.read_replies
    monkeypatch.setattr(_bell, "wake", lambda at, bits: (
        wakes.append((getattr(at, "value", at), bits)),
        real_wake(at, bits))[1])

    def read_replies(link):
        before = {h: len(h.inbox) for h in link.handles if h is not None}
        real_read(link)
        replies.extend(h.inbox[-1][1] for h, n in before.items()
                       if len(h.inbox) > n)

    monkeypatch.setattr(_handle.ZygoteLink, "read_replies", read_replies)
    names, group = _four_plans()
    scheduler = LocalHostScheduler(nodes=names)
    try:
        scheduler.run(group)
        handles = [scheduler._nodes[n] for n in names]
        bits = 0
        for handle in handles:
            bits |= handle.bit
        del commands[:], wakes[:], replies[:]
        for _ in range(3):
            scheduler.run(group)
        woken = list(wakes)
        got = [float(scheduler.fetch_blob("x", name)[0]) for name in names]
    finally:
        scheduler.close()
    runs = run_commands([c for c in commands if c[0] is None])
    assert len(runs) == 3 and all(len(sends) == 4 for sends in runs)
    # the three runs: no command to the zygote ...
    run_sends = [c for c in commands if c[0] is not None and
                 c[1] in ("send", "sends") and any(
                     pickle.loads(raw[4:])[0] == P.RUN for _, raw in
                     ([(c[2], c[3])] if c[1] == "send" else c[3]))]
    assert run_sends == []
    # ... one wake-up of all four nodes each ...
    assert len({h.bit for h in handles}) == 4
    assert woken == [(handles[0].board.word, bits)] * 3
    # ... and every answer of the runs on the reply pipe
    assert len(replies) == 3 * 4
    assert got == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.skipif(not _bell.AVAILABLE, reason="no futex here: runs go "
                    "through the zygote")
def test_a_node_served_before_its_request_is_counted_waits_for_the_next(
        monkeypatch):
    """The master counts a post, then the request: a node may read its
    post, run it and answer before the request is counted -- and must
    then sleep, not wait for a request on its socket that never comes."""
    real_ring = _handle.Board.ring

    def slow_ring(board, handles, posts=None):
        if posts is None:
            return real_ring(board, handles)
        for handle, (offset, length) in zip(handles, posts):
            words = handle.control_word
            words[_bell.WHERE] = (offset << 32) | length
            words[_bell.POSTS] += 1
        bits = 0
        for handle in handles:
            bits |= handle.bit
        board._word[0] += 1
        _bell.wake(board.word, bits)
        time.sleep(0.3)   # the nodes answer meanwhile
        for handle in handles:
            handle.control_word[_bell.ASKED] += 1
        board._word[0] += 1
        _bell.wake(board.word, bits)

    monkeypatch.setattr(_handle.Board, "ring", slow_ring)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("quick"), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=5.0)
    scheduler = LocalHostScheduler(nodes=["quick"])
    try:
        for _ in range(3):
            scheduler.run(group, timeout=10)
        assert float(scheduler.fetch_blob("x", "quick")[0]) == 5.0
    finally:
        scheduler.close()


def test_without_futexes_every_request_goes_through_the_zygote(
        monkeypatch):
    """Where the run word cannot be used, runs go as any other request:
    one command to the zygote per run, the answers through it -- errors
    and deaths included."""
    monkeypatch.setattr(_bell, "AVAILABLE", False)
    commands = record_commands(monkeypatch)
    names = [f"worker_{i}" for i in range(3)]
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        for i, name in enumerate(names):
            with Node(name), Task():
                ops.ConstantFill([], ["x"], shape=[1], value=float(i))
    with TaskGroup(WorkspaceType.GLOBAL) as failing:
        with Node("worker_1"), Task():
            ops.Python(raise_a_long_error)([ops.Const(1)], [])
    scheduler = LocalHostScheduler(nodes=names)
    try:
        assert scheduler._board is None
        for _ in range(2):
            scheduler.run(group, timeout=30)
        with pytest.raises(TaskFailedError):
            scheduler.run(failing, timeout=30)
        os.kill(scheduler.node_pids()["worker_2"], signal.SIGKILL)
        with pytest.raises(NodeFailedError, match="'worker_2'.*SIGKILL"):
            scheduler.run(group, timeout=30)
        scheduler.run(group, timeout=30)   # restarted
        got = [float(scheduler.fetch_blob("x", name)[0]) for name in names]
    finally:
        scheduler.close()
    assert got == [0.0, 1.0, 2.0]
    assert not [c for c in commands if c[1] in ("board", "clear")]
    runs = run_commands(commands)
    # the five runs, each in one command per zygote (the last has two)
    assert len({msg[1] for sends in runs for _, msg in sends}) == 5
    assert [len(sends) for sends in runs[:2]] == [3, 3]


def test_no_room_for_the_run_board_is_no_error(monkeypatch):
    """A scheduler that cannot make its run board (a full /dev/shm)
    runs through the zygotes."""
    from localcluster.sessions import localhost

    def no_room(prefix):
        raise OSError(errno.ENOSPC, "no room")

    monkeypatch.setattr(localhost, "Board", no_room)
    with TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("solo"), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=3.0)
    scheduler = LocalHostScheduler(nodes=["solo"])
    try:
        assert scheduler._board is None
        scheduler.run(group, timeout=30)
        assert float(scheduler.fetch_blob("x", "solo")[0]) == 3.0
    finally:
        scheduler.close()


def raise_a_long_error(_):
    raise ValueError("long " + "x" * 200_000)


def test_an_answer_too_big_for_the_reply_pipe_comes_through_the_zygote(
        monkeypatch):
    """A run's answer longer than one write to the reply pipe keeps whole
    (an error of 200 kB) reaches the master all the same, and the node
    answers the next run the short way again."""
    through_zygote = []
    real_read = _handle.ZygoteLink.read

    def read(link):
        before = {h: len(h.inbox) for h in link.handles if h is not None}
        real_read(link)
        through_zygote.extend(h.inbox[-1][0] for h, n in before.items()
                              if len(h.inbox) > n and h.inbox[-1] is not
                              _handle.DEATH)

    monkeypatch.setattr(_handle.ZygoteLink, "read", read)
    with TaskGroup(WorkspaceType.GLOBAL) as failing:
        with Node("talker"), Task():
            ops.Python(raise_a_long_error)([ops.Const(1)], [])
    with TaskGroup(WorkspaceType.GLOBAL) as fine:
        with Node("talker"), Task():
            ops.ConstantFill([], ["x"], shape=[1], value=2.0)
    scheduler = LocalHostScheduler(nodes=["talker"])
    try:
        del through_zygote[:]
        with pytest.raises(TaskFailedError) as info:
            scheduler.run(failing, timeout=30)
        assert "x" * 200_000 in str(info.value.__cause__)
        if _bell.AVAILABLE:
            assert through_zygote == [P.ERROR]
        del through_zygote[:]
        scheduler.run(fine, timeout=30)
        assert float(scheduler.fetch_blob("x", "talker")[0]) == 2.0
        if _bell.AVAILABLE:   # (the fetch's answer: by the zygote)
            assert through_zygote == [P.OK]
    finally:
        scheduler.close()


def test_a_plan_bigger_than_a_socket_buffer_reaches_every_instance():
    import numpy as np
    big = np.arange(400_000, dtype=np.float64)   # 3.2 MB in the plan
    with Cluster(), TaskGroup(WorkspaceType.GLOBAL) as group:
        with Node("trainer", num_instances=4), Task():
            ops.Add([ops.ReduceSum([ops.Const(big)]), ops.NodeIndex()],
                     ["total"])
    scheduler = LocalHostScheduler(nodes=[f"trainer_{i}" for i in range(4)])
    try:
        scheduler.run(group)
        for i in range(4):
            assert float(scheduler.fetch_blob("total", f"trainer_{i}")) \
                == big.sum() + i
    finally:
        scheduler.close()


def test_output_of_many_instances_reaches_each_ones_log(tmp_path):
    def group():
        with Cluster(), TaskGroup() as g:
            with Node("talker", num_instances=10), Task():
                ops.Python(_talk)([ops.NodeIndex()], [])
        return g

    scheduler = LocalHostScheduler(log_dir=str(tmp_path), log_echo=False)
    try:
        scheduler.run(group())
        pids = scheduler.node_pids()
    finally:
        scheduler.close()
    for i in range(10):
        text = (tmp_path / f"talker_{i}.log").read_text().splitlines()
        assert text[0].startswith(f"--- talker_{i} started: pid "
                                  f"{pids[f'talker_{i}']},")
        lines = text[1:]
        # a line longer than a frame arrives whole, in order
        assert lines == [f"{i}:{j}:" + "x" * (j * 997) for j in range(8)]


def _talk(index):
    for j in range(8):
        print(f"{int(index)}:{j}:" + "x" * (j * 997))


MASTER = textwrap.dedent("""
    import numpy as np
    from localcluster import (Cluster, LocalHostScheduler, Node, Task,
                              TaskGroup, ops)
    session = LocalHostScheduler({start_method!r})
    with Cluster(), TaskGroup() as tg:
        with Node("trainer", num_instances=20), Task():
            ops.Add([ops.NodeIndex(), ops.Const(1)])
    session.run(tg)
    session.feed_blob("big", np.ones(1 << 16), node="trainer_3")
    print(session.shm_prefix, *session.node_pids().values(), flush=True)
    import time
    time.sleep(3600)
""")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_killed_master_takes_every_instance_and_segment_with_it(
        start_method):
    master = subprocess.Popen(
        [sys.executable, "-c", MASTER.format(start_method=start_method)],
        stdout=subprocess.PIPE, text=True)
    try:
        prefix, *pids = master.stdout.readline().split()
        assert len(pids) == 20
        assert shm.segments(prefix), "the master made no segments"
        nodes = [psutil.Process(int(p)) for p in pids]
        parents = {n.ppid() for n in nodes}
        took, alive = kill_and_wait(master, nodes)
        assert not alive, f"instances outlived their master: {alive}"
        # the zygote went too: it notices its master's end on its own, a
        # moment after the nodes (which die by the kernel's signal)
        deadline = time.monotonic() + 10
        zygotes = []
        for pid in parents:
            try:
                zygotes.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        while any(map(running, zygotes)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not any(map(running, zygotes)), \
            f"the zygote outlived its master: {zygotes}"
        deadline = time.monotonic() + 10
        while shm.segments(prefix) and time.monotonic() < deadline:
            time.sleep(0.05)   # the group watcher sweeps them
        assert not shm.segments(prefix)
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
        master.stdout.close()



def _flood():
    for _ in range(4000):
        print("x" * 250)


def _die_soon():
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_death_is_reported_while_the_master_shows_no_output(monkeypatch,
                                                             capfd):
    """The master's terminal takes nothing (a pager stopped, say): the
    output pipe fills, and the zygote still reports a death at once."""
    gate = threading.Event()

    class Stuck:
        def write(self, text):
            gate.wait(60)

        def flush(self):
            pass

    with Cluster(), TaskGroup() as group:
        with Node("talker"), Task():
            ops.Python(_flood)([], [])
        with Node("victim"), Task():
            ops.Python(_die_soon)([], [])
    from localcluster.sessions import localhost
    stuck = Stuck()
    monkeypatch.setattr(localhost, "std_stream",
                        lambda tag: stuck if tag == "out" else sys.stderr)
    scheduler = LocalHostScheduler(nodes=["talker", "victim"])
    try:
        started = time.monotonic()
        with capfd.disabled(), pytest.raises(NodeFailedError) as info:
            scheduler.run(group, timeout=30)
        assert info.value.node == "victim"
        assert info.value.signal_name == "SIGKILL"
        assert time.monotonic() - started < 15
    finally:
        gate.set()
        monkeypatch.undo()
        scheduler.close()
