"""python -m localcluster.run under faults and bad input: signals at the
wrong moment, hung nodes, leftovers of killed runs, a checkpoint directory
two runs want, odd trace paths, closed streams, out-of-range options.
Every case ends in a clear error or a correct result, with nothing left
behind.  (Tests are grouped by the point of the hardening issue they pin.)
"""

import functools
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from test_run import (SLOW_JOB, USER_JOB, final_loss, json_run, leftovers,
                      run)

EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


def command(*args):
    return [sys.executable, "-m", "localcluster.run", *args]


def error_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def no_traceback(done):
    assert "Traceback" not in done.stderr + done.stdout, done.stderr


def write_job(tmp_path, text=USER_JOB, name="myjob.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


def stop_after_first_epoch(proc, sig=signal.SIGINT, wait=0.1):
    """Send ``sig`` once the run printed its first epoch; its output."""
    lines = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("epoch 1/") or not line:
                time.sleep(wait)
                proc.send_signal(sig)
                break
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return "".join(lines) + out, err


# -- 1: a signal while the master forks a node -------------------------------------

FORK_SIGNAL_JOB = textwrap.dedent('''
    import os, signal
    from localcluster.examples import regression

    # Loaded by the master: the first fork after this sends the master a
    # signal from inside the fork (an at-fork hook), the moment a handler
    # that raises loses its exception.
    MASTER, SENT = os.getpid(), []

    def _signal_master():
        if os.getpid() == MASTER and not SENT:
            SENT.append(1)
            os.kill(MASTER, int(os.environ["LC_TEST_SIGNAL"]))

    os.register_at_fork(before=_signal_master)

    def build(nodes=2, epochs=3, seed=0, threads=1):
        return regression.build(nodes=nodes, epochs=epochs, seed=seed,
                                threads=threads)
''')


@pytest.mark.parametrize("sig", sorted(EXIT))
def test_a_signal_while_the_master_forks_a_node_stops_the_run(tmp_path, sig):
    job = write_job(tmp_path, FORK_SIGNAL_JOB, "forkjob.py")
    ckpt = tmp_path / "c"
    proc = subprocess.Popen(
        command("--job", f"{job}:build", "--checkpoint-dir", str(ckpt)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, LC_TEST_SIGNAL=str(int(sig))))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT[sig], out + err
    assert "done:" not in out and "epoch 1/" not in out, out
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert leftovers(proc.pid) == ([], [])
    assert not [f for f in os.listdir(ckpt) if ".partial-" in f]


SCHEDULER_FORK_SIGNAL = textwrap.dedent('''
    import os, signal
    from localcluster import LocalHostScheduler

    class Stop(Exception):
        pass

    def stop(signum, frame):
        raise Stop()

    signal.signal(signal.SIGTERM, stop)
    MASTER, SENT = os.getpid(), []

    def _signal_master():
        if os.getpid() == MASTER and not SENT:
            SENT.append(1)
            os.kill(MASTER, signal.SIGTERM)

    os.register_at_fork(before=_signal_master)
    session = LocalHostScheduler()
    try:
        session.start_nodes(["a", "b"])
        print("lost", flush=True)
    except Stop:
        print("stopped", sorted(session.node_pids()), flush=True)
    finally:
        session.close()
''')


def test_a_signal_during_a_fork_reaches_the_schedulers_caller():
    done = subprocess.run([sys.executable, "-c", SCHEDULER_FORK_SIGNAL],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "stopped []", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


# -- 3: --timeout ---------------------------------------------------------------------

HANG_JOB = USER_JOB + textwrap.dedent('''

    def hang_once(epoch, marker):
        import os, time
        if int(epoch) == 2 and not os.path.exists(str(marker)):
            open(str(marker), "w").close()
            time.sleep(60)

    def hangs(epochs=4):
        import os
        marker = os.path.join(os.path.dirname(__file__), "hung")
        with Job() as job, Node("worker"):
            with job.init_group, Task():
                ops.Const(np.array(0.0), name="x")
                ops.Const(np.array(0), name="epoch_no")
                ops.Const(np.array(marker), name="marker")
            with Task() as task:
                ops.Add(["epoch_no", ops.Const(np.array(1))], ["epoch_no"])
                ops.Add(["x", ops.Const(np.array(1.0))], ["x"])
                ops.Python(hang_once)(["epoch_no", "marker"], [])
                out = task.add_output("x")
            epoch_limiter(job, epochs)
        return job, {"metrics": {"x": out}}
''')


def test_a_timed_out_run_is_one_line_naming_the_late_node(tmp_path):
    job = write_job(tmp_path, HANG_JOB)
    started = time.monotonic()
    done = run("--job", f"{job}:hangs", "--timeout", "1",
               "--checkpoint-dir", str(tmp_path / "c"), timeout=60)
    assert done.returncode == 1, done.stderr
    assert time.monotonic() - started < 30
    [line] = error_lines(done.stderr)
    assert "--timeout 1 s" in line and "'worker'" in line, line
    assert "--max-restarts" in line and "resume with:" in line, line
    no_traceback(done)


def test_max_restarts_recovers_a_timed_out_node(tmp_path):
    job = write_job(tmp_path, HANG_JOB)
    summary, _ = json_run("--job", f"{job}:hangs", "--timeout", "1",
                          "--max-restarts", "1", "--checkpoint-dir",
                          str(tmp_path / "c"))
    assert (tmp_path / "hung").exists()
    assert [r["resumed_from"] for r in summary["restarts"]] == [1]
    assert summary["epochs"][-1]["metrics"]["x"] == 4


STOPPED_NODE_JOB = USER_JOB + textwrap.dedent('''

    import os, signal

    # Loaded by the master: the first process it forks -- the node --
    # stops before it is ready (as a node stopped with SIGSTOP would).
    FORKS = []
    os.register_at_fork(
        before=lambda: FORKS.append(1),
        after_in_child=lambda: len(FORKS) == 1 and os.kill(os.getpid(),
                                                           signal.SIGSTOP))
''')


def test_a_node_that_does_not_start_is_bounded_by_the_timeout(tmp_path):
    job = write_job(tmp_path, STOPPED_NODE_JOB, "stopped_job.py")
    started = time.monotonic()
    proc = subprocess.Popen(
        command("--job", f"{job}:build", "--timeout", "2",
                "--checkpoint-dir", str(tmp_path / "c")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 1, out + err
    assert took < 20, f"the stopped node held the run {took:.1f} s"
    [line] = error_lines(err)
    assert "'worker'" in line and "did not start" in line, line
    assert "--timeout 2 s" in line and "--max-restarts" in line, line
    assert "Traceback" not in out + err, err
    assert leftovers(proc.pid) == ([], [])


def usage_error(capsys, *args):
    """The command line's usage error for ``args`` (parsed in this
    process: no job runs), as its one line."""
    from localcluster.cli.run import main
    with pytest.raises(SystemExit) as stopped:
        main(list(args))
    assert stopped.value.code == 2, args
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_timeout_must_be_a_positive_number_of_seconds(capsys):
    for value in ("0", "-1", "soon", "nan", "1e30"):
        line = usage_error(capsys, "--timeout", value)
        assert "argument --timeout" in line and "seconds" in line, line


# -- 5: repeated Ctrl-C, Ctrl-C at start-up, the run file ----------------------------

@pytest.mark.timeout(120)
def test_repeated_ctrl_c_exits_130_without_a_traceback(tmp_path):
    for attempt in range(3):
        proc = subprocess.Popen(
            command("--epochs", "50", "--checkpoint-dir",
                    str(tmp_path / str(attempt))),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            while not proc.stdout.readline().startswith("epoch"):
                assert proc.poll() is None
            while proc.poll() is None:  # a Ctrl-C held down
                proc.send_signal(signal.SIGINT)
                time.sleep(0.005)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.returncode == 130, err
        assert "Traceback" not in err and "Exception ignored" not in err, err
        assert leftovers(proc.pid) == ([], [])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_line_starts_is_its_exit_status(sig):
    # ~3 s of argument parsing: the signal lands while the command line
    # sets itself up, before it has a run to stop
    proc = subprocess.Popen(command(*["--seed", "1"] * 10000,
                                    "--print-plan"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(1.2)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT[sig], err
    assert err.strip() == "interrupted", err


def test_a_stop_raised_where_it_cannot_propagate_is_raised_again(capfd):
    from localcluster.cli.signals import Interrupted, StopSignals
    signals = StopSignals()
    signals.install()
    try:
        signals.arm()

        class Thing:
            pass

        def callback(ref):  # the handler runs here: its exception is lost
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass

        import weakref
        thing = Thing()
        ref = weakref.ref(thing, callback)
        started = time.monotonic()
        with pytest.raises(Interrupted) as raised:
            del thing
            time.sleep(5)  # raised again, in the main thread's own code
        assert raised.value.signum == signal.SIGTERM
        assert time.monotonic() - started < 2
        assert ref() is None
    finally:
        signals.restore()
    assert "Interrupted" not in capfd.readouterr().err


def test_the_run_file_is_never_left_half_written(tmp_path, monkeypatch):
    from localcluster.cli.rundir import directory as rundir
    rundir.save_options(str(tmp_path), "a:b", {"nodes": 1})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rundir.json, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):
        rundir.save_options(str(tmp_path), "a:b", {"nodes": 2})
    assert os.listdir(tmp_path) == [rundir.RUN_FILE]
    assert rundir.saved_options(str(tmp_path))["nodes"] == 1


# -- 12: partial checkpoints of killed runs -----------------------------------------

def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def plant_partial(directory, pid, age=0.0, base="ps.3"):
    path = os.path.join(directory, f"{base}.partial-{pid}-0badf00d")
    with open(path, "wb") as f:
        f.write(b"PK half a checkpoint")
    if age:
        os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_zombie_writer_is_not_alive(tmp_path):
    from localcluster.checkpoint.fileformat import remove_partials
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # exited, not reaped: a zombie
            with open(f"/proc/{zombie.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        path = plant_partial(str(tmp_path), zombie.pid)
        removed = remove_partials(str(tmp_path / "ps.3"), dead_only=True)
        assert removed == [os.path.basename(path)]
    finally:
        zombie.wait()


def test_a_reused_pid_is_not_the_writer(tmp_path):
    from localcluster.checkpoint.fileformat import remove_partials
    # a live process that started an hour after the file was last written
    other = subprocess.Popen([sys.executable, "-c",
                              "import time; time.sleep(30)"])
    try:
        path = plant_partial(str(tmp_path), other.pid, age=3600)
        removed = remove_partials(str(tmp_path / "ps.3"), dead_only=True)
        assert removed == [os.path.basename(path)]
    finally:
        other.kill()
        other.wait()


def test_a_live_writer_keeps_its_partial_file(tmp_path):
    from localcluster.checkpoint.fileformat import remove_partials
    path = plant_partial(str(tmp_path), os.getpid())
    assert remove_partials(str(tmp_path / "ps.3"), dead_only=True) == []
    assert os.path.exists(path)


BIG_JOB = textwrap.dedent('''
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    def build(epochs=3):
        with Job() as job, Node("worker"):
            with job.init_group, Task():
                # 64 MiB: a checkpoint takes a moment to write
                ops.ConstantFill([], ["big"], shape=[8 << 20], value=1.0)
                ops.Const(np.array(0.0), name="x")
            with Task():
                ops.Add(["x", ops.Const(np.array(1.0))], ["x"])
            epoch_limiter(job, epochs)
        return job
''')


@pytest.mark.timeout(120)
def test_partials_of_a_sigkilled_master_go_on_cleanup(tmp_path):
    job = write_job(tmp_path, BIG_JOB, "big_job.py")
    ckpt = tmp_path / "c"
    master = subprocess.Popen(
        command("--job", f"{job}:build", "--checkpoint-dir", str(ckpt)),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and master.poll() is None:
            if ckpt.is_dir() and any(".partial-" in n
                                     for n in os.listdir(ckpt)):
                master.kill()  # while a node writes its checkpoint
                break
            time.sleep(0.001)
    finally:
        master.kill()
        master.wait(10)
    partials = [n for n in os.listdir(ckpt) if ".partial-" in n]
    if not partials:
        pytest.skip("the checkpoint was written before the master died")
    deadline = time.monotonic() + 10  # the writer dies with its master
    while time.monotonic() < deadline and any(
            _alive(int(n.split(".partial-")[1].split("-")[0]))
            for n in partials):
        time.sleep(0.01)
    done = run("--cleanup", "--checkpoint-dir", str(ckpt))
    assert done.returncode == 0, done.stderr
    assert [n for n in os.listdir(ckpt) if ".partial-" in n] == []
    assert all(n in done.stdout for n in partials)


def _alive(pid):
    """Running, not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_next_run_removes_partials_a_killed_run_left(tmp_path):
    ckpt = str(tmp_path / "c")
    json_run("--nodes", "1", "--epochs", "2", "--checkpoint-dir", ckpt)
    partial = plant_partial(ckpt, dead_pid())
    done = run("--checkpoint-dir", ckpt, "--resume")
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(partial)


def test_cleanup_removes_partials_of_dead_writers(tmp_path):
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    gone = plant_partial(str(ckpt), dead_pid())
    alive = plant_partial(str(ckpt), os.getpid(), base="ps.4")
    done = run("--cleanup", "--checkpoint-dir", str(ckpt))
    assert done.returncode == 0, done.stderr
    assert gone in done.stdout and "partial checkpoint" in done.stdout
    assert not os.path.exists(gone) and os.path.exists(alive)
    done = run("--cleanup", "--json", "--checkpoint-dir", str(ckpt))
    assert json.loads(done.stdout)["partial_checkpoints"] == []


# -- 14: one run per checkpoint directory --------------------------------------------

def test_a_directory_of_another_run_is_refused_without_resume(tmp_path):
    ckpt = str(tmp_path / "c")
    json_run("--nodes", "1", "--epochs", "2", "--checkpoint-dir", ckpt)
    done = run("--nodes", "1", "--epochs", "1", "--checkpoint-dir", ckpt)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "holds another run's checkpoints" in line
    assert "--resume" in line and "--overwrite" in line
    summary, _ = json_run("--nodes", "1", "--epochs", "1", "--overwrite",
                          "--checkpoint-dir", ckpt)
    assert summary["last_epoch"] == 1
    assert not os.path.exists(os.path.join(ckpt, "ps.2"))  # the old run's


def test_resume_compares_options_left_at_their_defaults(tmp_path):
    ckpt = str(tmp_path / "c")
    json_run("--epochs", "2", "--checkpoint-dir", ckpt)  # --nodes 2, seed 0
    for option, value in (("--nodes", "1"), ("--seed", "9"),
                          ("--threads", "1")):
        done = run("--checkpoint-dir", ckpt, "--resume", "1", option, value)
        assert done.returncode == 2, (option, done.stdout)
        assert f"differs from the {option}" in done.stderr
        assert "epoch 2/" not in done.stdout


def test_a_second_run_into_a_directory_in_use_is_refused(tmp_path):
    job = write_job(tmp_path, SLOW_JOB, "slow_job.py")
    ckpt = str(tmp_path / "c")
    first = subprocess.Popen(
        command("--job", f"{job}:build", "--epochs", "4", "--checkpoint-dir",
                ckpt), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        while not first.stdout.readline().startswith("epoch 1/"):
            assert first.poll() is None
        second = run("--checkpoint-dir", ckpt, "--resume")
        out, err = first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert first.returncode == 0, err
    assert second.returncode == 1
    [line] = second.stderr.strip().splitlines()
    assert "is in use by another run" in line and str(first.pid) in line
    assert "epoch" not in second.stdout
    # the lock went with the run that held it
    assert "localcluster-run.lock" not in os.listdir(ckpt)
    done = run("--checkpoint-dir", ckpt, "--resume")
    assert done.returncode == 0 and "no epoch left" in done.stdout


FORKING_JOB = USER_JOB + textwrap.dedent('''

    def fork_once(marker):
        import os, time
        if os.path.exists(str(marker)):
            return
        child = os.fork()
        if child == 0:  # the node's title, the node's descriptors
            time.sleep(3600)
            os._exit(0)
        with open(str(marker) + ".tmp", "w") as f:
            f.write(str(child))
        os.rename(str(marker) + ".tmp", str(marker))

    def forks(epochs=40):
        import os
        marker = os.path.join(os.path.dirname(__file__), "child")
        with Job() as job, Node("worker"):
            with job.init_group, Task():
                ops.Const(np.array(0.0), name="x")
                ops.Const(np.array(marker), name="marker")
            with Task() as task:
                ops.Add(["x", ops.Const(np.array(1.0))], ["x"])
                ops.Python(fork_once)(["marker"], [])
                ops.Sleep([], seconds=0.25)
                out = task.add_output("x")
            epoch_limiter(job, epochs)
        return job, {"metrics": {"x": out}}
''')


@pytest.mark.timeout(120)
def test_a_killed_masters_node_children_die_and_free_its_directory(tmp_path):
    from localcluster import LocalHostScheduler
    from localcluster.cli.rundir.directory import LOCK_FILE, in_use
    job = write_job(tmp_path, FORKING_JOB, "forking_job.py")
    ckpt = str(tmp_path / "c")
    marker, child = tmp_path / "child", None
    master = subprocess.Popen(
        command("--job", f"{job}:forks", "--checkpoint-dir", ckpt),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert master.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        child = int(marker.read_text())
        # the directory's lock is the master's alone: not held by what
        # its nodes fork
        held = [os.readlink(f"/proc/{child}/fd/{fd}")
                for fd in os.listdir(f"/proc/{child}/fd")]
        assert not [f for f in held if f.endswith(LOCK_FILE)], held
        master.kill()
        master.wait(10)
        gone = time.monotonic()
        while _alive(child) and time.monotonic() - gone < 10:
            time.sleep(0.01)
        took = time.monotonic() - gone
        assert not _alive(child), "the node's child outlived its master"
        assert took < 2, f"the node's child took {took:.2f} s to die"
    finally:
        if master.poll() is None:
            master.kill()
            master.wait(10)
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)
    assert in_use(ckpt) == (False, None)   # --resume is not refused
    LocalHostScheduler().close()   # sweeps the dead master's segments
    assert leftovers(master.pid) == ([], [])


def test_resume_with_more_epochs_trains_further(tmp_path):
    common = ["--nodes", "1", "--threads", "1", "--seed", "4"]
    expected, _ = json_run(*common, "--epochs", "4", "--checkpoint-dir",
                           str(tmp_path / "u"))
    ckpt = str(tmp_path / "c")
    json_run(*common, "--epochs", "2", "--checkpoint-dir", ckpt)
    further, _ = json_run("--checkpoint-dir", ckpt, "--resume", "latest",
                          "--epochs", "4")
    assert [e["epoch"] for e in further["epochs"]] == [3, 4]
    assert final_loss(further) == final_loss(expected)
    # the directory now says 4: a plain --resume has nothing left to do
    done = run("--checkpoint-dir", ckpt, "--resume")
    assert done.returncode == 0 and "no epoch left" in done.stdout


# -- 16: --trace ------------------------------------------------------------------------

def test_trace_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    target = tmp_path / "precious"
    target.write_text("keep me")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    cases = [(fifo, "a FIFO"), (link, "a symlink")]
    if os.path.isdir("/proc"):
        cases.append(("/proc/t.json", "no file can be made"))
    for path, what in cases:
        done = run("--trace", str(path), "--epochs", "1")
        assert done.returncode == 2, path
        [line] = done.stderr.strip().splitlines()
        assert str(path) in line and what in line, line
        assert "epoch" not in done.stdout
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.path.islink(link) and target.read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link.json", "precious"]


def test_an_interrupted_run_writes_its_trace(tmp_path):
    job = write_job(tmp_path, SLOW_JOB, "slow_job.py")
    trace = tmp_path / "trace.json"
    proc = subprocess.Popen(
        command("--job", f"{job}:build", "--trace", str(trace),
                "--checkpoint-dir", str(tmp_path / "c")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = stop_after_first_epoch(proc)
    assert proc.returncode == 130, err
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "epoch 1" for e in events)
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_a_failed_run_writes_its_trace(tmp_path):
    job = write_job(tmp_path)
    trace = tmp_path / "trace.json"
    done = run("--job", f"{job}:broken", "--trace", str(trace),
               "--checkpoint-dir", str(tmp_path / "c"))
    assert done.returncode == 1
    assert "traceEvents" in json.loads(trace.read_text())


# -- 17: no tracebacks --------------------------------------------------------------

def test_resume_from_an_epoch_that_is_not_there_is_one_line(tmp_path):
    ckpt = str(tmp_path / "c")
    json_run("--nodes", "1", "--epochs", "2", "--checkpoint-dir", ckpt)
    done = run("--checkpoint-dir", ckpt, "--resume", "99")
    assert done.returncode == 1
    no_traceback(done)
    [line] = done.stderr.strip().splitlines()
    assert "--resume 99" in line and "--resume 2" in line, line
    os.unlink(os.path.join(ckpt, "ps.2"))
    done = run("--checkpoint-dir", ckpt, "--resume", "2")
    assert done.returncode == 1
    no_traceback(done)
    [line] = done.stderr.strip().splitlines()
    assert "ps" in line and "--resume 1" in line, line


def run_with_open_files(limits, *args):
    """The command line run with RLIMIT_NOFILE ``(soft, hard)``."""
    proc = subprocess.Popen(
        command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=functools.partial(
            resource.setrlimit, resource.RLIMIT_NOFILE, limits))
    out, err = proc.communicate(timeout=120)
    return proc, out, err


@pytest.mark.timeout(180)
def test_too_few_descriptors_for_the_nodes_is_one_line_naming_the_limit(
        tmp_path):
    # (the master holds none per node: their zygote holds one each)
    proc, out, err = run_with_open_files(
        (128, 128), "--nodes", "200", "--epochs", "1", "--checkpoint-dir",
        str(tmp_path / "c"))
    assert proc.returncode == 1, out + err
    [line] = error_lines(err)
    assert "out of file descriptors starting 202 node process(es)" in line
    assert "may have 128 open (soft RLIMIT_NOFILE; hard limit 128)" in line
    assert "needs about" in line and "ulimit -n 256" in line, line
    assert "Traceback" not in out + err, err
    assert "epoch 1/" not in out
    assert leftovers(proc.pid) == ([], [])   # nothing was started


@pytest.mark.timeout(180)
def test_a_low_soft_descriptor_limit_is_raised_for_the_nodes(tmp_path):
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024:
        pytest.skip(f"the hard limit here ({hard}) leaves no room")
    proc, out, err = run_with_open_files(
        (128, hard), "--nodes", "60", "--epochs", "1", "--checkpoint-dir",
        str(tmp_path / "c"))
    assert proc.returncode == 0, out + err
    assert "epoch 1/1" in out and "Traceback" not in err, err
    assert leftovers(proc.pid) == ([], [])


def test_a_closed_stdout_is_one_line(tmp_path):
    done = subprocess.run(command("--epochs", "1"), stdin=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=60,
                          preexec_fn=lambda: os.close(1))
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "standard output is closed" in line, done.stderr


# -- 18: what a failure says -----------------------------------------------------------

def test_a_failing_op_shows_where_in_the_users_code(tmp_path):
    job = write_job(tmp_path)
    done = run("--job", f"{job}:broken", "--checkpoint-dir",
               str(tmp_path / "c"))
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    at = lines.index(error_lines(done.stderr)[0])
    where = "\n".join(lines[at + 1:])
    line_no = USER_JOB.splitlines().index(
        '    raise RuntimeError("the user\'s op broke")') + 1
    assert f"{job}:{line_no} in explode" in where, done.stderr
    assert "--log-level DEBUG" in where
    assert "resume with" not in done.stderr
    debug = run("--job", f"{job}:broken", "--log-level", "debug",
                "--checkpoint-dir", str(tmp_path / "d"))
    assert "Traceback (most recent call last)" in debug.stderr
    assert "numpy_ops.py" in debug.stderr  # the frames inside localcluster


UNPICKLABLE_JOB = USER_JOB + textwrap.dedent('''

    def unpicklable(epochs=2):
        job, options = build(epochs)
        with job.epoch_group, Node("worker"), Task():
            ops.Python(lambda: None)([], [])
        return job, options

    def fails_at_2(epochs=3):
        job, options = build(epochs)
        with job.epoch_group, Node("worker"), Task():
            ops.Python(fail_past_1)(["x"], [])
        return job, options

    def fail_past_1(x):
        if float(x) > 1:
            raise RuntimeError("the op fails from epoch 2 on")
''')


def test_errors_that_recur_give_no_resume_hint(tmp_path):
    job = write_job(tmp_path, UNPICKLABLE_JOB)
    ckpt = tmp_path / "c"
    done = run("--job", f"{job}:fails_at_2", "--checkpoint-dir", str(ckpt))
    assert done.returncode == 1
    assert os.path.exists(ckpt / "worker.1")  # there was something to resume
    [line] = error_lines(done.stderr)
    assert "epoch 2 on" in line and "resume with" not in done.stderr, line


def test_a_plan_that_cannot_be_sent_is_refused_before_any_checkpoint(
        tmp_path):
    """A lambda in the epoch group cannot reach a node process: refused
    when the Job is validated, before the init group ran and epoch 0 was
    saved (it failed at epoch 1, after both)."""
    job = write_job(tmp_path, UNPICKLABLE_JOB)
    ckpt = tmp_path / "c"
    done = run("--job", f"{job}:unpicklable", "--checkpoint-dir", str(ckpt))
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    assert "the job's epoch group" in line and "lambda" in line, line
    assert "resume with" not in done.stderr
    assert not os.path.exists(ckpt / "worker.0")


def test_a_node_death_mentions_max_restarts_and_how_to_resume(tmp_path):
    job = write_job(tmp_path)
    done = run("--job", f"{job}:fragile", "--checkpoint-dir",
               str(tmp_path / "c"))
    assert done.returncode == 1
    [line] = error_lines(done.stderr)
    assert "'worker' died" in line and "--max-restarts" in line, line
    assert "resume with:" in line


OUT_OF_MEMORY_JOB = USER_JOB + textwrap.dedent('''

    def no_memory(*args):
        raise MemoryError()

    class Hungry:
        """An op function the node runs out of memory unpickling."""

        def __call__(self):
            return None

        def __reduce__(self):
            return (no_memory, ())

    def hungry_plan(epochs=2):
        job, options = build(epochs)
        with job.epoch_group, Node("worker"), Task():
            ops.Python(Hungry())([], [])
        return job, options

    def hungry_later(epochs=3):
        # the node (forked after this) has no memory for its 4th request
        # (however it comes: on the run board or the node's socket)
        import os
        from localcluster.sessions import _node
        master, original, calls = os.getpid(), _node._NodeServer._next, []

        def next_request(self):
            if os.getpid() != master:
                calls.append(1)
                if len(calls) == 4:
                    raise MemoryError()
            return original(self)
        _node._NodeServer._next = next_request
        return build(epochs)
''')


@pytest.mark.parametrize("builder, words", [
    ("hungry_plan", ["'worker' ran out of memory while loading the plan"]),
    # (while running -- or receiving its plan, if it was seen dead first)
    ("hungry_later", ["'worker' died (exit 86) while ",
                      "; it ran out of memory (MemoryError)"]),
])
def test_a_node_out_of_memory_outside_its_ops_is_one_line(tmp_path,
                                                          builder, words):
    job = write_job(tmp_path, OUT_OF_MEMORY_JOB)
    done = run("--job", f"{job}:{builder}", "--checkpoint-dir",
               str(tmp_path / "c"))
    assert done.returncode == 1
    no_traceback(done)
    [line] = error_lines(done.stderr)
    assert all(w in line for w in words), line
    assert "fewer or smaller blobs, or more memory" in line, line
    # said once: no warning before the error, no node output
    assert [line] == done.stderr.strip().splitlines(), done.stderr


# -- 19: bounds and forms of the options --------------------------------------------

@pytest.mark.parametrize("args, expected", [
    (["--nodes", "100000"], "from 1 to 4096"),
    (["--nodes", "1e20"], "is not a whole number"),
    (["--epochs", "100000000000000000000"], "from 1 to 1000000"),
    (["--threads", "0"], "from 1 to"),
    (["--log-level", "loud"], "invalid choice"),
])
def test_options_out_of_bounds_are_one_line_usage_errors(capsys, args,
                                                        expected):
    line = usage_error(capsys, *args)
    assert line.startswith("python -m localcluster.run: error: argument "
                           + args[0]) and expected in line, line


def test_log_level_takes_any_case():
    done = run("--print-plan", "--log-level", "info")
    assert done.returncode == 0, done.stderr


def test_print_plan_json_is_json_and_makes_nothing(tmp_path):
    ckpt = tmp_path / "never"
    done = run("--print-plan", "--json", "--nodes", "3", "--checkpoint-dir",
               str(ckpt))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["nodes"] == ["reader", "trainer_0", "trainer_1",
                             "trainer_2", "ps"]
    assert plan["options"]["nodes"] == 3
    assert any("node trainer (prototype: 3 instances trainer_0..trainer_2)"
               in line for line in plan["plan"])
    assert not ckpt.exists()
    done = run("--print-plan", "--checkpoint-dir", str(ckpt))
    assert done.returncode == 0 and not ckpt.exists()


# -- 20: what README promises ----------------------------------------------------------

def test_resume_latest_resumes_from_the_latest_complete_epoch(tmp_path):
    ckpt = str(tmp_path / "c")
    json_run("--nodes", "1", "--epochs", "3", "--checkpoint-dir", ckpt)
    os.unlink(os.path.join(ckpt, "reader.3"))  # epoch 3 is incomplete
    summary, _ = json_run("--checkpoint-dir", ckpt, "--resume", "latest")
    assert summary["resumed_from"] == 2
    assert [e["epoch"] for e in summary["epochs"]] == [3]


def test_resume_without_the_run_file_refuses_another_number_of_nodes(
        tmp_path):
    """The checkpoints themselves say which nodes wrote them: with the run
    file gone, --resume --nodes 1 on a 2-trainer run's checkpoints is one
    error line saying the trainers' prototype had 2 instances, not a mixed
    job trained to exit 0."""
    ckpt = str(tmp_path / "c")
    first = subprocess.run(command("--nodes", "2", "--epochs", "2",
                                   "--threads", "1", "--checkpoint-dir", ckpt),
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    os.unlink(os.path.join(ckpt, "localcluster-run.json"))
    again = subprocess.run(command("--nodes", "1", "--epochs", "3",
                                   "--checkpoint-dir", ckpt, "--resume"),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 1, (again.stdout, again.stderr)
    error = [l for l in again.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "Node('trainer')" in error[0] and \
        "2 instance(s)" in error[0] and "num_instances=1" in error[0], \
        again.stderr
    assert "epoch 3/3" not in again.stdout


@pytest.mark.timeout(120)
def test_a_checkpoint_directory_moved_mid_run_stops_the_run(tmp_path):
    """Renamed while the run trains: the run stops with one error line
    saying where the directory went -- it never re-creates the old path
    and splits its epochs over two directories."""
    old, new = tmp_path / "ckpt", tmp_path / "moved"
    proc = subprocess.Popen(
        command("--epochs", "500", "--checkpoint-dir", str(old)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.split()[:2] == ["epoch", "2/500"]:
                break
        os.rename(old, new)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    # one line, even when renamed while a save was under way: that save
    # fails (it does not make the old path again) and says the move
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert f"now at {new}" in lines[0], err
    assert "was removed" in lines[0], err
    assert not old.exists(), sorted(os.listdir(old))


@pytest.mark.timeout(120)
def test_a_checkpoint_directory_moved_during_a_save_is_one_line(tmp_path):
    """Renamed while the nodes write a checkpoint: the save that fails is
    the move, said once -- not a warning that epoch N was not written and
    then the move, and never the old path made again by that save."""
    from localcluster import (Job, JobRunner, LocalSession, Node, Task,
                              TaskGroup, WorkspaceType, epoch_limiter, ops)
    from localcluster.cli.resume import RunManager
    from localcluster.errors import CheckpointError
    old, new = tmp_path / "ckpt", tmp_path / "moved"
    with TaskGroup(WorkspaceType.GLOBAL) as init:
        with Node("a"), Task():
            ops.ConstantFill([], ["w"], shape=[4], value=1.0)
    with TaskGroup(WorkspaceType.GLOBAL) as epoch:
        with Node("a"), Task():
            ops.Add(["w", "w"], ["w"])
    with Job(init_group=init, epoch_group=epoch) as job:
        epoch_limiter(job, 3)
    old.mkdir()
    manager = RunManager(str(old))
    real = manager.save

    def save(epoch, final=False):
        group = real(epoch, final=final)
        if epoch == 2:       # the nodes' save of epoch 2 finds it moved
            os.rename(old, new)
        return group
    manager.save = save
    with LocalSession() as session, warnings.catch_warnings(record=True) \
            as caught:
        warnings.simplefilter("always")
        with pytest.raises(CheckpointError, match="was removed while the "
                           "run went on"):
            JobRunner(job, manager).train(session)
    assert not [w for w in caught if "was not written" in str(w.message)]
    assert not old.exists()


def test_a_refused_resume_epoch_is_never_the_one_suggested(tmp_path):
    """--resume 2 refused (this job has a node the checkpoints lack) must
    not say 'use --resume 2': the latest epoch of the other nodes is the
    very one refused."""
    ckpt = str(tmp_path / "c")
    first = subprocess.run(command("--nodes", "2", "--epochs", "2",
                                   "--checkpoint-dir", ckpt),
                           capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    os.unlink(os.path.join(ckpt, "localcluster-run.json"))
    again = subprocess.run(command("--nodes", "3", "--checkpoint-dir", ckpt,
                                   "--resume", "2"),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 1, again.stderr
    assert "trainer_2" in again.stderr, again.stderr
    assert "use --resume 2" not in again.stderr, again.stderr
