"""Device ops as torch custom ops: equal to the reference adaptor, faithful fakes, one node each traced."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_ascend.core.device.adaptor.base import DeviceOpError
from vllm_ascend.kernels.device import graph_ops as torch_ops
from vllm_ascend.kernels.device.graph_ops import DEVICE_TORCH_OPS, device_ops, register_device_ops
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor, pack_int4

SCHEMAS = {
    "rms_norm": "vllm_ascend::rms_norm(Tensor x, Tensor weight, float eps) -> Tensor",
    "add_rms_norm": "vllm_ascend::add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) "
    "-> (Tensor, Tensor)",
    "swiglu": "vllm_ascend::swiglu(Tensor x) -> Tensor",
    "rotary_embedding": "vllm_ascend::rotary_embedding(Tensor positions, Tensor query, Tensor? key, "
    "SymInt head_size, Tensor cos_sin_cache, bool is_neox) -> Tensor[]",
    "mrope": "vllm_ascend::mrope(Tensor positions, Tensor query, Tensor key, SymInt head_size, "
    "Tensor cos_sin_cache, SymInt[] mrope_section, bool is_neox, bool interleaved) -> (Tensor, Tensor)",
    "reshape_and_cache": "vllm_ascend::reshape_and_cache(Tensor key, Tensor value, Tensor(a2!) key_cache, "
    "Tensor(a3!) value_cache, Tensor slot_mapping) -> ()",
    "dynamic_quant": "vllm_ascend::dynamic_quant(Tensor x, Tensor? smooth_scales=None) -> (Tensor, Tensor)",
    "quantize": "vllm_ascend::quantize(Tensor x, Tensor scale, Tensor? offset) -> Tensor",
    "quant_matmul": "vllm_ascend::quant_matmul(Tensor x, Tensor weight, Tensor weight_scale, "
    "Tensor? pertoken_scale=None, Tensor? bias=None, ScalarType output_dtype=bfloat16) -> Tensor",
    "add_rms_norm_quant": "vllm_ascend::add_rms_norm_quant(Tensor x, Tensor residual, Tensor weight, float eps, "
    "Tensor scale, Tensor? offset) -> (Tensor, Tensor)",
    "add_rms_norm_dynamic_quant": "vllm_ascend::add_rms_norm_dynamic_quant(Tensor x, Tensor residual, "
    "Tensor weight, float eps, Tensor? smooth_scales=None) -> (Tensor, Tensor, Tensor)",
    "rms_norm_quant": "vllm_ascend::rms_norm_quant(Tensor x, Tensor weight, float eps, Tensor scale, "
    "Tensor? offset) -> Tensor",
    "rms_norm_dynamic_quant": "vllm_ascend::rms_norm_dynamic_quant(Tensor x, Tensor weight, float eps, "
    "Tensor? smooth_scales=None) -> (Tensor, Tensor)",
    "swiglu_quant": "vllm_ascend::swiglu_quant(Tensor x, Tensor scale, Tensor? offset) -> Tensor",
    "swiglu_dynamic_quant": "vllm_ascend::swiglu_dynamic_quant(Tensor x, Tensor? smooth_scales=None) "
    "-> (Tensor, Tensor)",
    "qk_rmsnorm_rope": "vllm_ascend::qk_rmsnorm_rope(Tensor positions, Tensor query, Tensor key, "
    "Tensor q_weight, Tensor k_weight, float eps, SymInt head_size, Tensor cos_sin_cache, bool is_neox) "
    "-> (Tensor, Tensor)",
    "muls_add": "vllm_ascend::muls_add(Tensor x, float scale, Tensor y) -> Tensor",
}
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def ref() -> ReferenceDeviceAdaptor:
    torch.manual_seed(0)
    return ReferenceDeviceAdaptor()


def _op(name: str):
    return getattr(torch.ops.vllm_ascend, name).default


def _rope_inputs(dtype, with_key=True, rot_dim=8, head_size=16):
    positions = torch.randint(0, 32, (5,))
    cache = torch.randn(32, rot_dim)
    query = torch.randn(5, 4 * head_size).to(dtype)
    key = torch.randn(5, 2 * head_size).to(dtype) if with_key else None
    return positions, query, key, head_size, cache.to(dtype)


def _caches(dtype=torch.float32, d=8, dv=6):
    """K/V caches as non-contiguous views of one [blocks, block_size, H, D + Dv] buffer (vLLM's layout)."""
    buf = torch.zeros(4, 4, 2, d + dv, dtype=dtype)
    return buf, buf[..., :d], buf[..., d:]


def _quant_inputs(packed: bool):
    x = torch.randint(-128, 128, (2, 3, 16), dtype=torch.int8)
    w8 = torch.randint(-8, 8, (16, 24), dtype=torch.int8)
    weight = pack_int4(w8) if packed else w8
    return x, weight, torch.rand(24) + 0.1, torch.rand(6) + 0.1


def test_registration_is_idempotent_with_the_expected_schemas(adaptor):
    register_device_ops()
    register_device_ops()
    assert DEVICE_TORCH_OPS == tuple(SCHEMAS)
    for name, schema in SCHEMAS.items():
        assert _op(name)._schema == torch._C.parse_schema(schema), name
        assert torch._C.parse_schema(torch_ops.expected_schema(name)) == _op(name)._schema
    assert device_ops() is device_ops()
    with pytest.raises(KeyError, match="'attention' is not a vllm_ascend device op; known: rms_norm"):
        torch_ops.expected_schema("attention")


def test_registration_refuses_an_op_defined_with_another_schema(adaptor, monkeypatch):
    monkeypatch.setattr(torch_ops, "_ops", None)
    other = torch._C.parse_schema("vllm_ascend::rms_norm(Tensor x) -> Tensor")
    monkeypatch.setattr(torch_ops, "_registered_schema", lambda name: other)
    with pytest.raises(RuntimeError, match=r"vllm_ascend::rms_norm is already defined as .*\(Tensor x\)"):
        register_device_ops()


@pytest.mark.parametrize("dtype", FLOATS)
def test_norms_and_swiglu_equal_the_reference(adaptor, ref, dtype):
    ops = device_ops()
    x = torch.randn(6, 32).to(dtype)[:, :16]  # a non-contiguous slice, like q/k of a fused qkv
    residual, weight = torch.randn(6, 16).to(dtype), torch.randn(16).to(dtype)
    out = ops.rms_norm(x, weight, 1e-6)
    assert torch.equal(out, ref.rms_norm(x, weight, 1e-6)) and out.is_contiguous()
    normed, total = ops.add_rms_norm(x, residual, weight, 1e-5)
    ref_normed, ref_total = ref.add_rms_norm(x, residual, weight, 1e-5)
    assert torch.equal(normed, ref_normed) and torch.equal(total, ref_total)
    gate_up = torch.randn(3, 5, 20).to(dtype)
    assert torch.equal(ops.swiglu(gate_up), ref.swiglu(gate_up))
    assert dict(adaptor.call_counts) == {"rms_norm": 1, "add_rms_norm": 1, "swiglu": 1}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("with_key", [True, False])
def test_rotary_embedding_equals_the_reference(adaptor, ref, dtype, is_neox, with_key):
    positions, query, key, head_size, cache = _rope_inputs(dtype, with_key)
    q, k = device_ops().rotary_embedding(positions, query, key, head_size, cache, is_neox)
    ref_q, ref_k = ref.rotary_embedding(positions, query, key, head_size, cache, is_neox)
    assert torch.equal(q, ref_q) and q.dtype == dtype
    assert (k is None) == (not with_key)
    if with_key:
        assert torch.equal(k, ref_k)
    assert adaptor.call_counts["rotary_embedding"] == 1


@pytest.mark.parametrize("dtype", FLOATS)
def test_reshape_and_cache_writes_the_caches_in_place_like_the_reference(adaptor, ref, dtype):
    key, value = torch.randn(5, 2, 8).to(dtype), torch.randn(5, 2, 6).to(dtype)
    slots = torch.tensor([3, -1, 12, 0, 7])  # -1: padding, skipped
    buf, key_cache, value_cache = _caches(dtype)
    ref_buf, ref_key_cache, ref_value_cache = _caches(dtype)
    assert device_ops().reshape_and_cache(key, value, key_cache, value_cache, slots) is None
    ref.reshape_and_cache(key, value, ref_key_cache, ref_value_cache, slots)
    assert torch.equal(buf, ref_buf) and bool(buf.any())
    assert torch.equal(key_cache[3, 0], key[2]) and torch.equal(value_cache[0, 3], value[0])


@pytest.mark.parametrize("dtype", FLOATS)
def test_dynamic_quant_equals_the_reference(adaptor, ref, dtype):
    x = torch.randn(3, 4, 16).to(dtype)
    x[1, 2] = 0
    smooth = torch.rand(16) + 0.5
    for kwargs in ({}, {"smooth_scales": smooth}):
        q, scale = device_ops().dynamic_quant(x, **kwargs)
        ref_q, ref_scale = ref.dynamic_quant(x, **kwargs)
        assert torch.equal(q, ref_q) and torch.equal(scale, ref_scale)
        assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (3, 4)
    assert adaptor.call_counts["dynamic_quant"] == 2


@pytest.mark.parametrize("dtype", FLOATS)
def test_quantize_equals_the_reference(adaptor, ref, dtype):
    x = (torch.randn(3, 4, 16) * 3).to(dtype).transpose(0, 1)
    scale = torch.tensor([0.02])
    for offset in (None, torch.tensor([-7.0]), torch.tensor([5], dtype=torch.int8)):
        q = device_ops().quantize(x, scale, offset)
        assert torch.equal(q, ref.quantize(x, scale, offset)) and q.dtype == torch.int8 and q.is_contiguous()
    assert adaptor.call_counts["quantize"] == 3


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("output_dtype", FLOATS)
def test_quant_matmul_equals_the_reference(adaptor, ref, packed, output_dtype):
    x, weight, weight_scale, pertoken = _quant_inputs(packed)
    cases = [
        {"pertoken_scale": pertoken},
        {"bias": torch.randint(-50, 50, (24,), dtype=torch.int32)},
        {"pertoken_scale": pertoken, "bias": torch.randn(24)},
    ]
    for kwargs in cases:
        out = device_ops().quant_matmul(x, weight, weight_scale, output_dtype=output_dtype, **kwargs)
        expected = ref.quant_matmul(x, weight, weight_scale, output_dtype=output_dtype, **kwargs)
        assert torch.equal(out, expected) and out.shape == (2, 3, 24) and out.dtype == output_dtype
    assert adaptor.call_counts["quant_matmul"] == len(cases)


def test_adaptor_errors_pass_through_the_ops(adaptor):
    with pytest.raises(DeviceOpError, match="swiglu needs an even last dim, got 5"):
        device_ops().swiglu(torch.randn(2, 5))
    _, key_cache, value_cache = _caches()
    with pytest.raises(DeviceOpError, match="slot 99 is out of range"):
        device_ops().reshape_and_cache(
            torch.randn(1, 2, 8), torch.randn(1, 2, 6), key_cache, value_cache, torch.tensor([99])
        )


def _op_cases():
    """(op name, args) covering every op, with non-contiguous and low-precision inputs."""
    positions, query, key, head_size, cache = _rope_inputs(torch.bfloat16)
    x, w8, weight_scale, pertoken = _quant_inputs(packed=False)
    _, packed, _, _ = _quant_inputs(packed=True)
    _, key_cache, value_cache = _caches()
    wide = torch.randn(6, 32, dtype=torch.float16)
    return [
        ("rms_norm", (wide[:, :16], torch.randn(16, dtype=torch.float16), 1e-6)),
        ("add_rms_norm", (wide[:, 16:], torch.randn(6, 16, dtype=torch.float16), torch.randn(16), 1e-6)),
        ("swiglu", (torch.randn(4, 3, 10, dtype=torch.bfloat16).transpose(0, 1),)),
        ("rotary_embedding", (positions, query, key, head_size, cache, True)),
        ("rotary_embedding", (positions, query, None, head_size, cache, False)),
        (
            "reshape_and_cache",
            (torch.randn(3, 2, 8), torch.randn(3, 2, 6), key_cache, value_cache, torch.tensor([5, -1, 2])),
        ),
        ("dynamic_quant", (torch.randn(3, 4, 16, dtype=torch.bfloat16), None)),
        ("dynamic_quant", (torch.randn(8, 16), torch.rand(16) + 0.5)),
        (
            "quantize",
            (torch.randn(4, 3, 16, dtype=torch.float16).transpose(0, 1), torch.tensor([0.05]), None),
        ),
        ("quantize", (torch.randn(5, 16), torch.tensor([0.01]), torch.tensor([3.0]))),
        ("quant_matmul", (x, w8, weight_scale, pertoken, None, torch.float16)),
        ("quant_matmul", (x, packed, weight_scale, None, torch.randn(24), torch.bfloat16)),
    ]


def _meta(out):
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.dtype, tuple(out.stride()))
    return [_meta(o) for o in out]


@pytest.mark.parametrize(("name", "args"), _op_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_fake_gives_the_real_output_metadata(adaptor, name, args):
    real = _op(name)(*args)
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = _op(name)(*fake_args)
    assert _meta(fake) == _meta(real)
    if name == "reshape_and_cache":
        assert fake is None


def test_fakes_refuse_shapes_the_op_cannot_take(adaptor):
    with FakeTensorMode() as mode:
        with pytest.raises(DeviceOpError, match="swiglu needs an even last dim, got 7"):
            _op("swiglu")(mode.from_tensor(torch.randn(2, 7)))
        x = mode.from_tensor(torch.zeros(2, 16, dtype=torch.int8))
        w = mode.from_tensor(torch.zeros(8, 4, dtype=torch.int8))
        with pytest.raises(DeviceOpError, match=r"x \[..., K\] and weight \[K, N\] disagree"):
            _op("quant_matmul")(x, w, mode.from_tensor(torch.ones(4)), None, None, torch.float32)
        with pytest.raises(DeviceOpError, match="weight must be int8"):
            _op("quant_matmul")(x, mode.from_tensor(torch.zeros(16, 4)), w, None, None, torch.float32)


@pytest.mark.parametrize(("name", "args"), _op_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_opcheck(adaptor, name, args):
    results = torch.library.opcheck(_op(name), args)
    assert results and set(results.values()) == {"SUCCESS"}, results


# -- tracing: one node per op ------------------------------------------------------------------


class Capture:
    """A torch.compile backend that keeps each Dynamo graph and runs it as traced."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def op_counts(self) -> dict[str, int]:
        """Occurrences of each vllm_ascend op among the call_function nodes of all graphs."""
        counts: dict[str, int] = {}
        for gm in self.graphs:
            for node in gm.graph.nodes:
                name = _vllm_ascend_op_name(node.target) if node.op == "call_function" else None
                if name is not None:
                    counts[name] = counts.get(name, 0) + 1
        return counts

    def call_targets(self) -> set[str]:
        return {str(n.target) for gm in self.graphs for n in gm.graph.nodes if n.op == "call_function"}


def _vllm_ascend_op_name(target) -> str | None:
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        namespace, name = str(target).split(".")[:2]  # vllm_ascend.<name>[.<overload>]
        return name if namespace == "vllm_ascend" else None
    return None


def _compile(fn, backend):
    torch._dynamo.reset()
    return torch.compile(fn, backend=backend, fullgraph=True)


def _norm_quant_matmul(x, residual, weight, wq, wscale):
    ops = device_ops()
    normed, total = ops.add_rms_norm(x, residual, weight, 1e-6)
    q, scale = ops.dynamic_quant(normed)
    return ops.quant_matmul(q, wq, wscale, pertoken_scale=scale, output_dtype=x.dtype), total


def _norm_rope(positions, q, k, weight, cache):
    ops = device_ops()
    q = ops.rms_norm(q.view(-1, 16), weight, 1e-6).view(q.shape)
    return ops.rotary_embedding(positions, q, k, 16, cache, True)


def _norm_rope_cache(positions, q, k, v, weight, cache, key_cache, value_cache, slots):
    q, k = _norm_rope(positions, q, k, weight, cache)
    device_ops().reshape_and_cache(k.view(-1, 2, 16), v, key_cache, value_cache, slots)
    return q


def _mlp(x):
    return device_ops().swiglu(x) * 2


def _quant_inputs_chain(dtype):
    return (
        torch.randn(5, 16).to(dtype),
        torch.randn(5, 16).to(dtype),
        torch.randn(16).to(dtype),
        torch.randint(-128, 128, (16, 12), dtype=torch.int8),
        torch.rand(12) + 0.01,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_graphs_hold_one_node_per_op(adaptor, dtype):
    chains = [
        (
            _norm_quant_matmul,
            _quant_inputs_chain(dtype),
            {"add_rms_norm": 1, "dynamic_quant": 1, "quant_matmul": 1},
        ),
        (
            _norm_rope,
            (torch.randint(0, 32, (5,)), torch.randn(5, 64).to(dtype), torch.randn(5, 32).to(dtype),
             torch.randn(16).to(dtype), torch.randn(32, 16).to(dtype)),
            {"rms_norm": 1, "rotary_embedding": 1},
        ),
        (_mlp, (torch.randn(5, 3, 24).to(dtype),), {"swiglu": 1}),
    ]  # fmt: skip
    for fn, args, expected in chains:
        backend = Capture()
        compiled = _compile(fn, backend)
        adaptor.reset_counts()
        out = compiled(*args)
        assert backend.op_counts() == expected, (fn.__name__, backend.call_targets())
        assert len(backend.graphs) == 1
        # the adaptor's body is not traced: nothing of rms_norm/quantization shows up as torch ops
        assert not {"rsqrt", "round", "amax", "silu"} & {t.split(".")[-1] for t in backend.call_targets()}
        assert dict(adaptor.call_counts) == expected  # the compiled graph ran the adaptor, once per op
        eager = fn(*args)
        for got, want in zip(
            out if isinstance(out, tuple) else (out,),
            eager if isinstance(eager, tuple) else (eager,),
            strict=True,
        ):
            assert torch.equal(got, want)


def test_mutating_op_survives_functionalization(adaptor):
    """Under AOT autograd (what post-grad passes see) the ops stay single nodes; the cache write lands."""
    aten_graphs: list[torch.fx.GraphModule] = []

    def fw_compiler(gm, example_inputs):
        aten_graphs.append(gm)
        return gm.forward

    from torch._dynamo.backends.common import aot_autograd

    compiled = _compile(_norm_rope_cache, aot_autograd(fw_compiler=fw_compiler))
    args = (torch.randint(0, 32, (5,)), torch.randn(5, 64), torch.randn(5, 32), torch.randn(5, 2, 6),
            torch.randn(16), torch.randn(32, 16))  # fmt: skip
    slots = torch.tensor([0, 9, -1, 3, 14])
    buf, key_cache, value_cache = _caches(d=16)
    eager_buf, eager_key_cache, eager_value_cache = _caches(d=16)
    q = compiled(*args, key_cache, value_cache, slots)
    eager_q = _norm_rope_cache(*args, eager_key_cache, eager_value_cache, slots)
    assert torch.equal(q, eager_q) and torch.equal(buf, eager_buf) and bool(buf.any())
    assert len(aten_graphs) == 1
    nodes = [n for n in aten_graphs[0].graph.nodes if n.op == "call_function"]
    functional = [_vllm_ascend_op_name(n.target) for n in nodes]
    assert functional.count("rms_norm") == 1 and functional.count("rotary_embedding") == 1
    # the mutating op is wrapped by functionalization, naming the op it stands for
    wrapped = [n for n in nodes if "auto_functionalized" in str(n.target)]
    assert len(wrapped) == 1 and _vllm_ascend_op_name(wrapped[0].args[0]) == "reshape_and_cache"
