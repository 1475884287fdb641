"""Shared code never branches on a device family (DESIGN.md, "Device families"): every difference is profile
data or an adaptor op. Outside the places that define families — core's device layer (profiles, family
parsing, detection), the family adaptors (ascend-kernels' device package), core's environment variables and
the 310P sibling (that family's own overlay) — no code names a family: no family string constant and no ``AscendDeviceType`` /
``DeviceAdaptorFamily`` member."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Lower-cased family names and SoC spellings.
FAMILY_TOKENS = frozenset({"a2", "a3", "a5", "310p", "910b", "910_93", "950", "ascend910b", "ascend950"})
FAMILY_ENUMS = frozenset({"AscendDeviceType", "DeviceAdaptorFamily"})
#: Where families are defined (relative to ``packages/``).
DEFINING = (
    "ascend-310p/",
    "ascend-core/src/vllm_ascend/core/device/",
    "ascend-core/src/vllm_ascend/core/envs.py",
    "ascend-kernels/src/vllm_ascend/kernels/device/",
    "ascend-kernels/src/vllm_ascend/kernels/_extension.py",
)


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def family_names_in(source: str) -> list[str]:
    """``line: what`` for every family named in ``source``'s code (docstrings and f-string text aside)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values if isinstance(v, ast.Constant))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value.strip().lower() in FAMILY_TOKENS:
                found.append(f"{node.lineno}: {node.value!r}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in FAMILY_ENUMS
        ):
            if not node.attr.startswith("__") and node.attr not in {"parse"}:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def _shared_sources() -> list[Path]:
    return [
        path
        for path in sorted((ROOT / "packages").glob("*/src/vllm_ascend/**/*.py"))
        if not path.relative_to(ROOT / "packages").as_posix().startswith(DEFINING)
    ]


def test_no_family_is_named_in_shared_code():
    offenders = {
        path.relative_to(ROOT).as_posix(): names
        for path in _shared_sources()
        if (names := family_names_in(path.read_text()))
    }
    assert offenders == {}


def test_the_scan_finds_what_it_forbids():
    source = 'def f(p):\n    """On a2."""\n    if p.family == "310p":\n        return AscendDeviceType.A2\n    return f"{p} on A3"\n'
    assert family_names_in(source) == ["3: '310p'", "4: AscendDeviceType.A2"]
    assert len(_shared_sources()) > 100
