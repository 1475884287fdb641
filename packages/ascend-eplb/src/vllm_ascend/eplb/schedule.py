"""The expert-placement schedule the runner's MoE layers register with (core's ``MOE_PLACEMENTS``).

One :class:`EplbUpdator` per model being built. On one expert-parallel rank every physical slot lives in
this process and weights move with a :class:`LocalWeightMover`; over several ranks (one process each)
each rank holds its own slots and weights move between ranks with a :class:`D2DWeightMover` over the
expert-parallel group (loads and plans over its CPU group).
"""

from __future__ import annotations

import weakref
from typing import Any

from vllm_ascend.core.sdk import get_section
from vllm_ascend.eplb.config import EplbConfig
from vllm_ascend.eplb.movers import D2DWeightMover, LocalWeightMover
from vllm_ascend.eplb.updator import EplbUpdator

#: One schedule per model: ``id(vllm_config) -> (weak ref to the config, its EplbUpdator)``.
_SCHEDULES: dict[int, tuple[weakref.ref[Any], EplbUpdator]] = {}


def schedule_for(vllm_config: Any, ep_group: Any = None) -> EplbUpdator | None:
    """The schedule of the model being built under ``vllm_config``. ``ep_group``: vLLM's expert-parallel
    group coordinator (``world_size``, ``device_group``, ``cpu_group``) when it has several ranks."""
    config = get_section("eplb_config")
    if not isinstance(config, EplbConfig):
        raise TypeError(f"core's eplb_config section is {type(config).__name__}, expected EplbConfig")
    if ep_group is not None and ep_group.world_size > 1:
        if not config.enabled:
            return None
        return _cached(
            vllm_config,
            lambda: EplbUpdator(config, D2DWeightMover(ep_group.device_group, ep_group.cpu_group)),
        )
    return _cached(vllm_config, lambda: EplbUpdator(config, LocalWeightMover()))


def _cached(vllm_config: Any, make: Any) -> EplbUpdator:
    """The model's schedule (made once per ``vllm_config``)."""
    for key in [k for k, (ref, _) in _SCHEDULES.items() if ref() is None]:
        del _SCHEDULES[key]
    entry = _SCHEDULES.get(id(vllm_config))
    if entry is not None and entry[0]() is vllm_config:
        return entry[1]
    schedule = make()
    _SCHEDULES[id(vllm_config)] = (weakref.ref(vllm_config), schedule)
    return schedule
