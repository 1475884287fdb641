"""ACLGraphWrapper dispatches like vLLM's CUDA-graph wrapper, on the reference device's graphs."""

from __future__ import annotations

import pytest
import torch
from vllm.config import CUDAGraphMode, VllmConfig
from vllm.forward_context import BatchDescriptor, set_forward_context

from vllm_ascend.runner.graph_wrapper import ACLGraphWrapper, GraphReplayError


class _Counted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(0)))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x @ self.weight


def _run(wrapper, x, mode, tokens):
    with set_forward_context(
        None, VllmConfig(), num_tokens=tokens, cudagraph_runtime_mode=mode,
        batch_descriptor=BatchDescriptor(num_tokens=tokens),
    ):  # fmt: skip
        return wrapper(x)


def test_capture_then_replay_on_the_static_buffer_and_eager_otherwise():
    module = _Counted()
    wrapper = ACLGraphWrapper(module, VllmConfig(), CUDAGraphMode.FULL)
    static = torch.zeros(4, 8)
    static.copy_(torch.ones(4, 8))
    first = _run(wrapper, static, CUDAGraphMode.FULL, 4)
    torch.testing.assert_close(first, torch.ones(4, 8) @ module.weight)
    assert (wrapper.captures, wrapper.replays) == (1, 0)

    step = torch.randn(4, 8)
    static.copy_(step)  # the runner writes the step's inputs into the captured buffer
    out = _run(wrapper, static, CUDAGraphMode.FULL, 4)
    assert out is first  # the captured output tensor, refreshed in place
    torch.testing.assert_close(out, step @ module.weight)
    assert (wrapper.captures, wrapper.replays) == (1, 1)

    eager = _run(wrapper, torch.randn(3, 8), CUDAGraphMode.NONE, 3)  # profile/eager steps bypass graphs
    assert eager.shape == (3, 8) and (wrapper.captures, wrapper.replays) == (1, 1)
    _run(wrapper, torch.randn(2, 8), CUDAGraphMode.PIECEWISE, 2)  # another wrapper's mode: eager here
    assert (wrapper.captures, wrapper.replays) == (1, 1)
    assert wrapper.weight is module.weight  # attributes reach the runnable


def test_a_stale_static_buffer_replays_stale_values_and_a_foreign_buffer_is_refused():
    module = _Counted()
    wrapper = ACLGraphWrapper(module, VllmConfig(), CUDAGraphMode.FULL)
    static = torch.ones(4, 8)
    captured = _run(wrapper, static, CUDAGraphMode.FULL, 4).clone()
    fresh = torch.randn(4, 8)  # the step's input, never copied into ``static``
    out = _run(wrapper, static, CUDAGraphMode.FULL, 4)
    torch.testing.assert_close(out, captured)
    assert not torch.allclose(out, fresh @ module.weight)
    with pytest.raises(GraphReplayError, match="replayed with other input buffers"):
        _run(wrapper, fresh, CUDAGraphMode.FULL, 4)
    with pytest.raises(ValueError, match="needs a graph runtime mode"):
        ACLGraphWrapper(module, VllmConfig(), CUDAGraphMode.NONE)


class _ReadsContext(torch.nn.Module):
    """Adds the forward context's ``attn_metadata["seq_lens"]`` (what attention would read)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        return x + get_forward_context().attn_metadata["seq_lens"]


def test_replay_reads_the_metadata_captured_with_it_updated_in_place():
    wrapper = ACLGraphWrapper(_ReadsContext(), VllmConfig(), CUDAGraphMode.FULL)
    static, seq_lens = torch.zeros(4), torch.tensor([1.0, 2.0, 3.0, 4.0])

    def run(metadata):
        with set_forward_context(
            metadata, VllmConfig(), num_tokens=4, cudagraph_runtime_mode=CUDAGraphMode.FULL,
            batch_descriptor=BatchDescriptor(num_tokens=4),
        ):  # fmt: skip
            return wrapper(static).clone()

    assert run({"seq_lens": seq_lens}).tolist() == [1, 2, 3, 4]
    # new metadata objects are not seen by a replay: only the captured tensors, updated in place, are
    assert run({"seq_lens": torch.full((4,), 9.0)}).tolist() == [1, 2, 3, 4]
    seq_lens += 10
    assert run({"seq_lens": torch.zeros(4)}).tolist() == [11, 12, 13, 14]
