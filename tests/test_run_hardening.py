"""python -m localcluster.run under faults and bad input: signals at the
wrong moment, hung nodes, leftovers of killed runs, a checkpoint directory
two runs want, odd trace paths, closed streams, out-of-range options.
Every case ends in a clear error or a correct result, with nothing left
behind.  (Tests are grouped by the point of the hardening issue they pin.)
"""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from test_run import USER_JOB, leftovers

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
            if line.startswith("epoch   1") or not line:
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
    assert "done:" not in out and "epoch   1" not in out, out
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
    from localcluster.checkpoint_file import remove_partials
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
    from localcluster.checkpoint_file import remove_partials
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
    from localcluster.checkpoint_file import remove_partials
    path = plant_partial(str(tmp_path), os.getpid())
    assert remove_partials(str(tmp_path / "ps.3"), dead_only=True) == []
    assert os.path.exists(path)
