"""The OpenAI-compatible proxy in front of prefill (P) and decode (D) vLLM instances (``vllm-ascend pd-proxy``).

Pull mode (``MooncakeConnectorV1``): P computes the prompt's KV cache (``max_tokens`` 1) and answers with the
``kv_transfer_params`` D needs to pull it; D then gets the client's request with exactly those and generates.
Layerwise mode (``MooncakeLayerwiseConnector``): P pushes each layer into D's blocks as it computes it, so D
goes first; D's connector posts its blocks to this proxy's ``/v1/metaserver``, and that post starts P.

Only FastAPI and httpx: no vLLM import, so the proxy runs on a host without vLLM.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

DEFAULT_TIMEOUT = 600.0
#: Connecting is quick or the instance is down: past this the next instance is tried.
CONNECT_TIMEOUT = 10.0
#: An instance's ``/health`` must answer within this to count as up.
HEALTH_TIMEOUT = 2.0
METASERVER_PATH = "/v1/metaserver"
#: The fields a decode instance's layerwise connector posts to the metaserver; all are handed to P.
METASERVER_FIELDS = (
    "transfer_id",
    "remote_engine_id",
    "remote_host",
    "remote_port",
    "remote_block_ids",
    "remote_tp_size",
    "remote_request_id",
)
#: Pull mode's ``kv_transfer_params`` for P: compute the prompt and keep its blocks for a remote decode.
PULL_PREFILL_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
_FORWARDED_HEADERS = ("authorization",)
_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found",
    502: "bad_gateway",
    503: "service_unavailable",
}
_UNSPECIFIED_HOSTS = ("0.0.0.0", "::")

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """A complete HTTP answer for the client: an instance's error relayed as it came, or the proxy's own."""

    status: int
    body: bytes
    media_type: str = "application/json"

    @classmethod
    def error(cls, status: int, message: str) -> Answer:
        """The proxy's own error, in OpenAI's shape."""
        error = {"message": message, "type": _ERROR_TYPES.get(status, "error"), "code": status}
        return cls(status, json.dumps({"error": error}).encode())

    def response(self) -> Response:
        return Response(self.body, status_code=self.status, media_type=self.media_type)

    def sse_event(self) -> bytes:
        """This answer as the last event of a stream already under way: ``data: {"error": ...}``."""
        try:
            error = json.loads(self.body)["error"]
        except (ValueError, KeyError, TypeError):
            error = json.loads(Answer.error(self.status, self.body.decode(errors="replace")).body)["error"]
        return f"data: {json.dumps({'error': error})}\n\n".encode()


class Refused(Exception):
    """Ends a client request with ``answer`` (raised wherever the proxy cannot go on)."""

    def __init__(self, answer: Answer) -> None:
        super().__init__(answer.body.decode(errors="replace"))
        self.answer = answer


def _refuse(status: int, message: str) -> Refused:
    return Refused(Answer.error(status, message))


async def _relayed(response: httpx.Response) -> Answer:
    """An instance's answer (read whole) as it came: status, body and content type."""
    body = await response.aread()
    return Answer(response.status_code, body, response.headers.get("content-type", "application/json"))


class Instance:
    """One vLLM instance and the load the proxy has sent it and not yet seen finish."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.load = 0


class Lease:
    """``weight`` units of an instance's load, given back once however the request ends."""

    def __init__(self, instance: Instance, weight: int) -> None:
        self.instance, self.weight = instance, weight
        instance.load += weight
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.instance.load -= self.weight


class InstancePool:
    """The prefill or the decode instances, least outstanding load first; equal loads take turns."""

    def __init__(self, role: str, urls: Sequence[str]) -> None:
        if not urls:
            raise ValueError(f"at least one {role} instance URL is needed")
        self.role = role
        self.instances = [Instance(url.rstrip("/")) for url in urls]
        self._turn = 0

    def ranked(self) -> list[Instance]:
        """Every instance in the order to try them; the first one's turn is taken."""
        n = len(self.instances)
        order = sorted(range(n), key=lambda i: (self.instances[i].load, (i - self._turn) % n))
        self._turn = (order[0] + 1) % n
        return [self.instances[i] for i in order]

    def loads(self) -> dict[str, int]:
        return {instance.url: instance.load for instance in self.instances}


def prompt_size(body: Mapping[str, Any]) -> int:
    """P's load estimate for a request: characters of its prompt or messages, tokens of a token prompt."""
    if isinstance(body.get("messages"), list):
        size = sum(_content_size(m.get("content")) for m in body["messages"] if isinstance(m, dict))
    else:
        size = _prompt_size(body.get("prompt"))
    return max(size, 1)


def _prompt_size(prompt: Any) -> int:
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list):
        return sum(_prompt_size(p) if isinstance(p, str | list) else 1 for p in prompt)
    return 0


def _content_size(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(
            len(part["text"])
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return 0


def prefill_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The request P computes: the client's, one token, not streamed, with ``kv_transfer_params``."""
    request = {key: value for key, value in body.items() if key != "stream_options"}
    request.update(max_tokens=1, stream=False, kv_transfer_params=dict(kv_transfer_params))
    if "max_completion_tokens" in request:
        request["max_completion_tokens"] = 1
    return request


async def _race(awaitable: Awaitable[T], failed: asyncio.Future[Answer] | None) -> T:
    """``awaitable``'s result, unless ``failed`` (the P call of a layerwise request) resolves first."""
    if failed is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    contenders: set[asyncio.Future[Any]] = {task, failed}
    try:
        await asyncio.wait(contenders, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({task})
    if task.cancelled() or not task.done():
        raise Refused(failed.result())
    return task.result()


class _Relay(StreamingResponse):
    """An instance's stream relayed to the client; ``close`` runs however it ends (done, error, client gone)."""

    def __init__(
        self, chunks: AsyncIterator[bytes], status: int, close: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(chunks, status_code=status, media_type="text/event-stream")
        self._close = close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._close()


class _Transfer:
    """A layerwise request between its D call and the P call that D's metaserver post starts."""

    def __init__(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> None:
        self.path, self.body, self.headers = path, body, headers
        self.failed: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.prefill_started = False


class PDProxy:
    """The instance pools, the requests in flight between P and D, and the one HTTP client they share."""

    def __init__(
        self,
        prefill_urls: Sequence[str],
        decode_urls: Sequence[str],
        *,
        layerwise: bool = False,
        public_url: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.prefill = InstancePool("prefill", prefill_urls)
        self.decode = InstancePool("decode", decode_urls)
        self.layerwise = layerwise
        self.public_url = public_url.rstrip("/") if public_url else None
        self.timeout = timeout
        self.transfers: dict[str, _Transfer] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The shared HTTP client while the app serves; background P calls are cancelled when it stops."""
        timeout = httpx.Timeout(self.timeout, connect=min(self.timeout, CONNECT_TIMEOUT))
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client:
            self._client = client
            try:
                yield
            finally:
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.gather(*self._tasks, return_exceptions=True)
                self._client = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("the proxy's HTTP client exists only while the app runs (its lifespan)")
        return self._client

    async def complete(self, request: Request, path: str) -> Response:
        """``POST`` ``path`` (completions or chat completions) through P and D."""
        try:
            body = json.loads(await request.body())
        except ValueError:
            return Answer.error(400, "the request body is not valid JSON").response()
        if not isinstance(body, dict):
            return Answer.error(400, "the request body must be a JSON object").response()
        headers = {name: value for name in _FORWARDED_HEADERS if (value := request.headers.get(name))}
        try:
            if self.layerwise:
                return await self._layerwise(request, path, body, headers)
            return await self._pull(path, body, headers)
        except Refused as refused:
            return refused.answer.response()

    async def _pull(self, path: str, body: dict[str, Any], headers: Mapping[str, str]) -> Response:
        prefill, lease = await self._open(
            self.prefill, path, prefill_body(body, PULL_PREFILL_PARAMS), headers
        )
        try:
            answer = await self._read(prefill)
        finally:
            lease.release()
        if not 200 <= answer.status < 300:
            return answer.response()
        try:
            params = json.loads(answer.body).get("kv_transfer_params")
        except (ValueError, AttributeError):
            params = None
        if not isinstance(params, dict):
            raise _refuse(
                502,
                f"the prefill instance {lease.instance.url} returned no kv_transfer_params "
                "(is it started with kv_role kv_producer?)",
            )
        decode, lease = await self._open(self.decode, path, {**body, "kv_transfer_params": params}, headers)
        return await self._answer(decode, lease, body.get("stream") is True)

    async def _layerwise(
        self, request: Request, path: str, body: dict[str, Any], headers: Mapping[str, str]
    ) -> Response:
        transfer_id = uuid.uuid4().hex
        transfer = _Transfer(path, body, headers)
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": transfer_id,
            "metaserver": f"{self.public_url or _own_url(request)}{METASERVER_PATH}",
        }
        self.transfers[transfer_id] = transfer

        async def finish() -> None:
            self.transfers.pop(transfer_id, None)

        try:
            decode, lease = await self._open(
                self.decode, path, {**body, "kv_transfer_params": params}, headers, failed=transfer.failed
            )
        except BaseException:
            await finish()
            raise
        return await self._answer(decode, lease, body.get("stream") is True, transfer.failed, finish)

    async def metaserver(self, request: Request) -> Response:
        """D's layerwise connector tells where its blocks are: answered at once, P is asked in the background."""
        try:
            fields = json.loads(await request.body())
        except ValueError:
            return Answer.error(400, "the metaserver body is not valid JSON").response()
        if not isinstance(fields, dict):
            return Answer.error(400, "the metaserver body must be a JSON object").response()
        missing = [name for name in METASERVER_FIELDS if name not in fields]
        if missing:
            return Answer.error(400, f"the metaserver body lacks {', '.join(missing)}").response()
        transfer = (
            self.transfers.get(fields["transfer_id"]) if isinstance(fields["transfer_id"], str) else None
        )
        if transfer is None or transfer.prefill_started:
            message = f"transfer_id {fields['transfer_id']!r} is unknown, finished or already posted"
            return Answer.error(404, message).response()
        transfer.prefill_started = True
        task = asyncio.create_task(self._prefill(transfer, fields))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return JSONResponse({})

    async def _prefill(self, transfer: _Transfer, fields: Mapping[str, Any]) -> None:
        """Layerwise P call; its failure ends the client's request and cancels D's."""
        params = {"do_remote_decode": True, "do_remote_prefill": False, **fields}
        try:
            prefill, lease = await self._open(
                self.prefill, transfer.path, prefill_body(transfer.body, params), transfer.headers
            )
            try:
                answer = await self._read(prefill)
            finally:
                lease.release()
        except Refused as refused:
            answer = refused.answer
        if not 200 <= answer.status < 300 and not transfer.failed.done():
            transfer.failed.set_result(answer)

    async def _open(
        self,
        pool: InstancePool,
        path: str,
        body: Mapping[str, Any],
        headers: Mapping[str, str],
        *,
        failed: asyncio.Future[Answer] | None = None,
    ) -> tuple[httpx.Response, Lease]:
        """Send ``body`` to the least loaded instance that accepts a connection; its response, headers read."""
        weight = prompt_size(body) if pool is self.prefill else 1
        unreachable = []
        for instance in pool.ranked():
            lease = Lease(instance, weight)
            request = self.client.build_request("POST", instance.url + path, json=body, headers=headers)
            try:
                return await _race(self.client.send(request, stream=True), failed), lease
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                lease.release()
                unreachable.append(f"{instance.url} ({exc or type(exc).__name__})")
            except httpx.HTTPError as exc:
                lease.release()
                raise _refuse(
                    502, f"the {pool.role} instance {instance.url} failed: {_describe(exc)}"
                ) from exc
            except BaseException:
                lease.release()
                raise
        raise _refuse(503, f"no {pool.role} instance is reachable; tried {', '.join(unreachable)}")

    async def _read(self, response: httpx.Response) -> Answer:
        try:
            return await _relayed(response)
        except httpx.HTTPError as exc:
            raise _refuse(502, f"{response.request.url} failed: {_describe(exc)}") from exc
        finally:
            await response.aclose()

    async def _answer(
        self,
        decode: httpx.Response,
        lease: Lease,
        stream: bool,
        failed: asyncio.Future[Answer] | None = None,
        finish: Callable[[], Awaitable[None]] | None = None,
    ) -> Response:
        """D's response for the client: relayed chunk by chunk when the client streams and D accepted,
        else read whole. The first chunk is awaited here, so a failure before it is a plain error answer."""

        async def close() -> None:
            lease.release()
            with anyio.CancelScope(shield=True):
                await decode.aclose()
                if finish is not None:
                    await finish()

        relay: _Relay | None = None
        try:
            if not (stream and decode.is_success):
                return (await _race(self._read(decode), failed)).response()
            chunks = decode.aiter_raw()
            try:
                first = await _race(anext(chunks, b""), failed)
            except httpx.HTTPError as exc:
                raise _refuse(
                    502, f"the decode instance {decode.request.url} failed: {_describe(exc)}"
                ) from exc
            relay = _Relay(_relay(first, chunks, decode, failed), decode.status_code, close)
        finally:
            if relay is None:
                await close()
        return relay

    async def models(self) -> Response:
        """``GET /v1/models`` of the first decode instance that answers (a prefill one if none does)."""
        tried = []
        for instance in [*self.decode.instances, *self.prefill.instances]:
            try:
                response = await self.client.get(f"{instance.url}/v1/models")
            except httpx.HTTPError as exc:
                tried.append(f"{instance.url} ({_describe(exc)})")
                continue
            if response.status_code < 500:
                return Answer(
                    response.status_code, response.content, response.headers.get("content-type", "")
                ).response()
            tried.append(f"{instance.url} (status {response.status_code})")
        return Answer.error(503, f"no instance answers /v1/models; tried {', '.join(tried)}").response()

    async def health(self) -> Response:
        """200 with an empty body while at least one P and one D answer ``/health``; else 503 naming the
        instances that are down."""
        roles = [(pool.role, instance) for pool in (self.prefill, self.decode) for instance in pool.instances]
        problems = await asyncio.gather(*(self._probe(instance) for _, instance in roles))
        down = [
            {"role": role, "url": instance.url, "reason": problem}
            for (role, instance), problem in zip(roles, problems, strict=True)
            if problem is not None
        ]
        up_roles = {role for (role, _), problem in zip(roles, problems, strict=True) if problem is None}
        if {"prefill", "decode"} <= up_roles:
            return Response(status_code=200)
        message = "; ".join(f"{d['role']} {d['url']} is down ({d['reason']})" for d in down)
        body = json.loads(Answer.error(503, message).body)
        return JSONResponse({**body, "down": down}, status_code=503)

    async def _probe(self, instance: Instance) -> str | None:
        try:
            response = await self.client.get(
                f"{instance.url}/health", timeout=min(self.timeout, HEALTH_TIMEOUT)
            )
        except httpx.HTTPError as exc:
            return _describe(exc)
        return None if response.status_code == 200 else f"status {response.status_code}"


async def _relay(
    first: bytes, chunks: AsyncIterator[bytes], decode: httpx.Response, failed: asyncio.Future[Answer] | None
) -> AsyncIterator[bytes]:
    """D's stream, chunk by chunk; a failure on the way ends it with an SSE error event."""
    chunk = first
    while chunk:
        yield chunk
        try:
            chunk = await _race(anext(chunks, b""), failed)
        except Refused as refused:
            yield refused.answer.sse_event()
            return
        except httpx.HTTPError as exc:
            message = f"the decode instance {decode.request.url} failed: {_describe(exc)}"
            yield Answer.error(502, message).sse_event()
            return


def _describe(exc: httpx.HTTPError) -> str:
    return str(exc) or type(exc).__name__


def _own_url(request: Request) -> str:
    """This proxy's address as the client reached it (an unspecified bind address as loopback)."""
    host, port = request.scope.get("server") or ("127.0.0.1", 80)
    host = "127.0.0.1" if host in _UNSPECIFIED_HOSTS else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def create_app(
    prefill_urls: Sequence[str],
    decode_urls: Sequence[str],
    *,
    layerwise: bool = False,
    public_url: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> FastAPI:
    """The proxy app; ``app.state.proxy`` is its :class:`PDProxy`. ``public_url`` is where D instances reach
    the metaserver (layerwise mode; default: the address the client used to reach the proxy)."""
    proxy = PDProxy(prefill_urls, decode_urls, layerwise=layerwise, public_url=public_url, timeout=timeout)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with proxy.running():
            yield

    app = FastAPI(title="vllm-ascend PD proxy", lifespan=lifespan)
    app.state.proxy = proxy

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy.complete(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy.complete(request, "/v1/chat/completions")

    @app.get("/v1/models")
    async def models() -> Response:
        return await proxy.models()

    @app.get("/health")
    async def health() -> Response:
        return await proxy.health()

    if layerwise:

        @app.post(METASERVER_PATH)
        async def metaserver(request: Request) -> Response:
            return await proxy.metaserver(request)

    return app
