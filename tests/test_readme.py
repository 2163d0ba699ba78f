"""README's Python examples run as written, in the order a reader meets
them (a later block may use what an earlier one built)."""

import pathlib
import re
import subprocess
import sys

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
    # the first example's comment says what it prints; so does the
    # scheduler's, on the same group
    assert done.stdout.count("6.0 150\n") == 2, done.stdout[:2000]
