"""The Ascend fusion passes on compiled graphs shaped like the model code: fused where the pattern occurs
(the match counted, the fused op in the graph, the unfused ops gone, outputs equal to eager bitwise in
fp32), untouched on near-misses."""

from __future__ import annotations

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx
from vllm.compilation.passes.inductor_pass import InductorPass, pass_context
from vllm.config import VllmConfig
from vllm.config.utils import Range

from vllm_ascend.core.device.config import clear_device_caches
from vllm_ascend.kernels.device.graph_ops import device_ops, register_device_ops
from vllm_ascend.runner.compilation.config import AscendCompilationConfig
from vllm_ascend.runner.compilation.pass_manager import (
    GraphFusionPassManager,
    fusion_match_counts,
    reset_fusion_match_counts,
)
from vllm_ascend.runner.compilation.passes.noop import NoOpEliminationPass

H, HEADS, KV_HEADS, HEAD = 32, 4, 2, 16


class GraphRecorder(InductorPass):
    """Keeps the targets of the graph it sees (added after the fusion passes)."""

    def __init__(self) -> None:
        self.targets: list[object] = []

    def __call__(self, graph: fx.Graph) -> None:
        self.targets = [n.target for n in graph.nodes if n.op == "call_function"]


def op(name: str):
    return getattr(torch.ops.vllm_ascend, name).default


@pytest.fixture(autouse=True)
def fresh():
    clear_device_caches()
    register_device_ops()
    torch._dynamo.reset()
    reset_fusion_match_counts()
    yield
    torch._dynamo.reset()
    clear_device_caches()


def compile_run(fn, args, section: AscendCompilationConfig | None = None):
    """``fn`` compiled by Inductor with the manager as post-grad pass: (outputs, graph targets, counts)."""
    manager = GraphFusionPassManager(section or AscendCompilationConfig())
    manager.configure(VllmConfig())
    recorder = GraphRecorder()
    manager.add(recorder)
    options = {
        "post_grad_custom_post_pass": manager,
        "fx_graph_cache": False,
        "enable_auto_functionalized_v2": False,  # as vLLM compiles
    }
    with pass_context(Range(start=1, end=64)):
        out = torch.compile(fn, backend="inductor", fullgraph=True, dynamic=False, options=options)(*args)
    return out, recorder.targets, fusion_match_counts()


def assert_bitwise(got, want) -> None:
    got = got if isinstance(got, tuple | list) else (got,)
    want = want if isinstance(want, tuple | list) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


def _norm_args(seed: int = 0):
    torch.manual_seed(seed)
    return torch.randn(6, H), torch.randn(6, H), torch.rand(H) + 0.5


# -- norm + quant -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True])
def test_add_rms_norm_then_quant_fuses(dynamic):
    ops = device_ops()

    def layer(x, residual, weight, scale, offset):
        normed, total = ops.add_rms_norm(x, residual, weight, 1e-6)
        rows = normed.reshape(-1, normed.shape[-1])  # what the W8A8 schemes do
        if dynamic:
            q, q_scale = ops.dynamic_quant(rows)
            return q, q_scale, total
        return ops.quantize(rows, scale, offset), total

    args = (*_norm_args(), torch.tensor([0.02]), torch.tensor([2.0]))
    out, targets, counts = compile_run(layer, args)
    assert counts["AddRMSNormQuantFusionPass"] == 1
    assert op("add_rms_norm_dynamic_quant" if dynamic else "add_rms_norm_quant") in targets
    assert not {op("add_rms_norm"), op("quantize"), op("dynamic_quant")} & set(targets)
    assert_bitwise(out, layer(*args))


@pytest.mark.parametrize("dynamic", [False, True])
def test_rms_norm_then_quant_fuses(dynamic):
    ops = device_ops()

    def first_layer(x, weight, scale):
        normed = ops.rms_norm(x, weight, 1e-5)
        return ops.dynamic_quant(normed) if dynamic else ops.quantize(normed, scale, None)

    x, _, weight = _norm_args(1)
    args = (x, weight, torch.tensor([0.03]))
    out, targets, counts = compile_run(first_layer, args)
    assert counts["RMSNormQuantFusionPass"] == 1 and counts["AddRMSNormQuantFusionPass"] == 0
    assert op("rms_norm_dynamic_quant" if dynamic else "rms_norm_quant") in targets
    assert op("rms_norm") not in targets
    assert_bitwise(out, first_layer(*args))


def test_norm_whose_output_is_also_used_elsewhere_is_not_fused():
    ops = device_ops()

    def moe_like(x, residual, weight, scale):
        normed, total = ops.add_rms_norm(x, residual, weight, 1e-6)
        return ops.quantize(normed, scale, None), normed, total  # e.g. a MoE router reads it too

    args = (*_norm_args(2), torch.tensor([0.02]))
    out, targets, counts = compile_run(moe_like, args)
    assert counts["AddRMSNormQuantFusionPass"] == 0
    assert {op("add_rms_norm"), op("quantize")} <= set(targets)
    assert_bitwise(out, moe_like(*args))


# -- qk norm + rope ---------------------------------------------------------------------------------


def _attention_args(seed: int = 3):
    torch.manual_seed(seed)
    x = torch.randn(5, H)
    w_qkv = torch.randn(H, (HEADS + 2 * KV_HEADS) * HEAD) / 8
    return (
        torch.randint(0, 32, (5,)),
        x,
        w_qkv,
        torch.rand(HEAD) + 0.5,
        torch.rand(HEAD) + 0.5,
        torch.randn(32, HEAD),
    )


def _qwen3_attention_input(also_return_normed_q: bool):
    ops = device_ops()
    q_size, kv_size = HEADS * HEAD, KV_HEADS * HEAD

    def attention_input(positions, x, w_qkv, q_weight, k_weight, cos_sin_cache):
        qkv = x @ w_qkv
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q_by_head = ops.rms_norm(q.view(*q.shape[:-1], q.shape[-1] // HEAD, HEAD), q_weight, 1e-6)
        k_by_head = ops.rms_norm(k.view(*k.shape[:-1], k.shape[-1] // HEAD, HEAD), k_weight, 1e-6)
        q_normed, k_normed = q_by_head.view(q.shape), k_by_head.view(k.shape)
        q_rot, k_rot = ops.rotary_embedding(positions, q_normed, k_normed, HEAD, cos_sin_cache, True)
        if also_return_normed_q:
            return q_rot, k_rot, v, q_normed
        return q_rot, k_rot, v

    return attention_input


def test_qk_norm_then_rope_fuses():
    fn = _qwen3_attention_input(also_return_normed_q=False)
    args = _attention_args()
    out, targets, counts = compile_run(fn, args)
    assert counts["QKNormRopeFusionPass"] == 1
    assert op("qk_rmsnorm_rope") in targets
    assert op("rms_norm") not in targets and op("rotary_embedding") not in targets
    assert_bitwise(out, fn(*args))


def test_qk_norm_used_elsewhere_is_not_fused():
    fn = _qwen3_attention_input(also_return_normed_q=True)
    args = _attention_args(4)
    out, targets, counts = compile_run(fn, args)
    assert counts["QKNormRopeFusionPass"] == 0
    assert op("qk_rmsnorm_rope") not in targets and op("rotary_embedding") in targets
    assert_bitwise(out, fn(*args))


# -- swiglu + quant ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True])
def test_swiglu_then_quant_fuses(dynamic):
    ops = device_ops()

    def mlp_down_input(gate_up, scale, offset):
        h = ops.swiglu(gate_up)
        rows = h.reshape(-1, h.shape[-1])
        return ops.dynamic_quant(rows) if dynamic else ops.quantize(rows, scale, offset)

    torch.manual_seed(5)
    args = (torch.randn(6, 2 * H), torch.tensor([0.01]), torch.tensor([-1.0]))
    out, targets, counts = compile_run(mlp_down_input, args)
    assert counts["SwiGLUQuantFusionPass"] == 1
    assert op("swiglu_dynamic_quant" if dynamic else "swiglu_quant") in targets
    assert op("swiglu") not in targets
    assert_bitwise(out, mlp_down_input(*args))


def test_swiglu_output_used_elsewhere_is_not_fused():
    ops = device_ops()

    def fn(gate_up):
        h = ops.swiglu(gate_up)
        q, q_scale = ops.dynamic_quant(h)
        return q, q_scale, h

    torch.manual_seed(6)
    args = (torch.randn(6, 2 * H),)
    out, targets, counts = compile_run(fn, args)
    assert counts["SwiGLUQuantFusionPass"] == 0 and op("swiglu") in targets
    assert_bitwise(out, fn(*args))


# -- muls + add -------------------------------------------------------------------------------------


def test_scalar_mul_then_add_fuses():
    def combine(routed, shared):
        return routed * 2.5 + shared  # routed_scaling_factor-style combine

    torch.manual_seed(7)
    args = (torch.randn(6, H), torch.randn(6, H))
    out, targets, counts = compile_run(combine, args)
    assert counts["MulsAddFusionPass"] == 1
    assert op("muls_add") in targets and torch.ops.aten.mul.Tensor not in targets
    assert_bitwise(out, combine(*args))


def test_tensor_mul_or_broadcast_add_is_not_fused():
    def near_misses(x, y, gate, bias):
        return x * gate + y, x * 3.0 + bias  # a tensor factor; a broadcast addend

    torch.manual_seed(8)
    args = (torch.randn(6, H), torch.randn(6, H), torch.randn(6, H), torch.randn(H))
    out, targets, counts = compile_run(near_misses, args)
    assert counts["MulsAddFusionPass"] == 0 and op("muls_add") not in targets
    assert_bitwise(out, near_misses(*args))


# -- every pass in one layer; switches ----------------------------------------------------------------


def _decoder_mlp():
    ops = device_ops()

    def mlp(x, residual, weight, w_gate_up, w_scale):
        normed, total = ops.add_rms_norm(x, residual, weight, 1e-6)
        q, q_scale = ops.dynamic_quant(normed.reshape(-1, H))
        gate_up = ops.quant_matmul(q, w_gate_up, w_scale, pertoken_scale=q_scale, output_dtype=torch.float32)
        h_q, h_scale = ops.dynamic_quant(ops.swiglu(gate_up))
        return h_q, h_scale, total * 0.5 + x

    torch.manual_seed(9)
    x, residual, weight = _norm_args(9)
    args = (x, residual, weight, torch.randint(-8, 8, (H, 4 * H), dtype=torch.int8), torch.rand(4 * H) / 50)
    return mlp, args


def test_section_switches_select_the_passes():
    mlp, args = _decoder_mlp()
    out, targets, counts = compile_run(mlp, args)
    assert counts["AddRMSNormQuantFusionPass"] == 1
    assert counts["SwiGLUQuantFusionPass"] == 1 and counts["MulsAddFusionPass"] == 1
    assert_bitwise(out, mlp(*args))

    torch._dynamo.reset()
    reset_fusion_match_counts()
    section = AscendCompilationConfig(fuse_norm_quant=False, fuse_muls_add=False)
    out, targets, counts = compile_run(mlp, args, section)
    assert "AddRMSNormQuantFusionPass" not in counts and "MulsAddFusionPass" not in counts
    assert counts["SwiGLUQuantFusionPass"] == 1
    assert op("add_rms_norm") in targets and op("swiglu_dynamic_quant") in targets
    assert_bitwise(out, mlp(*args))

    torch._dynamo.reset()
    reset_fusion_match_counts()
    out, targets, counts = compile_run(mlp, args, AscendCompilationConfig(enable_graph_fusion=False))
    assert counts == {}
    assert {op("add_rms_norm"), op("swiglu"), op("dynamic_quant")} <= set(targets)
    assert_bitwise(out, mlp(*args))


def test_graph_with_a_functionalized_mutating_op_compiles():
    """reshape_and_cache is an ``auto_functionalized`` node post-grad (as MoE graphs' mutating ops are):
    vLLM's fix-functionalization pass would look up its CUDA kernels there and fail on this install."""
    ops = device_ops()

    def write_kv(x, residual, weight, key_cache, value_cache, slots):
        normed, total = ops.add_rms_norm(x, residual, weight, 1e-6)
        ops.reshape_and_cache(
            normed.view(6, 2, H // 2), total.view(6, 2, H // 2), key_cache, value_cache, slots
        )
        return total * 2.0 + x

    def caches():
        return torch.zeros(4, 4, 2, H // 2), torch.zeros(4, 4, 2, H // 2)

    slots = torch.tensor([0, 5, 6, -1, 9, 15])
    args = _norm_args(10)
    compiled_caches, eager_caches = caches(), caches()
    out, _, counts = compile_run(write_kv, (*args, *compiled_caches, slots))
    assert counts["MulsAddFusionPass"] == 1
    assert_bitwise([out, *compiled_caches], [write_kv(*args, *eager_caches, slots), *eager_caches])


# -- no-op elimination ------------------------------------------------------------------------------


def test_noop_views_and_slices_are_removed_and_reshape_chains_collapsed():
    aten = torch.ops.aten

    def views(x):
        same = aten.slice.Tensor(x.view(6, H).reshape(6, H), 1, 0, H)  # three shape-keeping nodes
        flat = x.reshape(6 * H).view(3, 2 * H)  # a chain: one reshape of x remains
        return same + 1, flat * 2, aten.slice.Tensor(x, 1, 0, 4)

    x = torch.randn(6, H)
    gm = make_fx(views, tracing_mode="fake")(x)
    before = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    noop = NoOpEliminationPass(VllmConfig())
    matches = noop.apply(gm.graph)
    gm.recompile()
    after = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert matches == 4
    assert len(before) - len(after) == 4
    assert sum(t in (aten.view.default, aten.reshape.default) for t in after) == 1
    assert after.count(aten.slice.Tensor) == 1  # the slice to 4 columns changes the shape: kept
    assert_bitwise(gm(x), views(x))
