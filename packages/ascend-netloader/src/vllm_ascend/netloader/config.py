"""``model_loader_extra_config`` of the ``netloader`` load format, validated."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_PREFIX = "model_loader_extra_config"


@dataclass(frozen=True)
class NetLoaderConfig:
    """Where the seed is (``source``, ``http://host:port``), the per-request ``timeout`` (s), ``retries``,
    whether a seed that cannot serve this model falls back to vLLM's default loader (``fallback``) or
    fails the load, the file holding the seed's shared token (``token_file``; default: the
    ``VLLM_ASCEND_NETLOADER_TOKEN`` environment variable) and the CA of an ``https://`` seed (``ca_file``)."""

    source: str
    timeout: float = 30.0
    retries: int = 3
    fallback: bool = True
    token_file: str | None = None
    ca_file: str | None = None

    @classmethod
    def from_extra_config(cls, extra: Any) -> NetLoaderConfig:
        if not isinstance(extra, Mapping):
            raise ValueError(
                f"{_PREFIX} must be a dict for load format 'netloader', got {type(extra).__name__}"
            )
        allowed = ("source", "timeout", "retries", "fallback", "token_file", "ca_file")
        unknown = sorted(set(extra) - set(allowed))
        if unknown:
            raise ValueError(
                f"{_PREFIX}: unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(allowed)}"
            )
        if "source" not in extra:
            raise ValueError(
                f"{_PREFIX}.source is required for load format 'netloader' (e.g. 'http://10.0.0.2:18080')"
            )
        source = extra["source"]
        parts = urlsplit(source) if isinstance(source, str) else None
        try:
            port = parts.port if parts is not None else None
        except ValueError:
            port = None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or port is None:
            raise ValueError(
                f"{_PREFIX}.source = {source!r}: expected an http:// or https:// URL with host and port, "
                "e.g. 'http://10.0.0.2:18080'"
            )
        timeout = extra.get("timeout", cls.timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"{_PREFIX}.timeout = {timeout!r}: expected a positive number of seconds")
        retries = extra.get("retries", cls.retries)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"{_PREFIX}.retries = {retries!r}: expected an integer >= 0")
        fallback = extra.get("fallback", cls.fallback)
        if not isinstance(fallback, bool):
            raise ValueError(f"{_PREFIX}.fallback = {fallback!r}: expected true or false")
        files = {key: extra.get(key) for key in ("token_file", "ca_file")}
        for key, value in files.items():
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{_PREFIX}.{key} = {value!r}: expected a file path")
        if (parts.scheme == "https") != (files["ca_file"] is not None):
            raise ValueError(
                f"{_PREFIX}.ca_file = {files['ca_file']!r}: an https:// source needs the CA file that signed "
                "the seed's certificate, and an http:// source takes none"
            )
        return cls(
            source.rstrip("/"), float(timeout), retries, fallback, files["token_file"], files["ca_file"]
        )
