"""Cluster conditions on the command line: --slowdown, --stragglers,
--link, --simulate and partitions in --faults, as a user runs them."""

import json
import statistics
import subprocess
import sys
import time

import pytest


def run(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "localcluster.run", *args],
                          capture_output=True, text=True, timeout=timeout)


def json_run(*args):
    done = run("--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def timed_json_run(*args):
    start = time.monotonic()
    summary = json_run(*args)
    return summary, time.monotonic() - start


def losses(summary):
    return [e["metrics"]["loss"] for e in summary["epochs"]]


def test_a_straggler_makes_the_simulated_epoch_4x_not_the_wall_time(tmp_path):
    common = ("--simulate", "--epochs", "2", "--threads", "1")
    balanced, straggler, walls = [], [], ([], [])
    for i in range(2):   # alternated: the machine's noise hits both
        for slow, out, wall in ((False, balanced, walls[0]),
                                (True, straggler, walls[1])):
            extra = ("--stragglers", "1") if slow else ()
            summary, seconds = timed_json_run(
                *common, *extra, "--checkpoint-dir",
                str(tmp_path / f"{slow}{i}"))
            out.append(summary)
            wall.append(seconds)
    sim = [statistics.median(e["simulated_seconds"] for s in runs
                             for e in s["epochs"])
           for runs in (balanced, straggler)]
    assert sim[1] / sim[0] == pytest.approx(4.0, rel=0.15), sim
    # the slow trainer costs virtual time only: wall time stays put
    assert statistics.median(walls[1]) < 2 * statistics.median(walls[0]), \
        walls
    # and it changes nothing the job computes
    assert losses(balanced[0]) == losses(straggler[0]) == \
        losses(balanced[1])


def test_epoch_lines_show_simulated_beside_wall_seconds(tmp_path):
    done = run("--simulate", "--epochs", "1", "--slowdown", "trainer_0=2",
               "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith("epoch")][0]
    assert " s (simulated " in line
    assert "conditions: trainer_0=2" in done.stdout


def test_without_simulate_there_is_no_simulated_time(tmp_path):
    summary = json_run("--epochs", "1", "--session", "local",
                       "--checkpoint-dir", str(tmp_path))
    assert summary["epochs"][0]["simulated_seconds"] is None


def test_a_thin_link_leaves_the_result_as_it_was(tmp_path):
    plain = json_run("--epochs", "2", "--threads", "1", "--checkpoint-dir",
                     str(tmp_path / "a"))
    linked = json_run("--epochs", "2", "--threads", "1", "--link",
                      "reader->ps:latency=1ms,bandwidth=200MB/s",
                      "--link", "trainer_*->ps:latency=0.5ms",
                      "--link", "ps->trainer_*:latency=0.5ms",
                      "--checkpoint-dir", str(tmp_path / "b"))
    assert losses(plain) == losses(linked)


def test_a_simulated_trace_is_on_the_virtual_clock(tmp_path):
    trace = tmp_path / "trace.json"
    summary = json_run("--simulate", "--epochs", "2", "--trace", str(trace),
                       "--checkpoint-dir", str(tmp_path / "ck"))
    events = json.loads(trace.read_text())
    assert events["otherData"]["clock"] == "simulated"
    epochs = [e for e in events["traceEvents"]
              if e.get("cat") == "epoch"]
    assert [round(e["dur"] / 1e6, 6) for e in epochs] == [
        round(e["simulated_seconds"], 6) for e in summary["epochs"]]
    steps = [e for e in events["traceEvents"] if e.get("cat") == "step"]
    # virtual seconds from the session's start, not seconds since 1970
    assert steps and max(e["ts"] for e in steps) < 60e6


def test_a_partition_in_the_fault_plan_holds_then_releases(tmp_path):
    summary = json_run("--epochs", "2", "--threads", "1", "--faults",
                       "partition trainer_* from ps at epoch 2 heal at "
                       "0.05s", "--checkpoint-dir", str(tmp_path / "a"))
    plain = json_run("--epochs", "2", "--threads", "1", "--checkpoint-dir",
                     str(tmp_path / "b"))
    assert losses(summary) == losses(plain)
    assert [f["fault"] for f in summary["faults_fired"]] == [
        "partition 'trainer_*' from ps at epoch 2 heal at 0.05s"]
    # epoch 2 waited for the partition to heal
    assert summary["epochs"][1]["seconds"] >= 0.05


@pytest.mark.parametrize("args, words", [
    (("--simulate", "--session", "localhost"), "--simulate"),
    (("--op-seconds", "1ms"), "--op-seconds goes with --simulate"),
    (("--slowdown", "trainer_1=0.5"), "trainer_1=0.5: a slowdown is a factor"
                                      " >= 1"),
    (("--slowdown", "trainer_1"), "NODE=FACTOR"),
    (("--slowdown", "nosuch=2"), "'nosuch' matches no node"),
    (("--link", "reader->nosuch_*:latency=1ms"), "'nosuch_*' matches no "
                                                  "node"),
    (("--link", "reader->ps:latency=-1ms"), "latency"),
    (("--link", "reader->ps:speed=1"), "latency=, bandwidth="),
    (("--link", "reader->ps:bandwidth=fast"), "100MB/s"),
    (("--stragglers", "3"), "has 2 trainer(s)"),
])
def test_bad_conditions_are_one_line_usage_errors(args, words, tmp_path):
    done = run(*args, "--epochs", "1", "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert words in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
