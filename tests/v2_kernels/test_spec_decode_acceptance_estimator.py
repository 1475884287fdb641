"""V2 acceptance-estimator overrides (IRLS accumulation and refit, draft-logit statistics, prediction)
against vLLM's own kernels (run in Triton's interpreter)."""

from __future__ import annotations

import pytest
import torch

from vllm_ascend.kernels.v2 import spec_decode_acceptance_estimator as v2

from .vllm_oracle import clone_args, vllm_kernel

_VLLM = "vllm.v1.worker.gpu.spec_decode.acceptance_estimator"


def _check(kernel: str, grid: tuple[int, ...], args: dict, floats: tuple[str, ...] = ()) -> dict:
    expected = clone_args(args)
    vllm_kernel(f"{_VLLM}._{kernel}_kernel")(grid, **expected)
    getattr(v2, f"{kernel}_torch")(grid, **args)
    for name, value in args.items():
        if not isinstance(value, torch.Tensor):
            continue
        if name in floats:
            torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)
        else:
            assert torch.equal(value, expected[name]), name
    return expected


@pytest.mark.parametrize(("seed", "num_reqs"), [(0, 5), (1, 1), (2, 0), (3, 7)])
def test_accumulate_matches_vllm(seed: int, num_reqs: int) -> None:
    g = torch.Generator().manual_seed(seed)
    steps, max_reqs = 4, 8
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
        "BLOCK_R": 256,
    }
    before = args["counts_ptr"].clone()
    out = _check("accumulate", (steps,), args, floats=("info_ptr", "grad_ptr"))
    if num_reqs:
        assert (out["counts_ptr"] > before).any()


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


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_refit_matches_vllm(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    steps = 3 if seed != 2 else 4
    info, grad, counts = _irls_stats(g, steps)
    slope = torch.tensor([0.5 if seed != 1 else 0.01])
    if seed == 1:
        grad[:, 0] = -100.0  # a slope step that would go negative: dropped
    if seed == 2:
        info[1] = 0.0  # an empty position: only the ridge
        counts[1] = 0.0
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
        "BLOCK": 1 << (steps - 1).bit_length(),
    }
    out = _check("refit", (1,), args, floats=("slope_ptr", "intercepts_ptr"))
    assert (out["info_ptr"] == 0).all() and (out["counts_ptr"] == 0).all()


def _stats_args(g: torch.Generator, num_tokens: int, vocab: int, block: int, idx_stride: int) -> dict:
    max_reqs = 6
    blocks = (vocab + block - 1) // block
    logits = torch.randn(num_tokens, vocab, generator=g) * 3
    if num_tokens:
        logits[0, 3] = 300.0  # a one-hot row: its log-odds clamp
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
        "idx_mapping_ptr": idx if idx_stride > 1 else idx[:, 0],
        "idx_mapping_stride": idx_stride,
        "temperature_ptr": temp,
        "num_tokens": num_tokens,
        "vocab_size": vocab,
        "BLOCK_SIZE": block,
    }


@pytest.mark.parametrize(("seed", "num_tokens", "idx_stride"), [(0, 5, 1), (1, 4, 2), (2, 1, 1)])
def test_local_max_sumexp_matches_vllm(seed: int, num_tokens: int, idx_stride: int) -> None:
    g = torch.Generator().manual_seed(seed)
    args = _stats_args(g, num_tokens, 37, 16, idx_stride)
    blocks = args["local_max_stride"]
    out = _check("local_max_sumexp", (num_tokens + 1, blocks), args, floats=("local_sumexp_ptr",))
    assert (out["local_max_ptr"][num_tokens] == 7.0).all()  # past num_tokens: untouched


@pytest.mark.parametrize(("seed", "per_token_step"), [(0, True), (1, False), (2, True)])
def test_predict_matches_vllm(seed: int, per_token_step: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    steps, max_reqs = 3, 6
    num_tokens = 6 if per_token_step else 4
    stats = _stats_args(g, num_tokens, 37, 16, 1)
    blocks = stats["local_max_stride"]
    expected = clone_args(stats)
    vllm_kernel(f"{_VLLM}._local_max_sumexp_kernel")((num_tokens, blocks), **expected)
    batches = num_tokens // steps if per_token_step else num_tokens
    if per_token_step:
        step = torch.arange(num_tokens, dtype=torch.int64) % steps
        idx = torch.randperm(max_reqs, generator=g)[:batches].to(torch.int32).repeat_interleave(steps)
    else:
        step = torch.tensor(seed % steps, dtype=torch.int64)
        idx = torch.randperm(max_reqs, generator=g)[:batches].to(torch.int32)
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
        "local_max_ptr": expected["local_max_ptr"],
        "local_max_stride": blocks,
        "local_sumexp_ptr": expected["local_sumexp_ptr"],
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
    out = _check("predict", (num_tokens + 2,), args, floats=("features_ptr", "pred_ptr", "conf_ptr"))
    assert int((out["features_ptr"] != -9.0).sum()) == int((idx >= 0).sum())
    if int(idx[0]) >= 0:
        assert float(out["features_ptr"].reshape(-1)[int(idx[0]) * steps + int(step.reshape(-1)[0])]) == 40.0
