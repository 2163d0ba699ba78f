"""python -m localcluster.ckpt (ls, prune), the library's prune, and
--cleanup's removal of temporary run directories with nothing to resume.

Checkpoints are written with the checkpoint file's own writer (fast);
what must hold for a real run -- a pruned directory resumes -- is tested
with a real small run.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from localcluster.cli import ckpt
from localcluster.cli.rundir.prune import prune
from localcluster.cli.rundir.scan import scan
from localcluster.cli.cleanup import cleanup
from localcluster.cli.rundir.directory import (LOCK_FILE, RUN_FILE,
                                               TEMP_PREFIX, DirLock)
from localcluster.cli.rundir.metrics import METRICS_FILE, MetricsLog
from localcluster.cli.jobspec import RunFailure
from localcluster.checkpoint import MultiNodeCheckpointManager
from localcluster.checkpoint.fileformat import write_checkpoint

NODES = ["a", "b", "c"]


def write(directory, node, epoch, nodes=NODES, as_node=None, as_epoch=None):
    path = os.path.join(directory, f"{node}.{epoch}")
    write_checkpoint(path, {"w": np.arange(4096, dtype=np.float64) + epoch},
                     {"node": as_node or node,
                      "epoch": epoch if as_epoch is None else as_epoch,
                      "final": False, "job_nodes": list(nodes)})
    return path


def write_epochs(directory, epochs, nodes=NODES):
    for epoch in epochs:
        for node in nodes:
            write(str(directory), node, epoch, nodes)


def dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def partial(directory, base, pid):
    path = os.path.join(str(directory), f"{base}.partial-{pid}-0badf00d")
    with open(path, "wb") as f:
        f.write(b"PK\x03\x04 half a checkpoint")
    return path


def torn_dir(directory):
    """Epochs 0 and 1 complete; 2: c missing; 3: b truncated; 4: c's
    writer died mid-write."""
    write_epochs(directory, range(5))
    os.unlink(os.path.join(directory, "c.2"))
    with open(os.path.join(directory, "b.3"), "r+b") as f:
        f.truncate(1000)
    os.unlink(os.path.join(directory, "c.4"))
    partial(directory, "c.4", dead_pid())


def cli(capsys, *argv):
    code = ckpt.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys, *argv):
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def names(directory):
    return sorted(os.listdir(directory))


# -- ls --------------------------------------------------------------------------------

def test_ls_names_what_is_torn_per_node_and_the_resume_epoch(tmp_path,
                                                              capsys):
    torn_dir(str(tmp_path))
    [run] = cli_json(capsys, "ls", tmp_path)["runs"]
    states = {e["epoch"]: e for e in run["epochs"]}
    assert [states[e]["state"] for e in range(5)] == \
        ["complete", "complete", "torn", "torn", "torn"]
    assert states[2]["problems"] == {"c": "missing"}
    assert states[2]["nodes_present"] == ["a", "b"]
    assert list(states[3]["problems"]) == ["b"]
    assert states[3]["problems"]["b"].startswith("corrupt")
    assert states[4]["problems"] == {"c": "partial write"}
    # the epoch --resume itself would pick
    assert run["resume_epoch"] == 1 == \
        MultiNodeCheckpointManager(str(tmp_path)).latest_epoch_on_disk()
    code, out, _ = cli(capsys, "ls", tmp_path)
    assert code == 0
    assert "--resume picks epoch 1" in out
    assert "torn: c missing" in out and "torn: b corrupt" in out
    assert "c partial write" in out and "2/3" in out


def test_ls_verifies_every_byte_unless_quick(tmp_path, capsys):
    write_epochs(tmp_path, [0, 1])
    path = tmp_path / "a.1"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0xFF  # a flipped bit in a blob's data
    path.write_bytes(bytes(data))
    [full] = cli_json(capsys, "ls", tmp_path)["runs"]
    assert full["resume_epoch"] == 0
    assert "CRC" in full["epochs"][1]["problems"]["a"]
    [quick] = cli_json(capsys, "ls", tmp_path, "--quick")["runs"]
    assert quick["resume_epoch"] == 1 and quick["verified"] == "manifests"


def test_ls_lists_the_run_dirs_in_a_parent_and_who_holds_them(tmp_path,
                                                              capsys):
    write_epochs(tmp_path / "one", [0])
    write_epochs(tmp_path / "two", [0, 1])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("not a run")
    lock = DirLock(str(tmp_path / "two")).acquire()
    try:
        listing = cli_json(capsys, "ls", tmp_path)
        code, out, _ = cli(capsys, "ls", tmp_path)
        # the holder keeps its lock: a run still cannot start there
        with pytest.raises(RunFailure, match="in use"):
            DirLock(str(tmp_path / "two")).acquire()
    finally:
        lock.release()
    assert [r["path"] for r in listing["runs"]] == \
        [str(tmp_path / "one"), str(tmp_path / "two")]
    assert [(r["in_use"], r["pid"]) for r in listing["runs"]] == \
        [(False, None), (True, os.getpid())]
    assert f"running, pid {os.getpid()}" in out and "not in use" in out
    [two] = cli_json(capsys, "ls", tmp_path / "two")["runs"]
    assert not two["in_use"]


def test_ls_says_how_the_last_run_ended(tmp_path, capsys):
    write_epochs(tmp_path, [0])
    metrics = MetricsLog(str(tmp_path))
    metrics.write({"kind": "run", "run": "1-1"})
    metrics.write({"kind": "end", "run": "1-1", "status": "error"})
    [run] = cli_json(capsys, "ls", tmp_path)["runs"]
    assert run["last_run"] == "error"
    metrics.write({"kind": "run", "run": "2-2"})  # then killed
    metrics.close()
    code, out, _ = cli(capsys, "ls", tmp_path)
    assert "last run did not end" in out


def test_bad_directories_are_usage_errors(tmp_path, capsys):
    code, _, err = cli(capsys, "ls", tmp_path / "nothing")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "is not a directory" in err
    code, _, err = cli(capsys, "prune", tmp_path, "--keep", "1")
    assert code == 2 and "not a run's checkpoint directory" in err


# -- prune -----------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_a_pruned_directory_resumes(tmp_path):
    d = str(tmp_path / "c")

    def run(module, *args):
        done = subprocess.run([sys.executable, "-m", module, *args],
                              capture_output=True, text=True, timeout=100)
        assert done.returncode == 0, done.stderr
        return done

    run("localcluster.run", "--epochs", "3", "--checkpoint-dir", d)
    done = run("localcluster.ckpt", "prune", d, "--keep", "1", "--json")
    result = json.loads(done.stdout)
    # epoch 3 refers to epoch 0 for the reader's dataset, unchanged since
    assert result["kept_epochs"] == [0, 3] and result["bytes_freed"] > 0
    assert result["referred_epochs"] == [0]
    left = names(d)
    assert RUN_FILE in left
    assert {n.rsplit(".", 1)[1] for n in left if n != RUN_FILE and
            n != METRICS_FILE} == {"0", "3"}
    done = run("localcluster.run", "--checkpoint-dir", d, "--resume",
               "--epochs", "4", "--json")
    summary = json.loads(done.stdout)
    assert summary["resumed_from"] == 3
    assert [e["epoch"] for e in summary["epochs"]] == [4]


def test_prune_keeps_the_newest_complete_and_what_is_not_the_runs(tmp_path,
                                                                  capsys):
    torn_dir(str(tmp_path))
    write_epochs(tmp_path, [5])
    (tmp_path / "train.log.1").write_text("a log, not a checkpoint")
    (tmp_path / "a.9").write_text("named like a checkpoint of a")
    shutil.copy(tmp_path / "a.0", tmp_path / "a.00")  # not the a.0 name
    write(str(tmp_path), "b", 7, as_node="a")          # a's, named b's
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    os.rename(tmp_path / "other.npz", tmp_path / "c.8")  # not ours
    (tmp_path / RUN_FILE).write_text("{}")
    (tmp_path / METRICS_FILE).write_text("")
    (tmp_path / LOCK_FILE).write_text("12345\n")        # a killed run's
    result = cli_json(capsys, "prune", tmp_path, "--keep", "2")
    assert result["kept_epochs"] == [1, 5] and result["resume_epoch"] == 5
    assert names(tmp_path) == sorted(
        ["a.1", "b.1", "c.1", "a.5", "b.5", "c.5", "train.log.1", "a.9",
         "a.00",
         "b.7", "c.8", RUN_FILE, METRICS_FILE, LOCK_FILE])
    removed = {r["name"]: r["why"] for r in result["removed"]}
    assert removed["a.0"].startswith("epoch 0 (complete")
    assert removed["a.2"] == "epoch 2 (torn)"
    assert removed["b.3"] == "epoch 3 (torn)"
    assert any(".partial-" in n for n in removed)
    assert result["bytes_freed"] == sum(r["bytes"] for r in result["removed"])


def test_prune_refuses_a_directory_a_live_run_holds(tmp_path, capsys):
    write_epochs(tmp_path, [0, 1, 2])
    before = names(tmp_path)
    lock = DirLock(str(tmp_path)).acquire()
    try:
        code, out, err = cli(capsys, "prune", tmp_path, "--keep", "1")
    finally:
        lock.release()
    assert code == 1
    [line] = err.strip().splitlines()
    assert "in use by a running run" in line and str(os.getpid()) in line
    assert names(tmp_path) == before


def test_a_dry_run_removes_nothing(tmp_path, capsys):
    torn_dir(str(tmp_path))
    before = names(tmp_path)
    code, out, _ = cli(capsys, "prune", tmp_path, "--keep", "1",
                       "--dry-run")
    assert code == 0 and names(tmp_path) == before
    assert "would remove" in out and "a.0" in out and "b.3" in out
    result = cli_json(capsys, "prune", tmp_path, "--keep", "1", "--dry-run")
    assert result["dry_run"] and "a.0" in [r["name"]
                                           for r in result["removed"]]
    assert names(tmp_path) == before


def test_keep_must_be_one_or_more(tmp_path, capsys):
    write_epochs(tmp_path, [0])
    code, _, err = cli(capsys, "prune", tmp_path, "--keep", "0")
    assert code == 2 and "rm -r" in err
    assert len(err.strip().splitlines()) == 1
    assert names(tmp_path) == ["a.0", "b.0", "c.0"]


def test_library_prune_never_removes_what_a_resume_needs(tmp_path):
    write_epochs(tmp_path, [0, 1, 2, 3])
    os.unlink(tmp_path / "a.3")                     # 3 torn: 2 is newest
    partial(tmp_path, "a.3", os.getpid())           # ... and being written
    removed = prune(str(tmp_path), 1, nodes=NODES)
    assert sorted(removed) == sorted(f"{n}.{e}" for n in NODES
                                     for e in (0, 1))
    # epoch 2 -- what --resume takes -- and the epoch being written stay
    assert scan(str(tmp_path)).resume_epoch == 2
    assert {"b.3", "c.3"} <= set(names(tmp_path))
    with pytest.raises(ValueError, match="keep"):
        prune(str(tmp_path), 0)


def test_without_a_complete_epoch_no_epoch_is_pruned(tmp_path, capsys):
    write_epochs(tmp_path, [0, 1])
    os.unlink(tmp_path / "a.0")
    os.unlink(tmp_path / "b.1")
    gone = partial(tmp_path, "b.1", dead_pid())
    code, out, _ = cli(capsys, "prune", tmp_path, "--keep", "1")
    assert code == 0 and "no complete epoch" in out
    assert names(tmp_path) == ["a.1", "b.0", "c.0", "c.1"]
    assert not os.path.exists(gone)


# -- --cleanup ---------------------------------------------------------------------------

def test_cleanup_removes_gone_temp_runs_with_nothing_to_resume(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = tmp_path / (TEMP_PREFIX + "gone")
    write_epochs(gone, [0, 1])
    os.unlink(gone / "a.0")
    os.unlink(gone / "b.1")
    (gone / RUN_FILE).write_text("{}")
    complete = tmp_path / (TEMP_PREFIX + "complete")
    write_epochs(complete, [0])
    live = tmp_path / (TEMP_PREFIX + "live")
    write_epochs(live, [0])
    os.unlink(live / "a.0")
    elsewhere = tmp_path / "elsewhere"
    write_epochs(elsewhere, [0])
    os.unlink(elsewhere / "a.0")
    os.symlink(elsewhere, tmp_path / (TEMP_PREFIX + "link"))
    lock = DirLock(str(live)).acquire()
    try:
        code = cleanup(None, True, sys.stderr)  # --cleanup --json
    finally:
        lock.release()
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert [d["path"] for d in result["removed_directories"]] == [str(gone)]
    assert result["removed_directories"][0]["bytes"] > 0
    assert result["kept_directories"] == [str(complete)]
    assert not gone.exists()
    assert names(complete) == ["a.0", "b.0", "c.0"]
    assert names(live) == ["b.0", "c.0"]
    assert names(elsewhere) == ["b.0", "c.0"]


def ended(directory, status):
    metrics = MetricsLog(str(directory))
    metrics.write({"kind": "run", "run": "1-1"})
    metrics.write({"kind": "end", "run": "1-1", "status": status})
    metrics.close()


def test_cleanup_removes_finished_temp_runs_and_keeps_those_cut_short(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    finished = tmp_path / (TEMP_PREFIX + "finished")
    write_epochs(finished, [0, 1])
    ended(finished, "ok")
    stopped = tmp_path / (TEMP_PREFIX + "stopped")
    write_epochs(stopped, [0, 1])
    ended(stopped, "interrupted")
    assert cleanup(None, True, sys.stderr) == 0  # --cleanup --json
    result = json.loads(capsys.readouterr().out)
    assert [(d["path"], d["why"]) for d in result["removed_directories"]] \
        == [(str(finished), "finished")]
    assert result["kept_directories"] == [str(stopped)]
    assert not finished.exists()
    assert names(stopped) == ["a.0", "a.1", "b.0", "b.1", "c.0", "c.1",
                              METRICS_FILE]
    write_epochs(finished, [0])
    ended(finished, "ok")
    cleanup(None, False, sys.stdout)  # --cleanup
    out = capsys.readouterr().out
    assert f"{finished} (finished, " in out and "stopped short" in out


def test_cleanup_says_what_stays_and_how_to_remove_it(tmp_path, monkeypatch,
                                                      capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    write_epochs(tmp_path / (TEMP_PREFIX + "complete"), [0])
    cleanup(None, False, sys.stdout)  # --cleanup
    out = capsys.readouterr().out
    assert "1 temporary run directory" in out and "stays" in out
    assert "localcluster.ckpt prune" in out and "rm -r" in out


def test_a_bug_is_one_line_never_a_traceback(tmp_path, capsys, monkeypatch):
    write_epochs(tmp_path, [0])

    def broken(*args, **kwargs):
        raise RuntimeError("boom\nsecond line")
    monkeypatch.setattr(ckpt, "scan", broken)
    code, _, err = cli(capsys, "ls", tmp_path)
    assert code == 1
    [line] = err.strip().splitlines()
    assert "RuntimeError: boom" in line and "a bug in localcluster" in line
    code, _, err = cli(capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
