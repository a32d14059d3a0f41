"""The chat page and hanlm's request defaults, as ASGI middleware in front of an engine's
OpenAI-compatible app: added to llama-cpp-python's FastAPI app in this process, and given to
vLLM's server by its own `--middleware` option (which builds it with no arguments: the settings
then come from the environment, HANLM_SERVE_PAGE).

GET / is the page (hanlm/serve/chat.html: plain HTML and script, no external assets, so it works
offline), GET /hanlm/settings what it shows about the model and its settings, and a completion
request that leaves out a sampling field gets the run's value for it."""

from __future__ import annotations

import json
import os
from importlib.resources import files
from typing import Any

SETTINGS_ENV = "HANLM_SERVE_PAGE"
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")


class ChatPage:
    """`settings`: {"model", "engine", "defaults" (request fields), "notes", "api_key" (bool)}."""

    def __init__(self, app, settings: dict[str, Any] | None = None):
        self.app = app
        self.settings = settings if settings is not None else json.loads(os.environ[SETTINGS_ENV])
        self.page = (files("hanlm.serve") / "chat.html").read_bytes()
        self.about = json.dumps(self.settings, ensure_ascii=False).encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if method == "GET" and path == "/":
            return await _respond(send, self.page, "text/html; charset=utf-8")
        if method == "GET" and path == "/hanlm/settings":
            return await _respond(send, self.about, "application/json")
        if method == "POST" and path in COMPLETIONS:
            return await self._with_defaults(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _with_defaults(self, scope, receive, send):
        """The request with the run's value for each sampling field it leaves out; a body that
        is not a JSON object goes on as it came, for the engine to refuse."""
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if isinstance(request, dict):
            body = json.dumps({**self.settings["defaults"], **request}).encode()
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        scope = {**scope, "headers": headers}
        message = {"type": "http.request", "body": body}
        return await self.app(scope, _replay([message], receive), send)


def _replay(messages: list[dict], receive):
    """A `receive` that gives `messages`, then the server's own (which waits for the client to
    go away: a streamed answer stops when it does)."""
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _respond(send, body: bytes, content_type: str) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
