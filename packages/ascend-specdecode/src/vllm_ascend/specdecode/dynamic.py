"""Dynamic speculative decoding: each request's draft length adapted to its measured acceptance.

``additional_config.dynamic_spec_config`` (:class:`DynamicSpecConfig`) configures
:class:`DynamicSpecScheduler`, which any proposer's drafts go through before verification:

- **token-probability update** (:meth:`DynamicSpecScheduler.observe`): per request and draft position
  ``j``, an exponential moving average of the probability that draft ``j`` is accepted given that drafts
  ``0..j-1`` were (a conditional acceptance rate). A step that verified ``d`` drafts and accepted the
  first ``a`` measures positions ``0..a-1`` as accepted and position ``a`` (when ``a < d``) as rejected;
  later positions were not measured and drift toward the population's estimate, so a request trimmed to
  short drafts can earn long ones back. The population's estimate averages every request's measurements
  (each weighted by one over the number of tracked requests, so it moves about as fast per step as one
  request's estimate at any batch size); it starts at ``acceptance_prior``, and new requests start from it.
- **verification budget** (:meth:`DynamicSpecScheduler.budget`): ``verify_budget_ratio × num_reqs ×
  num_speculative_tokens`` draft tokens per step (rounded down), never below ``num_reqs × min_draft_len``.
- **allocation** (:meth:`DynamicSpecScheduler.allocate`): the ``j``-th draft of a request is worth the
  estimated probability that drafts ``0..j`` are all accepted (the product of the rates), which is the
  expected number of tokens it adds. Each request keeps ``min_draft_len`` drafts; the rest of the budget
  goes to the most valuable drafts of the whole batch, skipping any worth less than
  ``min_expected_gain``. Values never grow along a draft, so every request gets a prefix of its draft.
  Ties go to the earlier position, then the earlier request in the batch.

When the drafter reports its confidence in each draft token (its probability), a draft's rate is scaled
by its confidence relative to the request's average confidence at that position (capped at 1; once
:meth:`DynamicSpecScheduler.observe` has seen confidences for it), so a draft the drafter doubts is cut
earlier. Work per step is O(batch × k) numpy, plus a sort of the
batch's candidate drafts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from vllm_ascend.core.sdk import ConfigError, Section, option

PATH = "additional_config.dynamic_spec_config"


class DynamicSpecInputError(ValueError):
    """A call to :class:`DynamicSpecScheduler` with arguments that do not describe the batch."""


@dataclass(frozen=True)
class DynamicSpecConfig(Section):
    """Dynamic draft lengths (``additional_config.dynamic_spec_config``); read through core's
    ``get_section("dynamic_spec_config")``; :meth:`build_scheduler` makes the runner's scheduler."""

    PATH: ClassVar[str] = PATH

    enabled: bool = option(
        False, doc="Adapt each request's draft length to its measured acceptance (needs speculative_config)."
    )
    verify_budget_ratio: float = option(
        1.0,
        gt=0,
        le=1,
        doc=(
            "Draft tokens verified per step, as a fraction of num_reqs x num_speculative_tokens (rounded "
            "down, never below num_reqs x min_draft_len); 1.0 caps nothing and only min_expected_gain trims."
        ),
    )
    min_draft_len: int = option(
        1,
        ge=0,
        doc=(
            "Drafts every request keeps (when drafted), whatever its estimates; at most "
            "num_speculative_tokens. 1 keeps measuring every request's first position."
        ),
    )
    ema_decay: float = option(
        0.9,
        ge=0,
        doc="Weight of the previous estimate in each update, < 1 (higher: slower, steadier adaptation).",
    )
    acceptance_prior: float = option(
        0.7,
        gt=0,
        le=1,
        doc="Acceptance rate of every draft position before anything is measured.",
    )
    min_expected_gain: float = option(
        0.1,
        ge=0,
        le=1,
        doc=(
            "A draft beyond min_draft_len is verified only if the estimated probability that it and every "
            "draft before it are accepted is at least this."
        ),
    )

    def _validate(self) -> None:
        if self.ema_decay >= 1:
            raise ConfigError(f"{PATH}.ema_decay = {self.ema_decay} is out of range; allowed: >= 0 and < 1")

    def check_num_speculative_tokens(self, num_speculative_tokens: Any) -> int:
        """``num_speculative_tokens`` as an int, refused when it is not >= 1 or is below ``min_draft_len``."""
        k = num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise ConfigError(
                f"{PATH} needs speculative_config.num_speculative_tokens >= 1, got {num_speculative_tokens!r}"
            )
        if self.min_draft_len > k:
            raise ConfigError(
                f"{PATH}.min_draft_len = {self.min_draft_len} is out of range; allowed: <= "
                f"speculative_config.num_speculative_tokens ({int(k)})"
            )
        return int(k)

    def build_scheduler(self, num_speculative_tokens: int) -> DynamicSpecScheduler:
        """The scheduler for drafts of at most ``num_speculative_tokens`` tokens."""
        return DynamicSpecScheduler(self, num_speculative_tokens)


def validate_dynamic_spec_config(raw: Mapping[str, Any], vllm_config: Any = None) -> DynamicSpecConfig:
    """Core's ``CONFIG_SECTIONS`` validator: the typed settings, and when enabled, checked against vLLM's
    ``speculative_config`` (present, and ``min_draft_len <= num_speculative_tokens``)."""
    config = DynamicSpecConfig.from_dict(raw)
    if config.enabled and vllm_config is not None:
        spec = getattr(vllm_config, "speculative_config", None)
        if spec is None:
            raise ConfigError(
                f"{PATH}.enabled = true requires speculative decoding: set speculative_config "
                '(e.g. {"method": "ngram", "num_speculative_tokens": 4})'
            )
        config.check_num_speculative_tokens(getattr(spec, "num_speculative_tokens", None))
    return config


@dataclass
class _RequestState:
    rates: np.ndarray  # [k] conditional acceptance estimates
    confidence: np.ndarray  # [k] average drafter confidence at verified positions (nan: none seen)


def _check_count(name: str, value: Any, upper: int, upper_name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 0 <= value <= upper:
        raise DynamicSpecInputError(
            f"{name} must be an integer in [0, {upper_name} = {upper}], got {value!r}"
        )
    return int(value)


def _check_confidences(name: str, values: Sequence[float], length: int) -> np.ndarray:
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise DynamicSpecInputError(
            f"{name} must be a list of {length} probabilities, got {values!r}"
        ) from None
    if array.shape != (length,):
        raise DynamicSpecInputError(
            f"{name} must hold {length} probabilities (one per draft), got shape {array.shape}"
        )
    if not np.all((array >= 0) & (array <= 1)):
        raise DynamicSpecInputError(f"{name} must be probabilities in [0, 1], got {array.tolist()}")
    return array


class DynamicSpecScheduler:
    """Per-request acceptance estimates and the per-step allocation of verified draft tokens.

    The runner calls, each step: :meth:`trim` (or :meth:`allocate`) on the batch's drafts before
    verification, :meth:`observe` for every request verified (``num_drafted`` = drafts verified after
    trimming, 0 included; ``num_accepted`` = drafts accepted), and :meth:`finish` when a request leaves.
    """

    def __init__(self, config: DynamicSpecConfig, num_speculative_tokens: int) -> None:
        if not isinstance(config, DynamicSpecConfig):
            raise DynamicSpecInputError(f"config must be a DynamicSpecConfig, got {type(config).__name__}")
        self.config = config
        self.num_speculative_tokens = config.check_num_speculative_tokens(num_speculative_tokens)
        self._population = np.full(self.num_speculative_tokens, config.acceptance_prior)
        self._requests: dict[str, _RequestState] = {}

    def __len__(self) -> int:
        """Requests with state (observed and not finished)."""
        return len(self._requests)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._requests

    def estimates(self, req_id: str) -> tuple[float, ...]:
        """The request's conditional acceptance rate per draft position (the population's if unseen)."""
        state = self._requests.get(req_id)
        return tuple((self._population if state is None else state.rates).tolist())

    def observe(
        self,
        req_id: str,
        num_drafted: int,
        num_accepted: int,
        confidences: Sequence[float] | None = None,
    ) -> None:
        """Update the request's estimates from one verification: drafts ``0..num_accepted-1`` accepted,
        draft ``num_accepted`` rejected when ``num_accepted < num_drafted``. ``confidences``: the
        drafter's probability of each of the ``num_drafted`` verified drafts, if it has them."""
        k = self.num_speculative_tokens
        drafted = _check_count("num_drafted", num_drafted, k, "num_speculative_tokens")
        accepted = _check_count("num_accepted", num_accepted, drafted, "num_drafted")
        conf = None if confidences is None else _check_confidences("confidences", confidences, drafted)
        state = self._requests.get(req_id)
        if state is None:
            state = _RequestState(self._population.copy(), np.full(k, np.nan))
            self._requests[req_id] = state
        decay = self.config.ema_decay
        measured = accepted + (accepted < drafted)
        outcome = (np.arange(measured) < accepted).astype(np.float64)
        state.rates[:measured] = decay * state.rates[:measured] + (1 - decay) * outcome
        # the population moves about as far per step as one request does, whatever the batch size
        weight = (1 - decay) / len(self._requests)
        self._population[:measured] += weight * (outcome - self._population[:measured])
        state.rates[measured:] = decay * state.rates[measured:] + (1 - decay) * self._population[measured:]
        if conf is not None:
            seen = state.confidence[:measured]
            state.confidence[:measured] = np.where(
                np.isnan(seen), conf[:measured], decay * seen + (1 - decay) * conf[:measured]
            )

    def finish(self, req_id: str) -> None:
        """Drop the request's state (it left the batch); unknown ids are ignored."""
        self._requests.pop(req_id, None)

    def budget(self, num_reqs: int) -> int:
        """Draft tokens verified in a step of ``num_reqs`` requests."""
        if isinstance(num_reqs, bool) or not isinstance(num_reqs, int | np.integer) or num_reqs < 0:
            raise DynamicSpecInputError(f"num_reqs must be an integer >= 0, got {num_reqs!r}")
        full = int(num_reqs) * self.num_speculative_tokens
        capped = math.floor(self.config.verify_budget_ratio * full + 1e-9)
        return max(int(num_reqs) * self.config.min_draft_len, capped)

    def allocate(
        self,
        req_ids: Sequence[str],
        draft_lengths: Sequence[int],
        confidences: Sequence[Sequence[float] | None] | None = None,
    ) -> list[int]:
        """How many of its drafted tokens each request verifies this step (each <= its draft length,
        sum <= :meth:`budget`). ``confidences[i]``: the drafter's probability of each draft of request
        ``i`` (or None)."""
        n, k = len(req_ids), self.num_speculative_tokens
        if len(draft_lengths) != n:
            raise DynamicSpecInputError(f"draft_lengths has {len(draft_lengths)} entries for {n} req_ids")
        if len(set(req_ids)) != n:
            raise DynamicSpecInputError("req_ids must not repeat a request")
        if confidences is not None and len(confidences) != n:
            raise DynamicSpecInputError(f"confidences has {len(confidences)} entries for {n} req_ids")
        lengths = np.array(
            [
                _check_count(f"draft_lengths[{i}]", d, k, "num_speculative_tokens")
                for i, d in enumerate(draft_lengths)
            ],
            dtype=np.int64,
        )
        if n == 0:
            return []
        rates = np.stack([self._rates_of(r) for r in req_ids])
        for i, row in enumerate(confidences or ()):
            if row is not None:
                self._scale_by_confidence(rates[i], req_ids[i], row, int(lengths[i]), f"confidences[{i}]")
        value = np.cumprod(rates, axis=1)
        position = np.arange(k)
        drafted = position < lengths[:, None]
        kept = drafted & (position < self.config.min_draft_len)
        optional = drafted & ~kept & (value >= self.config.min_expected_gain)
        rows, cols = np.nonzero(optional)
        order = np.lexsort((rows, cols, -value[rows, cols]))
        take = order[: self.budget(n) - int(kept.sum())]
        counts = kept.sum(axis=1)
        np.add.at(counts, rows[take], 1)
        return [int(c) for c in counts]

    def trim(
        self,
        req_ids: Sequence[str],
        drafts: Sequence[Sequence[int]],
        confidences: Sequence[Sequence[float] | None] | None = None,
    ) -> list[list[int]]:
        """The batch's drafts cut to the lengths :meth:`allocate` gives them."""
        lengths = self.allocate(req_ids, [len(d) for d in drafts], confidences)
        return [list(draft[:length]) for draft, length in zip(drafts, lengths, strict=True)]

    def _rates_of(self, req_id: str) -> np.ndarray:
        state = self._requests.get(req_id)
        return (self._population if state is None else state.rates).copy()

    def _scale_by_confidence(
        self, rates: np.ndarray, req_id: str, row: Sequence[float], length: int, name: str
    ) -> None:
        conf = _check_confidences(name, row, length)
        state = self._requests.get(req_id)
        if state is None:
            return
        typical = state.confidence[:length]
        known = ~np.isnan(typical) & (typical > 0)
        ratio = np.divide(conf, typical, out=np.ones(length), where=known)
        rates[:length] = np.minimum(rates[:length] * ratio, 1.0)
