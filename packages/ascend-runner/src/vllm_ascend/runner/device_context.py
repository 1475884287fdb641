"""One wrapper, two targets: vLLM's GPU code paths mapped onto the NPU or the reference device.

vLLM's GPU worker and model runner call ``torch.cuda.Stream``, ``torch.Event`` and
``torch.accelerator.*`` directly. On an NPU those map onto ``torch.npu`` (torch_npu is a real
accelerator); on the reference device (torch's cpu device, no accelerator) streams and events
become synchronous placeholders and cache/synchronize calls become no-ops, which is exactly
their meaning when every op completes before it returns.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from vllm_ascend.core.platform import NPUPlatform


class ReferenceEvent:
    """A completed-on-creation event: work on the cpu device is synchronous."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded = False

    def record(self, stream: Any = None) -> None:
        self.recorded = True

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait(self, stream: Any = None) -> None:
        return None


class ReferenceStream:
    """A stream on the cpu device: every op has finished before the next is issued."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.device = torch.device("cpu")

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, event: ReferenceEvent | None = None) -> ReferenceEvent:
        event = event or ReferenceEvent()
        event.record()
        return event


@contextmanager
def _reference_stream_context(stream: Any = None) -> Iterator[None]:
    yield


def _stream_api() -> dict[str, Any]:
    """The ``torch.cuda`` stream/event API of the active target."""
    if NPUPlatform.is_reference():
        return {
            "Stream": ReferenceStream,
            "Event": ReferenceEvent,
            "current_stream": lambda device=None: ReferenceStream(),
            "stream": _reference_stream_context,
        }
    npu = torch.npu  # type: ignore[attr-defined]
    return {
        "Stream": npu.Stream,
        "Event": npu.Event,
        "current_stream": npu.current_stream,
        "stream": npu.stream,
    }


@contextmanager
def torch_device_wrapper() -> Iterator[None]:
    """Map ``torch.cuda`` streams/events and ``torch.Event`` onto the target while vLLM code runs."""
    api = _stream_api()
    saved_cuda = {name: getattr(torch.cuda, name) for name in api}
    saved_event = torch.Event
    try:
        for name, value in api.items():
            setattr(torch.cuda, name, value)
        torch.Event = api["Event"]  # type: ignore[misc]
        yield
    finally:
        for name, value in saved_cuda.items():
            setattr(torch.cuda, name, value)
        torch.Event = saved_event  # type: ignore[misc]


def _synchronize(*args: Any, **kwargs: Any) -> None:
    return None


def _empty_cache(*args: Any, **kwargs: Any) -> None:
    # Distinct from _synchronize: Dynamo keys its handling of these calls on object identity.
    return None


def _empty_host_cache(*args: Any, **kwargs: Any) -> None:
    return None


def install_accelerator_shims() -> None:
    """Make vLLM's direct ``torch.accelerator`` cache/sync calls harmless on the reference device.

    On an NPU torch_npu registers a real accelerator, so nothing is replaced.
    """
    if not NPUPlatform.is_reference() or torch.accelerator.is_available():
        return
    torch.accelerator.synchronize = _synchronize
    torch.accelerator.empty_cache = _empty_cache
    if hasattr(torch.accelerator, "empty_host_cache"):
        torch.accelerator.empty_host_cache = _empty_host_cache


def synchronize() -> None:
    """Wait for the device (a no-op on the reference device)."""
    if not NPUPlatform.is_reference():
        torch.npu.synchronize()  # type: ignore[attr-defined]
