"""The device ops graph passes target, as torch custom ops ``torch.ops.vllm_ascend.<name>``, generated from
their declarations in :class:`~vllm_ascend.core.device.adaptor.base.BaseDeviceAdaptor`.

For each :class:`GraphOp` the schema, the implementation (the current adaptor's method, outputs made
contiguous) and the typed accessor (:func:`device_ops`, the adaptor's own signature) are derived from the
declared method's signature; only the fake (output shapes, dtypes, and the contract's shape errors) is written
here, so ``torch.compile`` traces one opaque node per call on every device. ``torch.library`` refuses optional
tensor returns and keyword-only tensor arguments: keyword-only arguments become positional in the schema, and an
output that is None when an argument is None (``rotary_embedding``'s key) travels as a shorter list.

Attention itself is not here: vLLM calls it through its own opaque ``torch.ops.vllm.
unified_attention_with_output`` (the platform's ``opaque_attention_op()`` is True), and the KV-cache write
through ``torch.ops.vllm.unified_kv_cache_update``, inside which the backend calls ``reshape_and_cache``.
"""

from __future__ import annotations

import functools
import inspect
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from vllm_ascend.core.sdk import FUSED_OPS, BaseDeviceAdaptor, DeviceOpError, get_device_adaptor

#: The ``torch.ops`` namespace of the plugin's ops.
NAMESPACE = "vllm_ascend"


@dataclass(frozen=True)
class GraphOp:
    """An adaptor op registered as ``torch.ops.vllm_ascend.<name>``.

    ``fake`` takes the op's arguments in declaration order (keyword-only ones last, positionally) and returns
    empty outputs of the real ones' metadata; ``mutates``: the arguments written in place; ``optional_outputs``:
    output index -> the argument whose being None makes that output None.
    """

    name: str
    fake: Callable[..., Any]
    mutates: tuple[str, ...] = ()
    optional_outputs: Mapping[int, str] = field(default_factory=dict)


# -- fakes: output metadata (and the contract's shape errors) only ------------------------------


def _like(
    x: torch.Tensor, shape: Sequence[Any] | None = None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    return x.new_empty(tuple(x.shape) if shape is None else tuple(shape), dtype=dtype or x.dtype)


def _same_shape(name: str, x: torch.Tensor, other_name: str, other: torch.Tensor) -> None:
    if x.shape != other.shape:
        raise DeviceOpError(
            f"{name} {tuple(x.shape)} and {other_name} {tuple(other.shape)} must have the same shape"
        )


def _swiglu_out(x: torch.Tensor) -> torch.Tensor:
    if x.shape[-1] % 2 != 0:
        raise DeviceOpError(f"swiglu needs an even last dim, got {x.shape[-1]}")
    return _like(x, (*x.shape[:-1], x.shape[-1] // 2))


def _per_token_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() < 2:
        raise DeviceOpError(f"dynamic_quant needs x with at least 2 dims, got shape {tuple(x.shape)}")
    return _like(x, dtype=torch.int8), _like(x, x.shape[:-1], torch.float32)


def _add_norm(x: torch.Tensor, residual: torch.Tensor, *_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    _same_shape("x", x, "residual", residual)
    return _like(x), _like(x)


def _quant_matmul(x: torch.Tensor, weight: torch.Tensor, *args: Any) -> torch.Tensor:
    if weight.dtype not in (torch.int8, torch.int32) or weight.dim() != 2:
        raise DeviceOpError(
            f"weight must be int8 [K, N] or int4 packed in int32 [K, N/8], got {weight.dtype} {tuple(weight.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != weight.shape[0]:
        raise DeviceOpError(
            f"x [..., K] and weight [K, N] disagree: {tuple(x.shape)} vs {tuple(weight.shape)}"
        )
    n_dim = weight.shape[1] * (8 if weight.dtype == torch.int32 else 1)
    return _like(x, (*x.shape[:-1], n_dim), args[-1])


def _qk_rmsnorm_rope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, *args: Any) -> Any:
    head_size = args[3]
    for name, x in (("query", query), ("key", key)):
        if x.dim() != 2 or x.shape[-1] % head_size != 0:
            raise DeviceOpError(
                f"qk_rmsnorm_rope needs {name} [T, heads*{head_size}], got shape {tuple(x.shape)}"
            )
    return _like(query), _like(key)


def _muls_add(x: torch.Tensor, scale: float, y: torch.Tensor) -> torch.Tensor:
    _same_shape("x", x, "y", y)
    if x.dtype != y.dtype:
        raise DeviceOpError(f"muls_add needs x and y of one dtype, got {x.dtype} and {y.dtype}")
    return _like(x)


def _add_norm_dynamic_quant(x: torch.Tensor, residual: torch.Tensor, *_: Any) -> Any:
    _same_shape("x", x, "residual", residual)
    return (*_per_token_int8(x), _like(x))


GRAPH_OPS: tuple[GraphOp, ...] = (
    GraphOp("rms_norm", lambda x, *_: _like(x)),
    GraphOp("add_rms_norm", _add_norm),
    GraphOp("swiglu", _swiglu_out),
    GraphOp(
        "rotary_embedding",
        lambda positions, query, key, *_: (_like(query), None if key is None else _like(key)),
        optional_outputs={1: "key"},
    ),
    GraphOp("mrope", lambda positions, query, key, *_: (_like(query), _like(key))),
    GraphOp("reshape_and_cache", lambda *_: None, mutates=("key_cache", "value_cache")),
    GraphOp("dynamic_quant", lambda x, *_: _per_token_int8(x)),
    GraphOp("quantize", lambda x, *_: _like(x, dtype=torch.int8)),
    GraphOp("quant_matmul", _quant_matmul),
    GraphOp(
        "add_rms_norm_quant", lambda x, residual, *_: (_add_norm(x, residual)[0].to(torch.int8), _like(x))
    ),
    GraphOp("add_rms_norm_dynamic_quant", _add_norm_dynamic_quant),
    GraphOp("rms_norm_quant", lambda x, *_: _like(x, dtype=torch.int8)),
    GraphOp("rms_norm_dynamic_quant", lambda x, *_: _per_token_int8(x)),
    GraphOp("swiglu_quant", lambda x, *_: _swiglu_out(x).to(torch.int8)),
    GraphOp("swiglu_dynamic_quant", lambda x, *_: _per_token_int8(_swiglu_out(x))),
    GraphOp("qk_rmsnorm_rope", _qk_rmsnorm_rope),
    GraphOp("muls_add", _muls_add),
)

#: Names of the registered ops, ``torch.ops.vllm_ascend.<name>``.
DEVICE_TORCH_OPS: tuple[str, ...] = tuple(op.name for op in GRAPH_OPS)
#: The fused ops among them (the graph fusion passes' targets): every fused op of the contract.
FUSED_TORCH_OPS: tuple[str, ...] = tuple(name for name in DEVICE_TORCH_OPS if name in FUSED_OPS)


# -- generation from the declarations ----------------------------------------------------------


def _declaration(name: str) -> tuple[inspect.Signature, dict[str, Any]]:
    """The declared signature of adaptor op ``name`` (without ``self``) and its resolved annotations."""
    method = getattr(BaseDeviceAdaptor, name)
    hints = typing.get_type_hints(method)
    params = list(inspect.signature(method).parameters.values())[1:]
    return inspect.Signature(params, return_annotation=hints["return"]), hints


def _schema_prototype(op: GraphOp) -> Callable[..., Any]:
    """A function whose signature is the op's schema: every argument positional, optional outputs as a list."""
    sig, hints = _declaration(op.name)
    params = [
        p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[p.name])
        for p in sig.parameters.values()
    ]
    returns = list[torch.Tensor] if op.optional_outputs else sig.return_annotation
    if returns is type(None):
        returns = None

    def prototype(*args: Any) -> Any:
        """The schema's signature only (``torch.library.infer_schema`` reads it); the op runs the adaptor."""

    prototype.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    return prototype


def _schema_outputs(op: GraphOp, out: Any) -> Any:
    """An adaptor result as the schema returns it: contiguous tensors, optional outputs dropped when None."""
    if out is None:
        return None
    if isinstance(out, torch.Tensor):
        return out.contiguous()
    tensors = [t.contiguous() for t in out if t is not None]
    return tensors if op.optional_outputs else tuple(tensors)


def _implementation(op: GraphOp) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The op's eager implementation (the current adaptor's method) and its fake, both taking the schema's
    arguments (all positional; omitted trailing ones take the declared defaults)."""
    sig, _ = _declaration(op.name)
    schema_sig = inspect.signature(_schema_prototype(op))
    keyword_only = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    num_positional = len(sig.parameters) - len(keyword_only)

    def schema_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if len(args) == len(schema_sig.parameters) and not kwargs:
            return args
        bound = schema_sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return bound.args

    def impl(*args: Any, **kwargs: Any) -> Any:
        args = schema_args(args, kwargs)
        method = getattr(get_device_adaptor(), op.name)
        out = method(*args[:num_positional], **dict(zip(keyword_only, args[num_positional:], strict=True)))
        return _schema_outputs(op, out)

    def fake(*args: Any, **kwargs: Any) -> Any:
        return _schema_outputs(op, op.fake(*schema_args(args, kwargs)))

    impl.__signature__ = fake.__signature__ = schema_sig  # type: ignore[attr-defined]
    return impl, fake


def _traced() -> bool:
    """Whether the current call is being traced (Dynamo, or a dispatch mode such as ``make_fx``'s proxy mode,
    fake tensors or a memory-pool scope is active): then the op must be the opaque ``torch.ops`` node."""
    return torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0


#: op name -> the adaptor's own code for it, traced in place of the opaque node while Dynamo compiles and
#: ``_inline_when[0]()`` holds (:func:`trace_ops_inline`); empty unless a compile without graph passes asked.
_inline: dict[str, Callable[..., Any]] = {}
_inline_when: list[Callable[[], bool]] = [lambda: False]


def trace_ops_inline(
    adaptor: BaseDeviceAdaptor | None, when: Callable[[], bool] | None = None
) -> tuple[str, ...]:
    """While Dynamo compiles and ``when()`` is true (read at trace time; None: always), trace
    ``adaptor.traceable_ops`` as the adaptor's own torch code instead of one opaque ``torch.ops.vllm_ascend``
    node each, so the compiler fuses them with the ops around them (adaptor None: every op opaque again, what
    the plugin's graph passes match). Eager calls are unchanged. Returns the ops inlined.

    Only for a compile that runs none of the plugin's passes (vLLM's ``DYNAMO_TRACE_ONCE`` mode): the fusion
    passes of ``VLLM_COMPILE`` look for the opaque nodes. ``when`` keeps the choice to the compile it was made
    for (the worker's: while its engine's forward context is the current one), not every later trace in
    the process."""
    _inline.clear()
    _inline_when[0] = when or (lambda: True)
    if adaptor is None:
        return ()
    for name in sorted(adaptor.traceable_ops):
        code = inspect.unwrap(getattr(type(adaptor), name))  # without the call counter's Python side effects
        _inline[name] = functools.partial(code, adaptor)
    return tuple(_inline)


def _inlining(name: str) -> bool:
    return name in _inline and torch.compiler.is_compiling() and _inline_when[0]()


def _accessor(op: GraphOp) -> Callable[..., Any]:
    """A function with the adaptor's signature calling ``torch.ops.vllm_ascend.<name>`` where a graph is traced
    (or the adaptor's torch code, while Dynamo compiles with :func:`trace_ops_inline` on), and the op's
    implementation directly in eager execution (the same code the custom op runs, without the dispatcher's and
    ``torch.library``'s per-call layers, which cost several times a small op's own work).
    Generated source, so a call costs what a hand-written wrapper costs."""
    sig, _ = _declaration(op.name)
    defaults = {f"_d_{p.name}": p.default for p in sig.parameters.values() if p.default is not p.empty}
    params = []
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in params:
            params.append("*")
        params.append(p.name if p.default is p.empty else f"{p.name}=_d_{p.name}")
    names = ", ".join(sig.parameters)
    method_args = ", ".join(
        f"{p.name}={p.name}" if p.kind is inspect.Parameter.KEYWORD_ONLY else p.name
        for p in sig.parameters.values()
    )
    inlined = f"(_inline[{op.name!r}]({method_args}) if _inlining({op.name!r}) else _op({names}))"
    call = f"({inlined} if _traced() else _impl({names}))"
    if op.optional_outputs:
        outs = []
        count = len(typing.get_args(sig.return_annotation))
        for i in range(count):
            arg = op.optional_outputs.get(i)
            outs.append(f"(_out[{i}] if {arg} is not None else None)" if arg else f"_out[{i}]")
        body = f"    _out = {call}\n    return ({', '.join(outs)},)\n"
    else:
        body = f"    return {call}\n"
    namespace: dict[str, Any] = {
        "_op": getattr(getattr(torch.ops, NAMESPACE), op.name),
        "_impl": _implementation(op)[0],
        "_traced": _traced,
        "_inline": _inline,
        "_inlining": _inlining,
        **defaults,
    }
    exec(f"def {op.name}({', '.join(params)}):\n{body}", namespace)
    return cast(Callable[..., Any], namespace[op.name])


def expected_schema(name: str) -> str:
    """The schema ``vllm_ascend::<name>`` is registered with (from the adaptor's declaration)."""
    op = next((o for o in GRAPH_OPS if o.name == name), None)
    if op is None:
        raise KeyError(f"{name!r} is not a vllm_ascend device op; known: {', '.join(DEVICE_TORCH_OPS)}")
    return f"{NAMESPACE}::{name}{torch.library.infer_schema(_schema_prototype(op), mutates_args=op.mutates)}"


def _registered_schema(name: str) -> Any:
    """The ``FunctionSchema`` ``vllm_ascend::<name>`` is defined with in this process, or None."""
    try:
        packet = getattr(getattr(torch.ops, NAMESPACE), name)
    except AttributeError:
        return None
    return packet.default._schema


class GraphOps:
    """The registered ops under the adaptor's names and signatures: each call is one ``torch.ops.vllm_ascend``
    call (an adaptor op that is not a graph op is refused by name)."""

    def __getattr__(self, name: str) -> Any:
        raise DeviceOpError(
            f"{name!r} is not a graph op (graph ops: {', '.join(DEVICE_TORCH_OPS)}); call get_device_adaptor().{name}"
        )


_lock = threading.Lock()
_ops: GraphOps | None = None


def register_device_ops() -> None:
    """Define every op of :data:`GRAPH_OPS` once per process (later calls return at once).

    An op already defined with the same schema (e.g. by an earlier copy of this module) is kept; one
    defined with another schema raises ``RuntimeError`` naming both.
    """
    global _ops
    if _ops is not None:
        return
    with _lock:
        if _ops is not None:
            return
        ops = GraphOps()
        for op in GRAPH_OPS:
            schema = expected_schema(op.name)
            existing = _registered_schema(op.name)
            if existing is None:
                impl, fake = _implementation(op)
                custom = torch.library.custom_op(f"{NAMESPACE}::{op.name}", impl, mutates_args=op.mutates)
                custom.register_fake(fake)
            elif existing != torch._C.parse_schema(schema):
                raise RuntimeError(
                    f"torch op {NAMESPACE}::{op.name} is already defined as '{existing}'; vllm-ascend needs '{schema}'"
                )
            setattr(ops, op.name, _accessor(op))
        _ops = ops


def device_ops() -> BaseDeviceAdaptor:
    """The registered graph ops with the adaptor's signatures (registering them on first use)."""
    if _ops is None:
        register_device_ops()
    return cast(BaseDeviceAdaptor, _ops)
