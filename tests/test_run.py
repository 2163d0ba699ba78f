"""python -m localcluster.run: the newcomer's first command, as a user
runs it (a subprocess)."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

SHM = "/dev/shm"


def run(*args, timeout=120, **kwargs):
    return subprocess.run([sys.executable, "-m", "localcluster.run", *args],
                          capture_output=True, text=True, timeout=timeout,
                          **kwargs)


def leftovers(pid):
    """Segments and processes a finished master with ``pid`` left."""
    segments = [n for n in os.listdir(SHM) if n.startswith(f"lc_{pid}_")]
    orphans = []
    for proc in psutil.process_iter(["ppid", "cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            # a node process is titled "localcluster: <node> (<master>)"
            ours = "localcluster.run" in cmdline or (
                cmdline.startswith("localcluster: ") and
                cmdline.rstrip().endswith(f"({pid})"))
            if ours and proc.pid != os.getpid() \
                    and proc.info["ppid"] in (1, pid):
                orphans.append(proc.pid)
        except psutil.Error:
            pass
    return segments, orphans


def json_run(*args, **kwargs):
    done = run("--json", *args, **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done


@pytest.mark.parametrize("session", ["localhost", "local"])
def test_the_default_job_trains_and_its_loss_falls_tenfold(session,
                                                           tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "localcluster.run", "--session", session,
         "--checkpoint-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    epochs = [line for line in out.splitlines() if line.startswith("epoch")]
    assert len(epochs) == 5
    losses = [float(line.split(" loss ")[1].split()[0]) for line in epochs]
    assert losses[0] >= 10 * losses[-1], losses
    assert "checkpoints in" in out and re.search(r"\((\d+x|\d+%) lower\)", out)
    for node in ("reader", "trainer_0", "trainer_1", "ps"):
        assert os.path.isfile(tmp_path / f"{node}.5")
    assert leftovers(proc.pid) == ([], [])


def test_json_summary_has_epochs_metrics_checkpoints_and_usage(tmp_path):
    summary, done = json_run("--nodes", "3", "--epochs", "3",
                             "--checkpoint-dir", str(tmp_path))
    nodes = ["reader", "trainer_0", "trainer_1", "trainer_2", "ps"]
    assert summary["nodes"] == nodes and summary["last_epoch"] == 3
    assert [e["epoch"] for e in summary["epochs"]] == [1, 2, 3]
    for epoch in summary["epochs"]:
        assert epoch["seconds"] > 0 and epoch["records_per_s"] > 0
        assert set(epoch["metrics"]) >= {"loss", "train_loss_0"}
        assert set(epoch["nodes"]) == set(nodes)
        assert all(n["rss_bytes"] > 0 for n in epoch["nodes"].values())
    assert set(summary["node_usage"]) == set(nodes)
    for usage in summary["node_usage"].values():
        assert usage["peak_rss_bytes"] > 0 and usage["cpu_seconds"] >= 0
    assert str(tmp_path / "ps.3") in summary["checkpoints"]
    assert summary["status"] == "ok" and summary["checkpoint_errors"] == []
    # the progress lines went to stderr, stdout is the JSON alone
    assert "epoch 1/" in done.stderr


def test_trace_file_covers_every_node(tmp_path):
    trace = tmp_path / "trace.json"
    done = run("--trace", str(trace), "--epochs", "2")
    assert done.returncode == 0, done.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert set(names.values()) == {"runner", "reader", "trainer_0",
                                   "trainer_1", "ps"}
    spans = [e for e in events if e["ph"] == "X"]
    for pid, name in names.items():
        mine = [e for e in spans if e["pid"] == pid]
        assert mine, f"no span on {name}'s track"
        assert all(e["dur"] >= 0 and e["ts"] > 0 for e in mine)
    cats = {e["cat"] for e in spans}
    assert {"epoch", "task", "step", "checkpoint"} <= cats


def test_print_plan_prints_the_jobs_groups():
    done = run("--print-plan", "--nodes", "3")
    assert done.returncode == 0, done.stderr
    for text in ("Job", "init:", "epoch:", "node reader:",
                 "node trainer (prototype: 3 instances trainer_0..trainer_2):",
                 "node ps:"):
        assert text in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) < 300


SLOW_JOB = textwrap.dedent('''
    from localcluster import Node, Task, ops
    from localcluster.examples import regression

    def build(nodes=2, epochs=5, seed=0, threads=2):
        job, options = regression.build(nodes=nodes, epochs=epochs,
                                        seed=seed, threads=threads)
        with job.epoch_group, Node("ps"), Task(name="slow"):
            ops.Sleep([], seconds=0.4)   # time to press Ctrl-C
        return job, options
''')


def final_loss(summary):
    return summary["epochs"][-1]["metrics"]["loss"]


def test_ctrl_c_then_resume_ends_with_the_uninterrupted_loss(tmp_path):
    job = tmp_path / "slow_job.py"
    job.write_text(SLOW_JOB)
    common = ["--job", f"{job}:build", "--threads", "1", "--seed", "3"]
    expected, _ = json_run(*common, "--checkpoint-dir", str(tmp_path / "u"))

    ckpt = str(tmp_path / "r")
    proc = subprocess.Popen(
        [sys.executable, "-m", "localcluster.run", *common,
         "--checkpoint-dir", ckpt],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("epoch 1/"):
                time.sleep(0.1)  # well inside epoch 2 (it sleeps 0.4 s)
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = "".join(lines) + out
    assert proc.returncode == 130, out + err
    assert "interrupted; every node stopped" in out
    assert "last complete checkpoint is epoch 1" in out
    hint = [line for line in out.splitlines()
            if line.startswith("resume with:")]
    assert hint == [f"resume with: python -m localcluster.run "
                    f"--checkpoint-dir {ckpt} --resume"]
    assert leftovers(proc.pid) == ([], [])
    assert not [f for f in os.listdir(ckpt) if "partial" in f]

    # the hint's command: the job and its options come from the directory
    resumed, _ = json_run("--checkpoint-dir", ckpt, "--resume")
    assert resumed["job"] == f"{job}:build"
    assert resumed["resumed_from"] == 1
    assert [e["epoch"] for e in resumed["epochs"]] == [2, 3, 4, 5]
    assert final_loss(resumed) == final_loss(expected)


USER_JOB = textwrap.dedent('''
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    def build(epochs=3):
        with Job() as job, Node("worker"):
            with job.init_group, Task():
                ops.Const(np.array(0.0), name="x")
            with Task() as task:
                ops.Add(["x", ops.Const(np.array(1.0))], ["x"])
                out = task.add_output("x")
            epoch_limiter(job, epochs)
        return job, {"metrics": {"x": out}}

    def broken():
        with Job() as job, Node("worker"):
            with Task():
                ops.Div([ops.Const(np.array([1])), ops.Const(np.array([0]))])
                ops.Python(explode)([], [])
            epoch_limiter(job, 2)
        return job

    def explode():
        raise RuntimeError("the user's op broke")

    def shapes():
        with Job() as job, Node("worker"):
            with Task():
                ops.Div([ops.Const(np.array([1, 2])), ops.Const(np.array([1, 2, 3]))])
            epoch_limiter(job, 2)
        return job

    def not_a_job():
        return 42

    def raises():
        raise RuntimeError("builder exploded")

    def chatty(epochs=2):
        job, options = build(epochs)
        with job.epoch_group, Node("worker"), Task():
            ops.Python(say_hello)([], [])
        options["metrics"]["text"] = options["metrics"]["x"]
        return job, options

    def say_hello():
        print("hello from the worker")

    def die_once(epoch, marker):
        import os, signal
        if int(epoch) == 2 and not os.path.exists(str(marker)):
            open(str(marker), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    def fragile(epochs=4):
        import os
        marker = os.path.join(os.path.dirname(__file__), "died")
        with Job() as job, Node("worker"):
            with job.init_group, Task():
                ops.Const(np.array(0.0), name="x")
                ops.Const(np.array(0), name="epoch_no")
                ops.Const(np.array(marker), name="marker")
            with Task() as task:
                ops.Add(["epoch_no", ops.Const(np.array(1))], ["epoch_no"])
                ops.Add(["x", ops.Const(np.array(1.0))], ["x"])
                ops.Python(die_once)(["epoch_no", "marker"], [])
                out = task.add_output("x")
            epoch_limiter(job, epochs)
        return job, {"metrics": {"x": out}}
''')


def test_a_user_job_from_a_file_runs(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    summary, _ = json_run("--job", f"{job}:build", "--epochs", "4",
                          "--checkpoint-dir", str(tmp_path / "c"))
    assert [e["metrics"]["x"] for e in summary["epochs"]] == [1, 2, 3, 4]
    assert summary["nodes"] == ["worker"]


def test_a_failing_job_exits_1_with_one_line_naming_the_node(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    done = run("--job", f"{job}:broken", "--checkpoint-dir",
               str(tmp_path / "c"))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines()
              if line.startswith("error:")]
    assert len(errors) == 1, done.stderr
    assert "'worker'" in errors[0] and "the user's op broke" in errors[0]
    # an op that raises fails a resumed run the same way: no resume hint
    assert "resume with:" not in done.stderr


def test_a_failing_builtin_op_shows_the_users_line_not_the_librarys(
        tmp_path):
    """A built-in op (Div) fails inside the library's kernel: the lines
    under the error show where the job built the op, with its source,
    not the executor's frames."""
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    done = run("--job", f"{job}:shapes", "--session", "local",
               "--checkpoint-dir", str(tmp_path / "c"))
    assert done.returncode == 1
    line = USER_JOB.splitlines().index(
        "            ops.Div([ops.Const(np.array([1, 2])), "
        "ops.Const(np.array([1, 2, 3]))])") + 1
    built = f"built at {job}:{line} in shapes"
    error, *details = done.stderr.strip().splitlines()
    assert error.startswith("error: op Div") and built in error, error
    assert details[0] == (f"  op {built}: ops.Div([ops.Const(np.array([1, "
                          "2])), ops.Const(np.array([1, 2, 3]))])"), details
    assert "localcluster" not in "\n".join(details), details


@pytest.mark.parametrize("value, message", [
    ("nosuchmodule:build", "cannot import module 'nosuchmodule'"),
    ("localcluster.examples.regression:nope", "has no function 'nope'"),
    ("justaname", "expected MODULE:FUNC"),
    ("missing/file.py:build", "no file"),
    ("{job}:not_a_job", "returned int, not a Job"),
])
def test_a_bad_job_value_is_a_clear_usage_error(tmp_path, value, message):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    done = run("--job", value.format(job=job))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "python -m localcluster.run: error: --job")
    assert message in done.stderr


def test_usage_errors_exit_2():
    for args in (["--nodes", "0"], ["--resume"], ["--session", "mars"],
                 ["--epochs", "x"], ["--ray-address", "x"]):
        done = run(*args)
        assert done.returncode == 2, args
        assert "error:" in done.stderr


def test_resume_without_a_checkpoint_says_so(tmp_path):
    done = run("--checkpoint-dir", str(tmp_path), "--resume")
    assert done.returncode == 1
    assert "no complete checkpoint" in done.stdout + done.stderr


def test_cleanup_removes_segments_of_dead_runs_and_reports_them():
    from localcluster.cli.cleanup import cleanup
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # Every scheduler started on the machine sweeps stale segments too: one
    # of another test run (another worker of this one) may take ours first;
    # then plant another.  The command line's own code runs here, in this
    # process, so that the window for that is a few milliseconds, not a
    # Python start (``--cleanup`` as a command: test_run_hardening.py).
    for attempt in range(20):
        name = f"lc_{dead.pid}_deadbeef_{attempt}"
        with open(os.path.join(SHM, name), "wb") as f:
            f.write(b"x")
        os.utime(os.path.join(SHM, name), (0, 0))
        out = io.StringIO()
        try:
            assert cleanup(None, False, out) == 0
            assert not os.path.exists(os.path.join(SHM, name))
            if name in out.getvalue():
                break
        finally:
            if os.path.exists(os.path.join(SHM, name)):
                os.unlink(os.path.join(SHM, name))
    assert name in out.getvalue()


def test_max_restarts_recovers_a_node_killed_mid_epoch(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    summary, done = json_run("--job", f"{job}:fragile", "--max-restarts",
                             "1", "--checkpoint-dir", str(tmp_path / "c"))
    assert (tmp_path / "died").exists()
    assert [r["resumed_from"] for r in summary["restarts"]] == [1]
    assert summary["epochs"][-1]["metrics"]["x"] == 4
    done = run("--job", f"{job}:fragile", "--checkpoint-dir",
               str(tmp_path / "d"))
    assert done.returncode == 0  # the marker exists: nobody dies now


def test_json_stays_parseable_when_nodes_print(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    summary, done = json_run("--job", f"{job}:chatty", "--checkpoint-dir",
                             str(tmp_path / "c"))
    assert summary["last_epoch"] == 2
    assert "hello from the worker" in done.stderr  # node output, not stdout


@pytest.mark.parametrize("session", ["local", "localhost"])
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_node_output_is_prefixed_with_its_node_under_every_session(
        tmp_path, session, json_out):
    """README promises node output as ``[node] line`` on the terminal:
    --session local (nodes are threads of the master) printed it bare."""
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    done = run("--job", f"{job}:chatty", "--session", session,
               "--checkpoint-dir", str(tmp_path / "c"),
               *(["--json"] if json_out else []))
    assert done.returncode == 0, done.stderr
    shown = done.stderr if json_out else done.stdout
    said = [line for line in shown.splitlines() if "hello from" in line]
    assert said == ["[worker] hello from the worker"] * 2, shown
    if json_out:
        assert json.loads(done.stdout)["last_epoch"] == 2


def test_json_summary_of_a_failed_run_says_why(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    done = run("--json", "--job", f"{job}:broken", "--checkpoint-dir",
               str(tmp_path / "c"))
    assert done.returncode == 1
    summary = json.loads(done.stdout)
    assert summary["status"] == "error" and summary["node"] == "worker"
    assert "the user's op broke" in summary["error"]


def test_a_job_function_that_raises_is_one_line(tmp_path):
    job = tmp_path / "myjob.py"
    job.write_text(USER_JOB)
    done = run("--job", f"{job}:raises")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: the job function raises failed: RuntimeError: builder "
        "exploded (--log-level DEBUG shows the traceback)"]


def test_unwritable_paths_are_refused_before_training(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for args, what in ((["--checkpoint-dir", str(afile)], "not a directory"),
                       (["--trace", str(tmp_path / "no" / "t.json")],
                        "cannot be written"),
                       (["--trace", str(tmp_path)], "cannot be written")):
        done = run(*args)
        assert done.returncode == 2, args
        assert what in done.stderr and "epoch" not in done.stdout


def test_resume_takes_the_options_the_checkpoints_were_made_with(tmp_path):
    ckpt = str(tmp_path / "c")
    first, _ = json_run("--nodes", "1", "--epochs", "3", "--seed", "5",
                        "--threads", "1", "--checkpoint-dir", ckpt)
    # (more --epochs train further: tests/test_run_hardening.py)
    for option, value in (("--nodes", "2"), ("--epochs", "2"),
                          ("--seed", "6")):
        done = run("--checkpoint-dir", ckpt, "--resume", "1", option, value)
        assert done.returncode == 2
        assert f"differs from the {option}" in done.stderr
    again, _ = json_run("--checkpoint-dir", ckpt, "--resume", "1")
    assert again["nodes"] == first["nodes"]
    assert final_loss(again) == final_loss(first)
    done = run("--checkpoint-dir", ckpt, "--resume")
    assert done.returncode == 0
    assert "no epoch left to train" in done.stdout


def test_sigterm_stops_every_node_and_keeps_the_checkpoints(tmp_path):
    job = tmp_path / "slow_job.py"
    job.write_text(SLOW_JOB)
    ckpt = str(tmp_path / "r")
    proc = subprocess.Popen(
        [sys.executable, "-m", "localcluster.run", "--job", f"{job}:build",
         "--checkpoint-dir", ckpt],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.stdout.readline().startswith("epoch 1/"):
                time.sleep(0.1)
                proc.send_signal(signal.SIGTERM)
                break
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "resume with:" in out
    assert leftovers(proc.pid) == ([], [])
    assert not [f for f in os.listdir(ckpt) if "partial" in f]
