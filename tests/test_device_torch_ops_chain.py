"""The runner's RMSNorm feeding a W8A8_DYNAMIC linear traces as add_rms_norm -> dynamic_quant -> quant_matmul.

The chain the add_rms_norm + quant fusion targets, built from the real layers of two siblings (runner and
quant): each device op must be one ``torch.ops.vllm_ascend`` node and the compiled result equal eager.
"""

from __future__ import annotations

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config

from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor
from vllm_ascend.quant.schemes.w8a8 import W8A8Linear
from vllm_ascend.quant.schemes.w8a8_dynamic import W8A8DynamicLinear
from vllm_ascend.runner.ops.layernorm import AscendRMSNorm
from vllm_ascend.runner.ops.registry import register_custom_ops

HIDDEN, OUT = 32, 24


@pytest.fixture
def adaptor(monkeypatch):
    monkeypatch.setenv("VLLM_ASCEND_DEVICE", "reference")
    clear_device_caches()
    register_custom_ops()
    ad = get_device_adaptor()
    yield ad
    clear_device_caches()


def _layer(tensors: dict[str, torch.Tensor]) -> torch.nn.Module:
    layer = torch.nn.Module()
    for name, t in tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    return layer


def _dynamic_linear():
    w = torch.randn(OUT, HIDDEN)
    scale = w.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.round(w / scale).clamp(-128, 127).to(torch.int8)
    scheme = W8A8DynamicLinear(
        prefix="model.layers.0.mlp.gate_up_proj", group_size=None, params_dtype=torch.float32
    )
    layer = _layer({"weight": q, "weight_scale": scale, "weight_offset": torch.zeros_like(scale)})
    scheme.process_weights(layer)
    return scheme, layer


def _graph_ops(graphs: list[torch.fx.GraphModule]) -> list[str]:
    return [
        str(n.target).split(".")[1]
        for gm in graphs
        for n in gm.graph.nodes
        if n.op == "call_function" and str(n.target).startswith("vllm_ascend.")
    ]


def test_norm_then_dynamic_quant_linear_is_three_nodes(adaptor):
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        norm = AscendRMSNorm(HIDDEN, eps=1e-6)
    scheme, layer = _dynamic_linear()

    def block(x, residual):
        h, residual = norm.forward_oot(x, residual)
        return scheme.apply(layer, h), residual

    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x, residual = torch.randn(2, 3, HIDDEN), torch.randn(2, 3, HIDDEN)
    adaptor.reset_counts()
    out, res = torch.compile(block, backend=backend, fullgraph=True)(x, residual)
    assert dict(adaptor.call_counts) == {"add_rms_norm": 1, "dynamic_quant": 1, "quant_matmul": 1}
    eager_out, eager_res = block(x, residual)
    assert torch.equal(out, eager_out) and torch.equal(res, eager_res) and out.shape == (2, 3, OUT)
    assert _graph_ops(graphs) == ["add_rms_norm", "dynamic_quant", "quant_matmul"]


def test_static_w8a8_linear_is_quantize_then_quant_matmul(adaptor):
    torch.manual_seed(0)
    w = torch.randn(OUT, HIDDEN)
    ws = w.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.round(w / ws).clamp(-128, 127).to(torch.int8)
    in_scale, in_offset = torch.tensor([0.02]), torch.tensor([3.0])
    scheme = W8A8Linear(prefix="model.layers.0.mlp.down_proj", group_size=None, params_dtype=torch.float32)
    layer = _layer(
        {
            "weight": q,
            "input_scale": in_scale,
            "input_offset": in_offset,
            "weight_scale": ws,
            "weight_offset": torch.zeros_like(ws),
            "deq_scale": (in_scale * ws.reshape(-1)).float(),
            "quant_bias": (-in_offset.long() * q.long().sum(dim=1)).to(torch.int32),
        }
    )
    scheme.process_weights(layer)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    x = torch.randn(4, HIDDEN)
    out = torch.compile(lambda t: scheme.apply(layer, t), backend=backend, fullgraph=True)(x)
    assert torch.equal(out, scheme.apply(layer, x))
    assert _graph_ops(graphs) == ["quantize", "quant_matmul"]
