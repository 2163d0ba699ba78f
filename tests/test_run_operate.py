"""Operating a run of ``python -m localcluster.run``: the epoch lines at
many nodes, progress, node pids, ``--cpus``, and ``metrics.jsonl``, which
a SIGKILLed master keeps whole."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from localcluster.cli.train.epochs import (change_text, metric_values,
                                          metrics_text, prototype_metrics,
                                          nodes_text, short_names)
from localcluster.cli.rundir.metrics import METRICS_FILE, read_metrics

from test_run import json_run, leftovers, run


def epoch_lines(stdout):
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


@pytest.mark.timeout(180)
def test_32_nodes_print_epoch_lines_under_200_characters(tmp_path):
    done = run("--nodes", "32", "--epochs", "2", "--checkpoint-dir",
               str(tmp_path / "c"), timeout=170)
    assert done.returncode == 0, done.stderr
    lines = epoch_lines(done.stdout)
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    assert all(len(line) < 200 for line in lines), lines
    header = done.stdout.splitlines()[0]
    assert "trainer_0..trainer_31" in header and len(header) < 200
    # the nodes summarized: cpu and rss min/median/max, the last one named
    assert "34 nodes cpu " in lines[0] and "last done " in lines[0]
    assert "train_loss_* (32)" in lines[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("session", ["localhost", "local"])
def test_200_trainers_of_one_prototype_train_under_both_sessions(session,
                                                                tmp_path):
    done = run("--nodes", "200", "--epochs", "2", "--session", session,
               "--checkpoint-dir", str(tmp_path / "c"), timeout=110)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert header.startswith("localcluster: 202 nodes (reader, "
                             "trainer_0..trainer_199, ps)"), header
    lines = epoch_lines(done.stdout)
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    assert all(len(line) < 200 and "train_loss_* (200) " in line
               for line in lines), lines
    losses = [float(line.split(" loss ")[1].split()[0]) for line in lines]
    assert losses[1] < losses[0], losses
    # every instance checkpointed its own file
    assert {f"trainer_{i}.2" for i in range(200)} <= set(
        os.listdir(tmp_path / "c"))


def test_epoch_lines_say_k_of_n_checkpoint_seconds_elapsed_and_eta(tmp_path):
    done = run("--epochs", "3", "--checkpoint-dir", str(tmp_path / "c"))
    assert done.returncode == 0, done.stderr
    first, second, last = epoch_lines(done.stdout)
    assert first.startswith("epoch 1/3 ") and last.startswith("epoch 3/3 ")
    for line in (first, second, last):
        assert " + ckpt " in line and " elapsed " in line
    assert " ETA " in first and " ETA " in second
    assert " ETA " not in last  # nothing left to wait for
    # few nodes are listed one by one
    assert "| reader " in first and " ps " in first
    assert "checkpointing)" in done.stdout.splitlines()[-1]


def test_records_per_second_count_the_checkpoint(tmp_path):
    summary, _ = json_run("--epochs", "2", "--checkpoint-dir",
                       str(tmp_path / "c"))
    for epoch in summary["epochs"]:
        whole = epoch["seconds"] + epoch["checkpoint_seconds"]
        records = epoch["records_per_s"] * whole
        assert records == pytest.approx(round(records), rel=1e-6)


def test_verbose_lists_every_node_with_its_pid(tmp_path):
    summary_run = run("--epochs", "1", "--verbose", "--json",
                      "--checkpoint-dir", str(tmp_path / "c"))
    assert summary_run.returncode == 0, summary_run.stderr
    summary = json.loads(summary_run.stdout)
    shown = summary_run.stderr.splitlines()
    for node, pid in summary["node_pids"].items():
        assert any(line.split()[:3] == [node, "pid", str(pid)]
                   for line in shown), (node, shown)
    assert any(line.strip().startswith("metrics: loss ") for line in shown)


def test_node_pids_are_in_the_summary_and_the_trace(tmp_path):
    trace = tmp_path / "t.json"
    summary, _ = json_run("--epochs", "1", "--trace", str(trace),
                       "--checkpoint-dir", str(tmp_path / "c"))
    pids = summary["node_pids"]
    assert sorted(pids) == sorted(summary["nodes"])
    assert len(set(pids.values())) == len(pids)  # a process per node
    assert summary["master_pid"] not in pids.values()
    assert all(summary["epochs"][0]["nodes"][n]["pid"] == p
               for n, p in pids.items())
    events = json.loads(trace.read_text())
    assert events["otherData"]["pids"] == dict(
        pids, runner=summary["master_pid"])
    tracks = {e["pid"]: e["args"]["name"] for e in events["traceEvents"]
              if e["name"] == "process_name"}
    labels = {tracks[e["pid"]]: e["args"]["labels"]
              for e in events["traceEvents"] if e["name"] == "process_labels"}
    assert labels == {n: f"pid {p}" for n, p in
                      dict(pids, runner=summary["master_pid"]).items()}


CPU_JOB = textwrap.dedent("""
    import os
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    def pinned():
        return np.array(sorted(os.sched_getaffinity(0)), dtype=np.float64)

    def build(epochs=1):
        outputs = {}
        with Job() as job:
            for name in ("a", "b"):
                with Node(name), Task():
                    ops.Python(pinned)([], ["cpus"])
                    outputs[name] = Task.current().add_output("cpus")
            epoch_limiter(job, epochs)
        return job, {"metrics": {f"cpus_{n}": o for n, o in outputs.items()}}
""")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                    reason="pinning to one of two CPUs needs two")
def test_cpus_pins_the_nodes_it_names(tmp_path):
    job = tmp_path / "cpujob.py"
    job.write_text(CPU_JOB)
    first = min(os.sched_getaffinity(0))
    done = run("--job", f"{job}:build", "--cpus", f"a={first}", "--json",
               "--checkpoint-dir", str(tmp_path / "c"))
    assert done.returncode == 0, done.stderr
    metrics = json.loads(done.stdout)["epochs"][0]["metrics"]
    assert metrics["cpus_a"] == first  # one CPU: its id
    assert metrics["cpus_b"] != first  # unpinned: the mean of all of them


@pytest.mark.parametrize("spec, says", [
    ("nobody=0", "--cpus 'nobody' matches no node of the job"),
    ("trainer_*=4096", "are not usable here"),
    ("trainer_*=x", "is not a CPU id"),
    ("trainer_*", "is not NODE=CPUS"),
    ("trainer_*=3-1", "from low to high"),
])
def test_a_bad_cpus_is_a_one_line_usage_error(spec, says):
    done = run("--cpus", spec)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert says in line and "--cpus" in line


# -- metrics.jsonl ---------------------------------------------------------------------

def test_metrics_jsonl_has_a_run_every_epoch_and_the_end(tmp_path):
    directory = tmp_path / "c"
    summary, _ = json_run("--epochs", "3", "--checkpoint-dir", str(directory))
    records = read_metrics(directory / METRICS_FILE)
    assert [r["kind"] for r in records] == ["run", "epoch", "epoch", "epoch",
                                           "end"]
    start, *epochs, end = records
    assert start["nodes"] == summary["nodes"] and start["epochs"] == 3
    assert start["options"]["epochs"] == 3
    assert len({r["run"] for r in records}) == 1
    for record, shown in zip(epochs, summary["epochs"]):
        assert record["epoch"] == shown["epoch"] and record["of"] == 3
        assert record["metrics"] == shown["metrics"]
        assert record["checkpoint_seconds"] == shown["checkpoint_seconds"]
        assert set(record["processes"]) == set(summary["nodes"])
        for facts in record["processes"].values():
            assert facts["rss_bytes"] > 0 and facts["pid"] > 0
    assert end["status"] == "ok" and end["last_epoch"] == 3
    # a resumed run appends its own lines after the first run's
    json_run("--epochs", "4", "--resume", "--checkpoint-dir", str(directory))
    again = read_metrics(directory / METRICS_FILE)
    assert again[:5] == records
    assert [r["kind"] for r in again[5:]] == ["run", "epoch", "end"]
    assert again[5]["resumed_from"] == 3 and again[6]["epoch"] == 4


@pytest.mark.timeout(120)
def test_metrics_jsonl_survives_a_sigkilled_master(tmp_path):
    directory = tmp_path / "c"
    path = directory / METRICS_FILE
    proc = subprocess.Popen(
        [sys.executable, "-m", "localcluster.run", "--epochs", "1000",
         "--checkpoint-dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if path.exists() and len(read_metrics(path)) >= 4:
                break
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    raw = path.read_bytes()
    assert raw.endswith(b"\n")  # every line whole
    records = read_metrics(path)
    assert len(records) == raw.count(b"\n")  # none torn, none skipped
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "run" and "end" not in kinds
    epochs = [r["epoch"] for r in records if r["kind"] == "epoch"]
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= 3
    # each epoch logged was checkpointed first: its files are there
    for node in records[0]["nodes"]:
        assert (directory / f"{node}.{epochs[-1]}").exists()
    # the nodes follow their master out
    for facts in records[1]["nodes"].values():
        try:
            psutil.Process(facts["pid"]).wait(20)
        except psutil.NoSuchProcess:
            pass
    assert leftovers(proc.pid)[1] == []


def test_a_failed_run_ends_its_history_with_the_error(tmp_path):
    directory = tmp_path / "c"
    done = run("--epochs", "3", "--faults", "kill trainer_1 at epoch 2",
               "--checkpoint-dir", str(directory))
    assert done.returncode == 1
    records = read_metrics(directory / METRICS_FILE)
    assert [r["kind"] for r in records] == ["run", "epoch", "end"]
    assert records[-1]["status"] == "error"
    assert "trainer_1" in records[-1]["error"]


def test_restarts_are_in_the_history(tmp_path):
    directory = tmp_path / "c"
    summary, _ = json_run("--epochs", "3", "--max-restarts", "1", "--faults",
                       "kill trainer_1 at epoch 2", "--checkpoint-dir",
                       str(directory))
    assert len(summary["restarts"]) == 1
    records = read_metrics(directory / METRICS_FILE)
    kinds = [r["kind"] for r in records]
    assert kinds == ["run", "epoch", "restart", "epoch", "epoch", "end"]
    assert records[2]["resumed_from"] == 1
    assert [r["restarts"] for r in records if r["kind"] == "epoch"] == \
        [0, 1, 1]
    # the restarted node runs in a new process
    assert records[1]["nodes"]["trainer_1"]["pid"] != \
        records[3]["nodes"]["trainer_1"]["pid"]


# -- the parts of a line ------------------------------------------------------------

def test_numbered_metrics_are_summarized_from_three_on():
    assert metrics_text({"loss": 1.0, "x_0": 2.0, "x_1": 3.0}) == \
        "loss 1  x_0 2  x_1 3"
    assert metrics_text({"x_2": 5.0, "x_10": 1.0, "x_1": 3.0, "loss": None}) \
        == "loss n/a  x_* (3) 1/3/5"
    assert metrics_text({"x_2": 5.0, "x_10": 1.0, "x_1": 3.0}, every=True) \
        == "x_1 3  x_2 5  x_10 1"


def test_a_prototypes_metric_is_one_numbered_metric_per_instance():
    from localcluster import Job, LocalSession, Node, Task, ops
    with Job() as job:
        with Node("trainer", num_instances=3), Task() as task:
            index = ops.Cast([ops.NodeIndex()], to="float64")
            each = task.add_output(index)
            pair = task.add_outputs({"a": index, "b": ops.Scale(
                [index], scale=2.0)})
        with Node("ps"), Task() as task:
            loss = task.add_output(ops.Const(0.5))
    metrics = {"loss": loss, "each": each, "pair": pair}
    instances = prototype_metrics(job, metrics)
    assert instances == {"each": 3, "pair": 3}
    with LocalSession() as session:
        session.run(job.epoch_group)
    # a record of blobs: the mean of each instance's
    assert metric_values(metrics, instances) == {
        "loss": 0.5, "each_0": 0.0, "each_1": 1.0, "each_2": 2.0,
        "pair_0": 0.0, "pair_1": 1.5, "pair_2": 3.0}
    assert metric_values({"loss": loss}) == {"loss": 0.5}


def test_many_nodes_are_summarized_and_the_last_named():
    per_node = {f"n_{i}": {"cpu_percent": float(i), "rss_bytes": i << 20}
                for i in range(1, 6)}
    text = nodes_text(per_node, {"n_1": 0.1, "n_4": 0.9, "n_5": None})
    assert text == "5 nodes cpu 1/3/5% rss 1M/3M/5M  last done n_4 0.900 s"
    few = dict(list(per_node.items())[:2])
    assert nodes_text(few, {}) == "n_1 1% 1M  n_2 2% 2M"


def test_short_names_fold_numbered_runs():
    assert short_names(["reader", "t_0", "t_1", "t_2", "ps"]) == \
        "reader, t_0..t_2, ps"
    assert short_names(["t_0", "t_1", "t_3"]) == "t_0, t_1, t_3"
    assert short_names(["a_1", "a_2", "a_3", "b_4", "b_5", "b_6"]) == \
        "a_1..a_3, b_4..b_6"


# -- how many checkpoints a run keeps ------------------------------------------------

def checkpointed_epochs(directory):
    return sorted({int(n.rsplit(".", 1)[1]) for n in os.listdir(directory)
                   if n.startswith("trainer_0.") and "partial" not in n})


def checkpoint_bytes(directory):
    return sum(os.path.getsize(os.path.join(directory, n))
               for n in os.listdir(directory)
               if n.rsplit(".", 1)[-1].isdigit())


def test_the_temporary_directory_keeps_what_a_resume_needs_until_cleanup(
        tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    done = run("--epochs", "4", env=env)
    assert done.returncode == 0, done.stderr
    [directory] = [tmp_path / n for n in os.listdir(tmp_path)
                   if n.startswith("localcluster-ckpt-")]
    # the last epoch, and epoch 0, which holds the data (the trainers'
    # shards, the reader's held-out set) that epoch 4 refers to (unchanged
    # since): one copy of it on disk
    assert checkpointed_epochs(directory) == [0, 4]
    data = sum(os.path.getsize(directory / n) for n in os.listdir(directory)
               if n.endswith(".0"))
    assert checkpoint_bytes(directory) < data * 1.1
    assert f"checkpoints: {directory} (keeps the last complete epoch;" \
        in done.stdout
    assert (directory / METRICS_FILE).exists()
    # the run finished: --cleanup removes what it left
    cleaned = run("--cleanup", "--json", env=env)
    assert cleaned.returncode == 0, cleaned.stderr
    removed = json.loads(cleaned.stdout)["removed_directories"]
    assert [(d["path"], d["why"]) for d in removed] == \
        [(str(directory), "finished")]
    assert not directory.exists()


def test_a_blob_that_does_not_change_is_checkpointed_once(tmp_path):
    """The reader's dataset (17 MB) was written again every epoch."""
    directory = tmp_path / "c"
    done = run("--epochs", "3", "--checkpoint-dir", str(directory))
    assert done.returncode == 0, done.stderr
    assert checkpointed_epochs(directory) == [0, 1, 2, 3]
    first = sum(os.path.getsize(directory / n) for n in os.listdir(directory)
                if n.endswith(".0"))
    assert checkpoint_bytes(directory) < first * 1.1


def test_a_checkpoint_dir_keeps_every_epoch_unless_keep_last(tmp_path):
    every, last = tmp_path / "every", tmp_path / "last"
    assert run("--epochs", "3", "--checkpoint-dir", str(every)).returncode \
        == 0
    assert checkpointed_epochs(every) == [0, 1, 2, 3]
    done = run("--epochs", "3", "--keep-last", "1", "--checkpoint-dir",
               str(last))
    assert done.returncode == 0, done.stderr
    # (and epoch 0, whose reader's dataset epoch 3 refers to)
    assert checkpointed_epochs(last) == [0, 3]
    # what is kept resumes, and goes on keeping one
    summary, _ = json_run("--epochs", "5", "--resume", "--keep-last", "1",
                          "--checkpoint-dir", str(last))
    assert summary["resumed_from"] == 3 and summary["last_epoch"] == 5
    assert checkpointed_epochs(last) == [0, 5]


# -- node logs and the report from the command line ----------------------------------

PRINTING_JOB = textwrap.dedent("""
    import functools
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    def say(node, x):
        print(f"{node} says {int(x[0])}", flush=True)
        return x + 1

    def saying(node):
        return functools.partial(say, node)

    def build(epochs=2):
        with Job() as job:
            for name in ("alpha", "beta"):
                with Node(name):
                    with job.init_group, Task():
                        ops.Const(np.zeros(1), name=f"{name}_n")
                    with Task():
                        ops.Python(saying(name))([f"{name}_n"], [f"{name}_n"])
            epoch_limiter(job, epochs)
        return job
""")


def printing_run(tmp_path, *options):
    job = tmp_path / "printing.py"
    job.write_text(PRINTING_JOB)
    return run("--job", f"{job}:build", "--epochs", "2", "--checkpoint-dir",
               str(tmp_path / "c"), *options)


def node_lines(path):
    return [line for line in path.read_text().splitlines()
            if not line.startswith("--- ")]


def test_log_dir_writes_each_nodes_lines_to_its_file(tmp_path):
    logs = tmp_path / "logs"
    done = printing_run(tmp_path, "--log-dir", str(logs))
    assert done.returncode == 0, done.stderr
    assert node_lines(logs / "alpha.log") == ["alpha says 0", "alpha says 1"]
    assert node_lines(logs / "beta.log") == ["beta says 0", "beta says 1"]
    headers = [line for line in (logs / "alpha.log").read_text().splitlines()
               if line.startswith("--- alpha started: pid ")]
    assert len(headers) == 1
    # the terminal keeps the progress, not the node output
    assert "says" not in done.stdout + done.stderr
    assert "epoch 2/2" in done.stdout
    master = (logs / "master.log").read_text()
    assert "epoch 1/2" in master and "done: epoch 2" in master


def test_tee_and_log_nodes_choose_what_the_terminal_shows(tmp_path):
    done = printing_run(tmp_path, "--log-dir", str(tmp_path / "l1"), "--tee")
    assert done.returncode == 0, done.stderr
    assert "[alpha] alpha says 1" in done.stdout
    assert "[beta] beta says 1" in done.stdout
    done = printing_run(tmp_path, "--log-dir", str(tmp_path / "l2"),
                        "--log-nodes", "b*", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert "[beta] beta says 1" in done.stdout and "alpha says" not in \
        done.stdout
    assert node_lines(tmp_path / "l2" / "alpha.log") == \
        ["alpha says 0", "alpha says 1"]
    # without --log-dir, --log-nodes narrows the terminal alone
    done = printing_run(tmp_path, "--log-nodes", "alpha", "--overwrite")
    assert "[alpha] alpha says 0" in done.stdout and "beta says" not in \
        done.stdout


@pytest.mark.parametrize("options, says", [
    (["--tee"], "--tee keeps the terminal copy of --log-dir's files"),
    (["--log-nodes", "gamma*"], "--log-nodes 'gamma*' matches no node"),
])
def test_bad_log_options_are_one_line_usage_errors(tmp_path, options, says):
    done = printing_run(tmp_path, *options)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert says in line


def test_report_writes_the_runs_page_also_when_it_fails(tmp_path):
    page = tmp_path / "report.html"
    done = run("--epochs", "3", "--faults", "kill trainer_1 at epoch 2",
               "--checkpoint-dir", str(tmp_path / "c"), "--report", str(page))
    assert done.returncode == 1
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text
    assert "trainer_1" in text  # the error, named
    assert f"report: {page}" in done.stdout


@pytest.mark.parametrize("first, last, says", [
    (4.525, 0.01998, "226x lower"),
    (0.01005, 0.009912, "1% lower"),     # was "1x lower"
    (1.0, 0.8, "20% lower"),
    (1.0, 1.25, "25% higher"),
    (1.0, 3.0, "3x higher"),
    (1.0, 0.0, "lower"),
    (2.0, 2.0, "unchanged"),
])
def test_the_done_line_says_how_the_loss_changed_in_words(first, last, says):
    assert change_text(first, last) == says


def test_a_wall_clock_stepped_back_makes_no_negative_run_time(
        tmp_path, monkeypatch, capsys):
    """The run's seconds in metrics.jsonl come from the monotonic clock:
    an NTP step back by an hour mid-run changes the timestamps, never
    the durations."""
    from localcluster.cli.run import main
    real, calls = time.time, []

    def stepped_back():
        calls.append(1)
        return real() - (3600 if len(calls) > 1 else 0)
    monkeypatch.setattr(time, "time", stepped_back)
    code = main(["--session", "local", "--epochs", "1", "--checkpoint-dir",
                 str(tmp_path)])
    monkeypatch.undo()
    assert code == 0, capsys.readouterr()
    records = read_metrics(tmp_path / METRICS_FILE)
    end = [r for r in records if r["kind"] == "end"][-1]
    assert 0 <= end["seconds"] < 600, end
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert all(e["elapsed"] >= 0 and e["seconds"] >= 0 for e in epochs)


@pytest.mark.parametrize("where", ["no-such-dir/r.html", "a-dir"])
def test_a_report_path_that_cannot_be_written_is_refused_before_training(
        tmp_path, where):
    """``--report`` is checked first: one usage line, exit 2, nothing
    trained, no checkpoint written, no temporary file left."""
    (tmp_path / "a-dir").mkdir()
    ckpt = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, "-m", "localcluster.run", "--epochs", "1",
         "--checkpoint-dir", str(ckpt), "--report", str(tmp_path / where)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "--report" in done.stderr and \
        len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "epoch 1/1" not in done.stdout
    assert not ckpt.exists() or not any(ckpt.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-dir", "ckpt"] \
        or sorted(p.name for p in tmp_path.iterdir()) == ["a-dir"]


def test_an_unwritten_checkpoint_is_one_line_and_the_done_line_says_what_resumes(
        tmp_path):
    """A checkpoint that cannot be written: one warning line (not the log
    line, the same warning again and its source line), and the done line
    says which epoch a resume would start from."""
    done = subprocess.run(
        [sys.executable, "-m", "localcluster.run", "--epochs", "3",
         "--checkpoint-dir", str(tmp_path),
         "--faults", "fail-checkpoint ps at epoch 3"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = [line for line in (done.stdout + done.stderr).splitlines()
            if "checkpoint of epoch 3 was not written" in line]
    assert len(said) == 1, done.stdout + done.stderr
    assert "CheckpointWarning" not in done.stderr
    last = [l for l in done.stdout.splitlines() if l.startswith("done:")][0]
    assert last.endswith("; the last complete checkpoint is epoch 2"), last


# -- history and checkpoints agree -------------------------------------------------

def _sigint_after_save(monkeypatch, epoch):
    """A Ctrl-C that lands the moment ``epoch``'s checkpoint is complete,
    before the runner hands the epoch on."""
    from localcluster.job import JobRunner
    save = JobRunner._save

    def saved_then_interrupted(self, session, at, final=False):
        error = save(self, session, at, final=final)
        if at == epoch:
            signal.raise_signal(signal.SIGINT)
        return error
    monkeypatch.setattr(JobRunner, "_save", saved_then_interrupted)


def _sigint_while_the_line_is_made(monkeypatch, epoch):
    """A Ctrl-C that lands while ``epoch``'s line is being made (its nodes
    sampled), after its checkpoint is complete."""
    from localcluster.cli.train.progress import Usage
    sample, calls = Usage.sample, []

    def sampled_then_interrupted(self):
        calls.append(1)
        out = sample(self)
        if len(calls) == epoch + 1:  # one sample before the first epoch
            signal.raise_signal(signal.SIGINT)
        return out
    monkeypatch.setattr(Usage, "sample", sampled_then_interrupted)


@pytest.mark.parametrize("when", [_sigint_after_save,
                                  _sigint_while_the_line_is_made])
def test_a_ctrl_c_never_keeps_a_checkpoint_without_its_line_and_history(
        tmp_path, monkeypatch, capsys, when):
    """Whenever a Ctrl-C lands after an epoch's checkpoint is complete, the
    epoch has its progress line and its record in metrics.jsonl: the
    interrupted line names the last epoch shown, the report has no gap."""
    from localcluster.cli.run import main
    when(monkeypatch, 2)
    code = main(["--session", "local", "--epochs", "4", "--checkpoint-dir",
                 str(tmp_path)])
    monkeypatch.undo()
    out = capsys.readouterr().out
    assert code == 130, out
    assert [line.split()[1] for line in epoch_lines(out)] == ["1/4", "2/4"]
    assert "the last complete checkpoint is epoch 2" in out
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1, 2]
    assert records[-1]["kind"] == "end" and \
        records[-1]["status"] == "interrupted"
    assert records[-1]["last_epoch"] == 2


def test_the_done_line_and_the_epoch_lines_count_from_one_start(
        tmp_path, monkeypatch, capsys):
    """The done line's seconds and the epoch lines' ``elapsed`` count from
    the run's one start: a session that takes long to start (here 1000 s
    on a clock of the command line's own) is in both, not in one only
    (``done: ... 12.96 s`` against ``elapsed 11.3 s``)."""
    import types
    from localcluster.cli.run import main
    from localcluster.cli.train import epochs, loop
    offset = [0.0]
    clock = types.SimpleNamespace(
        monotonic=lambda: time.monotonic() + offset[0], time=time.time)
    monkeypatch.setattr(loop, "time", clock)
    monkeypatch.setattr(epochs, "time", clock)
    session_class = loop._session_class

    def slow_to_start(kind):
        made = session_class(kind)

        def make(**kwargs):
            offset[0] += 1000.0
            return made(**kwargs)
        make.__name__ = made.__name__
        return make
    monkeypatch.setattr(loop, "_session_class", slow_to_start)
    code = main(["--session", "local", "--epochs", "2", "--checkpoint-dir",
                 str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    done = [line for line in out.splitlines() if line.startswith("done:")]
    shown = done[0].split(" in ")[1].split(" s")[0]
    records = read_metrics(tmp_path / METRICS_FILE)
    elapsed = [r["elapsed"] for r in records if r["kind"] == "epoch"]
    seconds = records[-1]["seconds"]   # the end line's: the done line's
    assert shown == f"{seconds:.2f}", (shown, seconds)
    assert elapsed[0] >= 1000 and 0 <= seconds - elapsed[-1] < 500, (
        elapsed, seconds)
