"""Policy lookup by name or upstream numeric code, through core's EPLB-policy registry."""

from __future__ import annotations

from typing import Any

from vllm_ascend.eplb.policy.base import EplbPolicy
from vllm_ascend.eplb.validation import EplbInputError

POLICY_CODES = {0: "random", 1: "default", 2: "swift", 3: "flashlb"}


class PolicyFactory:
    """``generate_policy("flashlb" | 3, config)`` → a policy instance."""

    @staticmethod
    def generate_policy(name_or_code: str | int, config: Any = None) -> EplbPolicy:
        from vllm_ascend.core.registry import EPLB_POLICIES, registering_as
        from vllm_ascend.eplb._extension import register

        if not all(builtin in EPLB_POLICIES for builtin in POLICY_CODES.values()):
            # Without the plugin loader (a script, a policy process): register the built-ins.
            with registering_as("vllm-ascend-eplb"):
                register()
        name = name_or_code
        if isinstance(name_or_code, int) and not isinstance(name_or_code, bool):
            if name_or_code not in POLICY_CODES:
                codes = ", ".join(f"{c} ({n})" for c, n in POLICY_CODES.items())
                raise EplbInputError(f"unknown EPLB policy code {name_or_code}; allowed codes: {codes}")
            name = POLICY_CODES[name_or_code]
        if not isinstance(name, str) or name not in EPLB_POLICIES:
            raise EplbInputError(
                f"unknown EPLB policy {name_or_code!r}; registered names: {', '.join(EPLB_POLICIES.names())} "
                f"(or codes {sorted(POLICY_CODES)})"
            )
        cls = EPLB_POLICIES.get(name)
        if not issubclass(cls, EplbPolicy):
            raise EplbInputError(f"EPLB policy {name!r} resolved to {cls!r}, which is not an EplbPolicy")
        return cls(config)
