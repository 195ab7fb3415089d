"""setup.py / pyproject.toml: `pip install -e .` must build against the installed torch, with or
without pip's build isolation, and never make pip fetch a torch. These run setup.py's cheap paths
(metadata, errors); a full `pip install -e .` compiles for minutes and is checked by hand."""
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import torch

import redet_plugin

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_pyproject_build_requires_name_no_torch():
    build = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
    assert build["build-backend"] == "setuptools.build_meta"
    assert not [r for r in build["requires"] if r.split("=")[0].split("<")[0].split(">")[0]
                .strip().lower() == "torch"]


def test_setup_finds_the_environments_torch_under_pip_build_isolation(tmp_path):
    """pip's isolated build drops the environment's site-packages from sys.path (its own
    setuptools stays importable); setup.py must still find this environment's torch."""
    code = textwrap.dedent(f"""
        import runpy, site, sys
        import setuptools  # pip's isolated environment has its own
        hidden = set(site.getsitepackages() + [site.getusersitepackages()])
        sys.path[:] = [p for p in sys.path if p not in hidden]
        sys.argv = ['setup.py', '-q', 'egg_info', '--egg-base', {str(tmp_path)!r}]
        runpy.run_path('setup.py', run_name='__main__')
    """)
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"redet_plugin: compiling against torch {torch.__version__} from" in result.stderr
    sections, name = {}, ""
    for line in (tmp_path / "redet_plugin.egg-info" / "requires.txt").read_text().splitlines():
        if line.startswith("["):
            name = line.strip("[]")
        elif line:
            sections.setdefault(name, []).append(line)
    # pinned to the torch it compiles against: the installed one satisfies it, pip fetches none
    assert sections.pop("") == [f"torch=={torch.__version__.split('+')[0]}"]
    assert set(sections) == {"mm", "mim", "tests"}
    assert "mmdet<3.4.0,>=3.3.0" in sections["mm"] and "e2cnn>=0.2.3" in sections["mm"]
    assert not [r for r in sum(sections.values(), []) if r.startswith("torch")]
    assert sections["mim"] == ["mmcv<2.2.0,>=2.1.0"]  # apart: PyPI's mmcv source has no ops
    # the version is written once, in redet_plugin/version.py
    metadata = (tmp_path / "redet_plugin.egg-info" / "PKG-INFO").read_text().splitlines()
    assert f"Version: {redet_plugin.__version__}" in metadata


def test_setup_without_any_torch_says_what_to_do(tmp_path):
    fake = tmp_path / "no_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no torch in this environment')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), str(REPO)]))
    result = _run("import runpy, sys; sys.argv = ['setup.py', '--version']; "
                  "runpy.run_path('setup.py', run_name='__main__')", env=env)
    assert result.returncode != 0
    assert "compiles against an installed torch, and none was found" in result.stderr
    assert "install torch first (the CPU or CUDA build you want), then run `pip install -e .` " \
           "again" in result.stderr
