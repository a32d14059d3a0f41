"""hanlm's layer in front of an engine's OpenAI-compatible app, as ASGI middleware: added to
llama-cpp-python's FastAPI app in this process, and given to vLLM's server by its own
`--middleware` option (which builds it with no arguments: the settings then come from the
environment, HANLM_SERVE_PAGE, and the key from HANLM_API_KEY).

- GET / is the chat page (hanlm/serve/chat.html: plain HTML and script, no external assets, so it
  works offline), GET /hanlm/settings what it shows about the model and its limits, GET /health
  whether the server answers, GET /metrics the engine's own metrics where it has them (vLLM's),
  else hanlm's counters (hanlm/serve/metrics.py; llama-cpp-python's server has none).
- An API key, when set, guards every route but the page (which never holds the key: the user
  types it, and it stays in the tab's session storage).
- A completion request is read within [serve] body_timeout_s and max_body_bytes, checked
  (hanlm/serve/requests.py), measured against the context where the engine can count its prompt,
  and given the run's value for each sampling field it leaves out; whatever the server cannot
  take is answered here with a 4xx and OpenAI's error body, never passed on to fail in the engine.
- The engine's own error answers (FastAPI's `{"detail": ...}`) are rewritten into OpenAI's shape.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import time
from collections.abc import Callable
from importlib.resources import files
from typing import Any

import anyio

from hanlm.serve import requests
from hanlm.serve.metrics import ServerMetrics
from hanlm.serve.requests import RequestError

SETTINGS_ENV = "HANLM_SERVE_PAGE"
API_KEY_ENV = "HANLM_API_KEY"
PAGE, SETTINGS, HEALTH, METRICS, MODELS = (
    "/",
    "/hanlm/settings",
    "/health",
    "/metrics",
    "/v1/models",
)
GET_ROUTES = (PAGE, SETTINGS, HEALTH, METRICS, MODELS)
NOTE_HEADER = b"x-hanlm-note"
INLINE_COUNT_BYTES = 16 << 10  # a body up to this size has its prompt counted on the event loop
DRAIN_AT_MOST = 16  # a body this many times the limit is refused without being read
_USAGE_SCAN_BYTES = 1 << 20  # a non-streamed answer is read for its usage up to this size

# (route, request) -> the prompt's length in tokens, as the engine will count it
PromptCounter = Callable[[str, dict[str, Any]], int]


class Gateway:
    """`settings`: {"model", "engine", "defaults" (request fields), "notes", "api_key" (bool),
    "limits" (hanlm.serve.requests.Limits' fields), "body_timeout_s", "max_body_bytes", and
    "engine_metrics" (true: /metrics is the engine's)}."""

    def __init__(
        self,
        app,
        settings: dict[str, Any] | None = None,
        *,
        api_key: str | None = None,
        count_prompt: PromptCounter | None = None,
    ):
        self.app = app
        self.settings = settings if settings is not None else json.loads(os.environ[SETTINGS_ENV])
        self.api_key = (api_key or os.environ.get(API_KEY_ENV) or "").encode() or None
        self.count_prompt = count_prompt
        self.limits = requests.Limits(**self.settings["limits"])
        self.page = (files("hanlm.serve") / "chat.html").read_bytes()
        self.about = json.dumps(self.settings, ensure_ascii=False).encode()
        self.metrics = ServerMetrics()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        route = path if path in (*GET_ROUTES, *requests.ROUTES) else "other"
        answer = _Answer(send, self.metrics)
        started = time.perf_counter()
        self.metrics.started()
        try:
            await self._route(scope, receive, answer)
        except anyio.get_cancelled_exc_class():
            # uvicorn cancels what still runs once a stop's grace period is over: the client is
            # told, and the request ends here (not as a traceback in the server's log)
            if not answer.began:
                with contextlib.suppress(Exception):
                    await answer.error(RequestError(
                        503, "the server stopped before answering", type="server_error",
                        code="server_stopped"))  # fmt: skip
        except Exception as e:  # the engine failed: one line, and an answer if none began
            from hanlm.console import warn  # deferred: rich

            warn(f"serve: {scope['method']} {path} failed in the engine: {type(e).__name__}: {e}")
            if not answer.began:
                await answer.error(RequestError(500, "the engine failed", type="server_error"))
        finally:
            self.metrics.finished(route, answer.status, time.perf_counter() - started)

    async def _route(self, scope, receive, answer: _Answer) -> None:
        method, path = scope["method"], scope["path"]
        if path == PAGE:
            return await self._get_only(method, answer, self.page, "text/html; charset=utf-8")
        if self.api_key is not None and not self._authorised(scope):
            return await answer.error(
                RequestError(401, "this server needs its API key: send it as a Bearer token "
                             "(Authorization: Bearer KEY)", code="invalid_api_key"),
                headers=[(b"www-authenticate", b"Bearer")],
            )  # fmt: skip
        if path == SETTINGS:
            return await self._get_only(method, answer, self.about, "application/json")
        if path == HEALTH:
            return await self._get_only(method, answer, b'{"status":"ok"}', "application/json")
        if path == METRICS and not self.settings.get("engine_metrics"):
            body = self.metrics.render()
            return await self._get_only(method, answer, body, "text/plain; version=0.0.4")
        if path in requests.ROUTES:
            if method != "POST":
                return await answer.error(_not_allowed(method, path, "POST"), headers=[_ALLOW_POST])
            return await self._completion(scope, receive, answer)
        if path == MODELS and method != "GET":
            return await answer.error(_not_allowed(method, path, "GET"), headers=[_ALLOW_GET])
        return await self.app(scope, receive, answer.send)

    async def _get_only(self, method: str, answer: _Answer, body: bytes, content_type: str):
        if method not in ("GET", "HEAD"):
            return await answer.error(
                _not_allowed(method, "this route", "GET"), headers=[_ALLOW_GET]
            )
        await answer.respond(200, body if method == "GET" else b"", content_type)

    def _authorised(self, scope) -> bool:
        given = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key)

    async def _completion(self, scope, receive, answer: _Answer) -> None:
        path = scope["path"]
        try:
            body = await self._read_body(scope, receive)
            if body is None:
                return  # the client went away while sending: nobody to answer
            request = requests.parse(body)
            requests.check(path, request, self.limits)
            request = {**self.settings["defaults"], **request}
            note = await self._fit_context(path, request, inline=len(body) <= INLINE_COUNT_BYTES)
        except RequestError as e:
            return await answer.error(e)
        if note:
            answer.extra_headers.append((NOTE_HEADER, note.encode("ascii", "replace")))
        body = json.dumps(request, ensure_ascii=False).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        message = {"type": "http.request", "body": body, "more_body": False}
        await self.app({**scope, "headers": headers}, _replay(message, receive), answer.send)

    async def _read_body(self, scope, receive) -> bytes | None:
        """The request's body, or a RequestError when it is too large or too slow. A body over
        the limit is read to its end and dropped before the 413 (a client that is still sending
        would otherwise see its connection reset instead of the answer), unless it declares
        itself larger than DRAIN_AT_MOST times the limit."""
        limit = self.settings["max_body_bytes"]
        declared = dict(scope["headers"]).get(b"content-length")
        declared = int(declared) if declared is not None and declared.isdigit() else None
        if declared is not None and declared > DRAIN_AT_MOST * limit:
            raise _too_large(declared, limit)
        chunks, size = [], 0
        try:
            with anyio.fail_after(self.settings["body_timeout_s"]):
                while True:
                    message = await receive()
                    if message["type"] != "http.request":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size <= limit:
                        chunks.append(chunk)
                    elif size > DRAIN_AT_MOST * limit:
                        raise _too_large(size, limit)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestError(
                408, f"the request body did not arrive within {self.settings['body_timeout_s']:g} "
                "s", code="request_timeout",
            ) from None  # fmt: skip
        if size > limit:
            raise _too_large(size, limit)
        return b"".join(chunks)

    async def _fit_context(self, path: str, request: dict[str, Any], *, inline: bool) -> str | None:
        """Refuse a prompt the context cannot hold; lower max_tokens to what is left of the
        context when it asks for more (said in the answer's x-hanlm-note header). A small
        request is counted here (tens of microseconds), a large one on a worker thread."""
        if self.count_prompt is None:
            return None  # the engine measures it itself (vLLM answers 400)
        try:
            if inline:
                prompt = self.count_prompt(path, request)
            else:
                prompt = await anyio.to_thread.run_sync(self.count_prompt, path, request)
        except Exception as e:  # the chat template refused the conversation
            raise RequestError(
                400, f"the chat template could not render these messages: {e}", param="messages"
            ) from None
        context = self.limits.context
        if prompt >= context:
            raise RequestError(
                400, f"this model's maximum context length is {context} tokens, and the "
                f"{'messages take' if path == requests.CHAT else 'prompt takes'} {prompt}: shorten "
                "them", param="messages" if path == requests.CHAT else "prompt",
                code="context_length_exceeded",
            )  # fmt: skip
        key = "max_completion_tokens" if request.get("max_completion_tokens") else "max_tokens"
        wanted = request.get(key) or context
        if prompt + wanted <= context:
            return None
        request[key] = context - prompt
        return (
            f"{key} lowered from {wanted} to {context - prompt}: the prompt takes {prompt} of "
            f"the model's {context} tokens of context"
        )


class _Answer:
    """The response side of one request: what was sent (status, whether it began), error
    answers in OpenAI's shape, the engine's error answers rewritten into it, and the usage of
    answers counted into the metrics."""

    def __init__(self, send, metrics: ServerMetrics):
        self._send, self.metrics = send, metrics
        self.status, self.began = 0, False
        self.extra_headers: list[tuple[bytes, bytes]] = []
        self._held: dict | None = None  # an engine error's start, held until its body is read
        self._body: list[bytes] = []
        self._kind = ""  # "json" or "stream": an answer whose usage is counted

    async def respond(self, status: int, body: bytes, content_type: str, headers=()) -> None:
        await self.send({
            "type": "http.response.start", "status": status,
            "headers": [(b"content-type", content_type.encode()),
                        (b"content-length", str(len(body)).encode()),
                        (b"cache-control", b"no-store"), *headers],
        })  # fmt: skip
        await self.send({"type": "http.response.body", "body": body})

    async def error(self, e: RequestError, headers=()) -> None:
        body = json.dumps(e.body(), ensure_ascii=False).encode()
        await self.respond(e.status, body, "application/json", headers)

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status, self.began = message["status"], True
            headers = [*message.get("headers", []), *self.extra_headers]
            message = {**message, "headers": headers}
            content_type = dict(headers).get(b"content-type", b"")
            if self.status >= 400 and content_type.startswith(b"application/json"):
                self._held = message
                return
            if self.status == 200:
                self._kind = "stream" if content_type.startswith(b"text/event-stream") else (
                    "json" if content_type.startswith(b"application/json") else "")  # fmt: skip
        elif message["type"] == "http.response.body":
            chunk = message.get("body", b"")
            if self._held is not None:
                self._body.append(chunk)
                if not message.get("more_body", False):
                    await self._send_rewritten()
                return
            self._count_usage(chunk, done=not message.get("more_body", False))
        await self._send(message)

    async def _send_rewritten(self) -> None:
        """The engine's error answer, in OpenAI's shape if it was not."""
        start, raw = self._held, b"".join(self._body)
        self._held = None
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not (isinstance(body, dict) and isinstance(body.get("error"), dict)):
            detail = body.get("detail") if isinstance(body, dict) else None
            if isinstance(detail, list) and detail and isinstance(detail[0], dict):
                detail = detail[0].get("msg")
            kind = "server_error" if self.status >= 500 else requests.INVALID
            raw = json.dumps(RequestError(self.status, str(detail or raw.decode(errors="replace")),
                                          type=kind).body()).encode()  # fmt: skip
        headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": raw})

    def _count_usage(self, chunk: bytes, *, done: bool) -> None:
        if self._kind == "json":
            if sum(map(len, self._body)) < _USAGE_SCAN_BYTES:
                self._body.append(chunk)
            if done:
                self._usage_of(b"".join(self._body))
        elif self._kind == "stream" and b'"usage": {' in chunk:
            for line in chunk.split(b"\n"):
                if line.startswith(b"data: {") and b'"usage": {' in line:
                    self._usage_of(line[len(b"data: ") :])

    def _usage_of(self, raw: bytes) -> None:
        try:
            usage = json.loads(raw).get("usage")
        except (ValueError, AttributeError):
            return
        if isinstance(usage, dict):
            self.metrics.add_usage(usage)


_ALLOW_GET, _ALLOW_POST = (b"allow", b"GET, HEAD"), (b"allow", b"POST")


def _not_allowed(method: str, path: str, allowed: str) -> RequestError:
    return RequestError(
        405, f"{method} is not allowed on {path}: use {allowed}", code="method_not_allowed"
    )


def _too_large(size: int, limit: int) -> RequestError:
    return RequestError(
        413, f"the request body has {size:,} bytes; at most {limit:,} are taken (serve."
        "max_body_bytes)", code="request_too_large",
    )  # fmt: skip


def _replay(message: dict, receive):
    """A `receive` that gives `message`, then the server's own (which waits for the client to
    go away: a streamed answer stops when it does)."""
    pending = [message]

    async def replayed():
        if pending:
            return pending.pop()
        return await receive()

    return replayed
