"""python -m localcluster.run --faults and --check, as a user runs them."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(*args, timeout=240, **kwargs):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "localcluster.run", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env, **kwargs)


def final_loss(*args):
    done = run("--json", "--threads", "1", "--epochs", "3", *args)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout)
    return summary["epochs"][-1]["metrics"]["loss"], summary


@pytest.mark.parametrize("session", ["localhost", "local"])
def test_faults_with_max_restarts_recover_to_the_uninterrupted_loss(
        session):
    clean, _ = final_loss("--session", session)
    loss, summary = final_loss("--session", session, "--faults",
                               "kill trainer_1 at epoch 2", "--max-restarts",
                               "1")
    assert loss == clean
    assert [r["resumed_from"] for r in summary["restarts"]] == [1]
    assert summary["faults_fired"][0]["fault"] == "kill trainer_1 at epoch 2"
    assert summary["faults_fired"][0]["node"] == "trainer_1"


def test_without_restarts_a_fault_fails_the_run_naming_the_node():
    done = run("--threads", "1", "--epochs", "3", "--faults",
               "kill trainer_0 at epoch 2 by exit")
    assert done.returncode == 1
    error = [line for line in done.stderr.splitlines()
             if line.startswith("error:")]
    assert len(error) == 1 and "trainer_0" in error[0], done.stderr


@pytest.mark.parametrize("text, says", [
    ("kill nobody at epoch 1", "--faults 'nobody' matches no node of the job"),
    ("kill trainer_0 at", "no trigger point"),
    ("", "no fault given"),
])
def test_a_bad_fault_plan_is_a_one_line_usage_error(text, says):
    done = run("--faults", text)
    assert done.returncode == 2
    assert says in done.stderr and len(done.stderr.splitlines()) == 1, \
        done.stderr


def test_check_passes_on_the_embedded_job():
    done = run("--check", "--epochs", "2", "--max-examples", "2")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    verdicts = [line.split(" ... ")[0].strip()
                for line in done.stdout.splitlines() if " ... " in line]
    # races first, then the scheduled runs, then the real ones
    assert verdicts == ["races", "schedule_independent", "sessions_agree",
                        "resume_equals_uninterrupted", "restart_recovers"]
    for check in verdicts:
        assert f"{check} ... ok" in done.stdout
    # --max-examples bounds the kills too, and the verdict says so
    assert "restart_recovers ... ok (" in done.stdout and \
        " 2 of " in done.stdout.split("restart_recovers ... ok (")[1]
    assert "5 of 5 checks passed" in done.stdout


STATEFUL = textwrap.dedent("""
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    COUNTED = [0]

    def count(seen):
        COUNTED[0] += 1
        return np.array([COUNTED[0]])

    def build(epochs=3):
        COUNTED[0] = 0
        with Job() as job, Node("a"):
            with job.init_group, Task():
                ops.Const(np.array([0]), name="seen")
            with Task():
                ops.Python(count)(["seen"], ["seen"])
            epoch_limiter(job, epochs)
        return job
""")


def test_check_of_a_job_with_state_outside_its_checkpoints_fails_and_replays(
        tmp_path):
    (tmp_path / "stateful.py").write_text(STATEFUL)
    job = f"{tmp_path / 'stateful.py'}:build"
    done = run("--check", "resume_equals_uninterrupted", "--job", job)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "resume_equals_uninterrupted ... FAILED" in done.stdout
    assert "counter-example: {'epoch': 1, 'session': 'local'}" in done.stdout
    replay = done.stdout.split("replay: ", 1)[1].splitlines()[0]
    again = subprocess.run(
        [sys.executable, "-c", replay], capture_output=True, text=True,
        timeout=120, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT))
    assert again.returncode == 1
    assert "JobCheckFailed" in again.stderr and "epoch 1" in again.stderr


CHATTY = textwrap.dedent("""
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    def say():
        print("hello from the worker")

    def build(epochs=2):
        with Job() as job, Node("worker"):
            with job.init_group, Task():
                ops.Const(np.array(0.0), name="x")
            with Task():
                ops.Python(say)([], [])
                ops.Add(["x", ops.Const(np.array(1.0))], ["x"])
            epoch_limiter(job, epochs)
        return job
""")


def test_check_verdicts_are_whole_lines_apart_from_what_the_job_prints(
        tmp_path):
    """The job's own prints went to stdout in the middle of a verdict
    line (``sessions_agree ... hello from the worker``): they go to
    stderr, and stdout holds whole verdict lines only."""
    (tmp_path / "chatty.py").write_text(CHATTY)
    done = run("--check", "sessions_agree,restart_recovers",
               "--max-examples", "1", "--job",
               f"{tmp_path / 'chatty.py'}:build")
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("checking ") and \
        lines[-1] == "2 of 2 checks passed", lines
    assert [line.split(" ... ")[0] for line in lines[1:-1]] == [
        "  sessions_agree", "  restart_recovers"], lines
    assert all(" ... ok (" in line for line in lines[1:-1]), lines
    assert "hello from the worker" in done.stderr


def test_check_names_only_known_checks():
    done = run("--check", "sessions_agree,bogus")
    assert done.returncode == 2 and "'bogus' is no check" in done.stderr


@pytest.mark.parametrize("text, timeout, epochs, says", [
    ("hang trainer_0 at epoch 1", None, 2, "with no --timeout: the run will "
                                           "wait for the hung node forever"),
    ("hang trainer_0 at epoch 1", 5.0, 2, None),
    ("kill trainer_0 at epoch 99", None, 2, "the run trains 2 epoch(s), so "
                                            "epoch 99 is never reached"),
    ("fail-checkpoint ps at epoch 3", None, 2, "epoch 3 is never reached"),
    ("kill trainer_0 at epoch 2", None, 2, None),
    ("kill trainer_0 at op Add", None, 2, None),
])
def test_faults_that_cannot_do_what_they_seem_are_warned_at_start(
        text, timeout, epochs, says):
    from localcluster.cli.run import fault_warnings
    from localcluster.testing import FaultPlan
    warnings = fault_warnings(FaultPlan.parse(text), timeout, epochs)
    if says is None:
        assert warnings == []
    else:
        assert len(warnings) == 1 and says in warnings[0], warnings


def test_an_unreachable_fault_is_one_warning_line_and_the_run_goes_on(
        tmp_path):
    done = run("--epochs", "1", "--checkpoint-dir", str(tmp_path),
               "--faults", "kill trainer_1 at epoch 5")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("warning: --faults 'kill trainer_1 at epoch 5'"
                             ": the run trains 1 epoch(s)") == 1, done.stderr
