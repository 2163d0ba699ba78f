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
    "queue_big_memcpy", "queue_big_mpq", "ckpt_save", "ckpt_load",
    # scale (scripts/bench_scale.py), at the quick run's sizes
    "build_10_100", "build_100_1000", "startup_16_64", "idle_uss_64",
}
#: RaySession's rows (scripts/bench_ray.py): measured where Ray is
#: installed, reported as skipped elsewhere
RAY_MEASUREMENTS = {
    "ray_dispatch", "ray_startup", "ray_sigkill", "ray_fetch",
    "ray_queue_small", "ray_queue_small_mpq", "ray_queue_big",
}
HAVE_RAY = importlib.util.find_spec("ray") is not None


def quick_run(tmp_path, env=None):
    """The JSON report of ``bench.py --quick``, which must exit 0."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=110, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def assert_skipped(r):
    assert r["status"] == "skipped", r
    assert "pip install -e '.[ray]'" in r["label"], r
    assert r["ours_s"] is r["baseline_s"] is r["ratio"] is None, r


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_quick_run_reports_every_measurement(tmp_path):
    report = quick_run(tmp_path)
    results = {r["key"]: r for r in report["results"]}
    assert set(results) == MEASUREMENTS | RAY_MEASUREMENTS
    for key, r in results.items():
        if key in RAY_MEASUREMENTS and not HAVE_RAY:
            assert_skipped(r)
            continue
        for field in ("ours_s", "baseline_s", "ratio"):
            value = r[field]
            assert isinstance(value, (int, float)) and \
                not isinstance(value, bool), (key, field, value)
            assert math.isfinite(value) and value > 0, (key, field, value)
        assert r["status"] in {"PASS", "FAIL", "info"}, (key, r["status"])
    assert report["errors"] == []
    assert report["leaks"] == {"processes": [], "segments": []}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_bench_without_ray_reports_its_rows_skipped(tmp_path):
    # a package named ray that fails to import hides the installed one
    hidden = tmp_path / "hide" / "ray"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(hidden.parent)] + [p for p in [os.environ.get("PYTHONPATH")]
                                if p]))
    report = quick_run(tmp_path, env)
    results = {r["key"]: r for r in report["results"]}
    assert set(results) == MEASUREMENTS | RAY_MEASUREMENTS
    for key in RAY_MEASUREMENTS:
        assert_skipped(results[key])
    assert report["errors"] == []
