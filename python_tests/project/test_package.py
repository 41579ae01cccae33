"""Package-level behaviour: one version number, a clear warning without the compiled kernels."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import factkernels

# Imports factkernels with factkernels._C made unimportable, as in a source checkout without a build.
_WITHOUT_EXTENSION = """
import importlib.abc, sys, warnings
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "factkernels._C":
            raise ImportError("blocked")
sys.meta_path.insert(0, Block())
warnings.simplefilter("always")
import factkernels, factkernels.cli, factkernels._ops as ops
import torch
x = torch.randn(4, 3)
assert not ops.HAS_EXTENSION and ops.decode(x, x)[0].shape == (4,)
"""


def test_one_version_number():
    assert importlib.metadata.version("factkernels") == factkernels.__version__


def test_missing_extension_warns_once_with_the_fix():
    env = dict(os.environ, PYTHONWARNINGS="always")
    done = subprocess.run([sys.executable, "-c", _WITHOUT_EXTENSION], capture_output=True, text=True, env=env,
                          cwd=Path(factkernels.__file__).resolve().parent.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("has no compiled _C") == 1, done.stderr
    assert "pip install --no-build-isolation -e ." in done.stderr


def test_results_record_the_commit_of_the_code_that_made_them(tmp_path):
    import shutil

    from factkernels.environment import code_version, environment

    assert environment()["code"] == code_version()
    assert code_version(tmp_path) == "unknown"  # an installed copy outside a checkout
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "a.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "a"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert code_version(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == head + "+dirty"
