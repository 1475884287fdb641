"""The captured-graph contract on the reference device: a replay reads only the capture's buffers and
writes only the captured outputs, so a stale static input gives a stale result, as on the device."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.core.device.adaptor.graph import GraphCaptureError
from vllm_ascend.kernels.device.graph import ReferenceGraph
from vllm_ascend.kernels.device.reference import ReferenceDeviceAdaptor


def _step(x: torch.Tensor, weight: torch.Tensor, *, bias: torch.Tensor) -> dict[str, torch.Tensor]:
    hidden = x @ weight + bias
    return {"hidden": hidden, "top": hidden.argmax(dim=-1)}


@pytest.fixture
def captured():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=gen)  # the static input buffer
    weight, bias = torch.randn(8, 16, generator=gen), torch.randn(16, generator=gen)
    graph = ReferenceDeviceAdaptor().capture_graph(_step, (x, weight), {"bias": bias})
    return graph, x, weight, bias, gen


def test_replay_recomputes_the_captured_outputs_in_place_from_the_static_buffers(captured):
    graph, x, weight, bias, gen = captured
    assert isinstance(graph, ReferenceGraph)
    hidden, top = graph.output["hidden"], graph.output["top"]
    torch.testing.assert_close(hidden, x @ weight + bias)
    new = torch.randn(4, 8, generator=gen)
    x.copy_(new)  # the runner writes this step's inputs into the static buffer
    graph.replay()
    assert graph.output["hidden"] is hidden and graph.output["top"] is top  # same tensors, new values
    torch.testing.assert_close(hidden, new @ weight + bias)
    assert torch.equal(top, (new @ weight + bias).argmax(dim=-1))
    assert graph.replays == 1


def test_a_stale_static_buffer_replays_the_stale_result(captured):
    graph, _, weight, bias, gen = captured
    before = graph.output["hidden"].clone()
    fresh = torch.randn(4, 8, generator=gen)  # an input the runner forgot to copy into ``x``
    graph.replay()
    torch.testing.assert_close(graph.output["hidden"], before)
    assert not torch.allclose(graph.output["hidden"], fresh @ weight + bias)


def test_outputs_must_be_tensors_and_sizes_and_keep_their_shapes():
    with pytest.raises(GraphCaptureError, match=r"must return tensors and int sizes.*\['str'\]"):
        ReferenceGraph(lambda: (torch.zeros(2), "3"), (), {})
    tokens = [2]
    sized = ReferenceGraph(lambda: (torch.zeros(tokens[0]), tokens[0] * 8), (), {})  # a piece's size output
    assert sized.output[1] == 16
    sized.replay()
    tokens[0] = 3
    with pytest.raises(GraphCaptureError, match=r"other shapes than the capture"):
        sized.replay()
    sizes_only = [16]
    graph_of_sizes = ReferenceGraph(lambda: (torch.zeros(2), sizes_only[0]), (), {})
    sizes_only[0] = 24
    with pytest.raises(GraphCaptureError, match=r"other sizes than the capture: \[24\] vs \[16\]"):
        graph_of_sizes.replay()
    size = [2]
    graph = ReferenceGraph(lambda: torch.zeros(size[0]), (), {})
    size[0] = 3
    with pytest.raises(GraphCaptureError, match=r"other shapes than the capture: \[\(3,\)\] vs \[\(2,\)\]"):
        graph.replay()
