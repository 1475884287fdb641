"""The PD proxy against real HTTP servers on 127.0.0.1 that act as vLLM prefill (P) and decode (D) instances:
P answers ``kv_transfer_params`` built from the request, D accepts only what a P issued (pull) or posts its
blocks to the metaserver and waits for P's push (layerwise), so each test sees exactly what the proxy sent."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vllm_ascend.kvtransfer.proxy import Answer, InstancePool, Lease, create_app, prompt_size

WAIT = 5.0


class Cluster:
    """What every fake instance shares: an arrival clock, the params P issued, the layerwise pushes done."""

    def __init__(self) -> None:
        self.clock = itertools.count()
        self.issued: dict[str, dict[str, Any]] = {}
        self.pushed: dict[str, threading.Event] = {}
        self.lock = threading.Lock()

    def push_event(self, transfer_id: str) -> threading.Event:
        with self.lock:
            return self.pushed.setdefault(transfer_id, threading.Event())


class FakeVllm:
    """A vLLM instance at the HTTP level, P or D."""

    def __init__(self, role: str, cluster: Cluster) -> None:
        self.role, self.cluster = role, cluster
        self.received: list[tuple[int, str, dict[str, Any]]] = []
        self.delay = 0.0
        self.healthy = True
        self.fail_status: int | None = None
        self.producer = True
        self.active = self.peak = 0
        self.cancelled = threading.Event()
        self.port = 0
        self.app = self._build()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def bodies(self) -> list[dict[str, Any]]:
        return [body for _, _, body in self.received]

    def _build(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=200 if self.healthy else 503)

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "fake", "owned_by": f"{self.role}:{self.port}"}]}

        async def complete(request: Request, path: str) -> Response:
            body = await request.json()
            self.received.append((next(self.cluster.clock), path, body))
            if body.get("user") == f"reject-{self.role}":
                return _error(400, f"{self.role} refuses this user")
            if self.role == "prefill":
                return await self._prefill(body)
            return await self._decode(request, body)

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await complete(request, "/v1/completions")

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await complete(request, "/v1/chat/completions")

        return app

    async def _prefill(self, body: dict[str, Any]) -> Response:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_status is not None:
            return _error(self.fail_status, "prefill broke")
        kv = body.get("kv_transfer_params") or {}
        if "transfer_id" in kv:
            self.cluster.push_event(kv["transfer_id"]).set()
            return JSONResponse({"choices": [{"text": "x"}], "kv_transfer_params": None})
        if not (self.producer and kv.get("do_remote_decode")):
            return JSONResponse({"choices": [{"text": "x"}], "kv_transfer_params": None})
        request_id = f"cmpl-{self.port}-{len(self.received)}"
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": f"engine-{self.port}",
            "remote_block_ids": list(range(prompt_size(body) // 4 + 1)),
            "remote_host": "127.0.0.1",
            "remote_port": self.port,
            "remote_request_id": request_id,
        }
        self.cluster.issued[request_id] = params
        return JSONResponse({"id": request_id, "choices": [{"text": "x"}], "kv_transfer_params": params})

    async def _decode(self, request: Request, body: dict[str, Any]) -> Response:
        kv = body.get("kv_transfer_params") or {}
        if "transfer_id" in kv:
            return await self._decode_layerwise(request, body, kv)
        if kv != self.cluster.issued.get(kv.get("remote_request_id", "")):
            return _error(400, f"kv_transfer_params no prefill issued: {kv}")
        words = [kv["remote_engine_id"], str(len(kv["remote_block_ids"])), "done"]
        return await self._generate(request, body, words, ready=None)

    async def _decode_layerwise(self, request: Request, body: dict[str, Any], kv: dict[str, Any]) -> Response:
        fields = {
            "transfer_id": kv["transfer_id"],
            "remote_engine_id": f"engine-{self.port}",
            "remote_host": "127.0.0.1",
            "remote_port": self.port,
            "remote_block_ids": [7, 8],
            "remote_tp_size": 1,
            "remote_request_id": f"cmpl-d-{self.port}-{len(self.received)}",
        }
        async with httpx.AsyncClient(trust_env=False) as client:
            posted = await client.post(kv["metaserver"], json=fields)
        if posted.status_code != 200 or posted.json() != {}:
            return _error(500, f"metaserver answered {posted.status_code} {posted.text}")
        return await self._generate(request, body, [kv["transfer_id"], "done"], ready=kv["transfer_id"])

    async def _generate(
        self, request: Request, body: dict[str, Any], words: list[str], ready: str | None
    ) -> Response:
        """Waits (layerwise) for P's push, then answers ``words``: one SSE event each when streaming, after a
        first role event as vLLM's chat stream does; a client that goes away is recorded in ``cancelled``."""

        async def pushed() -> bool:
            event = self.cluster.push_event(ready) if ready else None
            deadline = time.monotonic() + WAIT
            while event is not None and not event.is_set() and time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.cancelled.set()
                    return False
                await asyncio.sleep(0.01)
            if self.delay:
                await asyncio.sleep(self.delay)
            return event is None or event.is_set()

        self.active += 1
        self.peak = max(self.peak, self.active)
        if not body.get("stream"):
            try:
                if not await pushed():
                    return _error(500, "no push")
                return JSONResponse({"choices": [{"text": " ".join(words)}]})
            finally:
                self.active -= 1

        async def events() -> Any:
            finished = False
            try:
                yield 'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n'
                if not await pushed():
                    return
                for word in words:
                    yield f"data: {json.dumps({'choices': [{'text': word}]})}\n\n"
                    await asyncio.sleep(0.01)
                yield "data: [DONE]\n\n"
                finished = True
            finally:
                self.active -= 1
                if not finished:
                    self.cancelled.set()

        return StreamingResponse(events(), media_type="text/event-stream")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError", "code": status}}, status)


class Served:
    """An ASGI app served by uvicorn on a free 127.0.0.1 port in a thread, until ``stop``."""

    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture
def serve() -> Iterator[Any]:
    """Serves apps and fake instances for one test; stops them all at its end."""
    served: list[Served] = []

    def start(thing: Any) -> Any:
        server = Served(thing.app if isinstance(thing, FakeVllm) else thing)
        served.append(server)
        if isinstance(thing, FakeVllm):
            thing.port = server.port
            return thing
        return server

    yield start
    for server in reversed(served):
        server.stop()


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=WAIT) as c:
        yield c


def fakes(serve: Any, cluster: Cluster, role: str, n: int) -> list[FakeVllm]:
    return [serve(FakeVllm(role, cluster)) for _ in range(n)]


def start_proxy(serve: Any, prefill: list[str], decode: list[str], **kwargs: Any) -> tuple[Served, Any]:
    app = create_app(prefill, decode, timeout=WAIT, **kwargs)
    return serve(app), app.state.proxy


def loads(proxy: Any) -> list[int]:
    return [*proxy.prefill.loads().values(), *proxy.decode.loads().values()]


def wait_until(condition: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


COMPLETION = {"model": "fake", "prompt": "hello there, decode", "max_tokens": 8, "temperature": 0}
CHAT = {
    "model": "fake",
    "messages": [{"role": "user", "content": "hi"}],
    "max_completion_tokens": 5,
    "stream": True,
    "stream_options": {"include_usage": True},
}


def sse_events(raw: bytes) -> list[Any]:
    events = [block.removeprefix("data: ") for block in raw.decode().split("\n\n") if block]
    return [event if event == "[DONE]" else json.loads(event) for event in events]


# ---- pull mode (MooncakeConnectorV1) ----


def test_pull_sends_one_token_prefill_then_the_original_with_its_params(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url])

    response = client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 200, response.text
    (p_body,), (d_body,) = p.bodies(), d.bodies()
    assert p_body == {
        **COMPLETION,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    issued = cluster.issued[f"cmpl-{p.port}-1"]
    assert d_body == {**COMPLETION, "kv_transfer_params": issued}
    assert response.json() == {
        "choices": [{"text": f"engine-{p.port} {len(issued['remote_block_ids'])} done"}]
    }
    assert loads(proxy) == [0, 0]


def test_pull_chat_stream_is_relayed_chunk_by_chunk_in_order(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url])

    with client.stream("POST", f"{proxy_server.url}/v1/chat/completions", json={**CHAT, "n": 2}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(response.iter_raw())

    (p_body,) = p.bodies()
    assert p_body["max_tokens"] == p_body["max_completion_tokens"] == 1
    assert p_body["stream"] is False and "stream_options" not in p_body and p_body["n"] == 2
    assert d.bodies()[0] == {**CHAT, "n": 2, "kv_transfer_params": cluster.issued[f"cmpl-{p.port}-1"]}
    assert len(chunks) > 1
    assert sse_events(b"".join(chunks)) == [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"text": f"engine-{p.port}"}]},
        {"choices": [{"text": "1"}]},
        {"choices": [{"text": "done"}]},
        "[DONE]",
    ]
    assert loads(proxy) == [0, 0]


def test_prefill_without_kv_transfer_params_is_a_502(serve, cluster, client):
    (p,) = fakes(serve, cluster, "prefill", 1)
    (d,) = fakes(serve, cluster, "decode", 1)
    p.producer = False
    proxy_server, _ = start_proxy(serve, [p.url], [d.url])

    response = client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 502
    message = response.json()["error"]["message"]
    assert message == (
        f"the prefill instance {p.url} returned no kv_transfer_params (is it started with kv_role kv_producer?)"
    )
    assert d.bodies() == []


def test_client_errors_are_relayed_with_their_status(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url])
    url = f"{proxy_server.url}/v1/completions"

    bad_prefill = client.post(url, json={**COMPLETION, "user": "reject-prefill"})
    bad_decode = client.post(url, json={**COMPLETION, "user": "reject-decode", "stream": True})
    not_json = client.post(url, content=b"{nope", headers={"content-type": "application/json"})
    not_object = client.post(url, json=[1, 2])

    assert (bad_prefill.status_code, bad_prefill.json()["error"]["message"]) == (
        400,
        "prefill refuses this user",
    )
    assert len(d.bodies()) == 1
    assert bad_decode.status_code == 400
    assert bad_decode.json()["error"]["message"] == "decode refuses this user"
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"
    assert not_object.status_code == 400
    assert loads(proxy) == [0, 0]


def test_failover_to_the_next_prefill_when_one_is_down(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    proxy_server, proxy = start_proxy(serve, [closed_port_url(), p.url], [d.url])

    statuses = [
        client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION).status_code for _ in range(2)
    ]

    assert statuses == [200, 200]
    assert len(p.bodies()) == 2 and len(d.bodies()) == 2
    assert loads(proxy) == [0, 0, 0]


def test_every_instance_down_is_a_503_naming_them(serve, cluster, client):
    (p,) = fakes(serve, cluster, "prefill", 1)
    down = [closed_port_url(), closed_port_url()]
    no_prefill, _ = start_proxy(serve, down, [p.url])
    no_decode, proxy = start_proxy(serve, [p.url], down)

    for server, role in ((no_prefill, "prefill"), (no_decode, "decode")):
        response = client.post(f"{server.url}/v1/completions", json=COMPLETION)
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["type"] == "service_unavailable" and error["code"] == 503
        assert error["message"].startswith(f"no {role} instance is reachable; tried {down[0]} (")
        assert all(url in error["message"] for url in down)
    assert loads(proxy) == [0, 0, 0]


def test_decode_balancing_by_outstanding_requests(serve, cluster, client):
    (p,) = fakes(serve, cluster, "prefill", 1)
    decodes = fakes(serve, cluster, "decode", 2)
    for d in decodes:
        d.delay = 0.3
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url for d in decodes])
    seen_loads: list[int] = []

    async def burst() -> list[int]:
        async with httpx.AsyncClient(trust_env=False, timeout=WAIT) as ac:
            sends = [ac.post(f"{proxy_server.url}/v1/completions", json=COMPLETION) for _ in range(4)]
            tasks = [asyncio.ensure_future(s) for s in sends]
            while not all(d.active for d in decodes) and not all(t.done() for t in tasks):
                await asyncio.sleep(0.01)
            seen_loads.append(sum(proxy.decode.loads().values()))
            return [(await t).status_code for t in tasks]

    assert asyncio.run(burst()) == [200] * 4
    assert [len(d.bodies()) for d in decodes] == [2, 2]
    assert [d.peak for d in decodes] == [2, 2]
    assert seen_loads[0] >= 2
    assert loads(proxy) == [0, 0, 0]


def test_equal_loads_take_turns_and_prefill_ranks_by_prompt_size():
    pool = InstancePool("prefill", ["http://a:1", "http://b:2", "http://c:3"])
    assert [pool.ranked()[0].url for _ in range(4)] == [
        "http://a:1",
        "http://b:2",
        "http://c:3",
        "http://a:1",
    ]
    a, b, c = pool.instances
    long_prompt = Lease(a, prompt_size({"prompt": "x" * 1000}))
    short = Lease(
        b, prompt_size({"messages": [{"role": "user", "content": [{"type": "text", "text": "hey"}]}]})
    )
    tokens = Lease(c, prompt_size({"prompt": [[1, 2, 3, 4, 5]]}))
    assert pool.loads() == {"http://a:1": 1000, "http://b:2": 3, "http://c:3": 5}
    assert [i.url for i in pool.ranked()] == ["http://b:2", "http://c:3", "http://a:1"]
    for lease in (long_prompt, short, tokens, tokens):
        lease.release()
    assert pool.loads() == {"http://a:1": 0, "http://b:2": 0, "http://c:3": 0}


def test_client_leaving_mid_stream_gives_the_load_back(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    d.delay = 0.5
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url])

    with client.stream(
        "POST", f"{proxy_server.url}/v1/completions", json={**COMPLETION, "stream": True}
    ) as r:
        assert next(r.iter_raw()).startswith(b"data: ")
        assert proxy.decode.loads() == {d.url: 1}

    wait_until(lambda: loads(proxy) == [0, 0])
    wait_until(d.cancelled.is_set)


# ---- /health and /v1/models ----


def test_health_and_models(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    down = closed_port_url()
    proxy_server, _ = start_proxy(serve, [p.url, down], [d.url])

    healthy = client.get(f"{proxy_server.url}/health")
    models = client.get(f"{proxy_server.url}/v1/models")
    d.healthy = False
    sick = client.get(f"{proxy_server.url}/health")

    assert healthy.status_code == 200 and healthy.content == b""
    assert models.json()["data"][0]["owned_by"] == f"decode:{d.port}"
    assert sick.status_code == 503
    assert {(x["role"], x["url"]) for x in sick.json()["down"]} == {("prefill", down), ("decode", d.url)}
    assert d.url in sick.json()["error"]["message"] and down in sick.json()["error"]["message"]


def test_models_falls_back_to_prefill(serve, cluster, client):
    (p,) = fakes(serve, cluster, "prefill", 1)
    proxy_server, _ = start_proxy(serve, [p.url], [closed_port_url()])
    assert client.get(f"{proxy_server.url}/v1/models").json()["data"][0]["owned_by"] == f"prefill:{p.port}"


# ---- layerwise mode (MooncakeLayerwiseConnector) ----


def layerwise_setup(serve, cluster) -> tuple[FakeVllm, FakeVllm, Served, Any]:
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url], layerwise=True)
    return p, d, proxy_server, proxy


def test_layerwise_decode_first_then_prefill_with_decodes_blocks(serve, cluster, client):
    p, d, proxy_server, proxy = layerwise_setup(serve, cluster)

    response = client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 200, response.text
    ((d_time, _, d_body),), ((p_time, _, p_body),) = d.received, p.received
    assert d_time < p_time
    kv = d_body["kv_transfer_params"]
    transfer_id = kv["transfer_id"]
    assert len(transfer_id) == 32 and int(transfer_id, 16) >= 0
    assert d_body == {
        **COMPLETION,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": transfer_id,
            "metaserver": f"{proxy_server.url}/v1/metaserver",
        },
    }
    assert p_body == {
        **COMPLETION,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "transfer_id": transfer_id,
            "remote_engine_id": f"engine-{d.port}",
            "remote_host": "127.0.0.1",
            "remote_port": d.port,
            "remote_block_ids": [7, 8],
            "remote_tp_size": 1,
            "remote_request_id": f"cmpl-d-{d.port}-1",
        },
    }
    assert response.json() == {"choices": [{"text": f"{transfer_id} done"}]}
    assert loads(proxy) == [0, 0] and proxy.transfers == {}
    late = client.post(f"{proxy_server.url}/v1/metaserver", json=p_body["kv_transfer_params"])
    assert late.status_code == 404 and transfer_id in late.json()["error"]["message"]


def test_layerwise_stream_and_public_url(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    elsewhere, _ = start_proxy(serve, [p.url], [d.url], layerwise=True)
    proxy_server, proxy = start_proxy(serve, [p.url], [d.url], layerwise=True, public_url=elsewhere.url)
    # D posts to the proxy named by public_url, which knows no such transfer: D's request then fails.
    failed = client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION)
    assert failed.status_code == 500 and "404" in failed.json()["error"]["message"]
    assert d.bodies()[0]["kv_transfer_params"]["metaserver"] == f"{elsewhere.url}/v1/metaserver"

    with client.stream("POST", f"{elsewhere.url}/v1/chat/completions", json=CHAT) as response:
        assert response.status_code == 200
        events = sse_events(response.read())
    transfer_id = d.bodies()[1]["kv_transfer_params"]["transfer_id"]
    assert events[1:] == [{"choices": [{"text": transfer_id}]}, {"choices": [{"text": "done"}]}, "[DONE]"]
    assert p.bodies()[0]["max_completion_tokens"] == 1 and "stream_options" not in p.bodies()[0]
    assert loads(proxy) == [0, 0]


def test_layerwise_prefill_failure_before_output_is_its_error_and_cancels_decode(serve, cluster, client):
    p, d, proxy_server, proxy = layerwise_setup(serve, cluster)
    p.fail_status = 500

    response = client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 500
    assert response.json()["error"]["message"] == "prefill broke"
    wait_until(d.cancelled.is_set)
    wait_until(lambda: loads(proxy) == [0, 0])
    assert proxy.transfers == {}


def test_layerwise_prefill_failure_mid_stream_ends_it_with_an_error_event(serve, cluster, client):
    p, d, proxy_server, proxy = layerwise_setup(serve, cluster)
    p.delay = 0.2
    p.fail_status = 503

    with client.stream(
        "POST", f"{proxy_server.url}/v1/completions", json={**COMPLETION, "stream": True}
    ) as r:
        assert r.status_code == 200
        events = sse_events(r.read())

    assert events == [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"error": {"message": "prefill broke", "type": "BadRequestError", "code": 503}},
    ]
    wait_until(d.cancelled.is_set)
    wait_until(lambda: loads(proxy) == [0, 0])


def test_layerwise_every_prefill_down_is_a_503_and_cancels_decode(serve, cluster, client):
    (d,) = fakes(serve, cluster, "decode", 1)
    down = closed_port_url()
    proxy_server, proxy = start_proxy(serve, [down], [d.url], layerwise=True)

    response = client.post(f"{proxy_server.url}/v1/completions", json=COMPLETION)

    assert response.status_code == 503
    assert response.json()["error"]["message"].startswith(f"no prefill instance is reachable; tried {down} (")
    wait_until(d.cancelled.is_set)
    assert loads(proxy) == [0, 0]


def test_metaserver_refuses_malformed_and_unknown_posts(serve, cluster, client):
    _, _, proxy_server, _ = layerwise_setup(serve, cluster)
    url = f"{proxy_server.url}/v1/metaserver"
    full = {
        "transfer_id": "f" * 32,
        "remote_engine_id": "e",
        "remote_host": "127.0.0.1",
        "remote_port": 1,
        "remote_block_ids": [1],
        "remote_tp_size": 1,
        "remote_request_id": "r",
    }

    missing = client.post(url, json={k: v for k, v in full.items() if k != "remote_block_ids"})
    unknown = client.post(url, json=full)
    garbage = client.post(url, content=b"][", headers={"content-type": "application/json"})

    assert (missing.status_code, missing.json()["error"]["message"]) == (
        400,
        "the metaserver body lacks remote_block_ids",
    )
    assert unknown.status_code == 404
    assert (
        unknown.json()["error"]["message"]
        == f"transfer_id {'f' * 32!r} is unknown, finished or already posted"
    )
    assert garbage.status_code == 400


def test_pull_mode_has_no_metaserver(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    proxy_server, _ = start_proxy(serve, [p.url], [d.url])
    assert client.post(f"{proxy_server.url}/v1/metaserver", json={}).status_code == 404


def test_answer_as_a_stream_event():
    relayed = Answer(500, b"upstream exploded", "text/plain")
    assert relayed.sse_event() == (
        b'data: {"error": {"message": "upstream exploded", "type": "error", "code": 500}}\n\n'
    )


# ---- the console command ----


# core's ``vllm-ascend`` loads the kvtransfer extension only once every path it registers resolves (the
# connectors included), so the command runs here the way core puts it together, in its own interpreter.
DRIVER = """
import argparse, sys
from vllm_ascend.kvtransfer.proxy_cli import PD_PROXY_COMMAND as command
parser = argparse.ArgumentParser(prog="vllm-ascend")
command.configure(parser.add_subparsers(dest="command", required=True).add_parser(command.name))
sys.exit(command.run(parser.parse_args(sys.argv[1:])))
"""


def test_cli_serves_until_interrupted(serve, cluster, client):
    (p,), (d,) = fakes(serve, cluster, "prefill", 1), fakes(serve, cluster, "decode", 1)
    port = int(closed_port_url().rsplit(":", 1)[1])
    argv = ["pd-proxy", "--prefill", p.url, "--decode", d.url, "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "pd-proxy did not come up"
            try:
                if client.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        response = client.post(f"http://127.0.0.1:{port}/v1/completions", json=COMPLETION)
        assert response.status_code == 200
        assert response.json()["choices"][0]["text"].startswith(f"engine-{p.port} ")
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert out.startswith(f"pd-proxy at http://127.0.0.1:{port}, pull (prefill first): prefill {p.url}; ")
