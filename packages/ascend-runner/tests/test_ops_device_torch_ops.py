"""The runner's custom ops run ``torch.ops.vllm_ascend.*``: same results, one node each."""

from __future__ import annotations

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config

from vllm_ascend.core.device.config import clear_device_caches, get_device_adaptor
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor
from vllm_ascend.runner.attention.impl import AscendAttentionImpl, split_kv_cache
from vllm_ascend.runner.ops.activation import AscendSiluAndMul
from vllm_ascend.runner.ops.layernorm import AscendRMSNorm
from vllm_ascend.runner.ops.registry import register_custom_ops
from vllm_ascend.runner.ops.rotary_embedding import AscendRotaryEmbedding

HEAD = 32


@pytest.fixture
def adaptor():
    clear_device_caches()
    register_custom_ops()  # what the worker does first: also defines torch.ops.vllm_ascend.*
    ad = get_device_adaptor()
    ad.reset_counts()
    yield ad
    clear_device_caches()


@pytest.fixture
def layers():
    torch.manual_seed(0)
    with set_current_vllm_config(VllmConfig()):
        norm = AscendRMSNorm(HEAD, eps=1e-6)
        rope = AscendRotaryEmbedding(HEAD, HEAD // 2, 64, 10000.0, True, torch.float32)
        act = AscendSiluAndMul()
    with torch.no_grad():
        norm.weight.copy_(torch.rand(HEAD) + 0.5)
    return norm, rope, act


def _block(norm, rope, act, positions, x, residual, q, k, gate_up):
    """A decoder-ish slice: add + norm, qk-norm + rope, swiglu (the layers' Ascend paths)."""
    h, residual = norm.forward_oot(x, residual)
    q_normed = norm.forward_oot(q.view(-1, HEAD)).view(q.shape)
    q_rot, k_rot = rope.forward_oot(positions, q_normed, k)
    return h, residual, q_rot, k_rot, act.forward_oot(gate_up)


def _inputs(dtype):
    return (
        torch.randint(0, 64, (6,)),
        torch.randn(6, HEAD).to(dtype),
        torch.randn(6, HEAD).to(dtype),
        torch.randn(6, 4 * HEAD).to(dtype),
        torch.randn(6, 2 * HEAD).to(dtype),
        torch.randn(6, 40).to(dtype),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layers_equal_the_reference_adaptor(adaptor, layers, dtype):
    norm, rope, act = layers
    norm = norm.to(dtype)
    positions, x, residual, q, k, gate_up = _inputs(dtype)
    h, res, q_rot, k_rot, mlp = _block(norm, rope, act, positions, x, residual, q, k, gate_up)
    ref = ReferenceDeviceAdaptor()
    eps = norm.variance_epsilon
    ref_h, ref_res = ref.add_rms_norm(x, residual, norm.weight.data, eps)
    ref_q = ref.rms_norm(q.view(-1, HEAD), norm.weight.data, eps).view(q.shape)
    cache = rope._match_cos_sin_cache_dtype(q)
    ref_q, ref_k = ref.rotary_embedding(positions, ref_q, k, HEAD, cache, True)
    assert torch.equal(h, ref_h) and torch.equal(res, ref_res)
    assert torch.equal(q_rot, ref_q) and torch.equal(k_rot, ref_k)
    assert torch.equal(mlp, ref.swiglu(gate_up))
    assert dict(adaptor.call_counts) == {"add_rms_norm": 1, "rms_norm": 1, "rotary_embedding": 1, "swiglu": 1}
    q_only, no_key = rope.forward_oot(positions, q)
    assert no_key is None and torch.equal(
        q_only, ref.rotary_embedding(positions, q, None, HEAD, cache, True)[0]
    )


def test_compiled_block_holds_one_node_per_layer_op(adaptor, layers):
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: _block(*layers, *a), backend=backend, fullgraph=True)
    args = _inputs(torch.float32)
    out = compiled(*args)
    eager = _block(*layers, *args)
    assert all(torch.equal(a, b) for a, b in zip(out, eager, strict=True))
    assert len(graphs) == 1
    names = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    ours = sorted(t.split(".")[1] for t in names if t.startswith("vllm_ascend."))
    assert ours == ["add_rms_norm", "rms_norm", "rotary_embedding", "swiglu"], names


def test_inlined_ops_trace_as_the_adaptors_torch_code_and_give_its_results(adaptor, layers):
    """``trace_ops_inline`` (vLLM's DYNAMO_TRACE_ONCE compile): no opaque node is left for the traceable ops,
    the traced graph computes what the eager ops compute (Inductor too, within fp32 contraction), the call
    counter is not touched by tracing, and switching it off brings the opaque nodes back."""
    from vllm_ascend.kernels.device.graph_ops import trace_ops_inline

    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    args = _inputs(torch.float32)
    eager = _block(*layers, *args)
    assert trace_ops_inline(adaptor) == ("add_rms_norm", "rms_norm", "rotary_embedding", "swiglu")
    try:
        torch._dynamo.reset()
        adaptor.reset_counts()
        out = torch.compile(lambda *a: _block(*layers, *a), backend=backend, fullgraph=True)(*args)
        assert all(torch.equal(a, b) for a, b in zip(out, eager, strict=True))
        names = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
        assert not [t for t in names if t.startswith("vllm_ascend.")], names
        assert not adaptor.call_counts
        torch._dynamo.reset()
        fused = torch.compile(lambda *a: _block(*layers, *a), backend="inductor", fullgraph=True)(*args)
        for a, b in zip(fused, eager, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    finally:
        assert trace_ops_inline(None) == ()

    def opaque_ops() -> list[str]:
        torch._dynamo.reset()
        graphs.clear()
        torch.compile(lambda *a: _block(*layers, *a), backend=backend, fullgraph=True)(*args)
        nodes = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
        return sorted(t.split(".")[1] for t in nodes if t.startswith("vllm_ascend."))

    want = ["add_rms_norm", "rms_norm", "rotary_embedding", "swiglu"]
    assert opaque_ops() == want
    trace_ops_inline(adaptor, when=lambda: False)  # another engine's compile: its choice does not apply here
    try:
        assert opaque_ops() == want
    finally:
        trace_ops_inline(None)


def test_eager_calls_skip_the_dispatcher_and_traces_keep_the_opaque_node(adaptor, layers, monkeypatch):
    """Eager: the accessor runs the adaptor's op without entering ``torch.ops`` (its per-call layers cost more
    than a small op); traced by ``make_fx`` (a dispatch mode is active): one ``vllm_ascend`` node per op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from vllm_ascend.kernels.device import graph_ops

    entered: list[str] = []
    real = graph_ops._implementation

    def spy(op):
        impl, fake = real(op)

        def counting(*args, **kwargs):
            entered.append(op.name)
            return impl(*args, **kwargs)

        return counting, fake

    monkeypatch.setattr(graph_ops, "_implementation", spy)
    accessor = graph_ops._accessor(next(op for op in graph_ops.GRAPH_OPS if op.name == "rms_norm"))
    norm = layers[0]
    x = torch.randn(5, HEAD)
    eager = accessor(x, norm.weight.data, 1e-6)
    assert torch.equal(eager, ReferenceDeviceAdaptor().rms_norm(x, norm.weight.data, 1e-6))
    assert entered == ["rms_norm"]  # the direct path, not the registered op (registered before the spy)
    graph = make_fx(lambda t: accessor(t, norm.weight.data, 1e-6))(x)
    targets = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert [t for t in targets if t != "aten.detach.default"] == ["vllm_ascend.rms_norm.default"], targets
    assert entered == ["rms_norm"], "tracing must not run the eager path"
    assert torch.equal(graph(x), eager)


def test_kv_cache_update_goes_through_reshape_and_cache(adaptor):
    impl = AscendAttentionImpl(4, 16, 0.25, 2)
    kv_cache = torch.zeros(3, 2, 4, 32)  # vLLM's per-layer [blocks, H, block_size, D + Dv]
    key, value = torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    slots = torch.tensor([1, 6, -1, 11])  # 4 slots for 5 rows: the fifth is padding of the batch
    impl.do_kv_cache_update(None, key, value, kv_cache, slots)
    assert dict(adaptor.call_counts) == {"reshape_and_cache": 1}
    expected = torch.zeros_like(kv_cache)
    ReferenceDeviceAdaptor().reshape_and_cache(key[:4], value[:4], *split_kv_cache(expected, 16), slots)
    assert torch.equal(kv_cache, expected) and bool(kv_cache.any())

    graphs: list[torch.fx.GraphModule] = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled_cache = torch.zeros_like(kv_cache)
    update = torch.compile(impl.do_kv_cache_update, backend=backend, fullgraph=True)
    update(None, key, value, compiled_cache, slots)
    assert torch.equal(compiled_cache, expected)
    names = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert [t for t in names if t.startswith("vllm_ascend.")] == ["vllm_ascend.reshape_and_cache"], names
