"""Captured device graphs: what the runner replays instead of launching every kernel.

A :class:`CapturedGraph` holds the output tensors of one capture and ``replay()``, which recomputes
them in place from the tensors the capture read. The contract is the hardware's: a replay reads only
the buffers that were live at capture (static inputs) and writes only the captured outputs, so a
caller must copy each step's inputs into those buffers before ``replay()`` and read the outputs
after it.

- On an NPU the graph is ``torch.npu.NPUGraph`` captured under ``torch.npu.graph`` (the kernels are
  recorded once and relaunched).
- On the reference device ``ReferenceGraph`` (``vllm_ascend.kernels.device.graph``) records the callable with the exact argument objects
  of the capture; ``replay()`` calls it again on those same objects and copies the results into the
  captured outputs. It reads nothing the caller passes later, so a runner that forgets to refresh a
  static buffer replays stale values here exactly as it would on the device.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_flatten


class CapturedGraph(Protocol):
    """One capture: ``output`` (the tensors the capture returned) and ``replay()``."""

    output: Any

    def replay(self) -> None:
        """Recompute ``output`` in place from the capture's static inputs."""


class GraphCaptureError(RuntimeError):
    """A capture whose output cannot be replayed in place (not made of tensors and sizes)."""


def captured_tensors(output: Any) -> list[torch.Tensor]:
    """The output's tensors. Int leaves are allowed: sizes a compiled piece hands the next one (e.g. a token
    count times a LoRA rank), fixed for the captured batch shape; anything else is refused."""
    leaves, _ = tree_flatten(output)
    kinds = sorted(
        {
            type(leaf).__name__
            for leaf in leaves
            if leaf is not None and not isinstance(leaf, torch.Tensor | int)
        }
    )
    if kinds:
        raise GraphCaptureError(
            f"a captured callable must return tensors and int sizes (or containers of them); got {kinds}"
        )
    return [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
