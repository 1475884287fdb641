"""A seed server on 127.0.0.1 serving a small state dict, and an ASGI wrapper that damages /batch bodies."""

from __future__ import annotations

import pytest
import torch
from vllm_ascend.netloader.seed_server import SeedServer

CHUNK = 1000


def make_state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(40, 16, generator=g).to(torch.bfloat16),
        "layers.0.linear.weight": torch.randn(24, 16, generator=g),
        "layers.0.linear.bias": torch.randn(24, generator=g).to(torch.float16),
        "layers.0.q.weight": torch.randint(-128, 128, (24, 16), generator=g, dtype=torch.int8),
        "layers.0.fp8": torch.randn(8, 8, generator=g).to(torch.float8_e4m3fn),
        "mask": torch.rand(7, generator=g) > 0.5,
        "step": torch.tensor(123456789, dtype=torch.int64),
        "empty": torch.empty(0, 3),
    }


class Tamper:
    """Wraps an ASGI app; for the first ``times`` /batch responses, flips the body byte at ``at`` or cuts there."""

    def __init__(self, app, mode: str, at: int, times: int) -> None:
        self.app, self.mode, self.at, self.times = app, mode, at, times
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            self.paths.append(scope["path"])
        if scope["type"] != "http" or scope["path"] != "/batch" or self.times == 0:
            return await self.app(scope, receive, send)
        self.times -= 1
        seen, done = 0, False

        async def damaged(message):
            nonlocal seen, done
            if done:
                return
            if message["type"] == "http.response.body":
                body = bytearray(message.get("body", b""))
                if seen <= self.at < seen + len(body):
                    if self.mode == "flip":
                        body[self.at - seen] ^= 0xFF
                    else:
                        body, done = body[: self.at - seen], True
                seen += len(message.get("body", b""))
                message = {**message, "body": bytes(body), "more_body": message.get("more_body", False) and not done}
            await send(message)

        await self.app(scope, receive, damaged)


@pytest.fixture(scope="module")
def state_dict():
    return make_state_dict()


@pytest.fixture
def fresh_state_dict():
    """A new copy of the test state dict (tests may damage it)."""
    return make_state_dict()


@pytest.fixture
def tamper():
    return Tamper


@pytest.fixture(scope="module")
def seed(state_dict):
    with SeedServer.serving(state_dict, chunk_bytes=CHUNK) as server:
        yield server
