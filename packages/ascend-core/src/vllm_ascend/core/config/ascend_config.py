"""``AscendConfig``: the Ascend options of vLLM's ``additional_config``, and its process-wide instance.

Built once per process by ``AscendPlatform.check_and_update_config`` through
:func:`init_ascend_config`; read everywhere else with :func:`get_ascend_config`. Sections owned by
a sibling (``eplb_config``) are validated by that sibling's entry in ``CONFIG_SECTIONS`` and read
with :func:`get_section`. Upstream options this version does not serve are refused by name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vllm_ascend.core._version import __version__
from vllm_ascend.core.config.jsonio import JsonInputError, parse_json
from vllm_ascend.core.config.schema import ConfigError, Section, field_meta, option
from vllm_ascend.core.config.sections import UNSUPPORTED_OPTIONS, RejectionSamplerConfig, RlConfig
from vllm_ascend.core.logger import init_logger

logger = init_logger(__name__)

#: ``additional_config`` sections validated by a sibling distribution -> the distribution to install.
SIBLING_SECTIONS: dict[str, str] = {
    "eplb_config": "vllm-ascend-eplb",
    "dynamic_spec_config": "vllm-ascend-specdecode",
    "ascend_compilation_config": "vllm-ascend-runner",
}
#: Siblings the ``vllm-ascend`` meta distribution installs without an extra.
DEFAULT_SIBLINGS = ("runner", "kernels")


def unsupported_message(path: str) -> str:
    return (
        f"`additional_config.{path}` is not supported yet by vllm-ascend {__version__} "
        f"({UNSUPPORTED_OPTIONS[path]}); remove it from additional_config"
    )


def refuse_unsupported(data: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first refused option present in ``data``."""
    for path in UNSUPPORTED_OPTIONS:
        head, _, tail = path.partition(".")
        section = data.get(head, None) if tail else data
        if isinstance(section, Mapping) and (tail or head) in section:
            raise ConfigError(unsupported_message(path))


@dataclass(frozen=True)
class AscendConfig(Section):
    """The options core serves; ``AscendConfig.from_dict(additional_config)`` validates them."""

    PATH: ClassVar[str] = "additional_config"

    rejection_sampler_config: RejectionSamplerConfig = field(
        default_factory=RejectionSamplerConfig, metadata=field_meta("Speculative verification.")
    )
    rl_config: RlConfig = field(
        default_factory=RlConfig, metadata=field_meta("Reinforcement-learning rollouts.")
    )
    enable_cpu_binding: bool = option(
        False, doc="Bind each worker process to its share of the host CPUs (the profile's binding mode)."
    )
    dump_config_path: str | None = option(
        None, doc="Write the effective config as JSON to this file at start."
    )

    @classmethod
    def from_json(cls, text: str) -> AscendConfig:
        return cls.from_dict(_parse_json(text))

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    def dump(self, path: str | os.PathLike[str]) -> Path:
        """Write the config as JSON (parent directories created); returns the path written."""
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self.to_json() + "\n", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(
                f"{self.PATH}.dump_config_path = {str(path)!r} cannot be written: {exc}"
            ) from exc
        return target


_config: AscendConfig | None = None
_sections: dict[str, Any] = {}


def _parse_json(text: str) -> Any:
    try:
        return parse_json(text, "additional_config")
    except JsonInputError as exc:
        raise ConfigError(str(exc)) from None


def _additional_config_of(source: Any) -> Mapping[str, Any]:
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return source
    if isinstance(source, str):
        data = _parse_json(source)
        if not isinstance(data, Mapping):
            raise ConfigError(f"additional_config must be a JSON object, got {type(data).__name__}")
        return data
    if hasattr(source, "additional_config"):
        value = source.additional_config
        if value is None or isinstance(value, Mapping):
            return value or {}
        raise ConfigError(
            f"additional_config must be a JSON object (dict), got {type(value).__name__} {value!r}"
        )
    raise ConfigError(
        f"init_ascend_config expects a vLLM VllmConfig, a dict or a JSON string, got {type(source).__name__}"
    )


def _validate_sections(data: Mapping[str, Any], vllm_config: Any) -> dict[str, Any]:
    """Run every sibling's section validator (with ``{}`` where the section is absent)."""
    from vllm_ascend.core.extensions import load_extensions
    from vllm_ascend.core.registry import CONFIG_SECTIONS

    load_extensions()
    validated: dict[str, Any] = {}
    for name in sorted(set(SIBLING_SECTIONS) | set(CONFIG_SECTIONS.names())):
        raw = data.get(name)
        if raw is not None and not isinstance(raw, Mapping):
            raise ConfigError(f"additional_config.{name} must be a JSON object, got {type(raw).__name__}")
        if name in CONFIG_SECTIONS:
            validated[name] = CONFIG_SECTIONS.get(name)(raw or {}, vllm_config)
        elif raw:
            dist = SIBLING_SECTIONS[name]
            extra = dist.removeprefix("vllm-ascend-")
            install = "vllm-ascend" if extra in DEFAULT_SIBLINGS else f"vllm-ascend[{extra}]"
            raise ConfigError(
                f"additional_config.{name} needs the {dist} distribution, which is not installed or "
                f"failed to load: pip install '{install}'"
            )
    return validated


def init_ascend_config(source: Any = None) -> AscendConfig:
    """Build, validate and install the process-wide :class:`AscendConfig` and sibling sections.

    ``source`` is a vLLM ``VllmConfig`` (its ``additional_config`` is read), a plain dict, a JSON
    string, or None. Refused options, refused ``VLLM_ASCEND_*`` variables and invalid values raise
    :class:`ConfigError` naming the key.
    """
    global _config
    from vllm_ascend.core import envs

    envs.refuse_unsupported()
    data = _additional_config_of(source)
    refuse_unsupported(data)
    vllm_config = source if hasattr(source, "parallel_config") else None
    sections = _validate_sections(data, vllm_config)
    config = AscendConfig.from_dict(
        {k: v for k, v in data.items() if k not in sections and k not in SIBLING_SECTIONS}
    )
    if config.dump_config_path is not None:
        written = config.dump(config.dump_config_path)
        logger.info("Ascend config written to %s", written)
    _config = config
    _sections.clear()
    _sections.update(sections)
    return config


def _current_vllm_config() -> Any:
    try:
        from vllm.config.vllm import get_current_vllm_config_or_none
    except ImportError:
        return None
    return get_current_vllm_config_or_none()


def get_ascend_config() -> AscendConfig:
    """The process-wide config.

    In a process where the platform hook did not run (a vLLM worker process), it is built on
    first use from vLLM's current config (set while vLLM constructs the model).
    """
    if _config is None:
        current = _current_vllm_config()
        if current is not None:
            return init_ascend_config(current)
        raise RuntimeError(
            "Ascend config is not initialised in this process: call init_ascend_config(vllm_config) "
            "(AscendPlatform.check_and_update_config does this)"
        )
    return _config


def get_section(name: str) -> Any:
    """The validated object of a sibling-owned section (``"eplb_config"``), as its validator returned it."""
    get_ascend_config()
    try:
        return _sections[name]
    except KeyError:
        known = ", ".join(sorted(_sections)) or "none"
        raise ConfigError(
            f"no validated additional_config section {name!r}; validated sections: {known}"
        ) from None


def clear_ascend_config() -> None:
    """Forget the process-wide config (tests; re-initialisation with another vLLM config)."""
    global _config
    _config = None
    _sections.clear()
