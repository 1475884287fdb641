"""Shared pieces of the netloader fuzz and fault tests: a seeded state dict, frame reading, fd/thread counts."""

from __future__ import annotations

import os
import socket
import threading

import pytest
import torch

from vllm_ascend.netloader.protocol import FrameReader, ProtocolError


def make_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(64, 32, generator=g).to(torch.bfloat16),
        "layers.0.weight": torch.randn(48, 32, generator=g),
        "layers.0.bias": torch.randn(48, generator=g).to(torch.float16),
        "layers.0.q": torch.randint(-128, 128, (16, 16), generator=g, dtype=torch.int8),
        "step": torch.tensor(7, dtype=torch.int64),
    }


def raw_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(raw_bytes(got[n]) == raw_bytes(want[n]) for n in want)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def read_answer(conn: socket.socket) -> tuple[list[tuple[str, dict, int]], str]:
    """The seed's frames until it closes, and how it ended: ``close``, ``reset`` or ``bad frame: ...``."""
    reader = FrameReader(conn.recv_into)
    frames: list[tuple[str, dict, int]] = []
    try:
        while (frame := reader.next()) is not None:
            frames.append((frame.type.name, frame.header, frame.payload_len))
    except ConnectionResetError:
        return frames, "reset"
    except ProtocolError as exc:
        return frames, f"bad frame: {exc}"
    return frames, "close"


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that escape any thread while the test runs."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen
