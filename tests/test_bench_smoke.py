"""scripts/bench.py runs end to end (its ratios are not checked: CI is noisy)."""

import json
import math
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
}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_bench_quick_run_reports_every_measurement(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    report = json.loads(out.read_text())
    results = {r["key"]: r for r in report["results"]}
    assert set(results) == MEASUREMENTS
    for key, r in results.items():
        for field in ("ours_s", "baseline_s", "ratio"):
            value = r[field]
            assert isinstance(value, (int, float)) and \
                not isinstance(value, bool), (key, field, value)
            assert math.isfinite(value) and value > 0, (key, field, value)
        assert r["status"] in {"PASS", "FAIL", "info"}, (key, r["status"])
    assert report["errors"] == []
    assert report["leaks"] == {"processes": [], "segments": []}
