"""The captured graphs of the family adaptors (the contract, :class:`CapturedGraph`, is core's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._pytree import tree_flatten

from vllm_ascend.core.sdk import GraphCaptureError, captured_tensors


def _sizes(output: Any) -> list[int]:
    """The int leaves of a capture's output (the graph returns them as captured)."""
    return [leaf for leaf in tree_flatten(output)[0] if isinstance(leaf, int)]


class ReferenceGraph:
    """The reference device's graph: the callable re-run on the capture's own argument objects."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._fn, self._args, self._kwargs = fn, args, kwargs
        self.output = fn(*args, **kwargs)
        self._outputs = captured_tensors(self.output)
        self._sizes = _sizes(self.output)
        self.replays = 0

    def replay(self) -> None:
        output = self._fn(*self._args, **self._kwargs)
        fresh = captured_tensors(output)
        if [t.shape for t in fresh] != [t.shape for t in self._outputs]:
            raise GraphCaptureError(
                "replay produced outputs of other shapes than the capture: "
                f"{[tuple(t.shape) for t in fresh]} vs {[tuple(t.shape) for t in self._outputs]}"
            )
        if _sizes(output) != self._sizes:
            raise GraphCaptureError(
                f"replay produced other sizes than the capture: {_sizes(output)} vs {self._sizes}"
            )
        for static, new in zip(self._outputs, fresh, strict=True):
            static.copy_(new)
        self.replays += 1


class NPUGraph:
    """``torch.npu.NPUGraph`` captured under ``torch.npu.graph`` (torch_npu's CUDA-graph counterpart)."""

    def __init__(
        self, npu: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], pool: Any
    ) -> None:
        self._graph = npu.NPUGraph()
        with npu.graph(self._graph, pool=pool):
            self.output = fn(*args, **kwargs)
        captured_tensors(self.output)

    def replay(self) -> None:
        self._graph.replay()
