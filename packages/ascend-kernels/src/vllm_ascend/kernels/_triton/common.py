"""Shared Triton helpers: interpreter detection, block-size choice, the 32-bit hash."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_ascend.kernels import _geometry


def vocab_block(vocab_size: int, cap: int = 8192) -> int:
    """Power-of-two tile over the vocabulary (smaller under the interpreter, which is slow)."""
    return min(triton.next_power_of_2(vocab_size), 1024 if IS_INTERPRETED else cap)


#: fp32 tiles a vocabulary kernel holds at once (loaded, upcast, derived, result): sizes tiles to the UB.
LIVE_TILES = 4


def ub_cap(device: torch.device, cap: int, live_tiles: int = LIVE_TILES) -> int:
    """``cap`` lowered until ``live_tiles`` fp32 tiles fit the device's unified buffer (Ascend; unchanged on
    CUDA and under the interpreter, which have no such bound)."""
    return _geometry.geometry(device).max_block(4, live_tiles, cap)


LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x * LOG2E): folds the scale into an FMA
ROW_WARPS = 16
SMALL_BATCH_ROWS = 128  # up to this many rows, per-row kernels use larger tiles (see row_block callers)


def row_block(vocab_size: int, cap: int = 2048) -> int:
    """Tile of the one-program-per-row kernels (``cap`` tuned per kernel on an H200).

    Those kernels loop over their row and load tile ``i + 1`` before working on tile ``i``: with one
    program per row, the loads in flight per program, not the number of programs, bound bandwidth.
    """
    return min(triton.next_power_of_2(vocab_size), 256 if IS_INTERPRETED else cap)


PROGRAMS_PER_SM = 4  # split kernels on CUDA: aim for this many programs per multiprocessor (H200-tuned)


def cores(device: torch.device) -> int:
    """SMs (CUDA) or vector cores (Ascend) of ``device``, from its launch geometry: sizes the row splits."""
    return _geometry.geometry(device).cores


def row_split(rows: int, vocab: int, block: int, device: torch.device, per_sm: int = 0) -> tuple[int, int]:
    """``(chunks, chunk)``: split each row into ``chunks`` ranges of ``chunk`` elements (a multiple of
    ``block``) so that ``rows * chunks`` programs fill the device; ``chunks == 1`` for large batches.

    With one program per row, a batch of 64 busies 64 multiprocessors of an H200's 132 and each
    program is latency-bound; splitting the row and combining per-chunk partials fixes both. The
    program count comes from the device's geometry (8 under the interpreter, so that the small test
    shapes take both paths)."""
    target = _geometry.geometry(device).split_programs(per_sm or PROGRAMS_PER_SM)
    tiles = triton.cdiv(vocab, block)
    chunks = max(1, min(tiles, triton.cdiv(target, max(rows, 1))))
    chunk = triton.cdiv(tiles, chunks) * block
    return triton.cdiv(vocab, chunk), chunk


def vector(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` per 16-byte load."""
    return 16 // dtype.itemsize


def slot_shape(tile: int, warps: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """``(A, NG, V)`` of a ``[A, NG, V]`` tile of ``tile`` elements (see :func:`slots`): ``V`` per
    16-byte load, ``NG`` one slot per thread (fewer under the interpreter)."""
    v = vector(dtype)
    ng = 8 if IS_INTERPRETED else 32 * warps
    return max(1, tile // (ng * v)), ng, v


@triton.jit
def slots(A: tl.constexpr, NG: tl.constexpr, V: tl.constexpr):
    """Offsets of a ``[A, NG, V]`` tile: slot ``g`` (one thread) holds ``A`` vectors of ``V`` elements
    ``NG * V`` apart, so each load is coalesced across the slots and a reduction over axes 0 and 2
    (one value per slot) stays inside its thread: no shuffles, no barriers."""
    a = tl.arange(0, A)[:, None, None]
    return (a * NG + tl.arange(0, NG)[None, :, None]) * V + tl.arange(0, V)[None, None, :]


_scratch: dict[tuple[str, torch.device, torch.dtype], torch.Tensor] = {}


def scratch(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A cached buffer of at least ``numel`` elements for per-chunk partials (saves an allocation
    per call). Shared per device: the kernels using it must not run concurrently on two streams."""
    key = (name, device, dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(max(numel, 4096), dtype=dtype, device=device)
        _scratch[key] = buf
    return buf


def counters(name: str, rows: int, device: torch.device) -> torch.Tensor:
    """A cached zeroed int32 buffer of one counter per row for :func:`last_chunk`; every launch that
    uses it leaves it zeroed. Shared per device like :func:`scratch`."""
    key = (name, device, torch.int32)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < rows:
        buf = torch.zeros(max(rows, 4096), dtype=torch.int32, device=device)
        _scratch[key] = buf
    return buf


@triton.jit
def last_chunk(counter_ptr, row, num_chunks):
    """Whether this program is the last of its row's ``num_chunks`` to finish: it then sees every
    partial the others stored before their own call (release/acquire on the counter) and combines
    them, so a split row needs no second launch. The last program resets the counter."""
    tl.debug_barrier()  # the partial stores of every thread precede the release
    last = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel") == num_chunks - 1
    if last:
        tl.atomic_xchg(counter_ptr + row, 0)
    return last


@triton.jit
def hash32(x):
    """The 32-bit mixer of ``vllm_ascend.kernels.gumbel`` (wrapping ``uint32`` arithmetic)."""
    x = x.to(tl.uint32)
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


# ``triton.jit`` returns an interpreter wrapper instead of a JITFunction under TRITON_INTERPRET=1.
IS_INTERPRETED = not isinstance(hash32, triton.runtime.JITFunction)


def check_logits(logits) -> None:
    """The vocabulary kernels need a 2-D tensor whose rows are contiguous."""
    if logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise ValueError(
            f"expected [B, V] logits with contiguous rows, got shape {tuple(logits.shape)} stride {logits.stride()}"
        )
