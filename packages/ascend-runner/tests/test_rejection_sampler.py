"""The runner's verification step (``rejection_sample``) on the kernels' torch references."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.runner.sample.rejection_sampler import recovery_noise, rejection_sample

P = -1


def _metadata(temperature, generators=None):
    t = torch.tensor(temperature)
    return SimpleNamespace(
        all_greedy=bool((t == 0).all()),
        all_random=bool((t > 0).all()),
        temperature=t,
        generators=generators or {},
    )


def test_mixed_batch_greedy_and_random_rows():
    """Row 0 (greedy) accepts its first draft and replaces the second with the argmax; row 1
    (random) drafts the tokens its target puts all mass on: both accepted, then the bonus token."""
    vocab = 8
    draft = torch.tensor([3, 4, 6, 2], dtype=torch.int32)
    cu = torch.tensor([2, 4], dtype=torch.int32)
    logits = torch.full((4, vocab), -30.0)
    logits[0, 3] = logits[1, 5] = 5.0  # greedy argmax: 3 (= draft), then 5 (draft 4 rejected)
    logits[2, 6] = logits[3, 2] = 40.0  # p(draft) = 1
    bonus = torch.tensor([[7], [1]], dtype=torch.int32)
    out = rejection_sample(draft, [2, 2], 2, cu, None, logits, bonus, _metadata([0.0, 0.7]))
    assert out.dtype == torch.int32 and out.tolist() == [[3, 5, P], [6, 2, 1]]


def test_all_greedy_batch_never_touches_random_state():
    state = torch.random.get_rng_state()
    logits = torch.eye(4)[[1, 2]] * 10
    out = rejection_sample(
        torch.tensor([1, 2]), [2], 3, torch.tensor([2]), None, logits, torch.tensor([[0]]), _metadata([0.0])
    )
    assert out.tolist() == [[1, 2, 0, P]]
    assert torch.equal(torch.random.get_rng_state(), state)


def test_synthetic_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="rejection_sample_method='synthetic' is not supported on Ascend"):
        rejection_sample(
            torch.tensor([1]), [1], 1, torch.tensor([1]), None, torch.zeros(1, 4), torch.tensor([[0]]),
            _metadata([0.5]), synthetic_mode=True,
        )  # fmt: skip


def test_recovery_noise_follows_the_request_generator():
    """A seeded request with drafts draws from its own generator (reproducible); one without
    drafts leaves its generator untouched."""
    gens = {0: torch.Generator().manual_seed(5), 1: torch.Generator().manual_seed(9)}
    a = recovery_noise(2, 16, [3, 0], gens, torch.device("cpu"))
    again = recovery_noise(1, 16, [3], {0: torch.Generator().manual_seed(5)}, torch.device("cpu"))
    assert torch.equal(a[0], again[0]) and bool((a > 0).all())
    assert torch.equal(gens[1].get_state(), torch.Generator().manual_seed(9).get_state())
