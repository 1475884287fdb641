"""V2 acceptance-estimator kernels (IRLS accumulation and refit, draft-logit statistics, prediction): the
Ascend Triton kernels (interpreter) against the torch references."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels._triton.v2 import spec_decode_acceptance_estimator as triton_impl
from vllm_ascend.kernels.v2 import spec_decode_acceptance_estimator as v2


def _clone(args: dict) -> dict:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _same(name: str, grid: tuple[int, ...], args: dict, floats: tuple[str, ...] = ()) -> dict:
    ref = _clone(args)
    getattr(v2, f"{name}_torch")(grid, **ref)
    getattr(triton_impl, name)(grid, **args)
    for key, value in args.items():
        if not isinstance(value, torch.Tensor):
            continue
        if key in floats:
            torch.testing.assert_close(value, ref[key], rtol=1e-5, atol=1e-5, equal_nan=True, msg=key)
        else:
            assert torch.equal(value, ref[key]), key
    return ref


@pytest.mark.parametrize(("num_reqs", "block_r"), [(0, 256), (1, 256), (6, 256), (21, 256), (12, 8)])
def test_accumulate(num_reqs: int, block_r: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    steps, max_reqs = 5, 24
    num_sampled = torch.randint(1, steps + 2, (num_reqs,), generator=g)
    num_logits = torch.clamp(num_sampled + torch.randint(0, 2, (num_reqs,), generator=g), max=steps + 1)
    args = {
        "info_ptr": torch.rand(steps, 3, generator=g),
        "grad_ptr": torch.randn(steps, 2, generator=g),
        "idx_mapping_ptr": torch.randperm(max_reqs, generator=g)[:num_reqs].to(torch.int32),
        "num_sampled_ptr": num_sampled.to(torch.int32),
        "num_rejected_ptr": (num_logits - num_sampled).to(torch.int32),
        "features_ptr": torch.randn(max_reqs, steps, generator=g) * 5,
        "features_stride": steps,
        "pred_ptr": torch.rand(max_reqs, steps, generator=g),
        "pred_stride": steps,
        "counts_ptr": torch.randint(0, 9, (steps,), generator=g).float(),
        "num_reqs": num_reqs,
        "BLOCK_R": block_r,
    }
    before = args["counts_ptr"].clone()
    ref = _same("accumulate", (steps,), args, floats=("info_ptr", "grad_ptr"))
    added = ref["counts_ptr"] - before
    assert int(added.sum()) <= min(num_reqs, block_r) * steps
    if num_reqs:
        assert added[0] > 0


def _irls_stats(g: torch.Generator, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Round statistics as the accumulation builds them (so the system is positive definite): per
    position, sums over observations of weight w = p (1 - p), feature f and residual r."""
    f = torch.randn(steps, 64, generator=g) * 3
    p = torch.rand(steps, 64, generator=g)
    w = p * (1 - p)
    r = (torch.rand(steps, 64, generator=g) < 0.6).float() - p
    info = torch.stack([(w * f * f).sum(1), (w * f).sum(1), w.sum(1)], dim=1)
    grad = torch.stack([(r * f).sum(1), r.sum(1)], dim=1)
    return info, grad, torch.full((steps,), 64.0)


@pytest.mark.parametrize("case", ["plain", "negative_slope", "empty_position", "nan"])
def test_refit(case: str) -> None:
    g = torch.Generator().manual_seed(len(case))
    steps = 5
    info, grad, counts = _irls_stats(g, steps)
    slope = torch.tensor([0.5])
    grad[:, 0] = grad[:, 0].abs() + 10.0  # a positive slope step
    if case == "negative_slope":
        slope[0] = 0.01
        grad[:, 0] = -100.0
    if case == "empty_position":
        info[2] = 0.0
        counts[2] = 0.0
    if case == "nan":
        grad[1, 1] = float("nan")
    args = {
        "slope_ptr": slope,
        "intercepts_ptr": torch.randn(steps, generator=g),
        "info_ptr": info,
        "info_row_stride": 3,
        "grad_ptr": grad,
        "grad_row_stride": 2,
        "counts_ptr": counts,
        "NUM_SPECULATIVE_STEPS": steps,
        "L2": 1e-3,
        "DAMPING": 50.0,
        "BLOCK": 8,
    }
    before = args["slope_ptr"].clone()
    ref = _same("refit", (1,), args, floats=("slope_ptr", "intercepts_ptr"))
    assert (ref["info_ptr"] == 0).all() and (ref["grad_ptr"] == 0).all() and (ref["counts_ptr"] == 0).all()
    if case in ("negative_slope", "nan"):
        assert torch.equal(ref["slope_ptr"], before)
    else:
        assert not torch.equal(ref["slope_ptr"], before)
    assert not ref["intercepts_ptr"].isnan().any()


def _stats_args(g: torch.Generator, num_tokens: int, vocab: int, block: int, idx_stride: int) -> dict:
    max_reqs = 6
    blocks = (vocab + block - 1) // block
    logits = torch.randn(num_tokens, vocab, generator=g) * 3
    if num_tokens:
        logits[0, 3] = 300.0  # a one-hot row
    idx = torch.randint(0, max_reqs, (num_tokens, idx_stride), generator=g, dtype=torch.int32)
    if num_tokens > 2:
        idx[2, 0] = -1  # a padded row
    temp = torch.rand(max_reqs, generator=g) + 0.5
    temp[0] = 0.0
    return {
        "local_max_ptr": torch.full((num_tokens + 1, blocks), 7.0),
        "local_max_stride": blocks,
        "local_sumexp_ptr": torch.full((num_tokens + 1, blocks), 7.0),
        "local_sumexp_stride": blocks,
        "logits_ptr": logits,
        "logits_stride": vocab,
        "idx_mapping_ptr": idx if idx_stride > 1 else idx[:, 0].contiguous(),
        "idx_mapping_stride": idx_stride,
        "temperature_ptr": temp,
        "num_tokens": num_tokens,
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }


@pytest.mark.parametrize(
    ("num_tokens", "idx_stride", "vocab"), [(0, 1, 37), (1, 1, 37), (5, 1, 70), (7, 2, 33)]
)
def test_local_max_sumexp(num_tokens: int, idx_stride: int, vocab: int) -> None:
    g = torch.Generator().manual_seed(num_tokens)
    args = _stats_args(g, num_tokens, vocab, 32, idx_stride)
    blocks = args["local_max_stride"]
    ref = _same("local_max_sumexp", (num_tokens + 1, blocks), args, floats=("local_sumexp_ptr",))
    assert (ref["local_max_ptr"][num_tokens] == 7.0).all()
    if num_tokens > 2:
        assert (ref["local_max_ptr"][2] == float("-inf")).all() and (ref["local_sumexp_ptr"][2] == 0).all()


@pytest.mark.parametrize(("num_tokens", "per_token_step"), [(1, False), (4, False), (6, True), (12, True)])
def test_predict(num_tokens: int, per_token_step: bool) -> None:
    g = torch.Generator().manual_seed(40 + num_tokens)
    steps, max_reqs = 3, 8
    stats = _stats_args(g, num_tokens, 70, 32, 1)
    blocks = stats["local_max_stride"]
    v2.local_max_sumexp_torch((num_tokens, blocks), **stats)
    batches = num_tokens // steps if per_token_step else num_tokens
    if per_token_step:
        step = torch.arange(num_tokens, dtype=torch.int64) % steps
        idx = torch.randperm(max_reqs, generator=g)[:batches].to(torch.int32).repeat_interleave(steps)
    else:
        step = torch.tensor(num_tokens % steps, dtype=torch.int64)
        idx = torch.randperm(max_reqs, generator=g)[:batches].to(torch.int32)
    if num_tokens > 1:
        idx[1] = -1
    args = {
        "features_ptr": torch.full((max_reqs, steps), -9.0),
        "features_stride": steps,
        "pred_ptr": torch.full((max_reqs, steps), -9.0),
        "pred_stride": steps,
        "conf_ptr": torch.full((batches + 1, steps + 1), -9.0),
        "conf_stride": steps + 1,
        "slope_ptr": torch.tensor([0.7]),
        "intercepts_ptr": torch.randn(steps, generator=g),
        "local_max_ptr": stats["local_max_ptr"],
        "local_max_stride": blocks,
        "local_sumexp_ptr": stats["local_sumexp_ptr"],
        "local_sumexp_stride": blocks,
        "idx_mapping_ptr": idx,
        "idx_mapping_stride": 1,
        "step_ptr": step,
        "num_tokens": num_tokens,
        "vocab_num_blocks": blocks,
        "per_token_step": per_token_step,
        "NUM_SPECULATIVE_STEPS": steps,
        "MAX_LOG_ODDS": 40.0,
        "PADDED_VOCAB_NUM_BLOCKS": 1 << (blocks - 1).bit_length(),
    }
    ref = _same("predict", (num_tokens + 2,), args, floats=("features_ptr", "pred_ptr", "conf_ptr"))
    assert int((ref["features_ptr"] != -9.0).sum()) == int((idx >= 0).sum())
    written = ref["pred_ptr"][ref["pred_ptr"] != -9.0]
    assert ((written > 0) & (written <= 1)).all()
