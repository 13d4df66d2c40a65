"""The Makefile's venv step with a Python older than tinylm's 3.10 (macOS's own python3 is 3.9)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _old_python(path: Path) -> Path:
    """A python that says it is 3.9.6 to `-c` code, as macOS Command Line Tools' python3."""
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} -c "import sys; '
                    f"sys.version_info = (3, 9, 6, 'final', 0); sys.version = '3.9.6'\n$2\"; fi\nexit 1\n")
    path.chmod(0o755)
    return path


def _new_python(path: Path) -> Path:
    """This Python, whose `-m venv` makes no pip (ensurepip: ~5 s of CPU per venv; the tests check which Python
    the venv is made with, and the --dry-run install after it fails on the empty pyproject.toml either way)."""
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "venv" ]; then shift 2; exec {sys.executable} -m venv '
                    f'--without-pip "$@"; fi\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_refuses_an_old_python_in_one_line_and_replaces_a_venv_made_with_it(tmp_path):
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    old = _old_python(tmp_path / "python3")
    run = subprocess.run(["make", "setup-train", f"PYTHON={old}"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode != 0
    assert f"tinylm needs Python >= 3.10 and {old} is 3.9.6: pass PYTHON=python3.12" in run.stderr
    assert not (tmp_path / ".venv").exists()
    # a venv an old python made before: made again with the newer PYTHON, not kept
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    shutil.copy(old, tmp_path / ".venv" / "bin" / "python")
    subprocess.run(["make", "setup-train", f"PYTHON={_new_python(tmp_path / 'python3.new')}",
                    "PIP_ARGS=--no-index --dry-run"],
                   cwd=tmp_path, capture_output=True, text=True)
    version = subprocess.run([tmp_path / ".venv" / "bin" / "python", "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True).stdout
    assert version.strip() == str(tuple(sys.version_info[:2]))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_remakes_a_venv_whose_python_is_gone_though_its_stamps_are_new(tmp_path):
    """Catches a venv whose Python was uninstalled or upgraded away under it (its bin/python a dangling link) kept
    because its install stamps are newer than pyproject.toml: `make train` ended in "make: .venv/bin/tinylm: No such
    file or directory" though the Makefile says the venv is made again when its Python is missing."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("")
    venv = tmp_path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to(tmp_path / "gone" / "python3")  # (the link replaced, nothing written through)
    (venv / ".installed").touch()
    (venv / ".installed-train").touch()
    subprocess.run(["make", "setup-train", f"PYTHON={_new_python(tmp_path / 'python3.new')}",
                    "PIP_ARGS=--no-index --dry-run"],
                   cwd=tmp_path, capture_output=True, text=True)
    version = subprocess.run([venv / "bin" / "python", "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True).stdout
    assert version.strip() == str(tuple(sys.version_info[:2]))
