"""How the package installs: the build system is declared, so pip builds
it in isolation (an older pip otherwise falls back to ``setup.py
install`` with a deprecation warning)."""

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_build_system_is_declared_in_pyproject():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())
    system = declared["build-system"]
    assert system["build-backend"] == "setuptools.build_meta"
    assert any(r.startswith("setuptools") for r in system["requires"])
