"""Every registry in core has a reader outside tests: a registry that siblings only write is a defect.

The check walks the AST of every package's source (tests excluded). A *write* is a call of the
registry's ``register``/``unregister``; any other use of the registry's name (``.get``, ``.names``,
``in REGISTRY``, passing it to a function that reads it) is a *read*. Each registry must be read
somewhere other than ``registry.py`` and the siblings' ``_extension.py`` descriptors.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from vllm_ascend.core.registry import ALL_REGISTRIES

ROOT = pathlib.Path(__file__).resolve().parents[1]
WRITE_METHODS = {"register", "unregister"}


def registry_variable_names() -> dict[str, str]:
    """ALL_REGISTRIES key -> the module-level variable that holds it in registry.py."""
    from vllm_ascend.core import registry

    return {
        key: next(name for name, value in vars(registry).items() if value is reg and name.isupper())
        for key, reg in ALL_REGISTRIES.items()
    }


def uses(tree: ast.AST, variable: str) -> tuple[list[int], list[int]]:
    """(read lines, write lines) of ``variable`` in a module."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    reads, writes = [], []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == variable):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.attr in WRITE_METHODS:
            writes.append(node.lineno)
        else:
            reads.append(node.lineno)
    return reads, writes


def source_files() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.glob("packages/*/src/vllm_ascend/**/*.py"))


def readers_and_writers(variable: str, files: list[pathlib.Path]) -> tuple[list[str], list[str]]:
    readers, writers = [], []
    for path in files:
        if path.name == "registry.py" and path.parent.name == "core":
            continue
        reads, writes = uses(ast.parse(path.read_text()), variable)
        rel = path.relative_to(ROOT)
        writers += [f"{rel}:{line}" for line in writes]
        if path.name != "_extension.py":
            readers += [f"{rel}:{line}" for line in reads]
    return readers, writers


@pytest.mark.parametrize("key", sorted(ALL_REGISTRIES))
def test_every_core_registry_has_a_reader_outside_tests(key):
    variable = registry_variable_names()[key]
    readers, _ = readers_and_writers(variable, source_files())
    assert readers, f"core registry {variable} ({key}) is written but never read by package code"


def test_the_walk_tells_reads_from_writes(tmp_path):
    module = tmp_path / "pkg" / "mod.py"
    module.parent.mkdir()
    module.write_text(
        "from vllm_ascend.core.registry import QUANT_METHODS\n"
        "QUANT_METHODS.register('x', 'a:b')\n"
        "def f():\n"
        "    return QUANT_METHODS.get('x')\n"
    )
    reads, writes = uses(ast.parse(module.read_text()), "QUANT_METHODS")
    assert writes == [2]
    assert reads == [4]
    write_only = tmp_path / "pkg" / "writer.py"
    write_only.write_text("QUANT_METHODS.register('x', 'a:b')\n")
    assert uses(ast.parse(write_only.read_text()), "QUANT_METHODS") == ([], [1])


def test_siblings_fill_only_registries_that_core_reads():
    """Every registry a sibling's descriptor says it provides is one of core's (read) registries."""
    from vllm_ascend.core.extensions import load_extensions

    records = load_extensions()
    assert records, "no extension is installed in the workspace environment"
    for record in records.values():
        provided = set(record.as_dict()["provides"])
        assert provided <= set(ALL_REGISTRIES), (record.dist, provided - set(ALL_REGISTRIES))
