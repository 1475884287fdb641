"""Ascend hardware families and parsing of SOC names (compile-time ``SOC_VERSION`` and runtime names)."""

from __future__ import annotations

import enum


class UnknownSocError(ValueError):
    """A SOC string that names no known Ascend family."""


class AscendDeviceType(enum.StrEnum):
    """The hardware family; one plugin wheel serves all of them (chosen at run time)."""

    A2 = "A2"  # Atlas A2 (Ascend910B*)
    A3 = "A3"  # Atlas A3 (Ascend910_93*)
    A5 = "A5"  # Ascend 950
    _310P = "310P"  # Atlas 300I/310P inference cards

    @classmethod
    def parse(cls, value: AscendDeviceType | str) -> AscendDeviceType:
        """A family from its value (``"A2"``, ``"310P"``, ``"950"``) or any known SOC string."""
        if isinstance(value, cls):
            return value
        text = str(value).strip()
        for member in cls:
            if text.upper() == member.value:
                return member
        if text == "950":
            return cls.A5
        return device_type_from_soc_version(text)


_A2_SOCS = ("Ascend910B1", "Ascend910B2", "Ascend910B2C", "Ascend910B3", "Ascend910B4", "Ascend910B4-1")
_A3_SOCS = (
    "Ascend910_9391",
    "Ascend910_9392",
    "Ascend910_9381",
    "Ascend910_9382",
    "Ascend910_9372",
    "Ascend910_9362",
)
_310P_SOCS = ("Ascend310P1", "Ascend310P2", "Ascend310P3", "Ascend310P4", "Ascend310P5", "Ascend310P7")
_A5_PREFIX = "Ascend950"

KNOWN_SOCS: dict[str, AscendDeviceType] = {
    **{s: AscendDeviceType.A2 for s in _A2_SOCS},
    **{s: AscendDeviceType.A3 for s in _A3_SOCS},
    **{s: AscendDeviceType._310P for s in _310P_SOCS},
}
_BY_LOWER = {name.lower(): family for name, family in KNOWN_SOCS.items()}


def known_soc_description() -> str:
    return ", ".join([*KNOWN_SOCS, f"{_A5_PREFIX}* (any Ascend 950 variant)"])


def _lookup(text: str, what: str) -> AscendDeviceType:
    name = text.strip()
    family = _BY_LOWER.get(name.lower())
    if family is not None:
        return family
    if name.lower().startswith(_A5_PREFIX.lower()):
        return AscendDeviceType.A5
    raise UnknownSocError(f"unknown {what} {text!r}; known: {known_soc_description()}")


def device_type_from_soc_version(soc_version: str) -> AscendDeviceType:
    """The family of a compile-time ``SOC_VERSION`` (e.g. ``Ascend910B3``, ``ascend910_9392``); case-insensitive."""
    return _lookup(soc_version, "SOC_VERSION")


def device_type_from_runtime_soc(soc_name: str) -> AscendDeviceType:
    """The family of the SOC name torch_npu reports at run time (``torch.npu.get_device_name()``).

    Runtime names may carry a product suffix after a space (``"Ascend910B3 (Atlas 800I A2)"``).
    """
    text = soc_name.strip()
    head = text.split()[0] if text else text
    return _lookup(head, "runtime SOC name")
