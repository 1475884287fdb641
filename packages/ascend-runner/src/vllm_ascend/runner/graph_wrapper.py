"""ACLGraphWrapper: vLLM's static-graph wrapper on the device adaptor's captured graphs.

vLLM wraps a runnable (the whole model for FULL graphs, each compiled piece for PIECEWISE) and
dispatches per forward from the forward context: when the context's ``cudagraph_runtime_mode`` is this
wrapper's mode, the first forward of a ``batch_descriptor`` captures (``adaptor.capture_graph``) and
every later one replays; any other mode runs the runnable eagerly. Replays must receive the very
buffers the capture read (the runner's static, padded input buffers): a different buffer is an error
here, not a silent read of stale memory; a buffer the runner forgot to refresh replays stale values,
exactly as a device graph would.

A device graph also bakes in the forward context it was captured under (attention metadata: sequence
lengths, block tables, slots): replays run under the captured context. Before a FULL replay the wrapper
performs the attention-parameter update (``update_full_graph_params``): every captured metadata object
that has ``update_for_replay`` takes the step's values into its own tensors, in place (on the NPU the
fused-attention task's host arguments are rebound the same way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.distributed.parallel_state import GraphCaptureContext
from vllm.forward_context import (
    BatchDescriptor,
    ForwardContext,
    get_forward_context,
    is_forward_context_available,
    override_forward_context,
)

from vllm_ascend.core.sdk import captured_tensors, get_device_adaptor


class GraphReplayError(RuntimeError):
    """A replay given other input buffers than its capture read, or metadata it cannot take."""


@dataclass
class GraphEntry:
    """One captured batch shape: the graph, the context it baked in, the addresses of the tensors it read."""

    graph: Any
    context: ForwardContext
    input_addresses: list[int] = field(default_factory=list)


def _addresses(args: tuple[Any, ...]) -> list[int]:
    return [arg.data_ptr() for arg in args if isinstance(arg, torch.Tensor)]


def _metadata_pairs(captured: Any, current: Any) -> Iterator[tuple[Any, Any]]:
    """(captured, current) attention metadata per layer, for dict or per-microbatch list layouts."""
    if isinstance(captured, dict) and isinstance(current, dict):
        for name, meta in captured.items():
            yield meta, current.get(name)
    elif isinstance(captured, list) and isinstance(current, list):
        for cap, cur in zip(captured, current, strict=True):
            yield from _metadata_pairs(cap, cur)


def update_full_graph_params(captured: ForwardContext, current: ForwardContext) -> int:
    """The attention-parameter update before a FULL replay: each captured metadata object (shared ones
    once) takes the step's sequence lengths, block table and slots in place. Returns how many did."""
    done: set[int] = set()
    for cap, cur in _metadata_pairs(captured.attn_metadata, current.attn_metadata):
        if id(cap) in done or not hasattr(cap, "update_for_replay"):
            continue
        if cur is None:
            raise GraphReplayError("a captured attention layer has no metadata in the replayed step")
        cap.update_for_replay(cur)
        done.add(id(cap))
    return len(done)


class ACLGraphWrapper(CUDAGraphWrapper):
    """Capture per batch descriptor on first use, replay afterwards (see the module docstring).

    A :class:`CUDAGraphWrapper` to vLLM (its runner unwraps and clears graphs through that type), with
    the capture and replay of the device adaptor instead of CUDA's."""

    def __init__(
        self,
        runnable: Callable[..., Any],
        vllm_config: VllmConfig,
        runtime_mode: CUDAGraphMode,
        cudagraph_options: Any = None,
    ) -> None:
        if runtime_mode == CUDAGraphMode.NONE:
            raise ValueError("ACLGraphWrapper needs a graph runtime mode (FULL or PIECEWISE), got NONE")
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.cudagraph_options = cudagraph_options
        self.entries: dict[BatchDescriptor, GraphEntry] = {}
        self.captures = 0
        self.replays = 0
        CUDAGraphWrapper._all_instances.add(self)

    def __getattr__(self, key: str) -> Any:
        runnable = self.__dict__.get("runnable")
        if runnable is not None and hasattr(runnable, key):
            return getattr(runnable, key)
        raise AttributeError(key)

    def unwrap(self) -> Callable[..., Any]:
        return self.runnable

    def clear_graphs(self) -> None:
        self.entries.clear()

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The adaptor's capture; with sleep mode, the graph's memory is the tagged pool's ``graph`` regions."""
        adaptor = get_device_adaptor()
        model_config = self.vllm_config.model_config
        if model_config is None or not model_config.enable_sleep_mode:
            return adaptor.capture_graph(self.runnable, args, kwargs)
        pool = adaptor.memory_pool()
        with pool.use_memory_pool("graph"):
            graph = adaptor.capture_graph(self.runnable, args, kwargs, pool=pool.graph_pool_handle())
        # Outputs a device made outside the scope (compiled code's own allocations on the host) join the graph's
        # regions; those sharing an input's memory stay where they are (the inputs' addresses are the contract).
        leaves = tree_flatten((args, kwargs))[0]
        inputs = {t.untyped_storage().data_ptr() for t in leaves if isinstance(t, torch.Tensor)}
        pool.adopt(
            "graph",
            [t for t in captured_tensors(graph.output) if t.untyped_storage().data_ptr() not in inputs],
        )
        return graph

    def refresh_attention_params(self, captured: ForwardContext, current: ForwardContext) -> None:
        """FULL graphs read attention metadata captured with them: bring it up to this step."""
        if self.runtime_mode == CUDAGraphMode.FULL:
            update_full_graph_params(captured, current)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        context = get_forward_context()
        mode, descriptor = context.cudagraph_runtime_mode, context.batch_descriptor
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode or descriptor is None:
            return self.runnable(*args, **kwargs)
        entry = self.entries.get(descriptor)
        if entry is None:
            graph = self._capture(args, kwargs)
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
        self.refresh_attention_params(entry.context, context)
        with override_forward_context(entry.context):  # what a device graph baked in at capture
            entry.graph.replay()
        self.replays += 1
        return entry.graph.output


@contextmanager
def device_graph_capture(device: torch.device) -> Iterator[GraphCaptureContext]:
    """vLLM's ``graph_capture`` for the device adaptor: captures run on a side stream of the device (the
    adaptor's stream API, installed by ``torch_device_wrapper``). Process groups need nothing around a capture
    here: collectives inside captured pieces are the device communicator's ops, recorded like any other."""
    stream = torch.cuda.Stream(device=device)
    current = torch.cuda.current_stream()
    if current != stream:
        stream.wait_stream(current)
    with torch.cuda.stream(stream):
        yield GraphCaptureContext(stream)


def release_captured_graphs(vllm_config: VllmConfig) -> int:
    """Drop the graphs the wrappers of ``vllm_config``'s engine captured (their device memory pools go with
    them); each is captured again on its first use. Returns how many were dropped."""
    dropped = 0
    for wrapper in list(CUDAGraphWrapper._all_instances):
        if isinstance(wrapper, ACLGraphWrapper) and wrapper.vllm_config is vllm_config:
            dropped += len(wrapper.entries)
            wrapper.clear_graphs()
    return dropped
