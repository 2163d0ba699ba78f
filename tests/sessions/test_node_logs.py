"""Per-node logs, their echo, and node process titles, on every session.

A node's output goes to ``<log_dir>/<node>.log`` (a header line at each
start of its process) and to the terminal only for the nodes
``log_echo`` names; ``ps`` shows each node process as
``localcluster: <node> (<master pid>)``.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from localcluster import (LocalHostScheduler, LocalSession, Node, Task,
                          TaskGroup, ops)
from localcluster.errors import NodeFailedError
from localcluster.runtime import shm
from localcluster.sessions._nodelogs import file_name

HEADER = "--- {node} started: pid "


# -- module-level op functions (they are pickled to the node processes) -----

def say_lines(_):
    """Two stdout lines and one stderr line naming the node that runs it
    (its process title names it under a process session; under
    LocalSession the op's argument does)."""
    node = _node_of(_)
    print(f"out 1 of {node}")
    print(f"err 1 of {node}", file=sys.stderr)
    print(f"out 2 of {node}", flush=True)


def _node_of(arg):
    return str(arg.item()) if hasattr(arg, "item") else str(arg)


def say_then_die(path):
    """One write (one pipe read in the master): a line and a partial
    one; then, once the master has the line in the log -- so the node's
    own relay has sent it all -- die."""
    print("said before dying\na partial line", end="", flush=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(str(path.item())) as f:
            if "said before dying" in f.read():
                break
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)


def say_partial(_):
    print("no newline at the end", end="", flush=True)


def speaking_group(names, fn=say_lines, instances=1):
    with TaskGroup() as tg:
        for name in names:
            with Node(name), Task(num_instances=instances):
                ops.Python(fn)([ops.Const(name)], [])
    return tg


def expected(node, instances=1):
    return sorted([f"out 1 of {node}", f"err 1 of {node}",
                   f"out 2 of {node}"] * instances)


def read_log(session, node):
    with open(session.log_path(node)) as f:
        return f.read().splitlines()


def body(lines):
    """The lines of a log that are not start headers."""
    return [line for line in lines if not line.startswith("--- ")]


def headers(lines, node):
    return [line for line in lines if line.startswith(HEADER.format(
        node=node))]


def skip_echo_on_ray(session_factory):
    if session_factory.kind == "ray":
        pytest.skip("the test Ray runs with log_to_driver=False: what an "
                    "actor echoes never reaches this process's terminal")


# -- the files ------------------------------------------------------------------

def test_each_node_log_holds_exactly_its_lines(session_factory, tmp_path):
    session = session_factory(log_dir=tmp_path / "logs", log_echo=False)
    session.run(speaking_group(["alpha", "beta"], instances=2))
    for node in ("alpha", "beta"):
        lines = read_log(session, node)
        assert lines[0].startswith(HEADER.format(node=node))
        assert len(headers(lines, node)) == 1
        assert sorted(body(lines)) == expected(node, instances=2)
    assert sorted(os.listdir(tmp_path / "logs")) == ["alpha.log", "beta.log"]


def test_a_second_run_appends_below_the_first(session_factory, tmp_path):
    session = session_factory(log_dir=tmp_path, log_echo=False)
    group = speaking_group(["alpha"])
    session.run(group)
    session.run(group)
    lines = read_log(session, "alpha")
    assert len(headers(lines, "alpha")) == 1   # one process, one start
    assert sorted(body(lines)) == sorted(expected("alpha") * 2)


def test_log_dir_is_made_private_and_files_are_private(session_factory,
                                                       tmp_path):
    log_dir = tmp_path / "made" / "here"
    session = session_factory(log_dir=log_dir, log_echo=False)
    session.run(speaking_group(["alpha"]))
    assert session.log_dir == str(log_dir)
    assert os.stat(log_dir).st_mode & 0o777 == 0o700
    assert os.stat(session.log_path("alpha")).st_mode & 0o777 == 0o600


def test_a_partial_last_line_is_written(session_factory, tmp_path):
    session = session_factory(log_dir=tmp_path, log_echo=False)
    session.run(speaking_group(["alpha"], fn=say_partial))
    session.close()   # the node ends (a process session's nodes here)
    assert body(read_log(session, "alpha")) == ["no newline at the end"]


@pytest.mark.parametrize("name", ["..", ".hidden", "a\x00b", "n" * 300,
                                  "tab\there"])
def test_a_hostile_node_name_stays_inside_log_dir(local, tmp_path, name):
    log_dir = tmp_path / "logs"
    session = local(log_dir=log_dir, log_echo=False)
    session.run(speaking_group([name]))
    path = session.log_path(name)
    assert os.path.dirname(path) == str(log_dir)
    assert os.listdir(log_dir) == [os.path.basename(path)]
    assert not os.path.basename(path).startswith(".")
    assert len(os.path.basename(path).encode()) <= 255
    assert sorted(body(read_log(session, name))) == expected(name)
    assert sorted(os.listdir(tmp_path)) == ["logs"]


def test_file_names_of_distinct_unsafe_names_differ():
    names = ["..", "_.", ".", "_", "a\x00b", "a\x01b", "n" * 300,
             "n" * 300 + "x", ".hidden", "_hidden"]
    files = [file_name(n) for n in names]
    assert len(set(files)) == len(names)
    assert file_name("trainer_0") == "trainer_0"   # safe names unchanged
    assert all("/" not in f and "\x00" not in f for f in files)


def test_log_files_are_closed_on_close(session_factory, tmp_path):
    session = session_factory(log_dir=tmp_path, log_echo=False)
    session.run(speaking_group(["alpha", "beta"]))
    # this process's, or -- under ray -- the actors' (a pooled actor lives
    # on past the session: its node's file must not)
    pids = {os.getpid(), *session.node_pids().values()}
    assert _open_under(tmp_path, pids)   # kept open while the session lives
    session.close()
    assert not _open_under(tmp_path, pids)


def _open_under(directory, pids):
    found, fds = [], []
    for pid in pids:
        try:
            fds += [f"/proc/{pid}/fd/{fd}"
                    for fd in os.listdir(f"/proc/{pid}/fd")]
        except FileNotFoundError:
            pass   # a node process that ended
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            found.append(target)
    return found


# -- bad options ------------------------------------------------------------

def test_a_log_dir_that_is_a_file_is_refused_naming_it(session_factory,
                                                        tmp_path):
    a_file = tmp_path / "not_a_dir"
    a_file.write_text("")
    for bad in (a_file, a_file / "below"):
        with pytest.raises(ValueError, match="log_dir") as caught:
            session_factory(log_dir=bad)
        assert str(bad) in str(caught.value)
        assert "give a directory" in str(caught.value)


@pytest.mark.parametrize("echo", [3, [1, "a"], None])
def test_a_bad_log_echo_is_a_type_error(echo):
    with pytest.raises(TypeError, match="log_echo must be"):
        LocalSession(log_echo=echo)


# -- echo ---------------------------------------------------------------------

def test_echo_false_shows_no_node_output(session_factory, tmp_path, capfd):
    skip_echo_on_ray(session_factory)
    session = session_factory(log_dir=tmp_path, log_echo=False)
    session.run(speaking_group(["alpha", "beta"]))
    session.close()
    out, err = capfd.readouterr()
    assert "of alpha" not in out + err and "of beta" not in out + err
    assert sorted(body(read_log(session, "beta"))) == expected("beta")


def test_echo_false_without_log_dir_drops_output(session_factory, capfd):
    skip_echo_on_ray(session_factory)
    session = session_factory(log_echo=False)
    session.run(speaking_group(["alpha"]))
    session.close()
    out, err = capfd.readouterr()
    assert "of alpha" not in out + err


def test_echo_patterns_show_only_matching_nodes(session_factory, tmp_path,
                                                capfd):
    skip_echo_on_ray(session_factory)
    session = session_factory(log_dir=tmp_path, log_echo=["tr*", "ps"])
    session.run(speaking_group(["trainer_0", "trainer_1", "ps", "reader"]))
    session.close()
    out, err = capfd.readouterr()
    for node in ("trainer_0", "trainer_1", "ps"):
        assert f"[{node}] out 1 of {node}" in out.splitlines()
        assert f"[{node}] err 1 of {node}" in err.splitlines()
    assert "of reader" not in out + err
    assert sorted(body(read_log(session, "reader"))) == expected("reader")


def test_local_session_output_of_other_threads_passes_through(local, capsys):
    before = sys.stdout, sys.stderr
    session = local(log_echo="alpha")
    print("the main thread speaks")
    session.run(speaking_group(["alpha", "beta"], instances=2))
    session.close()
    assert (sys.stdout, sys.stderr) == before   # put back on close
    out, err = capsys.readouterr()
    assert "the main thread speaks" in out.splitlines()
    assert sorted(line for line in out.splitlines() + err.splitlines()
                  if "alpha" in line) == sorted(
        f"[alpha] {line}" for line in expected("alpha", instances=2))
    assert "of beta" not in out + err


def test_local_session_without_log_options_leaves_output_alone(local,
                                                               capsys):
    before = sys.stdout
    session = local()
    assert sys.stdout is before
    session.run(speaking_group(["alpha"]))
    out, _ = capsys.readouterr()
    assert "out 1 of alpha" in out.splitlines()   # no [node] prefix


# -- restarts and deaths (processes) ------------------------------------------

def test_a_restarted_node_log_has_a_header_per_process(localhost, tmp_path):
    session = localhost(log_dir=tmp_path, log_echo=False)
    group = speaking_group(["alpha"])
    session.run(group)
    first = session.node_pids()["alpha"]
    os.kill(first, signal.SIGKILL)
    with pytest.raises(NodeFailedError):
        session.run(group)    # the death while idle is reported once
    session.run(group)
    second = session.node_pids()["alpha"]
    lines = read_log(session, "alpha")
    found = headers(lines, "alpha")
    assert [h.split("pid ")[1].split(",")[0] for h in found] == \
        [str(first), str(second)]
    assert lines.index(found[1]) == 1 + len(expected("alpha"))  # between
    assert title_of(second) == f"localcluster: alpha ({os.getpid()})"


def test_a_node_killed_mid_run_keeps_its_lines(localhost, tmp_path):
    session = localhost(log_dir=tmp_path, log_echo=False)
    with TaskGroup() as group, Node("alpha"), Task():
        ops.Python(say_then_die)([ops.Const(session.log_path("alpha"))], [])
    with pytest.raises(NodeFailedError) as caught:
        session.run(group)
    assert body(read_log(session, "alpha")) == ["said before dying",
                                                "a partial line"]
    assert "said before dying" in caught.value.last_log_lines


MASTER = textwrap.dedent("""
    import os, signal, sys
    from localcluster import LocalHostScheduler, Node, Task, TaskGroup, ops
    sys.path.insert(0, {tests!r})
    from test_node_logs import speaking_group
    session = LocalHostScheduler(log_dir={log_dir!r}, log_echo=False)
    session.run(speaking_group(["alpha"]))
    print(session.shm_prefix, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.timeout(60)
def test_a_master_killed_with_sigkill_leaves_every_line(tmp_path):
    script = MASTER.format(tests=os.path.dirname(__file__),
                           log_dir=str(tmp_path))
    master = subprocess.run([sys.executable, "-c", script], timeout=50,
                            stdout=subprocess.PIPE, text=True)
    assert master.returncode == -signal.SIGKILL
    prefix = master.stdout.split()[0]
    try:
        with open(tmp_path / "alpha.log") as f:
            assert sorted(body(f.read().splitlines())) == expected("alpha")
    finally:
        deadline = time.monotonic() + 5
        while [p for p in psutil.process_iter(["cmdline"])
               if " ".join(p.info["cmdline"] or ()).startswith(
                   "localcluster: alpha (")] and \
                time.monotonic() < deadline:
            time.sleep(0.05)   # the node dies with its master
        LocalHostScheduler().close()  # sweeps the dead master's segments
        assert not shm.segments(prefix)


# -- process titles and pids --------------------------------------------------

def title_of(pid):
    """A process's title as ``ps -o args`` shows it.  psutil splits a
    title at its spaces when it outgrew the argv it replaced (``python -m
    pytest`` is shorter than most titles): joined, it is the same."""
    return " ".join(psutil.Process(pid).cmdline()).strip()


def test_node_pids_and_process_titles(session_factory):
    session = session_factory()
    session.run(speaking_group(["alpha", "beta"]))
    pids = session.node_pids()
    assert sorted(pids) == ["alpha", "beta"]
    if session_factory.kind == "local":
        assert set(pids.values()) == {os.getpid()}
        return
    assert len(set(pids.values())) == 2
    for node, pid in pids.items():
        assert title_of(pid) == f"localcluster: {node} ({os.getpid()})"


def test_forked_node_process_name_is_its_title(localhost):
    session = localhost(nodes=["alpha"])
    pid = session.node_pids()["alpha"]
    title = f"localcluster: alpha ({os.getpid()})"
    # top shows the kernel's name (15 characters), ps -o args the title
    name = psutil.Process(pid).name()
    assert title.startswith(name) and len(name) >= 15
    assert title_of(pid) == title
    assert isinstance(session, LocalHostScheduler)
