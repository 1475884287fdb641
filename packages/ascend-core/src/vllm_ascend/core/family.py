"""Ascend device family names as used by config checks and MoE communication selection.

Families arrive as ``AscendDeviceType`` members (from :mod:`vllm_ascend.core.device`) or as plain
strings; both normalise to one of :data:`FAMILIES`. The device module is imported lazily so that
config and forward-context logic also work where it is absent or no device is present.
"""

from __future__ import annotations

import enum
from typing import Any

FAMILIES = ("A2", "A3", "A5", "310P")
_ALIASES = {"A2": "A2", "910B": "A2", "A3": "A3", "910C": "A3", "A5": "A5", "950": "A5", "310P": "310P"}


def family_name(family: Any) -> str:
    """Normalise an ``AscendDeviceType`` member or a name (``"a3"``, ``"950"``, ``"_310P"``)."""
    raw = family.name if isinstance(family, enum.Enum) else family
    if not isinstance(raw, str):
        raise ValueError(f"device family must be one of {', '.join(FAMILIES)}, got {family!r}")
    key = raw.strip().upper().lstrip("_")
    if key not in _ALIASES:
        raise ValueError(f"unknown device family {raw!r}; allowed: {', '.join(FAMILIES)} (or 910B, 910C, 950)")
    return _ALIASES[key]


def current_family() -> str | None:
    """The running device's family, or None where the device module or a device is unavailable."""
    try:
        from vllm_ascend.core.device import get_device_config  # type: ignore[attr-defined]
    except ImportError:
        return None
    try:
        device_type = get_device_config().device_type
    except (RuntimeError, AttributeError):
        return None
    try:
        return family_name(device_type)
    except ValueError:
        return None
