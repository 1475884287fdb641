"""Per-forward state for Ascend layers: MoE communication method, MC2 mask, DP token counts, flags.

:func:`set_ascend_forward_context` wraps vLLM's ``set_forward_context`` (imported lazily; skipped
when vLLM is absent or no ``VllmConfig`` is given) and adds an :class:`AscendForwardState`.
Layers read both through :func:`get_ascend_forward_context`, a proxy that looks up a name in the
Ascend state, then on vLLM's ``ForwardContext`` (model runner v1 style), then in its
``additional_kwargs`` (model runner v2 style), so layer code does not care which runner set it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import torch

from vllm_ascend.core.device.family import AscendDeviceType
from vllm_ascend.core.family import current_family
from vllm_ascend.core.moe_comm import (
    MoECommType,
    compute_mc2_tokens_capacity,
    get_mc2_tokens_capacity,
    select_moe_comm_method,
    set_mc2_mask,
    set_mc2_tokens_capacity,
)

ADDITIONAL_KWARGS_KEY = "ascend"
_AUTO: Any = object()


@dataclasses.dataclass
class AscendForwardState:
    """What Ascend layers need to know about the current forward pass."""

    num_tokens: int
    num_actual_tokens: int
    moe_comm_type: MoECommType | None = None
    mc2_mask: torch.Tensor | None = None
    num_tokens_across_dp: torch.Tensor | None = None
    max_tokens_across_dp: int = 0
    in_profile_run: bool = False
    with_prefill: bool = True
    attn_metadata: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


_STACK: list[AscendForwardState] = []


def _parallel_sizes(vllm_config: Any) -> tuple[int, int, int]:
    """(tp, dp, ep) from vLLM's parallel config; EP spans TP × DP when expert parallelism is on."""
    parallel = vllm_config.parallel_config
    tp = int(getattr(parallel, "tensor_parallel_size", 1))
    dp = int(getattr(parallel, "data_parallel_size", 1))
    ep = tp * dp if getattr(parallel, "enable_expert_parallel", False) else 1
    return tp, dp, ep


def mc2_capacity_for(vllm_config: Any) -> int:
    """The MC2 capacity vLLM's scheduler and speculative settings imply."""
    tp, _, _ = _parallel_sizes(vllm_config)
    sched = vllm_config.scheduler_config
    spec = getattr(vllm_config, "speculative_config", None)
    num_spec = (getattr(spec, "num_speculative_tokens", None) or 0) if spec is not None else 0
    return compute_mc2_tokens_capacity(
        sched.max_num_seqs,
        num_spec,
        tp,
        getattr(sched, "max_num_batched_tokens", None),
    )


def _mask_device() -> str:
    """Where the MC2 mask lives: the running device's torch device, else the CPU."""
    from vllm_ascend.core.device.config import DeviceConfigError, get_device_config

    try:
        return get_device_config().torch_device
    except DeviceConfigError:
        return "cpu"


def _is_moe(vllm_config: Any) -> bool:
    return getattr(vllm_config.parallel_config, "is_moe_model", None) is not False


def _is_vllm_config(obj: Any) -> bool:
    """Whether ``obj`` is vLLM's ``VllmConfig`` (without importing vLLM: one exists only if it is loaded)."""
    module = sys.modules.get("vllm.config")
    return module is not None and isinstance(obj, module.VllmConfig)


@contextlib.contextmanager
def set_ascend_forward_context(
    attn_metadata: Any,
    vllm_config: Any,
    num_tokens: int = 0,
    *,
    num_actual_tokens: int | None = None,
    num_tokens_across_dp: torch.Tensor | None = None,
    in_profile_run: bool = False,
    with_prefill: bool = True,
    moe_comm_type: MoECommType | None = None,
    family: AscendDeviceType | str | None = _AUTO,
    tp_rank: int = 0,
    **vllm_kwargs: Any,
) -> Iterator[AscendForwardState]:
    """Enter vLLM's forward context (when ``vllm_config`` is a real ``VllmConfig``) plus Ascend state.

    ``num_tokens`` is the padded token count of this rank, ``num_actual_tokens`` the real ones
    (default: all). The MoE method is chosen from the family (default: the running device),
    the parallel config and the MC2 capacity unless ``moe_comm_type`` is given; an MC2 forward
    also gets its padding mask (this ``tp_rank``'s slice). Extra keyword arguments go to vLLM's
    ``set_forward_context``.
    """
    actual = num_tokens if num_actual_tokens is None else num_actual_tokens
    state = AscendForwardState(
        num_tokens=num_tokens,
        num_actual_tokens=actual,
        num_tokens_across_dp=num_tokens_across_dp,
        max_tokens_across_dp=int(num_tokens_across_dp.max())
        if num_tokens_across_dp is not None
        else num_tokens,
        in_profile_run=in_profile_run,
        with_prefill=with_prefill,
        attn_metadata=attn_metadata,
    )
    if vllm_config is not None and _is_moe(vllm_config):
        tp, dp, ep = _parallel_sizes(vllm_config)
        if get_mc2_tokens_capacity() is None:
            set_mc2_tokens_capacity(mc2_capacity_for(vllm_config), _mask_device())
        capacity = get_mc2_tokens_capacity() or 0
        fam = current_family() if family is _AUTO else family
        state.moe_comm_type = moe_comm_type or select_moe_comm_method(num_tokens, fam, ep, dp, capacity)
        if state.moe_comm_type is MoECommType.MC2:
            padded = -(-num_tokens // tp) * tp
            state.mc2_mask = set_mc2_mask(actual, padded, tp, tp_rank)

    with contextlib.ExitStack() as stack:
        if _is_vllm_config(vllm_config):
            from vllm.forward_context import get_forward_context, set_forward_context

            stack.enter_context(
                set_forward_context(
                    attn_metadata,
                    vllm_config,
                    num_tokens=num_tokens,
                    num_tokens_across_dp=num_tokens_across_dp,
                    **vllm_kwargs,
                )
            )
            get_forward_context().additional_kwargs[ADDITIONAL_KWARGS_KEY] = state
        elif vllm_kwargs:
            raise TypeError(
                f"unexpected arguments without a vLLM VllmConfig: {', '.join(sorted(vllm_kwargs))}"
            )
        _STACK.append(state)
        try:
            yield state
        finally:
            _STACK.pop()


def _vllm_forward_context() -> Any:
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available
    except ImportError:
        return None
    return get_forward_context() if is_forward_context_available() else None


class ForwardContextProxy:
    """Attribute access over the Ascend state, vLLM's ForwardContext and its ``additional_kwargs``."""

    _FIELDS = frozenset(f.name for f in dataclasses.fields(AscendForwardState))

    def _state(self) -> AscendForwardState | None:
        if _STACK:
            return _STACK[-1]
        ctx = _vllm_forward_context()
        return ctx.additional_kwargs.get(ADDITIONAL_KWARGS_KEY) if ctx is not None else None

    def __getattr__(self, name: str) -> Any:
        state = self._state()
        if state is not None:
            if name in self._FIELDS:
                return getattr(state, name)
            if name in state.extra:
                return state.extra[name]
        ctx = _vllm_forward_context()
        if ctx is not None:
            if hasattr(ctx, name):
                return getattr(ctx, name)
            if name in ctx.additional_kwargs:
                return ctx.additional_kwargs[name]
        if state is None and ctx is None:
            raise RuntimeError(
                f"no forward context is set (reading {name!r}); use set_ascend_forward_context"
            )
        raise AttributeError(f"the forward context has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        state = self._state()
        if state is None:
            raise RuntimeError(
                f"no forward context is set (writing {name!r}); use set_ascend_forward_context"
            )
        if name in self._FIELDS:
            setattr(state, name, value)
        else:
            state.extra[name] = value


_PROXY = ForwardContextProxy()


def get_ascend_forward_context() -> ForwardContextProxy:
    return _PROXY


def is_ascend_forward_context_available() -> bool:
    return _PROXY._state() is not None


@contextlib.contextmanager
def override_in_profile_run(flag: bool = True) -> Iterator[None]:
    """Set ``in_profile_run`` for the current forward only (model runner v2's profile/dummy runs)."""
    state = _PROXY._state()
    if state is None:
        raise RuntimeError("override_in_profile_run needs an active set_ascend_forward_context")
    previous = state.in_profile_run
    state.in_profile_run = flag
    try:
        yield
    finally:
        state.in_profile_run = previous
