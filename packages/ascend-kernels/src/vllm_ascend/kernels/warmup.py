"""Warm-up: run every kernel once per compile-time variant a serving step can hit, before serving.

Triton compiles a kernel per combination of ``tl.constexpr`` values (block sizes derived from the
vocabulary size, dtypes, optional inputs present or absent). Compiling them inside the first real
step stalls it, and on Ascend would happen during graph capture. Each warm-up item runs in
isolation: a failure is logged with its name and the rest continue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import Any

import torch

from vllm_ascend.core.sdk import init_logger

logger = init_logger(__name__)

WarmupFn = Callable[[torch.device, int, Sequence[torch.dtype]], None]
_REGISTERED: dict[str, WarmupFn] = {}


def register_warmup(name: str, fn: WarmupFn) -> None:
    """Add a warm-up item ``fn(device, vocab_size, dtypes)`` (e.g. a sibling package's own kernels).

    Re-registering a name replaces the earlier function (extensions may load more than once).
    """
    _REGISTERED[name] = fn


_recording: ContextVar[bool] = ContextVar("kernel_warmup_recording", default=False)


def _call(fn: Callable[..., object], *args: object) -> None:
    """One kernel call of a warm-up item. While specializations are only recorded, kernels return
    without writing their outputs, so a call may fail on the garbage a previous one left: the failure
    is skipped there so that the item's later calls are still recorded (its launch runs for real)."""
    if not _recording.get():
        fn(*args)
        return
    try:
        fn(*args)
    except Exception as exc:
        logger.debug("recording %s stopped at an unset output (%s)", getattr(fn, "__name__", fn), exc)


def _logits(rows: int, vocab: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(rows, vocab, device=device).to(dtype)


def _batch_sizes(device: torch.device) -> tuple[int, ...]:
    """Row counts that reach every compiled variant: the Triton wrappers pick larger tiles for batches
    of up to ``SMALL_BATCH_ROWS`` and split rows over several programs below the core count (SMs,
    Ascend vector cores) or, for top-k/top-p and top-k logprobs, below ``PROGRAMS_PER_SM`` programs
    per core. Batch-dependent integers are not specialized on and the split kernels read their chunk
    statistics with one tile width, so these few batches cover every other batch size. The
    interpreter and the references have one variant."""
    from vllm_ascend.kernels._backend import use_triton

    if not use_triton(device):
        return (2,)
    from vllm_ascend.kernels._geometry import geometry
    from vllm_ascend.kernels._triton.common import IS_INTERPRETED, PROGRAMS_PER_SM, SMALL_BATCH_ROWS, cores

    if IS_INTERPRETED:
        return (2,)
    unsplit = geometry(device).split_programs(PROGRAMS_PER_SM)
    return tuple(
        sorted({2, min(cores(device), SMALL_BATCH_ROWS), SMALL_BATCH_ROWS + 1, cores(device), unsplit})
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
            _call(K.apply_temperature, _logits(rows, vocab_size, dtype, device), temp)
            for scale in (True, False):
                _call(K.gumbel_sample, _logits(rows, vocab_size, dtype, device), temp, seeds, pos, scale)
            _call(K.apply_min_p, _logits(rows, vocab_size, dtype, device), p)
            for kk, pp in ((k, None), (None, p), (k, p)):
                _call(K.apply_top_k_top_p, _logits(rows, vocab_size, dtype, device), kk, pp)
            _call(K.compute_token_logprobs, _logits(rows, vocab_size, dtype, device), ids)
            _call(K.compute_topk_logprobs, _logits(rows, vocab_size, dtype, device), 2, ids)


def penalties_triton_warmup(device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
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
        _call(
            K.apply_penalties,
            _logits(rows, vocab_size, dtype, device),
            history[:, :4],
            history[:, 4:],
            pen,
            freq,
            freq,
        )
        _call(
            K.apply_bad_words,
            _logits(rows, vocab_size, dtype, device),
            history,
            lens,
            words,
            offsets,
            word_rows,
        )


def rejection_sampler_triton_warmup(
    device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]
) -> None:
    """Speculative-decoding verification: greedy (all-greedy batch and mixed), random, block and
    recovered-token sampling (with and without draft probabilities), entropy and synthetic, and the per-token expansion
    of float and integer request values, at the compiled draft-length variant every draft of up to
    ``MIN_SPEC`` tokens uses (target and draft probabilities are float32 whatever the logits' dtype)."""
    from vllm_ascend import kernels as K
    from vllm_ascend.kernels._triton.rejection import MIN_SPEC

    counts = torch.tensor([MIN_SPEC, 1], device=device)
    cu = counts.cumsum(0).to(torch.int32)
    n = int(counts.sum())
    draft = torch.randint(0, vocab_size, (n,), device=device, dtype=torch.int32)
    target = torch.softmax(torch.randn(n, vocab_size, device=device), -1)
    bonus = torch.zeros(2, device=device, dtype=torch.int32)
    uniform = torch.rand(n, device=device, dtype=torch.float64)
    inv_q = 1.0 / torch.empty(2, vocab_size, device=device).exponential_()
    is_greedy = torch.tensor([True, False], device=device)
    out = torch.full((2, MIN_SPEC + 1), K.PLACEHOLDER_TOKEN_ID, device=device, dtype=torch.int32)
    for greedy in (None, is_greedy):
        _call(K.rejection_greedy_sample, out, cu, draft, target.argmax(-1), bonus, greedy)
    for draft_probs in (None, target.flip(-1).contiguous()):
        recovered = K.sample_recovered_tokens(MIN_SPEC, cu, draft, draft_probs, target, inv_q)
        _call(
            K.rejection_random_sample,
            out,
            cu,
            draft,
            draft_probs,
            target,
            bonus,
            recovered,
            uniform,
            is_greedy,
        )
        _call(K.rejection_block_sample, out, cu, draft, draft_probs, target, bonus, uniform, inv_q, is_greedy)
    _call(K.rejection_entropy_sample, out, cu, draft, target, bonus, inv_q, is_greedy, 0.09, 0.3)
    rates = torch.full((MIN_SPEC,), 0.5, device=device)
    _call(K.rejection_synthetic_sample, out, cu, draft, draft, bonus, uniform, rates)
    for values in (torch.rand(2, device=device), counts.to(torch.int32), counts):
        _call(K.expand_batch_to_tokens, values, cu, n)


def triton_rms_warmup(device: torch.device, head_dim: int, dtypes: Sequence[torch.dtype]) -> None:
    """``triton_q_rms`` over ``[rows, head_dim]`` at every ``BLOCK_M`` variant a token count can
    select (on the reference path, one call per dtype)."""
    from vllm_ascend import kernels as K
    from vllm_ascend.kernels._backend import use_triton

    device = torch.device(device)
    row_counts: tuple[int, ...] = (2,)
    if use_triton(device):
        from vllm_ascend.kernels._triton.rms_norm import programs, rms_block_m_values

        row_counts = tuple(b * programs(device) for b in rms_block_m_values())
    for rows in row_counts:
        for dtype in dtypes:
            _call(K.triton_q_rms, torch.randn(rows, head_dim, device=device).to(dtype))


def _run(
    name: str, fn: WarmupFn, device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]
) -> bool:
    try:
        fn(device, vocab_size, dtypes)
    except Exception:
        logger.warning("kernel warm-up %r failed; its kernels will compile on first use", name, exc_info=True)
        return False
    return True


def _record(
    name: str, fn: WarmupFn, device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]
) -> None:
    """One item while specializations are only recorded: its kernels return nothing, so code after
    them may fail on unset outputs; the kernels recorded up to there are still compiled ahead."""
    try:
        fn(device, vocab_size, dtypes)
    except Exception as exc:
        logger.debug("recording warm-up %r stopped early (%s); the rest compiles in the warm-up", name, exc)


def _parallel(device: torch.device, workers: int | None) -> int:
    """Processes to compile with: 0 where there is nothing to compile ahead (torch references, the
    interpreter) or the Triton in use cannot record specializations."""
    from vllm_ascend.kernels import _precompile
    from vllm_ascend.kernels._backend import use_triton

    if workers is not None and (type(workers) is not int or workers < 1):
        raise ValueError(
            f"workers={workers!r} must be a positive int or None (the CPUs this process may use)"
        )
    if not use_triton(device):
        return 0
    from vllm_ascend.kernels._triton.common import IS_INTERPRETED

    if IS_INTERPRETED or not _precompile.supported():
        return 0
    count = _precompile.default_workers() if workers is None else workers
    return count if count > 1 else 0


def kernel_warmup(
    device: torch.device | str,
    vocab_size: int,
    dtypes: Iterable[torch.dtype] = (torch.float32,),
    include: Iterable[str] | None = None,
    head_dims: Iterable[int] = (),
    exclude: Iterable[str] = (),
    workers: int | None = None,
    stats: dict[str, Any] | None = None,
) -> dict[str, bool]:
    """Run the built-in and registered warm-up items on ``device``; returns ``{name: succeeded}``.

    ``vocab_size`` fixes the block-size constexprs of the vocabulary kernels; ``dtypes`` are the
    logits dtypes the sampler will see; ``include`` restricts to the named items and ``exclude``
    drops some (e.g. ``rejection`` without speculative decoding); ``head_dims`` (the head sizes of
    a model that uses ``triton_q_rms``) adds the ``qk_rms`` item. ``workers``: processes that compile
    the Triton variants ahead of the warm-up's launches (default: the CPUs this process may use;
    1 compiles serially in this process). ``stats``, if given, receives what happened: ``workers``,
    ``variants`` and ``kernels`` compiled ahead, ``variants_by_kernel``, and the seconds spent recording,
    compiling and launching (``record_s``, ``compile_s``, ``launch_s``).
    """
    from vllm_ascend.kernels.ngram import ngram_warmup

    device = torch.device(device)
    dtypes = tuple(dtypes)
    items: dict[str, WarmupFn] = {
        "sampling": sampling_warmup,
        "penalties": penalties_triton_warmup,
        "rejection": rejection_sampler_triton_warmup,
        "ngram": ngram_warmup,  # the n-gram drafter's kernel (speculative method "ngram_gpu")
    }
    dims = tuple(head_dims)
    if dims:

        def qk_rms(device: torch.device, vocab_size: int, dtypes: Sequence[torch.dtype]) -> None:
            for head_dim in dims:
                triton_rms_warmup(device, head_dim, dtypes)

        items["qk_rms"] = qk_rms
    items.update(_REGISTERED)
    skipped = set(exclude)
    wanted = set(items) if include is None else set(include)
    unknown = (wanted | skipped) - set(items)
    if unknown:
        raise ValueError(f"unknown warm-up items {sorted(unknown)}; known: {sorted(items)}")
    selected = {name: fn for name, fn in items.items() if name in wanted and name not in skipped}
    processes = _parallel(device, workers)
    if processes:
        from vllm_ascend.kernels import _precompile

        def record() -> None:
            token = _recording.set(True)
            try:
                for name, fn in selected.items():
                    _record(name, fn, device, vocab_size, dtypes)
            finally:
                _recording.reset(token)

        report = _precompile.precompile(record, processes)
        summary = report.summary()
        logger.info("Triton variants compiled ahead: %s", summary)
        if stats is not None:
            stats.update(summary, variants_by_kernel=dict(report.variants))
    start = time.perf_counter()
    results = {name: _run(name, fn, device, vocab_size, dtypes) for name, fn in selected.items()}
    if stats is not None:
        stats.setdefault("workers", 1)
        stats["launch_s"] = round(time.perf_counter() - start, 3)
    return results
