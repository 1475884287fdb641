"""Core's one surface for siblings (DESIGN.md, "The core surface"): sibling distributions import from
``vllm_ascend.core.sdk`` only, everything else in core is private to core; the surface resolves every
name it lists, agrees with its type-checking imports and costs nothing to import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SURFACE = "vllm_ascend.core.sdk"


def core_imports_of(source: str) -> list[str]:
    """``line: module`` for every import of a ``vllm_ascend.core`` module other than the surface."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        modules: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
            if node.module == "vllm_ascend.core":
                modules = [f"vllm_ascend.core.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        for module in modules:
            if (module == "vllm_ascend.core" or module.startswith("vllm_ascend.core.")) and module != SURFACE:
                found.append((node.lineno, module))
    return [f"{line}: {module}" for line, module in sorted(found)]


def _sibling_sources() -> list[Path]:
    """Every module outside core: the siblings' and the dev-only members' (``dev/*``: test oracles, builders)."""
    return [
        path
        for top in ("packages", "dev")
        for path in sorted((ROOT / top).glob("*/src/vllm_ascend/**/*.py"))
        if not path.relative_to(ROOT).as_posix().startswith("packages/ascend-core/")
    ]


def test_siblings_import_core_through_its_surface_only():
    offenders = {
        path.relative_to(ROOT).as_posix(): found
        for path in _sibling_sources()
        if (found := core_imports_of(path.read_text()))
    }
    assert offenders == {}


def test_the_scan_finds_private_imports():
    source = (
        "from vllm_ascend.core.sdk import init_logger\n"
        "from vllm_ascend.core import envs\n"
        "def f():\n    from vllm_ascend.core.device.config import get_device_adaptor\n"
        "import vllm_ascend.core.registry\n"
    )
    assert core_imports_of(source) == [
        "2: vllm_ascend.core.envs",
        "4: vllm_ascend.core.device.config",
        "5: vllm_ascend.core.registry",
    ]
    assert len(_sibling_sources()) > 100
    assert any(path.relative_to(ROOT).parts[0] == "dev" for path in _sibling_sources())


def test_every_surface_name_resolves_and_is_typed():
    from vllm_ascend.core import sdk

    tree = ast.parse(Path(sdk.__file__).read_text())
    typed = {
        alias.asname: node.module
        for guard in tree.body
        if isinstance(guard, ast.If)
        for node in guard.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == sdk._EXPORTS
    for name, module in sdk._EXPORTS.items():
        assert getattr(sdk, name) is getattr(__import__(module, fromlist=[name]), name), name
    assert set(sdk.__all__) == {"envs", "lazy_exports", *sdk._EXPORTS}


def test_importing_the_surface_loads_neither_torch_nor_vllm():
    code = "import sys, vllm_ascend.core.sdk; print(sorted({'torch', 'vllm'} & set(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stderr
