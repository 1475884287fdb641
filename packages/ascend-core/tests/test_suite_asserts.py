"""Every test in core's suite checks behaviour: no empty tests, no test without an assertion."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
FILES = sorted(TESTS.glob("test_*.py"))
CHECKS = {"raises", "fail", "warns"}


def _checks_directly(node: ast.AST) -> bool:
    """An ``assert``, a ``pytest.raises/warns/fail`` or an ``assert_*`` call (``torch.testing.assert_close``)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Assert):
            return True
        if isinstance(child, ast.Call):
            func = child.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in CHECKS or name.startswith("assert_"):
                return True
    return False


def _called_names(node: ast.AST) -> set[str]:
    return {
        child.func.id
        for child in ast.walk(node)
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Name)
    }


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    """Every function of the module, nested ones included, by name."""
    return {node.name: node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}


def _asserts(name: str, functions: dict[str, ast.FunctionDef], seen: set[str]) -> bool:
    """Whether function ``name`` checks something itself or through a helper of the module it calls."""
    if name in seen or name not in functions:
        return False
    seen.add(name)
    node = functions[name]
    if _checks_directly(node):
        return True
    return any(_asserts(callee, functions, seen) for callee in _called_names(node))


def _is_empty(node: ast.FunctionDef) -> bool:
    body = [
        stmt
        for stmt in node.body
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))  # docstring or ...
    ]
    return not body or all(isinstance(stmt, ast.Pass) for stmt in body)


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_every_test_function_asserts_behaviour(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = _functions(tree)
    tests = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]
    assert tests, f"{path.name} has no test functions"
    empty = [node.name for node in tests if _is_empty(node)]
    assert not empty, f"{path.name}: empty tests {empty}"
    silent = [node.name for node in tests if not _asserts(node.name, functions, set())]
    assert not silent, f"{path.name}: tests that assert nothing {silent}"


def test_the_checker_catches_empty_and_silent_tests():
    source = (
        "def helper(x):\n    assert x\n"
        "def test_empty():\n    '''doc'''\n    pass\n"
        "def test_silent():\n    print(1)\n"
        "def test_via_helper():\n    helper(1)\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
    )
    tree = ast.parse(source)
    functions = _functions(tree)
    assert [n for n in ("test_empty", "test_silent") if _is_empty(functions[n])] == ["test_empty"]
    verdicts = {name: _asserts(name, functions, set()) for name in functions if name.startswith("test_")}
    assert verdicts == {
        "test_empty": False,
        "test_silent": False,
        "test_via_helper": True,
        "test_raises": True,
    }


def test_the_suite_covers_every_core_module():
    """Each core module is imported by at least one test file (directly or as a package export)."""
    src = TESTS.parent / "src" / "vllm_ascend" / "core"
    modules = {
        ".".join(p.relative_to(src.parent.parent).with_suffix("").parts)
        for p in src.rglob("*.py")
        if p.name != "__init__.py"
    }
    text = "\n".join(p.read_text() for p in FILES)
    untested = sorted(m for m in modules if m not in text and m.rsplit(".", 1)[-1] not in text)
    assert not untested, f"core modules no test imports: {untested}"
