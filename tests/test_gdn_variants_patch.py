"""``benchmarks/gdn_variants.py`` builds each GDN variant by applying a one-file patch to main's kernel module: the
result must be what ``git apply`` gives, and a patch whose context no longer matches must be refused, not half
applied (a device call would otherwise time a kernel nobody wrote)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    """The script as a module; the ``sys.path`` entries it adds for itself are taken out again."""
    spec = importlib.util.spec_from_file_location("gdn_variants", ROOT / "benchmarks" / "gdn_variants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    path = list(sys.path)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = path
    return module


ORIGINAL = "".join(f"line {i}\n" for i in range(1, 31))
PATCH = """diff --git a/m.py b/m.py
--- a/m.py
+++ b/m.py
@@ -2,3 +2,4 @@ line 1
 line 2
 line 3
+inserted after 3
 line 4
@@ -20,4 +21,3 @@ line 19
 line 20
-line 21
 line 22
 line 23
"""


def test_two_hunks_apply_with_the_offset_the_first_one_adds():
    got = _script().apply_patch(ORIGINAL, PATCH)
    lines = got.splitlines()
    assert lines[:5] == ["line 1", "line 2", "line 3", "inserted after 3", "line 4"]
    assert "line 21" not in lines
    assert len(lines) == 30
    assert lines[20:23] == ["line 20", "line 22", "line 23"]


def test_a_hunk_whose_context_changed_is_refused():
    with pytest.raises(ValueError, match=r"hunk @@ -20,4 \+21,3 @@ does not match"):
        _script().apply_patch(ORIGINAL.replace("line 22\n", "line 22 changed\n"), PATCH)
    with pytest.raises(ValueError, match="no hunks"):
        _script().apply_patch(ORIGINAL, "not a patch\n")


def test_the_repository_patch_gives_what_git_apply_gives(tmp_path):
    script = _script()
    patch_file = ROOT / "benchmarks" / "patches" / "gdn-bf16-chain.patch"
    original = script.MODULE.read_text()
    target = tmp_path / script.MODULE.relative_to(ROOT)
    target.parent.mkdir(parents=True)
    target.write_text(original)
    subprocess.run(["git", "apply", str(patch_file)], cwd=tmp_path, check=True)
    got = script.apply_patch(original, patch_file.read_text())
    assert got == target.read_text()
    assert got != original and "CHAIN_16BIT" in got


def test_variant_specs_name_their_mistake(tmp_path):
    script = _script()
    with pytest.raises(SystemExit, match="expected NAME=FILE"):
        script._parse_variant("bf16")
    with pytest.raises(SystemExit, match=r"not an existing \.patch or \.py file"):
        script._parse_variant(f"x={tmp_path / 'missing.patch'}")
    module = tmp_path / "v.py"
    module.write_text("A = 1\n")
    assert script._parse_variant(f"x={module}:A=2,B={{'cuda': 64}}") == (
        "x",
        module,
        {"A": 2, "B": {"cuda": 64}},
    )
