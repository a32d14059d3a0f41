"""`hanlm serve`'s pieces that need no engine: the [generate] settings as each engine's request
defaults, what an engine cannot do said, the gateway (the page, the routes it answers itself, the
API key, a request's missing fields filled and the rest left alone, what it refuses before the
engine, the engine's own errors put in OpenAI's shape, the counters), and vLLM's command line.
The gateway's engine here is an ASGI app that echoes what it got (tests/integration/test_serve.py
puts the real one behind it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hanlm import remote_code
from hanlm.config import GenerateSection, ServeSection
from hanlm.serve import REQUEST_LIMITS, gateway, settings, vllm_engine


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


def run_asgi(app, method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, bytes]:
    """One request through an ASGI app; the status and body it answered with."""
    sent, chunks = [], [{"type": "http.request", "body": body[:5], "more_body": True},
                        {"type": "http.request", "body": body[5:]}]  # fmt: skip

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path,
             "headers": [(b"content-length", str(len(body)).encode()), *headers]}  # fmt: skip
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


CAPS = ServeSection().model_dump(include=set(REQUEST_LIMITS))  # the [serve] defaults
LIMITS = {**CAPS, "model": "m", "context": 64, "vocab_size": 100, "max_n": 1, "max_messages": 3,
          "max_message_chars": 20, "max_total_chars": 40}  # fmt: skip
ABOUT = {"model": "m", "engine": "llama.cpp", "notes": [], "api_key": False,
         "defaults": {"temperature": 0.0, "max_tokens": 24}, "limits": LIMITS,
         "max_body_bytes": 16384, "body_timeout_s": 5.0}  # fmt: skip
HELLO = [{"role": "user", "content": "안녕"}]


def chat_body(**fields) -> bytes:
    return json.dumps({"messages": HELLO, **fields}).encode()


def test_the_gateway_serves_the_page_and_fills_only_missing_fields():
    app = gateway.Gateway(echo, settings=ABOUT)
    status, html = run_asgi(app, "GET", "/")
    assert status == 200 and b"<title>hanlm chat</title>" in html
    assert json.loads(run_asgi(app, "GET", "/hanlm/settings")[1]) == ABOUT
    answered = json.loads(run_asgi(app, "POST", "/v1/chat/completions", chat_body(max_tokens=5))[1])
    got = json.loads(answered["got"])
    assert got == {"temperature": 0.0, "max_tokens": 5, "messages": HELLO}  # the request's 5 kept
    assert answered["length"] == str(len(answered["got"].encode()))
    other = json.loads(run_asgi(app, "POST", "/v1/embeddings", chat_body())[1])
    assert json.loads(other["got"]) == {"messages": HELLO}  # not a completion: passed as it came
    assert run_asgi(app, "GET", "/health") == (200, b'{"status":"ok"}')


# (what is sent, the status, the error's code, its param): every one refused before the engine
REFUSED = [
    (b"", 400, "empty_body", None),
    (b"{not json", 400, "invalid_json", None),
    (b"\xff\xfe{}", 400, "invalid_utf8", None),
    (b"[" * 5000 + b"]" * 5000, 400, "invalid_json", None),
    (b'["messages"]', 400, "invalid_json", None),
    (
        b'{"messages": [{"role": "user", "content": "a"}], "temperature": NaN}',
        400,
        "invalid_json",
        None,
    ),
    (chat_body(messages=[]), 400, "invalid_value", "messages"),
    (chat_body(messages="hi"), 400, "invalid_type", "messages"),
    (
        chat_body(messages=[{"role": "robot", "content": "a"}]),
        400,
        "invalid_value",
        "messages[0].role",
    ),
    (chat_body(messages=[{"role": "user"}]), 400, "missing_required", "messages[0].content"),
    (
        chat_body(messages=[{"role": "user", "content": 3}]),
        400,
        "invalid_type",
        "messages[0].content",
    ),
    (
        chat_body(messages=[{"role": "user", "content": "a", "x": 1}]),
        400,
        "unknown_parameter",
        "messages[0].x",
    ),
    (chat_body(messages=HELLO * 4), 400, "too_many_messages", "messages"),
    (
        chat_body(messages=[{"role": "user", "content": "가" * 21}]),
        400,
        "too_long",
        "messages[0].content",
    ),
    (chat_body(messages=[{"role": "user", "content": "가" * 20}] * 3), 400, "too_long", "messages"),
    (
        json.dumps({"messages": HELLO, "colour": "blue"}).encode(),
        400,
        "unknown_parameter",
        "colour",
    ),
    (chat_body(model="gpt-4"), 404, "model_not_found", "model"),
    (chat_body(model=7), 400, "invalid_type", "model"),
    (chat_body(max_tokens=-1), 400, "invalid_value", "max_tokens"),
    (chat_body(max_tokens=10**12), 400, "invalid_value", "max_tokens"),
    (chat_body(max_tokens="5"), 400, "invalid_type", "max_tokens"),
    (chat_body(max_tokens=True), 400, "invalid_type", "max_tokens"),
    (chat_body(n=2), 400, "invalid_value", "n"),
    (chat_body(temperature=-0.5), 400, "invalid_value", "temperature"),
    (chat_body(temperature=1e308 * 10), 400, "invalid_json", None),  # json.dumps writes Infinity
    (chat_body(top_p=1.5), 400, "invalid_value", "top_p"),
    (chat_body(top_p=0), 400, "invalid_value", "top_p"),
    (chat_body(stop=["a", "b", "c", "d", "e"]), 400, "invalid_value", "stop"),
    (chat_body(stop="x" * 65), 400, "invalid_value", "stop"),
    (chat_body(stop=""), 400, "invalid_value", "stop"),
    (chat_body(logit_bias={str(i): 1 for i in range(301)}), 400, "invalid_value", "logit_bias"),
    (chat_body(logit_bias={"hello": 1}), 400, "invalid_value", "logit_bias"),
    (chat_body(logit_bias={"100": 1}), 400, "invalid_value", "logit_bias"),
    (chat_body(logit_bias={"5": 101}), 400, "invalid_value", "logit_bias"),
    (chat_body(stream="yes"), 400, "invalid_type", "stream"),
    (chat_body(stream_options={"include_usage": True}), 400, None, "stream_options"),
    (chat_body(seed=-2), 400, "invalid_value", "seed"),
    (b"x" * 20000, 413, "request_too_large", None),
]


def test_what_the_server_cannot_take_is_a_4xx_in_openais_shape_and_never_reaches_the_engine():
    reached = []

    async def engine(scope, receive, send):
        reached.append(scope["path"])
        await echo(scope, receive, send)

    app = gateway.Gateway(engine, settings=ABOUT)
    for body, status, code, param in REFUSED:
        got_status, got = run_asgi(app, "POST", "/v1/chat/completions", body)
        error = json.loads(got)["error"]
        assert (got_status, error["code"], error["param"]) == (status, code, param), (
            body[:80],
            error,
        )
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert reached == []
    prompt = json.dumps({"prompt": "x" * 41}).encode()
    status, got = run_asgi(app, "POST", "/v1/completions", prompt)
    assert status == 400 and json.loads(got)["error"]["param"] == "prompt"
    # a wrong method: 405 with what is allowed
    for method, path in (("GET", "/v1/chat/completions"), ("DELETE", "/v1/models"),
                         ("POST", "/"), ("PUT", "/metrics")):  # fmt: skip
        status, got = run_asgi(app, method, path)
        assert status == 405 and json.loads(got)["error"]["code"] == "method_not_allowed"
    assert reached == []
    assert json.loads(run_asgi(app, "POST", "/v1/completions", b'{"prompt": "a"}')[1])["got"]


def test_the_api_key_guards_every_route_but_the_page():
    app = gateway.Gateway(echo, settings={**ABOUT, "api_key": True}, api_key="sk-secret")
    status, html = run_asgi(app, "GET", "/")
    assert status == 200 and b"sk-secret" not in html
    for method, path, body in (("GET", "/hanlm/settings", b""), ("GET", "/health", b""),
                               ("GET", "/metrics", b""), ("GET", "/v1/models", b""),
                               ("POST", "/v1/chat/completions", chat_body())):  # fmt: skip
        for headers in (
            (),
            [(b"authorization", b"Bearer wrong")],
            [(b"authorization", b"sk-secret")],
        ):
            status, got = run_asgi(app, method, path, body, headers)
            assert status == 401, (path, headers)
            assert json.loads(got)["error"]["code"] == "invalid_api_key"
        key = [(b"authorization", b"Bearer sk-secret")]
        assert run_asgi(app, method, path, body, key)[0] == 200, path
    assert b"sk-secret" not in run_asgi(app, "GET", "/hanlm/settings", b"", key)[1]


def test_a_prompt_the_context_cannot_hold_is_refused_and_a_long_answer_is_shortened():
    counted = []

    def count(route, request):  # a token a character, as the engine's tokenizer would count
        counted.append(route)
        return sum(len(m["content"]) for m in request["messages"])

    sent = []

    async def engine(scope, receive, send):
        sent.append(json.loads((await receive())["body"]))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    app = gateway.Gateway(engine, settings=ABOUT, count_prompt=count)
    long_chat = [{"role": "user", "content": "가" * 20}] * 2 + [
        {"role": "assistant", "content": "나" * 20}
    ]
    status, got = run_asgi(app, "POST", "/v1/chat/completions", chat_body(messages=long_chat))
    assert status == 400, got  # 60 > 40 characters: refused by the character cap first
    status, got = run_asgi(app, "POST", "/v1/chat/completions", chat_body(
        messages=[{"role": "user", "content": "가" * 20}], max_tokens=60))  # fmt: skip
    assert status == 200 and sent[-1]["max_tokens"] == 44  # 20 + 44 = the context of 64
    shortened = gateway.Gateway(engine, settings={**ABOUT, "limits": {**LIMITS, "context": 16}},
                                count_prompt=count)  # fmt: skip
    status, got = run_asgi(shortened, "POST", "/v1/chat/completions", chat_body(
        messages=[{"role": "user", "content": "가" * 20}]))  # fmt: skip
    error = json.loads(got)["error"]
    assert status == 400 and error["code"] == "context_length_exceeded" and "16" in error["message"]


def test_the_engines_own_errors_come_back_in_openais_shape():
    async def engine(scope, receive, send):
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"22")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"detail":"Not Found"}'})

    status, got = run_asgi(gateway.Gateway(engine, settings=ABOUT), "GET", "/nothing")
    assert status == 404
    assert json.loads(got) == {"error": {"message": "Not Found", "type": "invalid_request_error",
                                         "param": None, "code": None}}  # fmt: skip


def test_the_counters_are_prometheus_text():
    async def engine(scope, receive, send):
        body = json.dumps({"usage": {"prompt_tokens": 7, "completion_tokens": 3}}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    app = gateway.Gateway(engine, settings=ABOUT)
    run_asgi(app, "POST", "/v1/chat/completions", chat_body())
    run_asgi(app, "POST", "/v1/chat/completions", b"nope")
    text = run_asgi(app, "GET", "/metrics")[1].decode()
    assert 'hanlm_requests_total{route="/v1/chat/completions",status="200"} 1' in text
    assert 'hanlm_requests_total{route="/v1/chat/completions",status="400"} 1' in text
    assert 'hanlm_tokens_total{kind="prompt"} 7' in text
    assert 'hanlm_tokens_total{kind="completion"} 3' in text
    assert 'hanlm_request_seconds_count{route="/v1/chat/completions"} 2' in text
    assert "hanlm_requests_in_flight 1" in text  # the /metrics request itself
    # an engine with metrics of its own (vLLM) answers /metrics itself
    engine_app = gateway.Gateway(echo, settings={**ABOUT, "engine_metrics": True})
    assert json.loads(run_asgi(engine_app, "GET", "/metrics")[1])["got"] == ""


def test_vllm_serves_the_folder_with_the_page_and_the_key():
    cmd = vllm_engine.command(Path("/runs/x/sft/hf"), "x-chat", "0.0.0.0", 8001, "sk-1")
    assert cmd[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
    flags = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert flags["--served-model-name"] == "x-chat" and flags["--port"] == "8001"
    assert flags["--middleware"] == "hanlm.serve.gateway.Gateway" and flags["--api-key"] == "sk-1"
    assert "--api-key" not in vllm_engine.command(Path("m"), "m", "127.0.0.1", 8000, None)
    assert "--trust-remote-code" not in cmd
    with remote_code.trusting(True):  # the recipe's model.trust_remote_code
        assert "--trust-remote-code" in vllm_engine.command(Path("m"), "m", "h", 1, None)
