"""The EPLB policy registry: built-in policies by name and upstream numeric code, more by name."""

from __future__ import annotations

from typing import Any

from vllm_ascend.core.sdk import Registry, registering_as
from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.validation import EplbInputError

#: The one table of built-in policies: name -> (upstream ``eplb_policy_type`` code, ``"module:class"``).
BUILTIN_POLICIES: dict[str, tuple[int, str]] = {
    "random": (0, "vllm_ascend.eplb.policy.random:RandomLoadBalance"),
    "default": (1, "vllm_ascend.eplb.policy.default:DefaultEplb"),
    "swift": (2, "vllm_ascend.eplb.policy.swift:SwiftBalanceEplb"),
    "flashlb": (3, "vllm_ascend.eplb.policy.flashlb:FlashLB"),
}
POLICY_NAMES_BY_CODE: dict[int, str] = {code: name for name, (code, _) in BUILTIN_POLICIES.items()}


def _is_policy_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, EplbPolicy)


#: Policy name -> :class:`EplbPolicy` subclass (or lazy ``"module:class"``); other packages may add names.
EPLB_POLICIES: Registry[type[EplbPolicy]] = Registry(
    "EPLB policy", _is_policy_class, "an EplbPolicy subclass"
)
with registering_as("vllm-ascend-eplb"):
    for _name, (_, _path) in BUILTIN_POLICIES.items():
        EPLB_POLICIES.register(_name, _path)


def allowed_policies() -> str:
    """Every accepted ``eplb_policy_type`` value, for error messages."""
    codes = ", ".join(f"{code} ({name})" for code, name in POLICY_NAMES_BY_CODE.items())
    return f"names {', '.join(repr(n) for n in EPLB_POLICIES.names())} or codes {codes}"


def policy_name(name_or_code: str | int) -> str:
    """The registered policy name of a name or an upstream code; unknown values raise
    :class:`EplbInputError` listing the allowed ones."""
    if isinstance(name_or_code, int) and not isinstance(name_or_code, bool):
        if name_or_code in POLICY_NAMES_BY_CODE:
            return POLICY_NAMES_BY_CODE[name_or_code]
    elif isinstance(name_or_code, str) and name_or_code in EPLB_POLICIES:
        return name_or_code
    raise EplbInputError(f"unknown EPLB policy {name_or_code!r}; allowed: {allowed_policies()}")


def policy_class(name_or_code: str | int) -> type[EplbPolicy]:
    return EPLB_POLICIES.get(policy_name(name_or_code))


class PolicyFactory:
    """``generate_policy("flashlb" | 3 | FlashLB, options)`` → a policy instance."""

    @staticmethod
    def generate_policy(policy: str | int | type[EplbPolicy], config: Any = None) -> EplbPolicy:
        cls = policy if isinstance(policy, type) else policy_class(policy)
        if not _is_policy_class(cls):
            raise EplbInputError(f"{cls!r} is not an EplbPolicy subclass")
        return cls(config)
