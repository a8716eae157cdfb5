"""The compiled extensions are what rtindex runs, unless RTINDEX_PURE_PYTHON=1 asks otherwise;
without them, the ImportError says why (a shadowing source tree, most often) and what to do."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import site
import subprocess
import sys

import pytest

from rtindex import _impl


def test_implementation():
    if os.environ.get("RTINDEX_PURE_PYTHON") == "1":
        assert _impl.IMPLEMENTATION == "python"
        assert _impl.SegmentBuilder.__module__ == "rtindex._py.segment"
    else:
        assert _impl.IMPLEMENTATION == "cython"
        assert _impl.SegmentBuilder.__module__ == "rtindex._ext._segment"


ROOT = pathlib.Path(__file__).resolve().parents[1]


def _checkout(tmp_path, *, marked: bool = True) -> pathlib.Path:
    """A copy of the source tree's package with nothing compiled, as a checkout has it;
    ``marked``: with the pyproject.toml that makes it recognisably a checkout."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "rtindex", checkout / "rtindex", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    if marked:
        shutil.copy(ROOT / "pyproject.toml", checkout)
    return checkout


def _import_in(cwd: pathlib.Path, *flags: str, **env: str) -> str:
    """``python -c "import rtindex"`` in ``cwd`` (which puts ``cwd`` first on the path, as
    running from a checkout does): its stderr, after checking that it failed."""
    base = {k: v for k, v in os.environ.items() if k not in ("RTINDEX_PURE_PYTHON", "PYTHONPATH")}
    out = subprocess.run([sys.executable, *flags, "-c", "import rtindex"], cwd=cwd, capture_output=True,
                         text=True, timeout=120, env={**base, **env})
    assert out.returncode == 1, out
    assert "No module named 'rtindex._ext._" in out.stderr  # the cause is kept
    return out.stderr


def test_a_source_tree_shadowing_an_installed_package_says_so(tmp_path):
    """The README's case: `pip install .`, then Python in the checkout. The installed copy is
    found on sys.path (here, a copy of the package with its extensions, in a site directory)."""
    installed = tmp_path / "site" / "rtindex"
    shutil.copytree(ROOT / "rtindex", installed, ignore=shutil.ignore_patterns("__pycache__"))
    checkout = _checkout(tmp_path)
    err = _import_in(checkout, "-S", PYTHONPATH=os.pathsep.join([str(installed.parent), *site.getsitepackages()]))
    assert f"ImportError: you are importing the source tree at {checkout.resolve() / 'rtindex'}, which shadows " \
           f"the installed rtindex at {installed.resolve()}: run from another directory, or `pip install -e .` " \
           f"in {checkout.resolve()} " in err, err


def test_a_source_tree_shadowing_an_editable_install_says_so(tmp_path):
    """The installed copy is found by an import hook (an editable install's), not on sys.path."""
    checkout = _checkout(tmp_path)
    err = _import_in(checkout)
    m = re.search(r"ImportError: you are importing the source tree at (\S+), which shadows the installed "
                  r"rtindex at (\S+): run from another directory, or `pip install -e \.` in (\S+) ", err)
    assert m, err
    assert m[1] == str(checkout.resolve() / "rtindex") and m[3] == str(checkout.resolve())
    assert (pathlib.Path(m[2]) / "_impl.py").is_file() and m[2] != m[1]


def test_a_source_tree_with_no_other_copy_says_to_build_it(tmp_path):
    site_dirs = site.getsitepackages()
    if any((pathlib.Path(d) / "rtindex").exists() for d in site_dirs):
        pytest.skip("rtindex is installed into site-packages here: no way to run without it")
    # -S: no .pth files, so no editable-install hook; the dependencies come from PYTHONPATH
    err = _import_in(_checkout(tmp_path), "-S", PYTHONPATH=os.pathsep.join(site_dirs))
    assert f"you are importing the source tree at {tmp_path.resolve() / 'checkout' / 'rtindex'}, whose compiled " \
           f"extensions are not built: run `pip install -e .` in {tmp_path.resolve() / 'checkout'}" in err, err


def test_an_installed_copy_without_extensions_says_to_reinstall(tmp_path):
    checkout = _checkout(tmp_path, marked=False)
    err = _import_in(checkout)
    assert f"rtindex's compiled extensions are missing from {checkout.resolve() / 'rtindex'}: reinstall with " \
           f"`pip install .`" in err, err
