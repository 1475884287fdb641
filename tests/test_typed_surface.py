"""Lazy public names are typed: beside each ``lazy_exports`` table, ``if TYPE_CHECKING:`` imports every name.

``lazy_exports`` gives the package a module ``__getattr__``, so without those imports a type checker
sees every public name as ``Any`` and accepts any call.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INITS = sorted(ROOT.glob("packages/*/src/vllm_ascend/**/__init__.py"))


def lazy_table(tree: ast.Module) -> dict[str, str] | None:
    """``name -> module`` of the dict passed to ``lazy_exports(__name__, <table>, globals())``, if any."""
    call = next(
        (
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "lazy_exports"
        ),
        None,
    )
    if call is None:
        return None
    table = call.args[1]
    if isinstance(table, ast.Name):
        assigned = {
            target.id: node.value
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
        table = assigned[table.id]
    assert isinstance(table, ast.Dict), "the lazy export table must be a dict literal"
    return {
        ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(table.keys, table.values, strict=True) if k
    }


def type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """Bound name -> source module of every ``from m import n`` under a module-level ``if TYPE_CHECKING:``."""
    found: dict[str, str] = {}
    for node in tree.body:
        if not isinstance(node, ast.If):
            continue
        test = node.test
        if not (
            (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        ):
            continue
        for stmt in node.body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                for alias in stmt.names:
                    found[alias.asname or alias.name] = stmt.module
    return found


def missing_typed_imports(source: str) -> list[str]:
    tree = ast.parse(source)
    table = lazy_table(tree)
    if table is None:
        return []
    typed = type_checking_imports(tree)
    return sorted(f"{name} (from {module})" for name, module in table.items() if typed.get(name) != module)


@pytest.mark.parametrize(
    "init", INITS, ids=[".".join(p.parent.parts[p.parts.index("src") + 1 :]) for p in INITS]
)
def test_every_lazy_export_is_imported_for_type_checkers(init):
    missing = missing_typed_imports(init.read_text())
    assert missing == [], (
        f"{init.relative_to(ROOT)}: add under `if TYPE_CHECKING:` an import of {', '.join(missing)}"
    )


def test_the_check_sees_a_missing_or_misplaced_import():
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from vllm_ascend.core.lazy import lazy_exports
        from vllm_ascend.demo.b import g
        if TYPE_CHECKING:
            from vllm_ascend.demo.a import f as f
            from vllm_ascend.demo.a import h
        _LAZY = {"f": "vllm_ascend.demo.a", "g": "vllm_ascend.demo.b", "h": "vllm_ascend.demo.c"}
        __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
        """
    )
    assert missing_typed_imports(source) == ["g (from vllm_ascend.demo.b)", "h (from vllm_ascend.demo.c)"]
    assert missing_typed_imports("X = 1\n") == []


def test_mypy_sees_the_real_signature_of_a_lazy_export(tmp_path):
    program = textwrap.dedent(
        """
        import torch
        from vllm_ascend import kernels
        kernels.apply_temperature(torch.zeros(1, 4), torch.ones(1))
        kernels.apply_temperature(1, 2, 3, 4)
        """
    ).lstrip()
    env = {**os.environ, "MYPYPATH": os.pathsep.join(str(p) for p in sorted(ROOT.glob("packages/*/src")))}
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "-c", program],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    errors = [line for line in proc.stdout.splitlines() if line.startswith("<string>:")]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert errors == ['<string>:4: error: Too many arguments for "apply_temperature"  [call-arg]'], (
        proc.stdout
    )
