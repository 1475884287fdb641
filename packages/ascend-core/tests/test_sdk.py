"""``vllm_ascend.core.sdk``, the surface siblings import: every listed name is its defining module's object,
loaded on first use; an unknown name is an AttributeError naming the surface."""

from __future__ import annotations

import importlib

import pytest

from vllm_ascend.core import sdk


def test_each_name_is_the_defining_object():
    assert len(sdk._EXPORTS) >= 50
    for name, module in sdk._EXPORTS.items():
        assert getattr(sdk, name) is getattr(importlib.import_module(module), name), name
    assert set(sdk._EXPORTS) <= set(dir(sdk))


def test_an_unknown_name_is_refused_by_name():
    with pytest.raises(AttributeError, match=r"module 'vllm_ascend\.core\.sdk' has no attribute 'platform'"):
        sdk.platform  # noqa: B018  (the attribute access is the test)
