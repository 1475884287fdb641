"""No import cycles inside ``vllm_ascend``: the module graph is read from the AST of every package.

Every ``import vllm_ascend.x`` / ``from vllm_ascend.x import y`` counts, at module level or inside a
function, except under ``if TYPE_CHECKING:``; so do ``importlib.import_module("vllm_ascend.x")`` and
``__import__("vllm_ascend.x")`` with a literal name. ``from pkg import name`` is an edge to the submodule
``pkg.name`` when that file exists, else to ``pkg`` (a package is its ``__init__.py``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "vllm_ascend"


def module_files(src_dirs: Iterable[Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``<src>/vllm_ascend/`` of each source dir."""
    found: dict[str, Path] = {}
    for src in src_dirs:
        for path in sorted((src / NAMESPACE).rglob("*.py")):
            parts = path.relative_to(src).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _dynamic_import(node: ast.AST) -> str | None:
    """The literal module name of an ``import_module("...")`` / ``__import__("...")`` call."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    value = node.args[0].value
    return value if name in {"import_module", "__import__"} and isinstance(value, str) else None


def _import_nodes(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom | ast.Call]:
    """Every import statement or literal dynamic import under ``node``, skipping ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        elif isinstance(child, ast.Call) and _dynamic_import(child) is not None:
            yield child
            yield from _import_nodes(child)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _import_nodes(ast.Module(body=[other], type_ignores=[]))
        else:
            yield from _import_nodes(child)


def _existing(name: str, modules: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is a module of the graph."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            names = [_dynamic_import(node) or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            names = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                for alias in node.names
            ]
        for name in names:
            if name == NAMESPACE or name.startswith(NAMESPACE + "."):
                target = _existing(name, modules)
                if target is not None and target != module:
                    targets.add(target)
    return targets


def import_graph(src_dirs: Iterable[Path]) -> dict[str, set[str]]:
    """Module -> the ``vllm_ascend`` modules it imports at run time."""
    modules = module_files(src_dirs)
    return {module: _targets(module, path, modules) for module, path in modules.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module (each one an import cycle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def import_cycles(packages_dir: Path) -> list[list[str]]:
    return strongly_connected(import_graph(sorted(packages_dir.glob("*/src"))))


def _all_sources() -> list[Path]:
    """The published packages' source roots and the dev-only members' (``dev/*/src``)."""
    return sorted((ROOT / "packages").glob("*/src")) + sorted((ROOT / "dev").glob("*/src"))


def test_no_import_cycles_in_any_package():
    cycles = strongly_connected(import_graph(_all_sources()))
    assert cycles == [], "import cycles (each line one strongly connected set of modules):\n" + "\n".join(
        "  " + " <-> ".join(cycle) for cycle in cycles
    )


def test_the_graph_covers_every_package():
    graph = import_graph(_all_sources())
    leaves = {p.parent.name for src in _all_sources() for p in src.glob("vllm_ascend/*/__init__.py")}
    assert leaves and {f"{NAMESPACE}.{leaf}" for leaf in leaves} <= set(graph)
    assert f"{NAMESPACE}.testing" in graph


def test_no_published_package_imports_a_dev_member():
    """Published wheels (packages/*) never import a dev-only member's modules (dev/*: test oracles, tiny-model
    builders), so `vllm-ascend demo` and everything else runs from the published wheels alone."""
    graph = import_graph(_all_sources())
    dev_modules = set(import_graph(sorted((ROOT / "dev").glob("*/src"))))
    published = set(import_graph(sorted((ROOT / "packages").glob("*/src"))))
    assert dev_modules and published and not dev_modules & published
    offenders = {
        module: sorted(graph[module] & dev_modules) for module in published if graph[module] & dev_modules
    }
    assert offenders == {}
    # The dev member builds on the runner's demo builder rather than copying it.
    assert f"{NAMESPACE}.runner.demo_model" in graph[f"{NAMESPACE}.testing.tiny_models"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    packages = tmp_path / "packages"
    for rel, text in files.items():
        path = packages / "ascend-demo" / "src" / NAMESPACE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return packages


def test_a_tree_without_cycles_passes(tmp_path):
    packages = _tree(
        tmp_path,
        {
            "demo/__init__.py": "",
            "demo/a.py": "from vllm_ascend.demo import b\nimport vllm_ascend.demo.sub.c\n",
            "demo/b.py": "import os\n",
            "demo/sub/__init__.py": "",
            "demo/sub/c.py": "from vllm_ascend.demo.b import helper\n",
        },
    )
    graph = import_graph([packages / "ascend-demo" / "src"])
    assert graph["vllm_ascend.demo.a"] == {"vllm_ascend.demo.b", "vllm_ascend.demo.sub.c"}
    assert graph["vllm_ascend.demo.sub.c"] == {"vllm_ascend.demo.b"}
    assert import_cycles(packages) == []


def test_a_cycle_through_a_function_level_import_fails(tmp_path):
    packages = _tree(
        tmp_path,
        {
            "demo/__init__.py": "",
            "demo/a.py": "from vllm_ascend.demo.b import g\n",
            "demo/b.py": "def g():\n    from vllm_ascend.demo import a\n    return a\n",
            "demo/c.py": "import vllm_ascend.demo.a\n",
        },
    )
    assert import_cycles(packages) == [["vllm_ascend.demo.a", "vllm_ascend.demo.b"]]


def test_literal_dynamic_imports_are_edges(tmp_path):
    packages = _tree(
        tmp_path,
        {
            "demo/__init__.py": "",
            "demo/a.py": "import importlib\n\ndef f():\n    return importlib.import_module('vllm_ascend.demo.b')\n",
            "demo/b.py": "def g(name):\n    __import__('vllm_ascend.demo.a', fromlist=['f'])\n    __import__(name)\n",
        },
    )
    assert import_cycles(packages) == [["vllm_ascend.demo.a", "vllm_ascend.demo.b"]]


def test_a_submodule_importing_its_package_init_is_an_edge(tmp_path):
    packages = _tree(
        tmp_path,
        {
            "demo/__init__.py": "from vllm_ascend.demo.impl import run\n",
            "demo/impl.py": "from vllm_ascend.demo import SETTING\n",
            "other/__init__.py": "from . import tool\n",
            "other/tool.py": "from .. import other\n",
        },
    )
    assert import_cycles(packages) == [
        ["vllm_ascend.demo", "vllm_ascend.demo.impl"],
        ["vllm_ascend.other", "vllm_ascend.other.tool"],
    ]


def test_type_checking_imports_are_not_edges(tmp_path):
    packages = _tree(
        tmp_path,
        {
            "demo/__init__.py": "",
            "demo/a.py": "from vllm_ascend.demo import b\n",
            "demo/b.py": (
                "import typing\n"
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from vllm_ascend.demo.a import A\n"
                "if typing.TYPE_CHECKING:\n    import vllm_ascend.demo.a\n"
                "else:\n    import json\n"
            ),
        },
    )
    assert import_cycles(packages) == []
    packages = _tree(tmp_path, {"demo/b.py": "if not TYPE_CHECKING:\n    from vllm_ascend.demo import a\n"})
    assert import_cycles(packages) == [["vllm_ascend.demo.a", "vllm_ascend.demo.b"]]
