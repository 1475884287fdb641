"""gpt-oss's experts in the runner's MoE layer: biased grouped matmuls and vLLM's ``swigluoai`` activation.

The runner's expert step (grouped by ``moe_init_routing``, weighted back by ``moe_finalize_routing``) must
equal a plain-torch gpt-oss expert written from HF transformers' ``GptOssExperts`` equations (interleaved
gate/up columns, gate clamped above at 7, up clamped to [-7, 7], ``(up + 1) * gate * sigmoid(1.702 * gate)``,
both biases), in fp32 within 1e-5, with inputs large enough that the clamp changes the result. SiLU experts
without bias keep their path; what the runner cannot compute is refused by name.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor
from vllm_ascend.runner.ops import moe as moe_module
from vllm_ascend.runner.ops.moe import AscendMoERunner
from vllm_ascend.runner.ops.moe_comm import allgather_experts

HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 16, 12, 4, 2, 11
ALPHA, LIMIT = 1.702, 7.0


@pytest.fixture
def adaptor(monkeypatch) -> ReferenceDeviceAdaptor:
    """A fresh reference adaptor as the runner's device adaptor (its call counts start at zero)."""
    ad = ReferenceDeviceAdaptor()
    monkeypatch.setattr(moe_module, "get_device_adaptor", lambda: ad)
    monkeypatch.setattr("vllm_ascend.runner.ops.moe_comm.get_device_adaptor", lambda: ad)
    return ad


def _gpt_oss_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """HF's layout: gate_up_proj [E, H, 2I] (gate/up interleaved), down_proj [E, I, H], their biases."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "gate_up": torch.randn(EXPERTS, HIDDEN, 2 * INTER, generator=gen),
        "gate_up_bias": torch.randn(EXPERTS, 2 * INTER, generator=gen),
        "down": torch.randn(EXPERTS, INTER, HIDDEN, generator=gen) * 0.3,
        "down_bias": torch.randn(EXPERTS, HIDDEN, generator=gen),
    }


def _routing(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens scaled so that many gate/up values pass the clamp limit, top-k ids and weights."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, HIDDEN, generator=gen) * 3
    ids = torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(TOKENS)])
    weights = torch.softmax(torch.randn(TOKENS, TOP_K, generator=gen), -1)
    return x, ids.to(torch.int32), weights


def _hf_gpt_oss_experts(x, ids, weights, w) -> torch.Tensor:
    """HF ``GptOssExperts.forward`` written out per token copy (fp32)."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate_up = x[t] @ w["gate_up"][e] + w["gate_up_bias"][e]
            gate, up = gate_up[::2], gate_up[1::2]
            gate = gate.clamp(max=LIMIT)
            up = up.clamp(min=-LIMIT, max=LIMIT)
            glu = gate * torch.sigmoid(gate * ALPHA)
            out[t] += (((up + 1) * glu) @ w["down"][e] + w["down_bias"][e]) * weights[t, j]
    return out


def _runner(activation: MoEActivation, has_bias: bool, **tensors: torch.Tensor) -> AscendMoERunner:
    """An ``AscendMoERunner`` holding only what its expert step reads (vLLM's layouts: w13 [E, 2I, H],
    w2 [E, H, I]); no vLLM model around it."""
    runner = AscendMoERunner.__new__(AscendMoERunner)
    torch.nn.Module.__init__(runner)
    runner.layer_name = "model.layers.0.mlp.experts"
    runner.moe_load = None
    runner.routed_experts = SimpleNamespace(
        activation=activation,
        quant_method=UnquantizedFusedMoEMethod.__new__(UnquantizedFusedMoEMethod),
        **tensors,
    )
    runner.moe_config = SimpleNamespace(has_bias=has_bias, swiglu_alpha=None, swiglu_limit=None)
    runner.routed_input_transform = runner.routed_output_transform = None
    runner.router = None
    return runner


def _vllm_layout(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What vLLM's gpt-oss loader makes of HF's tensors: weights transposed, biases as they are."""
    return {
        "w13_weight": w["gate_up"].transpose(1, 2).contiguous(),
        "w2_weight": w["down"].transpose(1, 2).contiguous(),
        "w13_bias": w["gate_up_bias"],
        "w2_bias": w["down_bias"],
    }


def test_gpt_oss_experts_equal_hf_equations_with_the_clamp_active(adaptor):
    w = _gpt_oss_weights()
    x, ids, weights = _routing()
    gate_up = torch.einsum("th,ehn->ten", x, w["gate_up"]) + w["gate_up_bias"]
    assert (gate_up[..., ::2] > LIMIT).float().mean() > 0.1  # the gate clamp bites
    assert (gate_up[..., 1::2].abs() > LIMIT).float().mean() > 0.1  # and the up clamp

    runner = _runner(MoEActivation.SWIGLUOAI, True, **_vllm_layout(w))
    got = allgather_experts(x, ids, weights, EXPERTS, runner._expert_rows)
    want = _hf_gpt_oss_experts(x, ids, weights, w)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert adaptor.call_counts["clipped_swiglu"] == 1 and adaptor.call_counts["swiglu"] == 0
    assert adaptor.call_counts["grouped_matmul"] == 2

    # the clamp, the +1 on up and each bias change the output: the comparison can fail
    for name in ("gate_up_bias", "down_bias"):
        zeroed = {**w, name: torch.zeros_like(w[name])}
        assert not torch.allclose(_hf_gpt_oss_experts(x, ids, weights, zeroed), want, atol=1e-3)
    unclamped = adaptor.clipped_swiglu(gate_up.reshape(-1, 2 * INTER), limit=1e9)
    clamped = adaptor.clipped_swiglu(gate_up.reshape(-1, 2 * INTER))
    assert not torch.allclose(unclamped, clamped, atol=1e-3)


def test_gpt_oss_experts_equal_transformers_module(adaptor):
    """The same against transformers' own ``GptOssExperts`` module (not only our reading of it)."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    config = GptOssConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_local_experts=EXPERTS)
    hf = GptOssExperts(config)
    w = _gpt_oss_weights(seed=3)
    with torch.no_grad():
        hf.gate_up_proj.copy_(w["gate_up"])
        hf.gate_up_proj_bias.copy_(w["gate_up_bias"])
        hf.down_proj.copy_(w["down"])
        hf.down_proj_bias.copy_(w["down_bias"])
        x, ids, weights = _routing(seed=4)
        want = hf(x, ids.long(), weights)
    got = allgather_experts(
        x, ids, weights, EXPERTS, _runner(MoEActivation.SWIGLUOAI, True, **_vllm_layout(w))._expert_rows
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_silu_experts_without_bias_keep_their_path(adaptor):
    gen = torch.Generator().manual_seed(5)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) * 0.3
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * 0.3
    x, ids, weights = _routing(seed=6)
    x = x / 3
    runner = _runner(MoEActivation.SILU, False, w13_weight=w13, w2_weight=w2)
    got = allgather_experts(x, ids, weights, EXPERTS, runner._expert_rows)
    want = torch.zeros_like(x)
    for t in range(TOKENS):
        for j in range(TOP_K):
            h = w13[int(ids[t, j])] @ x[t]
            want[t] += weights[t, j] * (
                w2[int(ids[t, j])] @ (torch.nn.functional.silu(h[:INTER]) * h[INTER:])
            )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert adaptor.call_counts["swiglu"] == 1 and adaptor.call_counts["clipped_swiglu"] == 0


def test_grouped_matmul_bias_per_group_and_zero_past_the_groups():
    ad = ReferenceDeviceAdaptor()
    x, weight, bias = torch.randn(7, 3), torch.randn(2, 3, 4), torch.randn(2, 4)
    out = ad.grouped_matmul(x, weight, torch.tensor([2, 3]), bias=bias)
    torch.testing.assert_close(out[:2], x[:2] @ weight[0] + bias[0])
    torch.testing.assert_close(out[2:5], x[2:5] @ weight[1] + bias[1])
    assert torch.equal(out[5:], torch.zeros(2, 4))
    with pytest.raises(DeviceOpError, match=r"bias must be \[G, N\] = \(2, 4\) .* got \(4,\)"):
        ad.grouped_matmul(x, weight, torch.tensor([2, 3]), bias=bias[0])


def test_clipped_swiglu_layouts_and_bad_input():
    ad = ReferenceDeviceAdaptor()
    x = torch.tensor([9.0, -9.0, 1.0, 2.0])  # interleaved: gates (9, 1), ups (-9, 2)
    gate, up = torch.tensor([7.0, 1.0]), torch.tensor([-7.0, 2.0])
    torch.testing.assert_close(ad.clipped_swiglu(x), (up + 1) * gate * torch.sigmoid(1.702 * gate))
    halves = ad.clipped_swiglu(x, interleaved=False, alpha=1.0, bias=0.0)  # gates (9, -9), ups (1, 2)
    gate_h = torch.tensor([7.0, -9.0])
    torch.testing.assert_close(halves, torch.tensor([1.0, 2.0]) * gate_h * torch.sigmoid(gate_h))
    with pytest.raises(DeviceOpError, match="clipped_swiglu needs an even last dim, got 3"):
        ad.clipped_swiglu(torch.randn(2, 3))
    with pytest.raises(DeviceOpError, match=r"clipped_swiglu limit must be > 0, got 0\.0"):
        ad.clipped_swiglu(x, limit=0.0)


def test_npu_adaptor_maps_clipped_swiglu_and_group_bias(monkeypatch):
    """The A2/A3 adaptor's glue, against torch_npu ops emulated from their documentation:
    ``npu_clipped_swiglu`` (interleaved split, clamp, alpha, bias) and ``npu_grouped_matmul`` (count /
    cumsum group lists, garbage past the groups), the bias added per group row after it."""
    import sys
    import types

    from vllm_ascend.kernels.device.npu import A2A3DeviceAdaptor

    def npu_clipped_swiglu(
        x, *, group_index=None, dim=-1, alpha=1.702, limit=7.0, bias=1.0, interleaved=True
    ):
        a, b = (x[..., ::2], x[..., 1::2]) if interleaved else x.chunk(2, dim)
        a, b = a.clamp(max=limit), b.clamp(-limit, limit)
        return a * torch.sigmoid(alpha * a) * (b + bias)

    def npu_grouped_matmul(x, weight, *, group_list, split_item, group_type, group_list_type):
        ends = group_list.cumsum(0) if group_list_type == 1 else group_list
        out = torch.full((x[0].shape[0], weight[0].shape[2]), 1e4)
        start = 0
        for g, end in enumerate(ends.tolist()):
            out[start:end] = x[0][start:end] @ weight[0][g]
            start = end
        return [out]

    fake = types.ModuleType("torch_npu")
    fake.npu_clipped_swiglu = npu_clipped_swiglu
    fake.npu_grouped_matmul = npu_grouped_matmul
    monkeypatch.setitem(sys.modules, "torch_npu", fake)
    npu, ref = A2A3DeviceAdaptor(), ReferenceDeviceAdaptor()
    x = torch.randn(5, 8) * 6
    torch.testing.assert_close(npu.clipped_swiglu(x), ref.clipped_swiglu(x))
    rows, weight, bias = torch.randn(9, 3), torch.randn(3, 3, 4), torch.randn(3, 4)
    for group_list, kind in ((torch.tensor([2, 0, 4]), "count"), (torch.tensor([1, 5, 7]), "cumsum")):
        got = npu.grouped_matmul(rows, weight, group_list, group_list_type=kind, bias=bias)
        torch.testing.assert_close(
            got, ref.grouped_matmul(rows, weight, group_list, group_list_type=kind, bias=bias)
        )


def _refusal(monkeypatch, activation, has_bias, quant_method=None) -> str:
    monkeypatch.setattr(moe_module, "check_router", lambda router, name: None)
    runner = _runner(activation, has_bias)
    if quant_method is not None:
        runner.routed_experts.quant_method = quant_method
    with pytest.raises(NotImplementedError) as info:
        runner._check_supported()
    return str(info.value)


def test_unsupported_activations_and_quantized_gpt_oss_experts_are_refused(monkeypatch):
    assert _refusal(monkeypatch, MoEActivation.GELU, False) == (
        "model.layers.0.mlp.experts: the Ascend MoE runner supports gated experts with activation silu, "
        "swigluoai and no routed input/output transforms; unsupported here: ['activation'] (activation "
        "MoEActivation.GELU)"
    )
    message = _refusal(monkeypatch, MoEActivation.SWIGLUOAI, True, quant_method=object())
    assert message == (
        "model.layers.0.mlp.experts: quantized experts with activation swigluoai or expert biases (gpt-oss "
        "style) are not supported by the Ascend MoE runner (quant method object); serve the unquantized "
        "(bf16/fp32) checkpoint"
    )
    assert "expert biases" in _refusal(monkeypatch, MoEActivation.SILU, True, quant_method=object())
    monkeypatch.setattr(moe_module, "check_router", lambda router, name: None)
    _runner(MoEActivation.SWIGLUOAI, True)._check_supported()  # unquantized gpt-oss experts are served


def test_mxfp4_gpt_oss_is_refused_at_config_time():
    from vllm_ascend.core.config import ConfigError
    from vllm_ascend.core.platform import ReferencePlatform

    with pytest.raises(
        ConfigError, match=r"quantization='mxfp4' is not supported by vllm-ascend \(its kernels are CUDA's\)"
    ):
        ReferencePlatform.verify_quantization("mxfp4")
