"""scripts/bench.py runs end to end (its ratios are not checked: CI is noisy)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "scripts" / "bench.py"

MEASUREMENTS = {
    "dispatch_localhost", "dispatch_local", "fetch_zero_copy", "fetch_copy",
    "fetch_copy_vs_pickle", "fetch_zero_copy_vs_pickle", "startup_16",
    "startup_16_vs_fork", "sigkill_detection", "op_loop", "queue_small",
    "queue_big_memcpy", "queue_big_mpq", "queue_fan_in", "ckpt_save",
    "ckpt_load", "scheduled_run", "check_job",
    # scale (scripts/bench_scale.py), at the quick run's sizes
    "build_10_100", "build_100_1000", "startup_1_4", "startup_4_16",
    "startup_16_64", "noop_run_1_4", "noop_run_4_16", "noop_run_16_64",
    "idle_uss_64", "epoch_2_8",
}
#: RaySession's rows (scripts/bench_ray.py) and ours beside Ray's
#: (scripts/bench_peers.py): measured where Ray is installed, reported as
#: skipped elsewhere
RAY_MEASUREMENTS = {
    "ray_dispatch", "ray_startup", "ray_sigkill", "ray_fetch",
    "ray_queue_small", "ray_queue_small_mpq", "ray_queue_big",
    "dispatch_vs_ray",
}
DASK_MEASUREMENTS = {"dispatch_vs_dask"}
#: rows of 16-node start-ups, which a quick run skips
QUICK_SKIPS = {"startup_16_vs_ray", "startup_16_vs_dask"}
ALL = MEASUREMENTS | RAY_MEASUREMENTS | DASK_MEASUREMENTS | QUICK_SKIPS
HAVE_RAY = importlib.util.find_spec("ray") is not None
HAVE_DASK = importlib.util.find_spec("distributed") is not None
PEERS = {"ray": HAVE_RAY, "dask": HAVE_DASK}


#: seconds a quick run may take: it is about 50 s on 2 cores with the peers
#: and half that without, alone; under README's command the other worker's
#: tests run beside it
QUICK_BOUND = 200


def quick_run(tmp_path, env=None):
    """The JSON report of ``bench.py --quick``, which must exit 0."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=QUICK_BOUND, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "bench.out").write_text(proc.stdout)
    return json.loads(out.read_text())


def assert_skipped(r, why):
    assert r["status"] == "skipped", r
    assert why in r["label"], r
    assert r["ours_s"] is r["baseline_s"] is r["ratio"] is None, r


def peer_of(key):
    """The peer a row needs, or None."""
    if key in RAY_MEASUREMENTS:
        return "ray"
    if key in DASK_MEASUREMENTS:
        return "dask"
    return None


def assert_figures(key, r):
    for field in ("ours_s", "baseline_s", "ratio"):
        value = r[field]
        assert isinstance(value, (int, float)) and \
            not isinstance(value, bool), (key, field, value)
        assert math.isfinite(value) and value > 0, (key, field, value)
    for side in ("ours", "baseline"):
        stat = r[side]
        assert stat["q1"] <= stat["median"] <= stat["q3"], (key, stat)
        assert stat["spread"] >= 0, (key, stat)
    assert r["status"] in {"PASS", "FAIL", "info"}, (key, r["status"])


@pytest.mark.slow
@pytest.mark.timeout(QUICK_BOUND + 20)
def test_bench_quick_run_reports_every_measurement(tmp_path):
    report = quick_run(tmp_path)
    results = {r["key"]: r for r in report["results"]}
    assert set(results) == ALL
    for key, r in results.items():
        peer = peer_of(key)
        if peer and not PEERS[peer]:
            assert_skipped(r, "pip install -e")
        elif key in QUICK_SKIPS:
            assert_skipped(r, "quick")
        else:
            assert_figures(key, r)
    # the same work on every system: ours always, the peers where installed
    peers = {(f["work"], f["system"]): f for f in report["peers"]}
    assert len(peers) == 6 * 5, sorted(peers)
    for (work, system), f in peers.items():
        if work == "startup_16":
            assert "quick" in f["skipped"], f
        elif system in ("localhost", "local") or \
                PEERS.get(system.replace("session", ""), True):
            assert f["samples"] and all(x > 0 for x in f["samples"]), f
            assert f["stat"]["median"] > 0, f
        else:
            assert "pip install -e" in f["skipped"], f
    assert report["errors"] == []
    assert report["leaks"] == {"processes": [], "segments": []}
    assert "| measurement" in report_text(tmp_path)
    assert "| work" in report_text(tmp_path)


def report_text(tmp_path):
    return (tmp_path / "bench.out").read_text()


@pytest.mark.slow
@pytest.mark.timeout(QUICK_BOUND + 20)
def test_bench_without_the_peers_reports_their_rows_skipped(tmp_path):
    # packages named ray and distributed that fail to import hide the
    # installed ones
    hide = tmp_path / "hide"
    for name in ("ray", "distributed"):
        (hide / name).mkdir(parents=True)
        (hide / name / "__init__.py").write_text(
            "raise ImportError('hidden')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(hide)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    report = quick_run(tmp_path, env)
    results = {r["key"]: r for r in report["results"]}
    assert set(results) == ALL
    for key in RAY_MEASUREMENTS | DASK_MEASUREMENTS:
        assert_skipped(results[key], "pip install -e")
    for key in MEASUREMENTS:
        assert_figures(key, results[key])
    assert report["errors"] == []


SCALE = BENCH.parent / "bench_scale.py"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_scale_prototypes_prints_every_figure(tmp_path):
    """scripts/bench_scale.py as a script: node prototypes at two small
    sizes, each figure present, and the build ratio within its bound."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(SCALE), "--quick", "--sizes", "4,8", "--json",
         str(out)], capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert [row["n"] for row in report["sizes"]] == [4, 8]
    for row in report["sizes"]:
        for key in ("build_s", "startup_s", "noop_run_s", "epoch1_s",
                    "epoch2_s", "master_rss_mb", "master_fds", "uss_mib",
                    "ckpt_bytes"):
            assert row[key] is not None and row[key] > 0, (key, row)
        assert row["master_fds"] < 64, row
    assert 0 < report["build_ratio"] <= 3.0
    assert "start-up s" in proc.stdout and "build of 1 reader" in proc.stdout
