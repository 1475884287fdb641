"""The expert-placement schedule the runner's MoE layers register with (core's ``MOE_PLACEMENTS``).

One :class:`EplbUpdator` per model being built. Its layers live in this process, so weights move with a
:class:`LocalWeightMover`; with expert parallel over several ranks (processes) there is no schedule
unless ``eplb_config`` asks for one, which is refused until placement across processes is served.
"""

from __future__ import annotations

import weakref
from typing import Any

from vllm_ascend.core.config import ConfigError, get_section
from vllm_ascend.eplb.config import PATH, EplbConfig
from vllm_ascend.eplb.movers import LocalWeightMover
from vllm_ascend.eplb.updator import EplbUpdator

#: One schedule per model: ``id(vllm_config) -> (weak ref to the config, its EplbUpdator)``.
_SCHEDULES: dict[int, tuple[weakref.ref[Any], EplbUpdator]] = {}


def schedule_for(vllm_config: Any, ep_size: int = 1) -> EplbUpdator | None:
    """The schedule of the model being built under ``vllm_config`` (``ep_size``: its expert-parallel ranks)."""
    config = get_section("eplb_config")
    if not isinstance(config, EplbConfig):
        raise TypeError(f"core's eplb_config section is {type(config).__name__}, expected EplbConfig")
    if ep_size > 1:
        if config.enabled:
            raise ConfigError(
                f"{PATH} (dynamic_eplb / expert_map_path / num_redundant_experts) with expert parallel over "
                f"{ep_size} ranks is not supported yet by vllm-ascend-eplb; supported: one expert-parallel rank"
            )
        return None
    for key in [k for k, (ref, _) in _SCHEDULES.items() if ref() is None]:
        del _SCHEDULES[key]
    entry = _SCHEDULES.get(id(vllm_config))
    if entry is not None and entry[0]() is vllm_config:
        return entry[1]
    schedule = EplbUpdator(config, LocalWeightMover())
    _SCHEDULES[id(vllm_config)] = (weakref.ref(vllm_config), schedule)
    return schedule
