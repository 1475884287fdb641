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


def test_a_git_diff_of_the_kernel_module_gives_what_git_apply_gives(tmp_path):
    """A several-hunk patch of the real module, written by ``git diff``, as a variant is written."""
    script = _script()
    original = script.MODULE.read_text()
    assert "_WARPS = 8\n" in original and "    return out, state\n" in original
    edited = original.replace("_WARPS = 8\n", "_WARPS = 4\n#: four warps\n").replace(
        "    return out, state\n", "    out = out * 1\n    return out, state\n"
    )
    rel = script.MODULE.relative_to(ROOT)
    for side, text in (("a", original), ("b", edited)):
        (tmp_path / side / rel).parent.mkdir(parents=True)
        (tmp_path / side / rel).write_text(text)
    diff = subprocess.run(
        ["git", "diff", "--no-index", f"a/{rel}", f"b/{rel}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert diff.returncode == 1 and diff.stdout.count("\n@@ ") >= 2, diff.stderr
    patch = diff.stdout.replace(f"a/a/{rel}", f"a/{rel}").replace(f"b/b/{rel}", f"b/{rel}")
    target = tmp_path / rel
    target.parent.mkdir(parents=True)
    target.write_text(original)
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=tmp_path, check=True)
    assert target.read_text() == edited
    assert script.apply_patch(original, patch) == edited


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
