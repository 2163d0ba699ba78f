"""python -m localcluster.run: the newcomer's first command."""

import subprocess
import sys

import pytest


def run(*args):
    return subprocess.run([sys.executable, "-m", "localcluster.run", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("session", ["localhost", "local"])
def test_the_example_job_runs_and_checks_its_result(session):
    done = run("--session", session)
    assert done.returncode == 0, done.stderr
    assert "4x the reader sum: OK" in done.stdout
    assert "trainer_1: 4000, 1998000" in done.stdout


def test_print_plan_shows_every_node():
    done = run("--print-plan", "--nodes", "3")
    assert done.returncode == 0, done.stderr
    for node in ("trainer_0", "trainer_1", "trainer_2", "reader"):
        assert f"node {node}:" in done.stdout


def test_bad_arguments_exit_2_with_a_usage_message():
    done = run("--nodes", "0")
    assert done.returncode == 2
    assert "--nodes" in done.stderr
