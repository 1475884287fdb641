"""AscendGraphWrapper: vLLM's static-graph wrapper on the device adaptor's captured graphs.

vLLM wraps a runnable (the whole model for FULL graphs, each compiled piece for PIECEWISE) and
dispatches per forward from the forward context: when the context's ``cudagraph_runtime_mode`` is this
wrapper's mode, the first forward of a ``batch_descriptor`` captures (``adaptor.capture_graph``) and
every later one replays; any other mode runs the runnable eagerly. Replays must receive the very
buffers the capture read (the runner's static, padded input buffers): a different buffer is an error
here, not a silent read of stale memory; a buffer the runner forgot to refresh replays stale values,
exactly as a device graph would. A device graph also bakes in the forward context it was captured
under (attention metadata: sequence lengths, block tables, slots): replays run under the captured
context, so the runner must update that metadata's tensors in place before each replay, as on the NPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import (
    BatchDescriptor,
    ForwardContext,
    get_forward_context,
    is_forward_context_available,
    override_forward_context,
)

from vllm_ascend.core.device.config import get_device_adaptor


class GraphReplayError(RuntimeError):
    """A replay given other input buffers than its capture read."""


@dataclass
class GraphEntry:
    """One captured batch shape: the graph and the addresses of the tensors it read."""

    graph: Any
    context: ForwardContext
    input_addresses: list[int] = field(default_factory=list)


def _addresses(args: tuple[Any, ...]) -> list[int]:
    return [arg.data_ptr() for arg in args if isinstance(arg, torch.Tensor)]


class AscendGraphWrapper:
    """Capture per batch descriptor on first use, replay afterwards (see the module docstring)."""

    def __init__(
        self,
        runnable: Callable[..., Any],
        vllm_config: VllmConfig,
        runtime_mode: CUDAGraphMode,
        cudagraph_options: Any = None,
    ) -> None:
        if runtime_mode == CUDAGraphMode.NONE:
            raise ValueError("AscendGraphWrapper needs a graph runtime mode (FULL or PIECEWISE), got NONE")
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.cudagraph_options = cudagraph_options
        self.entries: dict[BatchDescriptor, GraphEntry] = {}
        self.captures = 0
        self.replays = 0

    def __getattr__(self, key: str) -> Any:
        runnable = self.__dict__.get("runnable")
        if runnable is not None and hasattr(runnable, key):
            return getattr(runnable, key)
        raise AttributeError(key)

    def unwrap(self) -> Callable[..., Any]:
        runnable = self.runnable
        return runnable.unwrap() if hasattr(runnable, "unwrap") else runnable

    def clear_graphs(self) -> None:
        self.entries.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        context = get_forward_context()
        mode, descriptor = context.cudagraph_runtime_mode, context.batch_descriptor
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode or descriptor is None:
            return self.runnable(*args, **kwargs)
        entry = self.entries.get(descriptor)
        if entry is None:
            graph = get_device_adaptor().capture_graph(self.runnable, args, kwargs)
            self.entries[descriptor] = GraphEntry(graph, context, _addresses(args))
            self.captures += 1
            return graph.output
        addresses = _addresses(args)
        if addresses != entry.input_addresses:
            raise GraphReplayError(
                f"graph for {descriptor} ({self.runtime_mode.name}) replayed with other input buffers than it "
                f"captured ({len(addresses)} tensors now, {len(entry.input_addresses)} at capture; addresses "
                "differ): the runner must pass its static buffers"
            )
        with override_forward_context(entry.context):  # what a device graph baked in at capture
            entry.graph.replay()
        self.replays += 1
        return entry.graph.output
