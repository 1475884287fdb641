"""The op contract core keeps: graph ops generated from the adaptor's declarations, the MLA latent-cache layout,
and the counting of the attention op families (the implementations live in ascend-kernels)."""

from __future__ import annotations

import inspect
from collections import Counter

import pytest
import torch

from vllm_ascend.core.device import graph_ops
from vllm_ascend.core.device.adaptor.base import FUSED_OPS, BaseDeviceAdaptor, DeviceOpError
from vllm_ascend.core.device.adaptor.mla import MLA_OPS, MLADeviceOps, check_latent_cache, latent_cache_parts
from vllm_ascend.core.device.adaptor.sparse import SPARSE_OPS, SparseAttentionDeviceOps


def _declared(name: str) -> inspect.Signature:
    sig = inspect.signature(getattr(BaseDeviceAdaptor, name))
    return sig.replace(parameters=list(sig.parameters.values())[1:])


def test_every_fused_op_of_the_contract_is_a_graph_op_with_the_declared_signature():
    assert set(FUSED_OPS) <= set(graph_ops.DEVICE_TORCH_OPS)
    assert graph_ops.FUSED_TORCH_OPS == FUSED_OPS
    graph_ops.register_device_ops()
    ops = graph_ops.device_ops()
    for name in graph_ops.DEVICE_TORCH_OPS:
        accessor = getattr(ops, name)
        declared = _declared(name)
        assert list(inspect.signature(accessor).parameters) == list(declared.parameters), name
        kinds = [p.kind for p in inspect.signature(accessor).parameters.values()]
        assert kinds == [p.kind for p in declared.parameters.values()], name


def test_schemas_come_from_the_declarations():
    # keyword-only arguments become positional with their defaults; an optional output travels as a list
    assert graph_ops.expected_schema("quant_matmul") == (
        "vllm_ascend::quant_matmul(Tensor x, Tensor weight, Tensor weight_scale, Tensor? pertoken_scale=None, "
        "Tensor? bias=None, ScalarType output_dtype=bfloat16) -> Tensor"
    )
    assert graph_ops.expected_schema("rotary_embedding").endswith("bool is_neox) -> Tensor[]")
    assert "Tensor(a2!) key_cache, Tensor(a3!) value_cache" in graph_ops.expected_schema("reshape_and_cache")
    with pytest.raises(KeyError, match="'fused_infer_attention' is not a vllm_ascend device op"):
        graph_ops.expected_schema("fused_infer_attention")


def test_an_adaptor_op_that_is_not_a_graph_op_is_refused_by_name():
    with pytest.raises(
        DeviceOpError, match=r"'kv_load' is not a graph op .*call get_device_adaptor\(\).kv_load"
    ):
        graph_ops.device_ops().kv_load  # noqa: B018


def test_fakes_raise_the_contract_errors():
    x = torch.empty(4, 6)
    with pytest.raises(DeviceOpError, match="x \\(4, 6\\) and residual \\(4, 5\\) must have the same shape"):
        graph_ops.GRAPH_OPS[1].fake(x, torch.empty(4, 5), torch.empty(6), 1e-6)
    with pytest.raises(DeviceOpError, match="swiglu needs an even last dim, got 5"):
        graph_ops.GRAPH_OPS[2].fake(torch.empty(2, 5))


def test_latent_cache_parts_are_two_contiguous_regions_of_one_allocation():
    cache = torch.arange(2 * 3 * 5, dtype=torch.float32).view(2, 3, 5)
    c_kv, k_pe = latent_cache_parts(cache, 4)
    assert c_kv.shape == (2, 3, 4) and k_pe.shape == (2, 3, 1)
    assert c_kv.is_contiguous() and k_pe.is_contiguous()
    assert c_kv.flatten().tolist() == list(range(24)) and k_pe.flatten().tolist() == list(range(24, 30))
    c_kv.zero_()
    assert cache.flatten()[:24].eq(0).all()
    with pytest.raises(DeviceOpError, match=r"kv_lora_rank=5 must be within \(0, 5\)"):
        check_latent_cache(cache, 5)
    with pytest.raises(DeviceOpError, match="one contiguous allocation"):
        latent_cache_parts(cache.transpose(0, 1), 4)


def test_attention_op_families_count_their_overrides():
    def init(self):
        self.call_counts, self._active_ops = Counter(), set()

    names = MLA_OPS + SPARSE_OPS
    body = {"__init__": init, **{name: (lambda self, *a, **k: 1) for name in names}}
    ops = type("Impl", (MLADeviceOps, SparseAttentionDeviceOps), body)()
    assert [getattr(ops, name)() for name in names] == [1] * len(names)
    assert dict(ops.call_counts) == dict.fromkeys(names, 1)
