"""A warm-up item whose second launch depends on a value its first launch writes: the variant it
needs is known only once the first kernel has really run (a host read of a result). Imported by
the compile workers by module name, so it lives in a module of its own."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _fill_kernel(x_ptr, n, VALUE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.full([BLOCK], VALUE, tl.float32), mask=offs < n)


def fill(x: torch.Tensor, *args: object) -> None:
    """What a launch of ``_fill_kernel`` does (the stand-in device's effect)."""
    x.fill_(float(args[1]))  # type: ignore[arg-type]


def chain_warmup(device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
    """Fill with 3, then fill with 1 using a tile of ``16 * x[0]`` rounded up: 64 after a real first
    launch, 16 when the first launch was held back (its output left at 0)."""
    x = torch.zeros(16, device=device)
    _fill_kernel[(1,)](x, 16, VALUE=3, BLOCK=16)
    block = max(16, triton.next_power_of_2(16 * int(x[0].item())))
    _fill_kernel[(1,)](x, 16, VALUE=1, BLOCK=block)
