"""Graph ops generated from the adaptor's declarations: schemas, accessor signatures, refusals, fakes' errors."""

from __future__ import annotations

import inspect

import pytest
import torch

from vllm_ascend.core.device.adaptor.base import FUSED_OPS, BaseDeviceAdaptor, DeviceOpError
from vllm_ascend.kernels.device import graph_ops


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
