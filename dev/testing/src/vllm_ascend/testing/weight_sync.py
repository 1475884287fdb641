"""A trainer in another process for the weight-transfer tests.

The trainer (``python -m vllm_ascend.testing.weight_sync SPEC``) builds a trainer-side engine through vLLM's
``WeightTransferTrainerFactory`` and drives the inference side's four weight-sync methods (vLLM's
``VLLMWeightSyncClient``) over a ``multiprocessing`` connection to the test process on 127.0.0.1, which answers
each call (:func:`run_trainer`: an ``LLM``'s methods, or a bare worker engine). The weights themselves travel over
the engine's own process group between the two processes. Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

__all__ = ["ConnectionClient", "llm_handlers", "run_trainer"]

HOST = "127.0.0.1"


class ConnectionClient:
    """vLLM's ``VLLMWeightSyncClient`` over a connection: each call waits for the test process's answer."""

    def __init__(self, conn: Connection, timeout_s: float) -> None:
        self.conn = conn
        self.timeout_s = timeout_s
        self._lock = threading.Lock()

    def _call(self, method: str, *args: Any) -> Any:
        with self._lock:
            self.conn.send((method, args))
            if not self.conn.poll(self.timeout_s):
                raise TimeoutError(f"no answer to {method} within {self.timeout_s}s")
            ok, value = self.conn.recv()
        if not ok:
            raise RuntimeError(f"{method} failed on the inference side: {value}")
        return value

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._call("init_weight_transfer_engine", init_info)

    def start_weight_update(self) -> None:
        self._call("start_weight_update")

    def update_weights(self, update_info: Any) -> None:
        self._call("update_weights", update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._call("finish_weight_update")


def llm_handlers(llm: Any) -> dict[str, Callable[..., Any]]:
    """The calls answered by a ``vllm.LLM`` (its RL methods take request dicts). After an update the prefix
    cache is reset, as vLLM's RL examples do: cached blocks hold keys and values of the old weights."""

    def finish() -> None:
        llm.finish_weight_update()
        llm.reset_prefix_cache()

    return {
        "init_weight_transfer_engine": lambda info: llm.init_weight_transfer_engine({"init_info": info}),
        "start_weight_update": llm.start_weight_update,
        "update_weights": lambda info: llm.update_weights({"update_info": info}),
        "finish_weight_update": finish,
    }


def run_trainer(
    spec: Mapping[str, Any],
    handlers: Mapping[str, Callable[..., Any]],
    timeout_s: float = 120,
    env: Mapping[str, str] | None = None,
) -> tuple[Any, str]:
    """Start the trainer on ``spec`` and answer its calls with ``handlers`` until it reports; return its report
    and everything it printed. A failed handler is reported to the trainer and re-raised here."""
    authkey = secrets.token_bytes(16)
    with Listener((HOST, 0), authkey=authkey) as listener, tempfile.TemporaryFile("w+") as log:
        host, port = listener.address
        payload = json.dumps(
            {**spec, "address": [host, port], "authkey": authkey.hex(), "timeout_s": timeout_s}
        )
        environ = {**os.environ, **(env or {})}
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm_ascend.testing.weight_sync", payload],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environ,
        )

        def output() -> str:
            log.seek(0)
            return log.read()

        try:
            conn = _accept(listener, proc, timeout_s)
            if conn is None:
                raise AssertionError(f"the trainer did not connect:\n{output()[-6000:]}")
            report = _serve(conn, handlers, timeout_s)
            proc.wait(timeout=timeout_s)
        except BaseException:
            proc.kill()
            proc.wait(timeout=30)
            raise
        if proc.returncode != 0:
            raise AssertionError(f"trainer exit code {proc.returncode}:\n{output()[-6000:]}")
        return report, output()


def _accept(listener: Listener, proc: subprocess.Popen[Any], timeout_s: float) -> Connection | None:
    accepted: list[Connection] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    return accepted[0] if accepted else None


def _serve(conn: Connection, handlers: Mapping[str, Callable[..., Any]], timeout_s: float) -> Any:
    while True:
        if not conn.poll(timeout_s):
            raise TimeoutError(f"the trainer sent nothing for {timeout_s}s")
        method, args = conn.recv()
        if method == "done":
            return args[0]
        if method == "failed":
            raise AssertionError(f"the trainer failed: {args[0]}")
        try:
            result = handlers[method](*args)
        except BaseException as exc:
            conn.send((False, f"{type(exc).__name__}: {exc}"))
            raise
        conn.send((True, result))


# -- the trainer process ----------------------------------------------------------------------------------
def _source(spec: Mapping[str, Any]) -> Any:
    """The trainer's weights: an HF model (``model``: its directory), or checkpoint-format tensors as stored
    (``safetensors``: a file, e.g. per-expert MoE weights; ``state_dict``: a ``torch.save`` path)."""
    import torch
    from vllm.distributed.weight_transfer.base import ModuleSource, ParamMeta, WeightSource

    if "safetensors" in spec or "state_dict" in spec:
        from safetensors.torch import load_file

        tensors: dict[str, torch.Tensor] = (
            load_file(spec["safetensors"]) if "safetensors" in spec else torch.load(spec["state_dict"])
        )

        class DictSource(WeightSource):
            def metadata(self) -> list[ParamMeta]:
                return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]

            def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
                yield from tensors.items()

        return DictSource()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec["model"], torch_dtype=torch.float32)
    return ModuleSource(model)


def _main(spec: dict[str, Any]) -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
    from vllm.plugins import load_general_plugins

    conn = Client(tuple(spec["address"]), authkey=bytes.fromhex(spec["authkey"]))
    try:
        load_general_plugins()  # the plugin registers its engines with vLLM's factories
        from vllm.utils.network_utils import get_open_port

        from vllm_ascend.runner.weight_transfer import GlooTrainerInitInfo, HcclTrainerInitInfo

        info_cls = {"gloo": GlooTrainerInitInfo, "hccl": HcclTrainerInitInfo}[spec["backend"]]
        init_info = info_cls(
            rank=0,
            master_address=HOST,
            master_port=get_open_port(),
            world_size=spec["world_size"],
            packed=spec.get("packed", True),
            packed_buffer_size_bytes=spec.get("packed_buffer_size_bytes", 1 << 20),
            timeout_s=spec["timeout_s"],
        )
        source = _source(spec)
        client = ConnectionClient(conn, spec["timeout_s"])
        engine = WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)
        for _ in range(spec.get("rounds", 1)):
            engine.send_weights()
        engine.shutdown()
        conn.send(("done", ({"engine": type(engine).__name__, "tensors": len(source.metadata())},)))
    except BaseException as exc:
        conn.send(("failed", (f"{type(exc).__name__}: {exc}",)))
        raise
    finally:
        conn.close()


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
