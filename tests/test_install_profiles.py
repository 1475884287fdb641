"""Selective installs from built wheels, each in a fresh venv.

Third-party dependencies (torch, numpy, scipy, ...) are installed once into a base venv from
uv's cache; each profile venv sees them through a ``.pth`` file, and pip installs only our
wheels (``--no-index``), so pip's real resolver decides which of our distributions an install
line pulls in, without reinstalling torch per profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: packages/<dir> -> (its [project] table, its import package); nothing here lists the siblings by hand.
_PACKAGES = {
    pkg.name: (
        tomllib.loads((pkg / "pyproject.toml").read_text())["project"],
        "vllm_ascend." + next(i.parent.name for i in (pkg / "src/vllm_ascend").glob("*/__init__.py")),
    )
    for pkg in sorted(p for p in (ROOT / "packages").iterdir() if p.is_dir())
}
SIBLINGS = {project["name"]: leaf for project, leaf in _PACKAGES.values()}
#: Distribution -> the core extension it declares (siblings without a descriptor are absent).
EXTENSION_NAMES = {
    project["name"]: name
    for project, _ in _PACKAGES.values()
    for name in project.get("entry-points", {}).get("vllm_ascend.extensions", {})
}
#: dev/<dir> -> its distribution: development-only members (test oracles, tiny-model builders). `uv build
#: --all-packages` builds their wheels too; they lie beside the published ones, and no profile may pull them in.
DEV_DISTS = {
    member.name: tomllib.loads((member / "pyproject.toml").read_text())["project"]["name"]
    for member in sorted(p for p in (ROOT / "dev").iterdir() if p.is_dir())
}
DEFAULT = {
    "vllm-ascend",
    *(
        re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0]
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    ),
}

PROBE = r"""
import importlib, json, sys
from importlib import metadata
leaves = %r
dists = sorted({d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("vllm-ascend")})
importable = {}
for dist, leaf in leaves.items():
    try:
        importlib.import_module(leaf)
        importable[leaf] = True
    except ImportError:
        importable[leaf] = False
eps = {g: sorted(ep.name for ep in metadata.entry_points(group=g))
       for g in ("vllm.platform_plugins", "vllm.general_plugins", "vllm_ascend.extensions")}
from vllm_ascend.core.extensions import load_extensions
status = {name: rec.status.value + (":" + rec.reason if rec.reason else "") for name, rec in load_extensions().items()}
print(json.dumps({"dists": dists, "importable": importable, "entry_points": eps, "status": status}))
"""


def _uv() -> str:
    found = shutil.which("uv")
    assert found, "uv must be on PATH (.ci/run installs it)"
    return found


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **kw)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    _run([_uv(), "build", "--all-packages", "--wheel", "-o", str(out), str(ROOT)], cwd=ROOT)
    return out


@pytest.fixture(scope="session")
def base_site(tmp_path_factory) -> Path:
    """A venv holding only the third-party runtime dependencies of every package (from the lock)."""
    base = tmp_path_factory.mktemp("base") / "venv"
    reqs = base.parent / "requirements.txt"
    exported = _run(
        [_uv(), "export", "--all-packages", "--no-dev", "--no-emit-workspace", "--no-hashes", "--frozen"],
        cwd=ROOT,
    ).stdout
    # the `all` profile brings the kvtransfer sibling with its `tcp` extra (Mooncake's TCP/RDMA build)
    mooncake = _run(
        [_uv(), "export", "--package", "vllm-ascend-kvtransfer", "--extra", "tcp", "--no-dev", "--no-emit-workspace",
         "--no-hashes", "--frozen"],
        cwd=ROOT,
    ).stdout  # fmt: skip
    reqs.write_text(exported + mooncake)
    _run([_uv(), "venv", "-q", "--python", sys.executable, str(base)])
    find_links = os.environ.get("PIP_FIND_LINKS", "/opt/wheels")
    _run(
        [
            _uv(),
            "pip",
            "install",
            "-q",
            "--python",
            str(base / "bin" / "python"),
            "--find-links",
            find_links,
            "-r",
            str(reqs),
        ],
        cwd=base.parent,
    )
    site = next((base / "lib").glob("python3.*/site-packages"))
    return site


def install_profile(tmp_path: Path, wheels: Path, base_site: Path, requirement: str) -> dict:
    venv = tmp_path / "venv"
    _run([_uv(), "venv", "-q", "--seed", "--python", sys.executable, str(venv)])
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "zz_base_deps.pth").write_text(str(base_site) + "\n")
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VLLM_ASCEND_", "VIRTUAL_ENV"))}
    _run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wheels), requirement], env=env)
    probe = _run([py, "-c", PROBE % SIBLINGS], env=env, cwd=tmp_path)
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    report["doctor"] = subprocess.run(
        [str(venv / "bin" / "vllm-ascend"), "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    return report


def check(report: dict, expected: set[str]) -> None:
    assert set(report["dists"]) == expected
    for dist, leaf in SIBLINGS.items():
        assert report["importable"][leaf] is (dist in expected), leaf
    assert report["entry_points"]["vllm.platform_plugins"] == (
        ["ascend"] if "vllm-ascend-core" in expected else []
    )
    assert report["entry_points"]["vllm.general_plugins"] == (
        ["ascend"] if "vllm-ascend-core" in expected else []
    )
    extensions = sorted(EXTENSION_NAMES[d] for d in expected if d in EXTENSION_NAMES)
    assert report["entry_points"]["vllm_ascend.extensions"] == extensions
    assert report["status"] == {name: "loaded" for name in extensions}
    doctor = report["doctor"]
    assert doctor.returncode == 0, doctor.stderr
    listed = sorted(ext["name"] for ext in json.loads(doctor.stdout)["extensions"])
    assert listed == extensions


def _wheel_metadata(whl: Path) -> str:
    with zipfile.ZipFile(whl) as z:
        return z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def test_dev_wheels_are_private_and_ship_only_their_leaf(wheels):
    """A dev member's wheel is marked never to be uploaded and holds only its own leaf (the oracles)."""
    dev_wheels = {
        whl: dist
        for whl in wheels.glob("*.whl")
        for dist in DEV_DISTS.values()
        if whl.name.startswith(dist.replace("-", "_") + "-")
    }
    assert sorted(dev_wheels.values()) == sorted(DEV_DISTS.values())
    for whl, dist in dev_wheels.items():
        assert "Classifier: Private :: Do Not Upload" in _wheel_metadata(whl), whl.name
        leaves = {
            n.split("/")[1]
            for n in zipfile.ZipFile(whl).namelist()
            if n.startswith("vllm_ascend/") and n.count("/") >= 2
        }
        assert leaves == {dist.removeprefix("vllm-ascend-")}, whl.name
    for whl in set(wheels.glob("*.whl")) - set(dev_wheels):
        metadata = _wheel_metadata(whl)
        assert not [line for line in metadata.splitlines() if line.startswith("Classifier: Private ::")], (
            whl.name
        )
        assert not [
            line
            for line in metadata.splitlines()
            if line.startswith("Requires-Dist:") and any(d in line for d in DEV_DISTS.values())
        ], whl.name


def test_no_wheel_contains_the_namespace_init(wheels):
    built = sorted(wheels.glob("*.whl"))
    assert len(built) == len(SIBLINGS) + 1 + len(DEV_DISTS)
    tops: dict[str, set[str]] = {}
    for whl in built:
        if any(whl.name.startswith(dist.replace("-", "_") + "-") for dist in DEV_DISTS.values()):
            continue
        names = zipfile.ZipFile(whl).namelist()
        assert "vllm_ascend/__init__.py" not in names, whl.name
        assert whl.name.endswith("-py3-none-any.whl"), whl.name
        leaves = {n.split("/")[1] for n in names if n.startswith("vllm_ascend/") and n.count("/") >= 2}
        tops[whl.name] = leaves
    meta = next(name for name in tops if name.startswith("vllm_ascend-0"))
    assert tops.pop(meta) == set(), "the meta distribution must carry no code"
    all_leaves = [leaf for leaves in tops.values() for leaf in leaves]
    assert len(all_leaves) == len(set(all_leaves)) == len(SIBLINGS), tops


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        ("vllm-ascend", DEFAULT),
        ("vllm-ascend[quant,eplb]", DEFAULT | {"vllm-ascend-quant", "vllm-ascend-eplb"}),
        ("vllm-ascend[kvtransfer]", DEFAULT | {"vllm-ascend-kvtransfer"}),
        ("vllm-ascend[all]", {"vllm-ascend", *SIBLINGS}),
        ("vllm-ascend-core", {"vllm-ascend-core"}),
    ],
    ids=["default", "quant-eplb", "kvtransfer", "all", "core-alone"],
)
def test_install_profile(tmp_path, wheels, base_site, requirement, expected):
    report = install_profile(tmp_path, wheels, base_site, requirement)
    assert set(report["dists"]) == expected
    check(report, expected)


DEMO_MODEL_PROBE = r"""
import importlib.util, json, sys
from pathlib import Path
from vllm_ascend.runner import demo
from vllm_ascend.runner.demo_model import MODEL_BUILDERS, build_tiny_model, qwen3_spec
model_dir = build_tiny_model(qwen3_spec(), Path(sys.argv[1]))
print(json.dumps({
    "testing": importlib.util.find_spec("vllm_ascend.testing") is not None,
    "kinds": sorted(MODEL_BUILDERS),
    "files": sorted(p.name for p in model_dir.iterdir()),
    "loaded": sorted(m for m in sys.modules if m.startswith("vllm_ascend.")),
}))
"""


def test_demo_model_builds_from_the_published_wheels(tmp_path, wheels, base_site):
    """The default install (published wheels only; the dev wheels lie beside them) builds the model `vllm-ascend
    demo` serves, without the dev-only oracles: no `vllm_ascend.testing` installed, none imported."""
    report = install_profile(tmp_path, wheels, base_site, "vllm-ascend")
    assert set(report["dists"]) == DEFAULT
    py = str(tmp_path / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VLLM_ASCEND_", "VIRTUAL_ENV"))}
    probe = _run([py, "-c", DEMO_MODEL_PROBE, str(tmp_path / "models")], env=env, cwd=tmp_path)
    built = json.loads(probe.stdout.strip().splitlines()[-1])
    assert built["testing"] is False
    assert built["kinds"] == ["llama", "qwen3"]
    assert {"complete", "config.json", "model.safetensors", "tokenizer.json"} <= set(built["files"])
    assert not [m for m in built["loaded"] if m.startswith("vllm_ascend.testing")]
