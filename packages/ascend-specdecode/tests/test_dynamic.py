"""DynamicSpecConfig validation and DynamicSpecScheduler's estimates, budget and allocation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import vllm_ascend.specdecode as specdecode
from vllm_ascend.core.config import ConfigError
from vllm_ascend.core.registry import CONFIG_SECTIONS, registering_as
from vllm_ascend.specdecode._extension import EXTENSION
from vllm_ascend.specdecode.dynamic import (
    DynamicSpecConfig,
    DynamicSpecInputError,
    DynamicSpecScheduler,
    validate_dynamic_spec_config,
)

PATH = "additional_config.dynamic_spec_config"


def scheduler(k: int = 4, **options) -> DynamicSpecScheduler:
    return DynamicSpecConfig(enabled=True, **options).build_scheduler(k)


# -- config -----------------------------------------------------------------------------------------
def test_defaults_and_round_trip():
    config = DynamicSpecConfig()
    assert (config.enabled, config.verify_budget_ratio, config.min_draft_len) == (False, 1.0, 1)
    assert (config.ema_decay, config.acceptance_prior, config.min_expected_gain) == (0.9, 0.7, 0.1)
    assert DynamicSpecConfig.from_dict(config.to_dict()) == config
    assert {row[0] for row in DynamicSpecConfig.describe()} == {
        f"{PATH}.{name}" for name in DynamicSpecConfig.option_names()
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"enabled": 1}, rf"^{PATH}.enabled must be a boolean \(true or false\), got int 1$"),
        (
            {"verify_budget_ratio": 0},
            rf"^{PATH}.verify_budget_ratio = 0.0 is out of range; allowed: > 0 and <= 1$",
        ),
        (
            {"verify_budget_ratio": 1.5},
            rf"^{PATH}.verify_budget_ratio = 1.5 is out of range; allowed: > 0 and <= 1$",
        ),
        ({"verify_budget_ratio": "half"}, rf"^{PATH}.verify_budget_ratio must be a number, got str 'half'$"),
        ({"min_draft_len": -1}, rf"^{PATH}.min_draft_len = -1 is out of range; allowed: >= 0$"),
        ({"min_draft_len": 1.5}, rf"^{PATH}.min_draft_len must be an integer, got float 1.5$"),
        ({"ema_decay": 1.0}, rf"^{PATH}.ema_decay = 1.0 is out of range; allowed: >= 0 and < 1$"),
        ({"ema_decay": -0.1}, rf"^{PATH}.ema_decay = -0.1 is out of range; allowed: >= 0$"),
        ({"acceptance_prior": 0}, rf"^{PATH}.acceptance_prior = 0.0 is out of range; allowed: > 0 and <= 1$"),
        (
            {"acceptance_prior": 1.01},
            rf"^{PATH}.acceptance_prior = 1.01 is out of range; allowed: > 0 and <= 1$",
        ),
        (
            {"min_expected_gain": -0.5},
            rf"^{PATH}.min_expected_gain = -0.5 is out of range; allowed: >= 0 and <= 1$",
        ),
        (
            {"min_expected_gain": 2},
            rf"^{PATH}.min_expected_gain = 2.0 is out of range; allowed: >= 0 and <= 1$",
        ),
        (
            {"min_expected_gain": float("nan")},
            rf"^{PATH}.min_expected_gain must be a finite number, got nan$",
        ),
        ({"budget": 8}, rf"^unknown option {PATH}.budget\b.*Allowed keys: acceptance_prior, "),
    ],
)
def test_each_field_is_validated_naming_it(raw, message):
    with pytest.raises(ConfigError, match=message):
        DynamicSpecConfig.from_dict(raw)


def test_validator_checks_against_the_speculative_config():
    assert validate_dynamic_spec_config({}, None) == DynamicSpecConfig()
    assert validate_dynamic_spec_config({"enabled": True}, None).enabled
    no_spec = SimpleNamespace(speculative_config=None)
    assert validate_dynamic_spec_config({}, no_spec) == DynamicSpecConfig()  # disabled needs nothing
    with pytest.raises(ConfigError, match=rf"^{PATH}.enabled = true requires speculative decoding"):
        validate_dynamic_spec_config({"enabled": True}, no_spec)
    spec = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=2))
    assert validate_dynamic_spec_config({"enabled": True, "min_draft_len": 2}, spec).min_draft_len == 2
    with pytest.raises(
        ConfigError,
        match=rf"^{PATH}.min_draft_len = 3 is out of range; allowed: <= speculative_config.num_speculative_tokens \(2\)$",
    ):
        validate_dynamic_spec_config({"enabled": True, "min_draft_len": 3}, spec)


@pytest.mark.parametrize("k", [0, -1, True, 2.0, None])
def test_scheduler_refuses_a_bad_num_speculative_tokens(k):
    with pytest.raises(ConfigError, match=rf"^{PATH} needs speculative_config.num_speculative_tokens >= 1"):
        DynamicSpecScheduler(DynamicSpecConfig(), k)


def test_registered_as_a_config_section_and_exported_lazily():
    with registering_as("vllm-ascend-specdecode"):
        EXTENSION.register()
    assert CONFIG_SECTIONS.get("dynamic_spec_config") is validate_dynamic_spec_config
    assert CONFIG_SECTIONS.owner("dynamic_spec_config") == "vllm-ascend-specdecode"
    assert specdecode.DynamicSpecScheduler is DynamicSpecScheduler
    assert specdecode.DynamicSpecConfig is DynamicSpecConfig
    assert specdecode.DynamicSpecInputError is DynamicSpecInputError


def test_init_ascend_config_serves_the_section_through_this_package():
    from vllm_ascend.core.config import clear_ascend_config, get_section, init_ascend_config

    with registering_as("vllm-ascend-specdecode"):
        EXTENSION.register()
    spec = SimpleNamespace(num_speculative_tokens=3)
    vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(),
        speculative_config=spec,
        additional_config={"dynamic_spec_config": {"enabled": True, "verify_budget_ratio": 0.5}},
    )
    try:
        init_ascend_config(vllm_config)
        section = get_section("dynamic_spec_config")
        assert section == DynamicSpecConfig(enabled=True, verify_budget_ratio=0.5)
        assert section.build_scheduler(spec.num_speculative_tokens).budget(4) == 6
        vllm_config.additional_config = {"dynamic_spec_config": {"enabled": True, "min_draft_len": 4}}
        with pytest.raises(ConfigError, match=rf"^{PATH}.min_draft_len = 4 is out of range"):
            init_ascend_config(vllm_config)
        init_ascend_config({})
        assert get_section("dynamic_spec_config") == DynamicSpecConfig()
    finally:
        clear_ascend_config()


# -- estimates ---------------------------------------------------------------------------------------
def test_estimates_move_toward_observed_acceptance():
    s = scheduler(k=4, ema_decay=0.5, acceptance_prior=0.6)
    assert s.estimates("a") == (0.6, 0.6, 0.6, 0.6)
    s.observe("a", num_drafted=4, num_accepted=2)  # 0, 1 accepted; 2 rejected; 3 not measured
    assert s.estimates("a") == pytest.approx((0.8, 0.8, 0.3, 0.6))
    s.observe("a", num_drafted=4, num_accepted=4)
    assert s.estimates("a") == pytest.approx((0.9, 0.9, 0.65, 0.8))
    for _ in range(30):
        s.observe("a", num_drafted=4, num_accepted=0)
    rates = s.estimates("a")
    assert rates[0] < 1e-6  # always rejected at position 0
    # unmeasured positions drift toward the population's estimate (which "a" alone drove down to ~0.2 at
    # positions 2 and 3 before it stopped being measured there)
    population = s.estimates("never-seen")
    assert population[0] < 1e-6 and population[1:] == pytest.approx((0.9, 0.65, 0.8))
    assert rates[1:] == pytest.approx(population[1:], abs=1e-6)


def test_new_requests_start_from_the_population_estimate():
    s = scheduler(k=2, ema_decay=0.5, acceptance_prior=0.5)
    s.observe("a", 2, 2)
    assert s.estimates("b") == pytest.approx((0.75, 0.75))
    s.observe("b", 2, 0)
    assert s.estimates("b") == pytest.approx((0.375, 0.75))  # from 0.75: 0.5 * 0.75 + 0.5 * 0


def test_the_population_moves_per_step_about_as_far_as_one_request():
    s = scheduler(k=1, ema_decay=0.5, acceptance_prior=0.5)
    ids = [f"r{i}" for i in range(10)]
    for req in ids:
        s.observe(req, 0, 0)  # nothing verified: tracked, nothing measured
    assert len(s) == 10 and s.estimates("new") == (0.5,)
    for req in ids:
        s.observe(req, 1, 1)
    assert s.estimates("r0") == (0.75,)
    assert s.estimates("new")[0] == pytest.approx(1 - 0.5 * 0.95**10)  # 0.70: each step weighs 0.5 / 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((5, 0), r"^num_drafted must be an integer in \[0, num_speculative_tokens = 4\], got 5$"),
        ((-1, 0), r"^num_drafted must be an integer in \[0, num_speculative_tokens = 4\], got -1$"),
        ((2, 3), r"^num_accepted must be an integer in \[0, num_drafted = 2\], got 3$"),
        ((2, True), r"^num_accepted must be an integer in \[0, num_drafted = 2\], got True$"),
    ],
)
def test_observe_refuses_counts_that_cannot_happen(args, message):
    s = scheduler()
    with pytest.raises(DynamicSpecInputError, match=message):
        s.observe("a", *args)
    assert "a" not in s


def test_finish_frees_the_state():
    s = scheduler()
    for i in range(100):
        s.observe(f"r{i}", 4, i % 5)
    assert len(s) == 100 and "r7" in s
    for i in range(100):
        s.finish(f"r{i}")
    s.finish("unknown")
    assert len(s) == 0 and "r7" not in s
    s.allocate(["r1", "r2"], [4, 4])  # allocation alone keeps no state
    assert len(s) == 0


# -- budget and allocation ---------------------------------------------------------------------------
def test_budget():
    assert scheduler(k=4).budget(3) == 12
    assert scheduler(k=4, verify_budget_ratio=0.5).budget(3) == 6
    assert (
        scheduler(k=1, verify_budget_ratio=0.29, min_draft_len=0).budget(100) == 29
    )  # no float round-down to 28
    assert scheduler(k=4, verify_budget_ratio=0.1, min_draft_len=2).budget(3) == 6  # min_draft_len wins
    assert scheduler(k=4, min_draft_len=0, verify_budget_ratio=0.1).budget(3) == 1
    assert scheduler().budget(0) == 0
    with pytest.raises(DynamicSpecInputError, match=r"^num_reqs must be an integer >= 0, got -1$"):
        scheduler().budget(-1)


def test_allocation_respects_budget_drafted_lengths_and_min_length():
    s = scheduler(k=4, verify_budget_ratio=0.5, min_draft_len=1, min_expected_gain=0.0)
    for _ in range(20):
        s.observe("good", 4, 4)
        s.observe("bad", 1, 0)
    ids = ["good", "bad", "new", "short"]
    lengths = s.allocate(ids, [4, 4, 4, 2])
    assert sum(lengths) == s.budget(4) == 8
    assert lengths[1] == 1  # kept at min_draft_len although its estimate is ~0
    assert lengths[0] == 4 and lengths[3] <= 2
    assert lengths == [4, 1, 2, 1]
    # a request that drafted nothing gets nothing; drafts shorter than the budget are all verified
    assert s.allocate(ids, [0, 0, 0, 0]) == [0, 0, 0, 0]
    assert s.allocate(ids, [1, 1, 0, 3]) == [1, 1, 0, 3]
    assert s.allocate([], []) == []


def test_min_expected_gain_cuts_unlikely_drafts():
    s = scheduler(k=4, ema_decay=0.0, min_draft_len=0, min_expected_gain=0.3)
    assert s.allocate(["c"], [4]) == [3]  # at the prior 0.7 the drafts are worth 0.7, 0.49, 0.343, 0.24
    s.observe("a", 4, 4)
    s.observe("b", 4, 1)  # b: position 0 accepted, position 1 rejected
    # b's second draft is worth 0; c, unseen, takes the population's rates: (1, 0.5, 1, 1), the average of
    # a's (1, 1, 1, 1) and b's measured (1, 0): worth 1, 0.5, 0.5, 0.5
    assert s.estimates("c") == (1.0, 0.5, 1.0, 1.0)
    assert s.allocate(["a", "b", "c"], [4, 4, 4]) == [4, 1, 4]
    assert scheduler(k=4, min_draft_len=0, min_expected_gain=0.0).allocate(["c"], [4]) == [4]


def test_high_acceptance_gets_longer_drafts_than_low():
    s = scheduler(k=5, verify_budget_ratio=0.6)
    rng = np.random.default_rng(0)
    for _ in range(50):
        for req, rate in (("high", 0.9), ("low", 0.3)):
            accepted = int(np.argmin(np.append(rng.random(5) < rate, False)))
            s.observe(req, 5, accepted)
    high, low = s.allocate(["high", "low"], [5, 5])
    assert high > low
    assert (high, low) == (5, 1)


def test_ties_are_broken_by_position_then_batch_order():
    s = scheduler(k=3, verify_budget_ratio=0.5, min_draft_len=0, min_expected_gain=0.0)
    # every request at the prior: values 0.7, 0.49, 0.343; budget 4 of 8 drafts
    assert s.allocate(["a", "b", "c"], [3, 3, 3]) == [2, 1, 1]
    assert s.allocate(["c", "b", "a"], [3, 3, 3]) == [2, 1, 1]
    assert s.allocate(["a", "b", "c", "d"], [3, 3, 3, 3]) == [
        2,
        2,
        1,
        1,
    ]  # budget 6: four 0.7s, a's and b's 0.49
    assert [s.allocate(["x", "y"], [3, 3]) for _ in range(3)] == [[2, 1]] * 3


def test_allocate_refuses_a_malformed_batch():
    s = scheduler(k=4)
    with pytest.raises(DynamicSpecInputError, match=r"^draft_lengths has 1 entries for 2 req_ids$"):
        s.allocate(["a", "b"], [1])
    with pytest.raises(DynamicSpecInputError, match=r"^req_ids must not repeat a request$"):
        s.allocate(["a", "a"], [1, 1])
    with pytest.raises(
        DynamicSpecInputError,
        match=r"^draft_lengths\[1\] must be an integer in \[0, num_speculative_tokens = 4\]",
    ):
        s.allocate(["a", "b"], [1, 5])
    with pytest.raises(DynamicSpecInputError, match=r"^confidences\[0\] must hold 2 probabilities"):
        s.allocate(["a"], [2], [[0.5]])
    with pytest.raises(DynamicSpecInputError, match=r"^confidences\[0\] must be probabilities in \[0, 1\]"):
        s.allocate(["a"], [2], [[0.5, 1.5]])
    with pytest.raises(DynamicSpecInputError, match=r"^confidences\[0\] must be probabilities in \[0, 1\]"):
        s.allocate(["a"], [2], [[0.5, float("nan")]])
    with pytest.raises(DynamicSpecInputError, match=r"^confidences\[0\] must be a list of 2 probabilities"):
        s.allocate(["a"], [2], [["high", "low"]])
    with pytest.raises(DynamicSpecInputError, match=r"^confidences has 2 entries for 1 req_ids$"):
        s.allocate(["a"], [2], [None, None])


def test_draft_confidences_scale_the_estimates():
    s = scheduler(k=4, ema_decay=0.0, min_draft_len=0, min_expected_gain=0.3)
    s.observe("a", 4, 3, confidences=[0.8, 0.8, 0.8, 0.8])  # rates 1, 1, 1, 0; typical confidence 0.8
    s.observe("a", 4, 4, confidences=[0.8, 0.8, 0.8, 0.8])  # rates 1, 1, 1, 1
    assert s.allocate(["a"], [4]) == [4]
    # the drafter doubts its second token (0.2 of the usual 0.8): that draft is worth 0.25 < 0.3
    assert s.allocate(["a"], [4], [[0.8, 0.2, 0.8, 0.8]]) == [1]
    assert s.allocate(["a"], [4], [None]) == [4]
    assert s.trim(["a", "b"], [[7, 8, 9, 10], [1, 2, 3]], [[0.8, 0.8, 0.2, 0.9], None]) == [[7, 8], [1, 2, 3]]
    with pytest.raises(DynamicSpecInputError, match=r"^confidences must hold 2 probabilities"):
        s.observe("a", 2, 1, confidences=[0.5])


def test_trim_cuts_each_draft_to_its_allocation():
    s = scheduler(k=3, verify_budget_ratio=0.5, min_draft_len=0, min_expected_gain=0.0)
    assert s.trim(["a", "b", "c"], [[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == [[1, 2], [4], [7]]
    assert s.trim(["a"], [[]]) == [[]]


# -- simulation --------------------------------------------------------------------------------------
def simulate(scheduler_or_length, rates, steps, k, seed=0) -> tuple[int, int]:
    """Verified and accepted draft tokens over ``steps`` steps of a batch whose request ``i`` accepts each
    draft with probability ``rates[i][step]`` (given the previous ones were accepted)."""
    rng = np.random.default_rng(seed)
    ids = [f"r{i}" for i in range(len(rates))]
    verified = accepted = 0
    for step in range(steps):
        if isinstance(scheduler_or_length, int):
            lengths = [scheduler_or_length] * len(ids)
        else:
            lengths = scheduler_or_length.allocate(ids, [k] * len(ids))
        draws = rng.random((len(ids), k))
        for i, length in enumerate(lengths):
            ok = draws[i, :length] < rates[i][step]
            n = int(np.argmin(np.append(ok, False)))
            verified += length
            accepted += n
            if not isinstance(scheduler_or_length, int):
                scheduler_or_length.observe(ids[i], length, n)
    return verified, accepted


def test_dynamic_lengths_verify_fewer_tokens_per_accepted_token_than_fixed_lengths_at_equal_budget():
    """Synthetic trace: 8 requests, k = 4, budget half of the drafts (16 per step, fixed length 2). Four
    requests are easy (acceptance 0.9) and four hard (0.3); halfway through two of each swap roles."""
    k, steps = 4, 400
    rates = []
    for i in range(8):
        easy = i < 4
        swaps = i % 2 == 0
        rates.append([(0.9 if easy != (swaps and t >= steps // 2) else 0.3) for t in range(steps)])
    s = scheduler(k=k, verify_budget_ratio=0.5)
    assert s.budget(8) == 16
    fixed_verified, fixed_accepted = simulate(2, rates, steps, k)
    dyn_verified, dyn_accepted = simulate(s, rates, steps, k)
    assert fixed_verified == 16 * steps
    assert dyn_verified <= 16 * steps
    fixed_cost = fixed_verified / fixed_accepted
    dyn_cost = dyn_verified / dyn_accepted
    # expected fixed: 16 / (4 * (0.9 + 0.81) + 4 * (0.3 + 0.09)) = 1.905
    assert fixed_cost == pytest.approx(1.905, abs=0.03)
    assert dyn_cost < 0.8 * fixed_cost
    assert dyn_accepted > 1.25 * fixed_accepted
    # seeded: fixed 6400 / 3385 = 1.891 verified per accepted token, dynamic 6400 / 4394 = 1.457
    assert (fixed_verified, fixed_accepted, dyn_verified, dyn_accepted) == (6400, 3385, 6400, 4394)
