"""Lazy package exports: import on first access, cache, clear error, listed by dir()."""

import sys

import pytest

from vllm_ascend.core.lazy import lazy_exports


def test_lazy_exports_import_on_first_access_and_cache():
    namespace: dict = {}
    getattr_, dir_ = lazy_exports("pkg", {"OrderedDict": "collections", "sqrt": "math"}, namespace)
    import collections

    assert getattr_("OrderedDict") is collections.OrderedDict
    assert namespace["OrderedDict"] is collections.OrderedDict
    assert dir_() == ["OrderedDict", "sqrt"]
    with pytest.raises(AttributeError, match=r"^module 'pkg' has no attribute 'missing'$"):
        getattr_("missing")


def test_core_package_import_is_cheap():
    import subprocess

    code = "import sys, vllm_ascend.core; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
