"""vLLM's GPU code paths on the target device: ``torch.cuda`` streams/events come from the adaptor.

vLLM's GPU worker and model runner call ``torch.cuda.Stream``, ``torch.Event`` and friends
directly. While that code runs, these names are bound to the device adaptor's ``stream_api()``
(torch_npu's streams on an NPU, synchronous stand-ins on the reference device).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vllm_ascend.core.sdk import get_device_adaptor

TENSOR_PREFIX = "Tensor."


@contextmanager
def torch_device_wrapper() -> Iterator[None]:
    """Map ``torch.cuda`` streams/events and ``torch.Event`` onto the target while vLLM code runs; entries
    named ``Tensor.<method>`` replace that tensor method (``record_stream`` on the reference device, whose
    streams order nothing)."""
    api = get_device_adaptor().stream_api()
    cuda_api = {name: value for name, value in api.items() if not name.startswith(TENSOR_PREFIX)}
    tensor_api = {
        name[len(TENSOR_PREFIX) :]: value for name, value in api.items() if name.startswith(TENSOR_PREFIX)
    }
    saved_cuda = {name: getattr(torch.cuda, name) for name in cuda_api}
    saved_tensor = {name: getattr(torch.Tensor, name) for name in tensor_api}
    saved_event = torch.Event
    try:
        for name, value in cuda_api.items():
            setattr(torch.cuda, name, value)
        for name, value in tensor_api.items():
            setattr(torch.Tensor, name, value)
        torch.Event = api["Event"]  # type: ignore[misc]
        yield
    finally:
        for name, value in saved_cuda.items():
            setattr(torch.cuda, name, value)
        for name, value in saved_tensor.items():
            setattr(torch.Tensor, name, value)
        torch.Event = saved_event  # type: ignore[misc]
