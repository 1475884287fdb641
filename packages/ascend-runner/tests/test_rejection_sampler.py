"""The runner's verification step (``rejection_sample``) on the kernels' torch references."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_ascend.core.config import clear_ascend_config, init_ascend_config
from vllm_ascend.runner.sample.rejection_sampler import (
    Verification,
    recovery_noise,
    rejection_sample,
    verification_of,
)

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


def test_synthetic_mode_accepts_by_the_rates():
    """Rate 1 then 0: every request keeps its first draft and replaces its second with the target
    argmax (greedy row 0) or its recovered token (random row 1, q = 1: p without the draft)."""
    vocab = 8
    draft = torch.tensor([3, 4, 6, 2], dtype=torch.int32)
    logits = torch.full((4, vocab), -30.0)
    logits[0, 1] = logits[1, 5] = logits[2, 0] = 5.0
    logits[3, 2] = logits[3, 7] = 40.0  # random row: all mass on 2 (the draft) and 7
    out = rejection_sample(
        draft, [2, 2], 2, torch.tensor([2, 4], dtype=torch.int32), None, logits, torch.tensor([[7], [1]]),
        _metadata([0.0, 0.7]), synthetic_mode=True, synthetic_conditional_rates=torch.tensor([1.0, 0.0]),
    )  # fmt: skip
    assert out.tolist() == [[3, 5, P], [6, 7, P]]


@pytest.mark.parametrize("method", ["block", "entropy"])
def test_block_and_entropy_keep_greedy_rows_on_the_argmax(method):
    """Greedy rows are verified by argmax whatever the method; a random row whose target puts all
    mass on its drafts accepts them and takes its bonus token."""
    vocab = 8
    draft = torch.tensor([3, 4, 6, 2], dtype=torch.int32)
    logits = torch.full((4, vocab), -30.0)
    logits[0, 3] = logits[1, 5] = 5.0
    logits[2, 6] = logits[3, 2] = 40.0
    out = rejection_sample(
        draft, [2, 2], 2, torch.tensor([2, 4], dtype=torch.int32), None, logits, torch.tensor([[7], [1]]),
        _metadata([0.0, 0.7]), verification=Verification(method),
    )  # fmt: skip
    assert out.tolist() == [[3, 5, P], [6, 2, 1]]


def test_entropy_always_rejects_a_draft_below_its_threshold():
    """Draft 0 has target probability 0.05 < min(0.09, 0.3 e^-H): entropy verification rejects it
    every time (never the bonus token 3), writing a draw from p in its place; a draft above the
    threshold (token 1) is accepted every time."""
    probs = torch.tensor([[0.05, 0.95, 0.0, 0.0]])
    logits = probs.clamp(min=1e-30).log()
    cu = torch.tensor([1], dtype=torch.int32)

    def run(draft):
        out = rejection_sample(
            torch.tensor([draft], dtype=torch.int32), [1], 1, cu, None, logits, torch.tensor([[3]]),
            _metadata([1.0]), verification=Verification("entropy"),
        )  # fmt: skip
        return tuple(out[0].tolist())

    assert {run(0) for _ in range(30)} <= {(0, P), (1, P)}
    assert {run(1) for _ in range(5)} == {(1, 3)}


@pytest.mark.parametrize(
    ("verify_method", "vllm_method", "expected"),
    [("strict", "standard", "strict"), ("entropy", "standard", "entropy"), ("strict", "block", "block"),
     ("block", "block", "block"), ("strict", "synthetic", "strict")],
)  # fmt: skip
def test_verification_of_reads_both_configs(verify_method, vllm_method, expected):
    init_ascend_config({"rejection_sampler_config": {"verify_method": verify_method, "posterior_alpha": 0.5}})
    try:
        got = verification_of(SimpleNamespace(rejection_sample_method=vllm_method))
    finally:
        clear_ascend_config()
    assert got == Verification(expected, 0.09, 0.5)


def test_conflicting_methods_are_refused_naming_both_fields():
    init_ascend_config({"rejection_sampler_config": {"verify_method": "entropy"}})
    try:
        with pytest.raises(ValueError) as info:
            verification_of(SimpleNamespace(rejection_sample_method="synthetic"))
    finally:
        clear_ascend_config()
    assert str(info.value) == (
        "speculative_config.rejection_sample_method='synthetic' conflicts with "
        "additional_config.rejection_sampler_config.verify_method='entropy'; give one of them"
    )


def test_recovery_noise_follows_the_request_generator():
    """A seeded request with drafts draws from its own generator (reproducible); one without
    drafts leaves its generator untouched."""
    gens = {0: torch.Generator().manual_seed(5), 1: torch.Generator().manual_seed(9)}
    a = recovery_noise(2, 16, [3, 0], gens, torch.device("cpu"))
    again = recovery_noise(1, 16, [3], {0: torch.Generator().manual_seed(5)}, torch.device("cpu"))
    assert torch.equal(a[0], again[0]) and bool((a > 0).all())
    assert torch.equal(gens[1].get_state(), torch.Generator().manual_seed(9).get_state())
