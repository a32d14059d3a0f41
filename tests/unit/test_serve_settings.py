"""`hanlm serve`'s pieces that need no engine: the [generate] settings as each engine's request
defaults, what an engine cannot do said, the page middleware filling a request's missing fields
(and leaving the rest, and what is not JSON, alone), and vLLM's command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hanlm.config import GenerateSection
from hanlm.serve import page, settings, vllm_engine


def test_defaults_are_the_generate_settings_in_each_engines_fields():
    sampled = GenerateSection(temperature=0.6, top_k=0, top_p=0.9, repetition_penalty=1.2)
    llama = settings.request_defaults(sampled, settings.LLAMA_CPP)
    assert llama["temperature"] == 0.6 and llama["top_p"] == 0.9 and llama["top_k"] == 0
    assert llama["repeat_penalty"] == 1.2 and llama["max_tokens"] == 128
    assert "min_tokens" not in llama  # 0: the engine's own
    vllm = settings.request_defaults(sampled, settings.VLLM)
    assert vllm["repetition_penalty"] == 1.2 and vllm["top_k"] == -1  # vLLM's "no top-k"
    greedy = settings.request_defaults(GenerateSection(greedy=True, min_new_tokens=3), "vllm")
    assert greedy["temperature"] == 0.0 and "top_p" not in greedy and greedy["min_tokens"] == 3


def test_what_an_engine_cannot_do_is_said():
    notes = settings.engine_notes(GenerateSection(), settings.LLAMA_CPP)
    assert len(notes) == 1 and "also lower special tokens" in notes[0]
    assert settings.engine_notes(GenerateSection(repetition_penalty=1.0), "llama.cpp") == []
    odd = GenerateSection(no_repeat_ngram_size=3, frequency_penalty=0.5, exempt_common_words=True)
    said = " ".join(settings.engine_notes(odd, settings.LLAMA_CPP))
    assert "no_repeat_ngram_size = 3 is not applied" in said
    assert "prompt's tokens" in said and "common words" in said


def run_asgi(app, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request through an ASGI app; the status and body it answered with."""
    sent, chunks = [], [{"type": "http.request", "body": body[:5], "more_body": True},
                        {"type": "http.request", "body": body[5:]}]  # fmt: skip

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"content-length", str(len(body)).encode())]}  # fmt: skip
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


async def echo(scope, receive, send):
    """Stands in for the engine: answers with the request body it got and its length header."""
    got, more = b"", True
    while more:
        message = await receive()
        got, more = got + message.get("body", b""), message.get("more_body", False)
    length = dict(scope["headers"])[b"content-length"]
    body = json.dumps({"got": got.decode(), "length": length.decode()}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


def test_the_middleware_serves_the_page_and_fills_only_missing_fields():
    about = {"model": "m", "engine": "llama.cpp", "notes": [], "api_key": False,
             "defaults": {"temperature": 0.0, "max_tokens": 24}}  # fmt: skip
    app = page.ChatPage(echo, settings=about)
    status, html = run_asgi(app, "GET", "/")
    assert status == 200 and b"<title>hanlm chat</title>" in html
    assert json.loads(run_asgi(app, "GET", "/hanlm/settings")[1]) == about
    request = json.dumps({"messages": [], "max_tokens": 5}).encode()
    answered = json.loads(run_asgi(app, "POST", "/v1/chat/completions", request)[1])
    got = json.loads(answered["got"])
    assert got == {"temperature": 0.0, "max_tokens": 5, "messages": []}  # the request's 5 kept
    assert answered["length"] == str(len(answered["got"].encode()))
    untouched = json.loads(run_asgi(app, "POST", "/v1/chat/completions", b"not json")[1])
    assert untouched["got"] == "not json"  # for the engine to refuse
    other = json.loads(run_asgi(app, "POST", "/v1/embeddings", request)[1])
    assert json.loads(other["got"]) == {"messages": [], "max_tokens": 5}


def test_vllm_serves_the_folder_with_the_page_and_the_key():
    cmd = vllm_engine.command(Path("/runs/x/sft/hf"), "x-chat", "0.0.0.0", 8001, "sk-1")
    assert cmd[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags["--served-model-name"] == "x-chat" and flags["--port"] == "8001"
    assert flags["--middleware"] == "hanlm.serve.page.ChatPage" and flags["--api-key"] == "sk-1"
    assert "--api-key" not in vllm_engine.command(Path("m"), "m", "127.0.0.1", 8000, None)
