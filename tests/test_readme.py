"""README's Python examples run as written, in the order a reader meets
them (a later block may use what an earlier one built); its samples of
output are what the code prints; it names only files that are here."""

import pathlib
import re
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.timeout(240)
def test_the_readme_python_examples_run_as_written(tmp_path):
    blocks = python_blocks()
    assert blocks, "README.md has no python examples"
    done = subprocess.run([sys.executable, "-c", "\n".join(blocks)],
                          cwd=tmp_path, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stderr[-2000:]
    # the first example's comment says what it prints; so do the
    # scheduler's and the Ray session's, on the same group
    assert done.stdout.count("6.0 150\n") == 3, done.stdout[:2000]
    # the conditions example: 40 records of 100 kB over 100 MB/s and 5 ms
    # of latency, plus the ops' virtual time
    assert "0.0451 s\n" in done.stdout, done.stdout[:2000]
    # the prototype example: each instance's 10 * index + N, and their sum
    assert "[3, 13, 23] 39\n23\n" in done.stdout, done.stdout[:2000]


def block_after(marker):
    """The text of the first plain ``` block after ``marker``."""
    text = README.read_text()
    start = text.index(marker)
    found = re.compile(r"^```\n(.*?)^```", re.S | re.M).search(text, start)
    return found.group(1)


def test_the_to_string_sample_is_what_printer_prints():
    sample = block_after("`printer.to_string(tg)` shows")
    code = python_blocks()[0] + textwrap.dedent('''
        from localcluster import printer
        print("-- plan --")
        print(printer.to_string(tg))
    ''')
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("-- plan --\n", 1)[1] == sample


def transcript_commands(block):
    """``[(argv, status, expected output lines)]`` of a shell transcript:
    ``$ python -m localcluster.run ...`` lines, what follows each, and the
    ``$ echo $?`` after it."""
    commands = []
    for line in block.splitlines():
        if line.startswith("$ python -m localcluster.run"):
            commands.append([shlex.split(line[2:])[3:], 0, []])
        elif line == "$ echo $?":
            commands[-1].append("status")
        elif len(commands[-1]) == 4:  # the status echoed
            commands[-1][1] = int(line)
            commands[-1].pop()
        else:
            commands[-1][2].append(line)
    return commands


def shown_as(line, directory):
    """What must match of a transcript line: the exact text, or -- for the
    lines with timings and losses -- the part before them."""
    line = line.replace("/tmp/ckpt", directory)
    if line.startswith("epoch "):
        return line[:line.index("/") + 1]   # "epoch  7/": the epoch shown
    if line.startswith("done: "):
        return line[:line.index(" in ")]
    return line


@pytest.mark.timeout(120)
def test_the_resume_transcript_is_what_the_command_line_prints(tmp_path):
    block = block_after("**Resuming.**")
    directory = str(tmp_path / "ckpt")
    for argv, status, expected in transcript_commands(block):
        argv = [a.replace("/tmp/ckpt", directory) for a in argv]
        proc = subprocess.Popen(
            [sys.executable, "-m", "localcluster.run", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        interrupt_after = next((expected[i - 1] for i, line in
                                enumerate(expected) if line == "^C"), None)
        lines = []
        try:
            while interrupt_after is not None:
                line = proc.stdout.readline()
                lines.append(line)
                if not line or line.startswith(
                        shown_as(interrupt_after, directory)):
                    proc.send_signal(signal.SIGINT)
                    break
            out, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        shown = ("".join(lines) + out).splitlines()
        assert proc.returncode == status, err
        wanted = [shown_as(line, directory) for line in expected
                  if line not in ("...", "^C")]
        rest = iter(shown)  # each README line, in README's order
        assert all(any(s.startswith(w) for s in rest) for w in wanted), \
            "\n".join(["README:"] + wanted + ["printed:"] + shown)


def test_readme_points_only_at_files_in_the_repository():
    root = README.parent
    text = README.read_text()
    named = set(re.findall(r"`([\w./-]+\.(?:py|md|cfg|txt|json|toml))`",
                           text))
    named |= set(re.findall(r"python ([\w/]+\.py)", text))
    named = {n for n in named if "/" in n or n.endswith(".md")}
    missing = sorted(n for n in named if not (root / n).exists())
    assert not missing, f"README names files that are not here: {missing}"


def test_readme_documents_every_option_and_exit_status():
    from localcluster.cli.args import parser
    text = README.read_text()
    options = [o for action in parser()._actions
               for o in action.option_strings if o.startswith("--")]
    undocumented = [o for o in options
                    if o != "--help" and f"`{o}" not in text]
    assert not undocumented, undocumented
    for status in ("130", "143", "129"):
        assert status in text
    assert "`--resume latest`" in text


def test_the_test_file_for_a_job_passes_under_pytest_with_the_plugin(
        pytester):
    block = next(b for b in python_blocks()
                 if b.startswith("# test_myjob.py"))
    pytester.makepyfile(test_myjob=block)
    result = pytester.runpytest_subprocess(
        "-q", "-p", "no:cacheprovider", "--strict-markers",
        "--localcluster-sessions", "local,localhost")
    result.assert_outcomes(passed=3)   # the checks, and any_session twice


RACY = textwrap.dedent("""
    import numpy as np
    from localcluster import Job, Node, Task, epoch_limiter, ops

    def build():
        with Job() as job, Node("worker_0"):
            with job.init_group, Task():
                ops.Const(np.array(0.0), name="seen")
            with Task(num_instances=2):
                last = ops.Copy(["seen"])
                ops.Add([last, ops.Const(np.array(1.0))], ["seen"])
            epoch_limiter(job, 3)
        return job
""")


def test_the_failure_sample_is_what_check_job_raises(tmp_path):
    sample = block_after("`check_job` would fail at once") + block_after(
        "and the schedules show what the race does")
    (tmp_path / "myjob_racy.py").write_text(RACY)
    code = ("import myjob_racy\n"
            "from localcluster.testing import (JobCheckFailed, check_job,\n"
            "                                  schedule_independent)\n"
            "for check in (check_job, schedule_independent):\n"
            "    try:\n"
            "        check(myjob_racy.build)\n"
            "    except JobCheckFailed as exc:\n"
            "        print(f'JobCheckFailed: {exc}')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == sample


def test_no_python_example_checkpoints_where_a_transcript_does():
    """A reader who runs the examples and then the transcripts meets no
    'holds another run's checkpoints': each writes its own directory."""
    dirs = set(re.findall(r"--checkpoint-dir (\S+)", README.read_text()))
    for block in python_blocks():
        for directory in dirs:
            assert f'"{directory}"' not in block, (directory, block[:200])


def test_readme_says_where_a_task_with_no_node_runs_and_it_does():
    """A Task built with no Node runs on ``local`` without a word: that
    is the model's default (API: ``Node(name='local')``), so README says
    it rather than the library warning about it."""
    import numpy as np
    from localcluster import Task, TaskGroup, ops, printer
    text = " ".join(README.read_text().split())
    assert ("a `Task` built with no `Node` current (and no `node=`) runs "
            "on the node `local`") in text
    with TaskGroup() as group:
        with Task() as task:
            ops.Const(np.array(1))
    assert task.node == "local" and group.used_nodes() == ["local"]
    assert "  node local:" in printer.to_string(group)
