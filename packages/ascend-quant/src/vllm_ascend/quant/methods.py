"""Method adapters: vLLM's linear and fused-MoE quant-method interfaces over an Ascend scheme.

vLLM calls ``create_weights`` when it builds a layer, the parameters' weight loaders while it reads
the checkpoint, ``process_weights_after_loading`` once, and ``apply`` per forward. The adapters turn
a scheme's :class:`~vllm_ascend.quant.schemes.base.TensorSpec` list into vLLM parameters (so tensor
parallel sharding and fused shards load as for vLLM's own methods), check every checkpoint tensor
against its spec before it is copied (dtype, rank, the dimensions a shard does not split), and leave
the maths to the scheme.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.layers.linear import (
    LinearMethodBase,
    RowParallelLinear,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.parameter import (
    BasevLLMParameter,
    ChannelQuantScaleParameter,
    GroupQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)
from vllm.model_executor.utils import set_weight_attrs

from vllm_ascend.quant.errors import QuantLoadError
from vllm_ascend.quant.schemes.base import AscendLinearScheme, AscendMoEScheme, TensorSpec
from vllm_ascend.quant.schemes.w8a8 import deq_scale_fp32


def _dtype_problem(spec: TensorSpec, loaded: torch.Tensor) -> str | None:
    if spec.dtype is None or spec.dtype.is_floating_point:
        if not loaded.is_floating_point():
            return f"expected a floating-point tensor, got {loaded.dtype}"
        return None
    if loaded.dtype != spec.dtype:
        return f"expected {spec.dtype}, got {loaded.dtype}"
    return None


def _shape_problem(spec: TensorSpec, loaded: torch.Tensor, *, expert: bool) -> str | None:
    """Checks what sharding never changes: the rank and the trailing (unsplit) dimensions."""
    shape = spec.shape[1:] if expert else spec.shape
    if spec.kind == "tensor":
        return None if loaded.numel() == 1 else f"expected one value (shape [1]), got {list(loaded.shape)}"
    if spec.kind == "blob":
        return (
            None
            if loaded.dim() == 1 and loaded.numel()
            else f"expected a non-empty 1-D tensor, got {list(loaded.shape)}"
        )
    if loaded.dim() != len(shape):
        return f"expected {len(shape)} dimensions like {list(shape)}, got shape {list(loaded.shape)}"
    if spec.kind in ("channel", "expert_channel") and loaded.dim() == 2 and loaded.shape[1] != shape[1]:
        return f"expected one value per output channel (shape [out, {shape[1]}]), got {list(loaded.shape)}"
    return None


class _LoadLedger:
    """Which checkpoint pieces reached each parameter of one layer: a tensor missing from the checkpoint
    must fail loading, not leave uninitialised memory in a parameter."""

    def __init__(self, prefix: str, expected: dict[str, int]) -> None:
        self.prefix = prefix
        self.expected = expected
        self.seen: dict[str, set[Any]] = {name: set() for name in expected}

    def record(self, name: str, piece: Any) -> None:
        self.seen[name].add(piece)

    def check(self) -> None:
        missing = [
            f"{self.prefix}.{name} ({len(self.seen[name])} of {count} pieces loaded)"
            for name, count in self.expected.items()
            if len(self.seen[name]) < count
        ]
        if missing:
            raise QuantLoadError(
                "tensors missing from the checkpoint (the quant description says this layer is quantized): "
                + ", ".join(missing)
            )


def _piece(args: tuple[Any, ...], kwargs: dict[str, Any], *, expert: bool) -> Any:
    """The part of a parameter one loader call fills: (expert, shard) for experts, the shard id otherwise."""
    if expert:
        shard = kwargs.get("shard_id", args[1] if len(args) > 1 else None)
        return (kwargs.get("expert_id", args[2] if len(args) > 2 else None), shard)
    return kwargs.get("loaded_shard_id", args[0] if args else None)


def _checked(
    ledger: _LoadLedger, name: str, spec: TensorSpec, loader: Callable[..., Any], *, expert: bool
) -> Any:
    """Wrap a vLLM weight loader: the checkpoint tensor is checked against ``spec`` first, a shape the
    parameter cannot take becomes a :class:`QuantLoadError` naming the layer and the tensor, and what was
    loaded is recorded in ``ledger``."""
    prefix = ledger.prefix

    @functools.wraps(loader)
    def load(param: torch.Tensor, loaded_weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if name == "deq_scale" and loaded_weight.dtype == torch.int64:
            loaded_weight = deq_scale_fp32(loaded_weight)
        problem = _dtype_problem(spec, loaded_weight) or _shape_problem(spec, loaded_weight, expert=expert)
        if problem is not None:
            raise QuantLoadError(f"{prefix}.{name}: {problem}")
        try:
            result = loader(param, loaded_weight, *args, **kwargs)
        except (AssertionError, RuntimeError, ValueError, IndexError) as exc:
            raise QuantLoadError(
                f"{prefix}.{name}: checkpoint tensor of shape {list(loaded_weight.shape)} does not fit the "
                f"layer's parameter of shape {list(param.shape)} ({type(exc).__name__}: {exc})"
            ) from None
        if result is not False:
            ledger.record(name, _piece(args, kwargs, expert=expert))
        return result

    return load


class _BlobLoader:
    """Loads a ``blob`` tensor (1-D, sized by the checkpoint, never split over ranks): each fused shard's piece
    is kept whole and the pieces are concatenated in shard order once loading is done."""

    def __init__(self, shard_order: list[Any]) -> None:
        self.shard_order = shard_order
        self.pieces: dict[Any, torch.Tensor] = {}

    def __call__(self, param: torch.Tensor, loaded_weight: torch.Tensor, shard_id: Any = None) -> None:
        if shard_id not in self.shard_order:
            raise QuantLoadError(
                f"shard id {shard_id!r} is not one of this layer's shards ({', '.join(map(repr, self.shard_order))})"
            )
        self.pieces[shard_id] = loaded_weight.detach().clone()

    def assemble(self, layer: torch.nn.Module, name: str) -> None:
        pieces = [self.pieces[s] for s in self.shard_order if s in self.pieces]
        if pieces:
            data = torch.cat(pieces)
            layer.register_parameter(name, BasevLLMParameter(data=data, weight_loader=self))
        self.pieces.clear()


def _shard_order(layer: torch.nn.Module, shards: int) -> list[Any]:
    """The shard ids vLLM's loaders pass for each fused shard, in output order (None for an unfused layer)."""
    if shards == 1:
        return [None]
    from vllm.model_executor.layers.linear import QKVParallelLinear

    return ["q", "k", "v"] if isinstance(layer, QKVParallelLinear) else list(range(shards))


@register_weight_loader_v2_supported_method
class AscendLinearMethod(LinearMethodBase):
    """vLLM ``LinearMethodBase`` over an :class:`AscendLinearScheme` (vLLM's parameter classes load it)."""

    def __init__(self, scheme: AscendLinearScheme) -> None:
        self.scheme = scheme

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        tp_size = getattr(layer, "tp_size", 1)
        reason = self.scheme.TENSOR_PARALLEL_UNSUPPORTED
        kind = "layers"
        if reason is None and isinstance(layer, RowParallelLinear):
            reason, kind = self.scheme.ROW_PARALLEL_UNSUPPORTED, "row-parallel layers"
        if reason and tp_size > 1:
            raise QuantLoadError(
                f"{self.scheme.prefix}: {self.scheme.quant_type} {kind} with tensor_parallel_size="
                f"{tp_size} are not supported yet ({reason}); serve this checkpoint with "
                "tensor_parallel_size=1"
            )
        loader = extra_weight_attrs["weight_loader"]
        specs = self.scheme.weight_specs(sum(output_partition_sizes), input_size_per_partition)
        self.ledger = _LoadLedger(self.scheme.prefix, {name: len(output_partition_sizes) for name in specs})
        self.blobs: dict[str, _BlobLoader] = {}
        for name, spec in specs.items():
            dtype = spec.dtype or params_dtype
            param: torch.nn.Parameter
            if spec.kind == "blob":
                self.blobs[name] = _BlobLoader(_shard_order(layer, len(output_partition_sizes)))
                wl = _checked(self.ledger, name, spec, self.blobs[name], expert=False)
                param = BasevLLMParameter(data=torch.empty(0, dtype=dtype), weight_loader=wl)
                layer.register_parameter(name, param)
                continue
            wl = _checked(self.ledger, name, spec, loader, expert=False)
            if spec.kind == "weight":
                param = ModelWeightParameter(
                    data=torch.empty(spec.shape, dtype=dtype), input_dim=1, output_dim=0, weight_loader=wl
                )
            elif spec.kind == "channel":
                param = ChannelQuantScaleParameter(
                    data=torch.empty(spec.shape, dtype=dtype), output_dim=0, weight_loader=wl
                )
            elif spec.kind == "group":
                param = GroupQuantScaleParameter(
                    data=torch.empty(spec.shape, dtype=dtype), input_dim=1, output_dim=0, weight_loader=wl
                )
            elif spec.kind == "tensor":
                shards = len(output_partition_sizes)
                param = PerTensorScaleParameter(data=torch.empty(shards, dtype=dtype), weight_loader=wl)
            else:
                raise ValueError(f"{self.scheme.prefix}.{name}: unknown TensorSpec kind {spec.kind!r}")
            layer.register_parameter(name, param)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.ledger.check()
        for name, blob in getattr(self, "blobs", {}).items():
            blob.assemble(layer, name)
        self.scheme.process_weights(layer)

    def apply(
        self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.scheme.apply(layer, x, bias)


class AscendFusedMoEMethod(FusedMoEMethodBase):
    """vLLM ``FusedMoEMethodBase`` over an :class:`AscendMoEScheme`: routed experts as grouped matmuls."""

    def __init__(self, scheme: AscendMoEScheme, moe: Any) -> None:
        super().__init__(moe)
        self.scheme = scheme

    def create_weights(
        self,
        layer: torch.nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        loader = extra_weight_attrs.pop("weight_loader")
        specs = self.scheme.weight_specs(num_experts, hidden_size, intermediate_size_per_partition)
        pieces = {name: num_experts * (2 if name.startswith("w13") else 1) for name in specs}
        self.ledger = _LoadLedger(self.scheme.prefix, pieces)
        for name, spec in specs.items():
            param = torch.nn.Parameter(
                torch.empty(spec.shape, dtype=spec.dtype or params_dtype), requires_grad=False
            )
            layer.register_parameter(name, param)
            set_weight_attrs(param, extra_weight_attrs)
            attrs: dict[str, Any] = {"weight_loader": _checked(self.ledger, name, spec, loader, expert=True)}
            if spec.kind == "expert_channel":
                attrs["quant_method"] = FusedMoeWeightScaleSupported.CHANNEL.value
            set_weight_attrs(param, attrs)

    def get_fused_moe_quant_config(self, layer: torch.nn.Module) -> None:
        return None

    @property
    def is_monolithic(self) -> bool:
        return False

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        self.ledger.check()
        self.scheme.process_weights(layer)

    def apply(  # type: ignore[override]
        self,
        layer: torch.nn.Module,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        shared_experts: Any = None,
        shared_experts_input: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.scheme.apply(layer, x, topk_weights, topk_ids)

    def apply_experts(self, layer: torch.nn.Module, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The scheme's experts on rows already grouped by expert (the runner's communication methods)."""
        return self.scheme.apply_experts(layer, rows, counts)

    def expert_tensors(self, layer: torch.nn.Module) -> list[torch.Tensor]:
        """Every per-expert runtime tensor (dim 0 = expert), for EPLB's physical copies."""
        return self.scheme.expert_tensors(layer)
