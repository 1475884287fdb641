"""Peer authentication and TLS for the seed's two channels (HTTP control and TCP stream).

Authentication is a shared token: the seed hands out a random single-use nonce and the client
answers ``HMAC-SHA256(token, context || nonce)``; the seed compares in constant time, so the token
itself never crosses the wire. The ``context`` differs per channel, so a MAC made for one cannot
be replayed on the other. A seed that binds to a non-loopback address refuses to start without a
token. TLS (stdlib :mod:`ssl`) wraps both channels when the seed is given a certificate and key;
the client verifies the seed's certificate against a CA file.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

MIN_TOKEN_BYTES = 16
NONCE_BYTES = 32
STREAM_CONTEXT = b"vllm-ascend-netloader/stream/1:"
HTTP_CONTEXT = b"vllm-ascend-netloader/http/1:"
AUTH_HEADER = "X-Netloader-Auth"
TOKEN_ENV = "VLLM_ASCEND_NETLOADER_TOKEN"


class SecurityError(ValueError):
    """Authentication or TLS settings that cannot be used, or a peer that failed authentication."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals; any other name or address counts as remote."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_token(token: str | bytes) -> bytes:
    """``token`` as bytes, refused when shorter than :data:`MIN_TOKEN_BYTES`."""
    raw = token.encode() if isinstance(token, str) else bytes(token)
    raw = raw.strip()
    if len(raw) < MIN_TOKEN_BYTES:
        raise SecurityError(
            f"the netloader token has {len(raw)} bytes; at least {MIN_TOKEN_BYTES} are required "
            "(e.g. `openssl rand -hex 32`)"
        )
    return raw


def read_token(file: str | os.PathLike[str] | None = None, env: str | None = TOKEN_ENV) -> bytes | None:
    """The token from ``file`` (first) or the environment variable ``env``; None when neither is set."""
    if file is not None:
        path = Path(file)
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise SecurityError(f"cannot read the netloader token file {path}: {exc.strerror}") from None
        return check_token(text)
    value = os.environ.get(env) if env else None
    return check_token(value) if value else None


def mac(token: bytes, context: bytes, nonce: bytes) -> str:
    """The hex HMAC-SHA256 a client sends for ``nonce`` on the channel named by ``context``."""
    return hmac.new(token, context + nonce, hashlib.sha256).hexdigest()


def mac_matches(token: bytes, context: bytes, nonce: bytes, answer: str) -> bool:
    """Constant-time check of a client's ``answer`` for ``nonce``."""
    return hmac.compare_digest(mac(token, context, nonce), answer)


@dataclass(frozen=True)
class ServerSecurity:
    """A seed's settings: the shared ``token`` (None: no authentication) and its TLS certificate and key."""

    token: bytes | None = None
    certfile: str | None = None
    keyfile: str | None = None

    def __post_init__(self) -> None:
        if self.token is not None:
            object.__setattr__(self, "token", check_token(self.token))
        if (self.certfile is None) != (self.keyfile is None):
            raise SecurityError("TLS needs both a certificate and its private key (--tls-cert and --tls-key)")
        for label, path in (("certificate", self.certfile), ("private key", self.keyfile)):
            if path is not None and not Path(path).is_file():
                raise SecurityError(f"TLS {label} file {path} does not exist")

    @property
    def tls(self) -> bool:
        return self.certfile is not None

    def check_bind(self, host: str) -> None:
        """Refuse a non-loopback ``host`` without a token: anyone who can connect would read every weight."""
        if self.token is None and not is_loopback(host):
            raise SecurityError(
                f"the seed binds to {host}, which is not a loopback address: a shared token is required "
                f"(set {TOKEN_ENV} or pass --token-file; clients send the same token)"
            )

    def server_context(self) -> ssl.SSLContext | None:
        """The TLS context for the stream port (None without certificates)."""
        if self.certfile is None or self.keyfile is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
        except (ssl.SSLError, OSError) as exc:
            raise SecurityError(
                f"cannot load TLS certificate {self.certfile} with key {self.keyfile}: {exc}"
            ) from None
        return context


def client_context(ca_file: str | os.PathLike[str]) -> ssl.SSLContext:
    """A TLS context that trusts only the CA in ``ca_file`` and checks the seed's host name."""
    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (ssl.SSLError, OSError) as exc:
        raise SecurityError(f"cannot load the TLS CA file {ca_file}: {exc}") from None


class NonceBook:
    """Single-use nonces for the HTTP channel: each lives ``ttl`` seconds, at most ``capacity`` at once."""

    def __init__(self, ttl: float = 60.0, capacity: int = 4096) -> None:
        self.ttl, self.capacity = ttl, capacity
        self._issued: OrderedDict[bytes, float] = OrderedDict()
        self._lock = threading.Lock()

    def issue(self) -> bytes:
        nonce = secrets.token_bytes(NONCE_BYTES)
        with self._lock:
            self._expire()
            while len(self._issued) >= self.capacity:
                self._issued.popitem(last=False)
            self._issued[nonce] = time.monotonic() + self.ttl
        return nonce

    def consume(self, nonce: bytes) -> bool:
        """True once for a nonce this book issued that has not expired."""
        with self._lock:
            self._expire()
            return self._issued.pop(nonce, None) is not None

    def _expire(self) -> None:
        now = time.monotonic()
        while self._issued and next(iter(self._issued.values())) < now:
            self._issued.popitem(last=False)
