"""The wheel holds the whole package: every module and data file of ``sim/``.

A subpackage or data file left out of pyproject.toml's setuptools tables shows only once
trainsim is installed from a wheel: the source tree and an editable install find
everything. This test builds the wheel from a copy of the tree (so no stale ``build/``
leaks in) and compares its files with the tree's, and reads setuptools' output for
warnings. ``make test``'s wheel-check goes on from there: it installs the wheel into a
fresh virtual environment, imports every module and runs a simulation from it.
"""

import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _source_files() -> set[str]:
    """Every file of the package as the tree has it (sim/topologies is a link to topologies/)."""
    pkg = ROOT / "sim"
    return {f"sim/{p.relative_to(pkg).as_posix()}" for p in pkg.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"} | {
        f"sim/topologies/{p.name}" for p in (ROOT / "topologies").iterdir() if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(wheel path, the build's output) for a wheel built from a copy of the tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for d in ("sim", "topologies"):
        shutil.copytree(ROOT / d, src / d, symlinks=True, ignore=skip)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    # setuptools from this environment when it is new enough (no download), else pip's
    # isolated build fetches the version pyproject.toml asks for
    isolation = ["--no-build-isolation"] if int(version("setuptools").split(".")[0]) >= 77 else []
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", *isolation,
                           "-w", str(tmp / "dist"), str(src)], capture_output=True, text=True, cwd=tmp)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = (tmp / "dist").glob("trainsim-*.whl")
    return wheel, proc.stdout + proc.stderr


def test_the_wheel_holds_every_module_and_data_file(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        names = {n for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")}
    source = _source_files()
    # the modules and the data: hardware profiles, built-in topologies, goodput presets
    assert sorted(source - names) == []
    assert sorted(names - source) == []
    assert {"sim/program/memory/__init__.py", "sim/profiles/h100-sxm.json", "sim/topologies/dgx-h100.toml",
            "sim/studies/goodput/presets/llama3.toml"} <= names


def test_the_wheel_declares_its_command_and_dependencies(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        info = {Path(n).name: z.read(n).decode() for n in z.namelist() if ".dist-info/" in n}
    assert "trainsim = sim.cli:main" in info["entry_points.txt"]
    requires = re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)(.*)$", info["METADATA"], re.M)
    core = {name for name, rest in requires if "extra ==" not in rest}
    assert core == {"simpy", "numpy", "networkx", "matplotlib", "scipy", "pydantic"}


def test_setuptools_builds_the_wheel_without_warnings(built):
    _, output = built
    # setuptools' warnings are Python warning classes (BuildBackendWarning,
    # SetuptoolsDeprecationWarning, ...); pip's own notes about the local indexes are not
    warnings = [line.strip() for line in output.splitlines() if re.search(r"[a-z]Warning\b", line)]
    assert warnings == []
