"""Rebinding kernel copies when overrides are registered: module attributes and JIT warmup owners are pointed
at the override, and objects whose ``__dict__`` is no mapping (llvmlite's library functions) are passed over."""

from __future__ import annotations

import sys
import types

import pytest

from vllm_ascend.runner.kernel_overrides import rebind_kernel_copies


class _LazyLibrary:
    """Like llvmlite's library object: every unknown attribute (``__dict__`` included) is a wrapper object."""

    __slots__ = ()

    def __getattr__(self, name):
        return object()


class _WarmupOwner:
    def __init__(self, kernel):
        self.kernel = kernel
        self._kernel_arg_names = ("stale",)


@pytest.fixture
def holder_module():
    module = types.ModuleType("_kernel_holder_for_test")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_copies_and_owners_are_rebound_and_odd_objects_skipped(holder_module):
    def original():
        return "original"

    def other():
        return "other"

    def wrapper():
        return "wrapper"

    holder_module.copy = original
    holder_module.unrelated = other
    holder_module.owner = _WarmupOwner(original)
    holder_module.other_owner = _WarmupOwner(other)
    holder_module.library = _LazyLibrary()
    rebind_kernel_copies([(original, wrapper)])
    assert holder_module.copy is wrapper
    assert holder_module.unrelated is other
    assert holder_module.owner.kernel is wrapper and "_kernel_arg_names" not in vars(holder_module.owner)
    assert holder_module.other_owner.kernel is other and vars(holder_module.other_owner)["_kernel_arg_names"]
    assert isinstance(holder_module.library, _LazyLibrary)


def test_vllms_own_scan_breaks_on_such_objects(holder_module):
    """Why the rebinding is the plugin's: vLLM 0.32's scan reads ``vars()`` of every attribute."""
    from vllm.triton_utils import dispatcher

    holder_module.library = _LazyLibrary()
    with pytest.raises(AttributeError, match="get"):
        dispatcher._rebind_kernels([(object(), object())])
