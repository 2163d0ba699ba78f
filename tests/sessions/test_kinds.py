"""The session kinds registry: one place names "localhost", "local" and
"ray" for the command line, the pytest plugin and the job checks."""

import importlib.util
import subprocess
import sys

import pytest

from localcluster import LocalHostScheduler, LocalSession
from localcluster.sessions.kinds import KINDS, installed_kinds, session_class

pytestmark = pytest.mark.timeout(30)


def _ray_installed():
    return importlib.util.find_spec("ray") is not None


def test_the_kinds_are_named_reference_session_first():
    assert KINDS == ("local", "localhost", "ray")


def test_local_and_localhost_are_their_session_classes():
    assert session_class("local") is LocalSession
    assert session_class("localhost") is LocalHostScheduler


def test_an_unknown_kind_is_a_value_error_naming_it_and_the_kinds():
    with pytest.raises(ValueError) as caught:
        session_class("mars")
    message = str(caught.value)
    assert "'mars'" in message
    assert all(kind in message for kind in KINDS)


def test_installed_kinds_are_local_localhost_and_ray_iff_importable():
    installed = installed_kinds()
    assert installed["local"] is LocalSession
    assert installed["localhost"] is LocalHostScheduler
    assert ("ray" in installed) == _ray_installed()
    assert list(installed) == [k for k in KINDS if k in installed]


def _run(code):
    """The lines ``code`` prints, run in a fresh interpreter (what it
    imports is its own, whatever this one has imported)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_installed_kinds_finds_ray_without_importing_it():
    found, imported = _run(
        "import sys\n"
        "from localcluster.sessions.kinds import installed_kinds\n"
        "print('ray' in installed_kinds())\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or\n"
        "             m.startswith('ray.') or m.endswith('sessions.ray')))\n")
    assert found == str(_ray_installed())
    assert imported == "[]"


def test_ray_without_ray_installed_says_what_to_install():
    # as if the extra were not installed: importing Ray fails
    error, installed = _run(
        "import sys; sys.modules['ray'] = None\n"
        "from localcluster.sessions.kinds import (KindNotInstalled,\n"
        "                                         installed_kinds,\n"
        "                                         session_class)\n"
        "try:\n"
        "    session_class('ray')\n"
        "except KindNotInstalled as exc:\n"
        "    print(isinstance(exc, ImportError), exc)\n"
        "print(sorted(installed_kinds()))\n")
    assert error.startswith("True ") and \
        "pip install 'localcluster[ray]'" in error, error
    assert installed == "['local', 'localhost']"
