"""Warm-up: run every kernel once per compile-time variant a serving step can hit, before serving.

Triton compiles a kernel per combination of ``tl.constexpr`` values (block sizes derived from the
vocabulary size, dtypes, optional inputs present or absent). Compiling them inside the first real
step stalls it, and on Ascend would happen during graph capture. Each warm-up item runs in
isolation: a failure is logged with its name and the rest continue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch

from vllm_ascend.core.logger import init_logger

logger = init_logger(__name__)

WarmupFn = Callable[[torch.device, int, Sequence[torch.dtype]], None]
_REGISTERED: dict[str, WarmupFn] = {}


def register_warmup(name: str, fn: WarmupFn) -> None:
    """Add a warm-up item ``fn(device, vocab_size, dtypes)`` (e.g. a sibling's rejection or qk-rms kernels).

    Re-registering a name replaces the earlier function (extensions may load more than once).
    """
    _REGISTERED[name] = fn


def _logits(rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(rows, vocab, device=device).to(dtype)


def _batch_sizes(device: torch.device) -> tuple[int, ...]:
    """Row counts that reach every tile variant: the Triton wrappers pick larger tiles for small
    batches (compiled separately) and split the rows of batches smaller than the multiprocessor
    count over several programs (min-p compiles a separate unsplit kernel); the interpreter and the
    references have one variant."""
    from vllm_ascend.kernels._backend import use_triton

    if not use_triton(device):
        return (2,)
    from vllm_ascend.kernels._triton.common import IS_INTERPRETED, SMALL_BATCH_ROWS, multiprocessors

    if IS_INTERPRETED:
        return (2,)
    return tuple(
        sorted(
            {2, min(multiprocessors(device), SMALL_BATCH_ROWS), SMALL_BATCH_ROWS + 1, multiprocessors(device)}
        )
    )


def sampling_warmup(device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
    """Temperature, Gumbel (with and without temperature, greedy and random rows), min-p,
    top-k/top-p (k only, p only, both), token and top-k logprobs, for every tile variant."""
    from vllm_ascend import kernels as K

    for rows in _batch_sizes(device):
        temp = torch.linspace(0.0, 1.0, rows, device=device)
        seeds = torch.arange(rows, device=device, dtype=torch.int64)
        pos = torch.zeros(rows, device=device, dtype=torch.int64)
        ids = torch.randint(0, vocab_size, (rows,), device=device, dtype=torch.int64)
        k = torch.randint(1, 50, (rows,), device=device, dtype=torch.int32)
        p = torch.linspace(0.5, 0.95, rows, device=device)
        for dtype in dtypes:
            K.apply_temperature(_logits(rows, vocab_size, dtype, device), temp)
            for scale in (True, False):
                K.gumbel_sample(_logits(rows, vocab_size, dtype, device), temp, seeds, pos, scale)
            K.apply_min_p(_logits(rows, vocab_size, dtype, device), p)
            for kk, pp in ((k, None), (None, p), (k, p)):
                K.apply_top_k_top_p(_logits(rows, vocab_size, dtype, device), kk, pp)
            K.compute_token_logprobs(_logits(rows, vocab_size, dtype, device), ids)
            K.compute_topk_logprobs(_logits(rows, vocab_size, dtype, device), 2, ids)


def penalties_warmup(device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
    """Penalties (bincount + apply) and bad-words kernels, on a short dummy token history."""
    from vllm_ascend import kernels as K

    rows = 2
    history = torch.randint(0, vocab_size, (rows, 8), device=device, dtype=torch.int64)
    pen = torch.tensor([1.2, 1.0], device=device)
    freq = torch.tensor([0.1, 0.0], device=device)
    words = torch.tensor([history[0, -1].item(), 1], device=device, dtype=torch.int64)
    offsets = torch.tensor([0, 2], device=device, dtype=torch.int64)
    word_rows = torch.tensor([0], device=device, dtype=torch.int64)
    lens = torch.full((rows,), 8, device=device, dtype=torch.int64)
    for dtype in dtypes:
        K.apply_penalties(
            _logits(rows, vocab_size, dtype, device), history[:, :4], history[:, 4:], pen, freq, freq
        )
        K.apply_bad_words(_logits(rows, vocab_size, dtype, device), history, lens, words, offsets, word_rows)


def _run(
    name: str, fn: WarmupFn, device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]
) -> bool:
    try:
        fn(device, vocab_size, dtypes)
    except Exception:
        logger.warning("kernel warm-up %r failed; its kernels will compile on first use", name, exc_info=True)
        return False
    return True


def kernel_warmup(
    device: torch.device | str,
    vocab_size: int,
    dtypes: Iterable[torch.dtype] = (torch.float32,),
    include: Iterable[str] | None = None,
) -> dict[str, bool]:
    """Run the built-in and registered warm-up items on ``device``; returns ``{name: succeeded}``.

    ``vocab_size`` fixes the block-size constexprs of the vocabulary kernels; ``dtypes`` are the
    logits dtypes the sampler will see; ``include`` restricts to the named items.
    """
    device = torch.device(device)
    dtypes = tuple(dtypes)
    items: dict[str, WarmupFn] = {"sampling": sampling_warmup, "penalties": penalties_warmup, **_REGISTERED}
    wanted = set(items) if include is None else set(include)
    unknown = wanted - set(items)
    if unknown:
        raise ValueError(f"unknown warm-up items {sorted(unknown)}; known: {sorted(items)}")
    return {name: _run(name, fn, device, vocab_size, dtypes) for name, fn in items.items() if name in wanted}
