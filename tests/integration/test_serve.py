"""`hanlm serve` on llama.cpp (llama-cpp-python's server), called with the official `openai`
client: the model is listed; a chat completion is `hanlm generate --chat --greedy`'s answer on
the same prompt, streamed or not, and ends at the end-of-turn token; 8 requests sent together are
all answered with the one-client answer; the defaults are the [generate] settings; every request
the server cannot take is a 4xx in OpenAI's shape with no traceback, and the next good request is
answered; a client that goes away mid-stream frees the engine at once; SIGTERM with answers in
flight ends it with status 0 within its grace period; an address open to other machines needs
an API key, which guards every route but the page; SIGTERM and SIGINT stop it with status 0. Bad
inputs are refused before anything starts."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import TINY_PRETRAIN, trained_and_exported
from hanlm.config import GenerateSection

pytest.importorskip("llama_cpp.server.app", reason="llama-cpp-python's server: hanlm[serve]")
openai = pytest.importorskip("openai", reason="the openai client: scripts/setup.sh --dev")

PROMPT = "서울은 어디에 있나요?"
MAX_TOKENS = 24
# greedy, and no repetition penalty: llama.cpp's also lowers special tokens (said at start)
SETTINGS = {"generate.greedy": True, "generate.repetition_penalty": 1.0,
            "generate.max_new_tokens": MAX_TOKENS}  # fmt: skip
STARTED = re.compile(r"at (http://[^ ]+)/v1 ")


def settings_args(values: dict) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={json.dumps(v)}")]


@pytest.fixture(scope="module")
def model_dir(demo_run, tmp_path_factory) -> Path:
    """A tiny model trained a few steps on the demo world and exported (its tokenizer carries
    the chat template); what it says does not matter, only that both engines say the same."""
    values = {**TINY_PRETRAIN, "pretrain.max_steps": 40, "logging.eval_every": 0}
    return trained_and_exported(demo_run, tmp_path_factory.mktemp("serve") / "run", values)


@pytest.fixture(scope="module")
def gguf(model_dir, tmp_path_factory) -> Path:
    """The model as f32 GGUF: llama.cpp then computes what torch does, to the last digits."""
    from hanlm.share.gguf import write_gguf

    out = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(model_dir, out, gguf_type="f32", name="tiny")
    return out


@pytest.fixture(scope="module")
def reference(model_dir) -> dict:
    """`hanlm generate --chat --greedy` (and without --chat) on the prompt, in this process."""
    from hanlm.inference import generate, load

    loaded = load(model_dir, device="cpu")
    settings = GenerateSection(greedy=True, repetition_penalty=1.0, max_new_tokens=MAX_TOKENS)
    [chat] = generate(loaded, [PROMPT], settings, chat=True)
    [plain] = generate(loaded, [PROMPT], settings, chat=False)
    eot = loaded.tokenizer.convert_tokens_to_ids("<|eot|>")
    return {"chat": chat, "plain": plain, "eot": eot, "tokenizer": loaded.tokenizer}


class Server:
    """`hanlm serve ARGS` as a user starts it, on a free port; its output in a file."""

    def __init__(self, args: list[str], log: Path, env: dict | None = None):
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hanlm", "serve", "--port", "0", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "300", **(env or {})},
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = STARTED.search(self.output())
            if found:
                self.url = found.group(1)
                break
            assert self.proc.poll() is None, self.output()
            time.sleep(0.05)
        else:
            self.proc.kill()
            pytest.fail(f"hanlm serve did not start:\n{self.output()}")
        self.port = int(self.url.rsplit(":", 1)[1])
        try:
            self._wait_until_answering()
        except BaseException:  # a failed start leaves no server behind
            self.proc.kill()
            raise

    def _wait_until_answering(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # it answers (a 401 where it needs its API key)
            except OSError:
                time.sleep(0.05)
        pytest.fail(f"hanlm serve does not answer:\n{self.output()}")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def client(self, api_key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0)

    def stop(self, signum: int) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=90)  # a loaded machine: uvicorn drains connections first
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections linger
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def server(gguf, tmp_path_factory):
    """The GGUF served with greedy defaults; stopped at the end with SIGTERM, which must end it
    cleanly: status 0, the port given back."""
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    running = Server([str(gguf), *settings_args(SETTINGS), "--set", "serve.body_timeout_s=2"], log)
    yield running
    assert running.stop(signal.SIGTERM) == 0, running.output()[-3000:]
    assert "Traceback" not in running.output()
    assert port_is_free(running.port)


def chat(client, **extra):
    return client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], **extra
    )


def test_the_model_is_listed(server):
    assert [m.id for m in server.client().models.list()] == ["tiny"]


def test_a_chat_completion_is_hanlm_generates_greedy_answer(server, reference):
    """The same text from the same tokens (llama-cpp-python's API gives no ids: the count and the
    text together pin them), ending where hanlm's does and why."""
    answer = chat(server.client())
    want = reference["chat"]
    assert want["text"].strip(), "the tiny model should say something"
    assert answer.choices[0].message.content == want["text"]
    assert answer.usage.completion_tokens == len(want["token_ids"])
    assert answer.choices[0].finish_reason == want["finish_reason"]
    tokenizer = reference["tokenizer"]
    assert tokenizer.decode(want["token_ids"], skip_special_tokens=True) == want["text"]


def test_streaming_yields_the_same_text(server, reference):
    pieces = [
        chunk.choices[0].delta.content or ""
        for chunk in chat(server.client(), stream=True)
        if chunk.choices
    ]
    assert len([p for p in pieces if p]) > 1, "the answer should arrive piece by piece"
    assert "".join(pieces) == reference["chat"]["text"]


def test_an_answer_ends_at_the_end_of_turn_token(server, reference):
    """The end-of-turn token made the likeliest: the answer ends there, empty, as a stop."""
    answer = chat(server.client(), logit_bias={str(reference["eot"]): 100})
    assert answer.choices[0].message.content == ""
    assert answer.choices[0].finish_reason == "stop"
    assert "<|eot|>" not in (answer.choices[0].message.content or "")


def test_completions_continue_text_as_hanlm_generate_does(server, reference):
    answer = server.client().completions.create(model="tiny", prompt=PROMPT)
    assert answer.choices[0].text == reference["plain"]["text"]


def test_requests_sent_together_are_all_answered(server, reference):
    """8 clients at once: llama-cpp-python answers one at a time, the others wait; none is
    dropped, and each gets the answer one client alone gets."""
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: chat(server.client(), stream=False), range(8)))
    assert [a.choices[0].message.content for a in answers] == [reference["chat"]["text"]] * 8


def test_the_defaults_are_the_generate_settings_and_the_page_is_served(server):
    with urllib.request.urlopen(f"{server.url}/hanlm/settings") as response:
        about = json.load(response)
    assert about["model"] == "tiny" and about["engine"] == "llama.cpp"
    assert about["defaults"]["temperature"] == 0.0
    assert about["defaults"]["repeat_penalty"] == 1.0
    assert about["defaults"]["max_tokens"] == MAX_TOKENS
    with urllib.request.urlopen(f"{server.url}/") as response:
        page = response.read().decode()
    assert "<title>hanlm chat</title>" in page
    assert not re.search(r"(src|href)=\"https?:", page), "no external assets: works offline"


def post(url: str, body: bytes | None, method: str = "POST", headers: dict | None = None):
    """(status, parsed JSON body or None, headers) of one raw HTTP request."""
    request = urllib.request.Request(url, data=body, method=method,
                                     headers=headers or {"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as e:
        raw, status, got = e.read(), e.code, dict(e.headers)
    try:
        return status, json.loads(raw), got
    except ValueError:
        return status, None, got


def chat_json(**fields) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": PROMPT}], **fields}).encode()


# (what is sent, to where, how; the status and the error's code)
BAD_REQUESTS = [
    (b"", "/v1/chat/completions", "POST", 400, "empty_body"),
    (b'{"messages": [', "/v1/chat/completions", "POST", 400, "invalid_json"),
    (b"{'messages': []}", "/v1/chat/completions", "POST", 400, "invalid_json"),
    (
        b'{"messages": "' + bytes([0xFF, 0xFE]) + b'"}',
        "/v1/chat/completions",
        "POST",
        400,
        "invalid_utf8",
    ),
    (b"[" * 5000 + b"]" * 5000, "/v1/chat/completions", "POST", 400, "invalid_json"),
    (b"42", "/v1/chat/completions", "POST", 400, "invalid_json"),
    (chat_json(model="gpt-4o"), "/v1/chat/completions", "POST", 404, "model_not_found"),
    (chat_json(messages=[]), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (
        chat_json(messages=[{"role": "tool", "content": "x"}]),
        "/v1/chat/completions",
        "POST",
        400,
        "invalid_value",
    ),
    (
        chat_json(messages=[{"content": "x"}]),
        "/v1/chat/completions",
        "POST",
        400,
        "missing_required",
    ),
    (
        chat_json(messages=[{"role": "user", "content": ["x"]}]),
        "/v1/chat/completions",
        "POST",
        400,
        "invalid_type",
    ),
    (chat_json(max_tokens=-5), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (chat_json(max_tokens=1 << 40), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (chat_json(n=4), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (chat_json(temperature=7), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (
        chat_json().replace(b"}", b', "temperature": NaN}'),
        "/v1/chat/completions",
        "POST",
        400,
        "invalid_json",
    ),
    (chat_json(top_p=-1), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (chat_json(top_k="all"), "/v1/chat/completions", "POST", 400, "invalid_type"),
    (
        chat_json(stop=[str(i) for i in range(9)]),
        "/v1/chat/completions",
        "POST",
        400,
        "invalid_value",
    ),
    (chat_json(stop="끝" * 100), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (
        chat_json(logit_bias={str(i): 1 for i in range(5000)}),
        "/v1/chat/completions",
        "POST",
        400,
        "invalid_value",
    ),
    (chat_json(logit_bias={"99999999": 5}), "/v1/chat/completions", "POST", 400, "invalid_value"),
    (
        chat_json(tools=[{"type": "function"}]),
        "/v1/chat/completions",
        "POST",
        400,
        "unknown_parameter",
    ),
    (
        chat_json(messages=[{"role": "user", "content": "서울 " * 400}]),
        "/v1/chat/completions",
        "POST",
        400,
        "context_length_exceeded",
    ),
    (json.dumps({"prompt": 5}).encode(), "/v1/completions", "POST", 400, "invalid_type"),
    (
        json.dumps({"prompt": "서울 " * 400}).encode(),
        "/v1/completions",
        "POST",
        400,
        "context_length_exceeded",
    ),
    (b"{" + b" " * (2 << 20) + b"}", "/v1/chat/completions", "POST", 413, "request_too_large"),
    (None, "/v1/chat/completions", "GET", 405, "method_not_allowed"),
    (b"{}", "/v1/models", "POST", 405, "method_not_allowed"),
    (None, "/v2/nothing", "GET", 404, None),
]


def test_every_request_the_server_cannot_take_is_a_4xx_and_the_next_good_one_is_answered(
    server, reference
):
    for body, path, method, status, code in BAD_REQUESTS:
        got_status, got, _ = post(server.url + path, body, method)
        assert got_status == status, (path, (body or b"")[:60], got)
        assert set(got["error"]) == {"message", "type", "param", "code"}, got
        assert got["error"]["code"] == code and got["error"]["message"], got
        assert chat(server.client()).choices[0].message.content == reference["chat"]["text"]
    assert "Traceback" not in server.output() and "Exception" not in server.output()


def test_a_client_that_sends_slowly_blocks_no_one(server, reference):
    """One client sends half its headers and waits; another sends its body half and waits:
    others are answered meanwhile. The slow body gets a 408 once serve.body_timeout_s passes
    (set to 2 s for this server)."""
    host, port = "127.0.0.1", server.port
    slow_headers = socket.create_connection((host, port), timeout=30)
    slow_headers.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-")
    slow_body = socket.create_connection((host, port), timeout=30)
    body = chat_json()
    slow_body.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\n\r\n" + body[:10])  # fmt: skip
    try:
        started = time.perf_counter()
        assert chat(server.client()).choices[0].message.content == reference["chat"]["text"]
        assert time.perf_counter() - started < 10
        answer = b""  # waits for the timeout; the headers and the body may come apart
        while b'"code"' not in answer and (chunk := slow_body.recv(4096)):
            answer += chunk
        answer = answer.decode(errors="replace")
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert '"code": "request_timeout"' in answer
    finally:
        slow_headers.close()
        slow_body.close()
    assert chat(server.client()).choices[0].message.content == reference["chat"]["text"]


def test_a_long_answer_asked_for_is_shortened_to_the_context_and_said(server):
    status, got, headers = post(server.url + "/v1/chat/completions", chat_json(max_tokens=64))
    note = {k.lower(): v for k, v in headers.items()}.get("x-hanlm-note", "")
    assert status == 200 and "max_tokens lowered from 64 to" in note, (got, headers)
    assert got["usage"]["prompt_tokens"] + got["usage"]["completion_tokens"] <= 64


def test_health_and_counters(server):
    status, got, _ = post(server.url + "/health", None, "GET")
    assert status == 200 and got == {"status": "ok"}
    with urllib.request.urlopen(f"{server.url}/metrics") as response:
        text = response.read().decode()
    assert 'hanlm_requests_total{route="/v1/chat/completions",status="200"}' in text
    completion = re.search(r'hanlm_tokens_total\{kind="completion"\} (\d+)', text)
    assert completion and int(completion.group(1)) > 0


def test_an_open_address_needs_the_api_key_and_sigint_stops_it(model_dir, tmp_path):
    """On 0.0.0.0 with a key (from the environment). The folder is a run's model: its GGUF is
    written into the run, where `hanlm export --format gguf` puts it, since it was missing."""
    key = "sk-test-hanlm"
    run_dir = model_dir.parent.parent
    running = Server(
        [str(model_dir), "--host", "0.0.0.0", "--gguf-type", "f32"],
        tmp_path / "server.log",
        env={"HANLM_API_KEY": key},
    )
    try:
        assert "every route but the chat page needs the API key" in running.output()
        assert (run_dir / "gguf" / "base-f32.gguf").is_file(), running.output()
        with pytest.raises(openai.AuthenticationError):
            running.client("wrong").models.list()
        assert [m.id for m in running.client(key).models.list()] == [f"{run_dir.name}-base"]
        # every route but the page needs the key, and the page never holds it
        for route in ("/hanlm/settings", "/health", "/metrics"):
            status, got, _ = post(running.url + route, None, "GET")
            assert status == 401 and got["error"]["code"] == "invalid_api_key", route
            status, _, _ = post(
                running.url + route, None, "GET", {"Authorization": f"Bearer {key}"}
            )
            assert status == 200, route
        with urllib.request.urlopen(f"{running.url}/") as response:
            assert response.status == 200 and key.encode() not in response.read()
    finally:
        code = running.stop(signal.SIGINT)
    assert code == 0, running.output()[-3000:]
    assert "serve: stopped" in running.output() and "Traceback" not in running.output()


# --- a client that goes away, and a stop with answers in flight --------------------------------

LONG = 1500  # tokens of an answer that takes the engine a second or more


@pytest.fixture(scope="module")
def long_gguf(model_dir, tmp_path_factory) -> Path:
    """The tiny model with a 2,048-token context (its rotary positions go on past the 64 it was
    trained on), so that one answer can be long enough to be interrupted."""
    from hanlm.share.gguf import write_gguf

    folder = tmp_path_factory.mktemp("long") / "model"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    out = folder.parent / "long.gguf"
    write_gguf(folder, out, gguf_type="f32", name="long")
    return out


def long_answer(client, **extra):
    return client.chat.completions.create(
        model="long", messages=[{"role": "user", "content": PROMPT}], max_tokens=LONG,
        extra_body={"min_tokens": LONG}, **extra,
    )  # fmt: skip


def test_a_client_that_goes_away_mid_stream_frees_the_engine_at_once(long_gguf, tmp_path):
    import httpx

    running = Server([str(long_gguf), *settings_args(SETTINGS)], tmp_path / "server.log")
    try:
        client = running.client()
        started = time.perf_counter()
        assert long_answer(client).usage.completion_tokens == LONG
        whole = time.perf_counter() - started
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": LONG,
                "min_tokens": LONG, "stream": True}  # fmt: skip
        with (
            httpx.Client(timeout=60) as http,
            http.stream("POST", f"{running.url}/v1/chat/completions", json=body) as streamed,
        ):
            pieces = 0
            for line in streamed.iter_lines():
                pieces += line.startswith("data:")
                if pieces == 3:
                    break  # and the connection closes
        started = time.perf_counter()
        short = client.chat.completions.create(  # waits behind the dropped stream for a token
            model="long", messages=[{"role": "user", "content": PROMPT}], max_tokens=8
        )
        waited = time.perf_counter() - started
        assert short.choices[0].message.content is not None
        assert waited < whole / 3, (waited, whole)
    finally:
        assert running.stop(signal.SIGTERM) == 0
    assert "Traceback" not in running.output()


def test_sigterm_with_answers_in_flight_ends_them_and_exits_0_within_its_grace(long_gguf, tmp_path):
    grace = 2.0
    running = Server([str(long_gguf), *settings_args(SETTINGS), "--set", f"serve.shutdown_s={grace}"],
                     tmp_path / "server.log")  # fmt: skip
    client = running.client()
    outcomes: list[str] = []

    def ask(stream: bool) -> None:
        try:
            if stream:
                outcomes.append(f"stream of {sum(1 for _ in long_answer(client, stream=True))}")
            else:
                outcomes.append(f"answer of {long_answer(client).usage.completion_tokens}")
        except openai.APIStatusError as e:
            outcomes.append(f"status {e.status_code}")
        except openai.APIConnectionError:
            outcomes.append("connection closed")

    with ThreadPoolExecutor(4) as pool:
        asked = [pool.submit(ask, i % 2 == 0) for i in range(4)]
        time.sleep(0.5)  # every request is in: one is being answered, three wait
        started = time.perf_counter()
        code = running.stop(signal.SIGTERM)
        took = time.perf_counter() - started
        for future in asked:
            future.result(timeout=60)
    assert code == 0, running.output()[-3000:]
    assert took < grace + 10, took  # the grace, then uvicorn's own stop (about 1.5 s here)
    assert len(outcomes) == 4, outcomes  # every client got an answer, an end or a close
    assert all(o.startswith(("answer", "stream", "status 503", "connection")) for o in outcomes), (
        outcomes
    )
    assert "Traceback" not in running.output() and "serve: stopped" in running.output()
    assert port_is_free(running.port)


# --- the chat page, in a browser --------------------------------------------------------------

ARTIFACTS = Path(
    os.environ.get("HANLM_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)


def test_the_chat_page_streams_a_korean_answer_in_a_browser(server, reference):
    """Headless Chromium (Debian's chromium and chromium-driver) on the page: a Korean message
    typed and sent, the answer arrives in pieces and is the API's; a new conversation clears it.
    The screenshot is kept in test-artifacts/."""
    pytest.importorskip("selenium", reason="selenium: scripts/setup.sh --dev")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("headless Chromium: apt-get install chromium chromium-driver")
    options = Options()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=900,700"):  # fmt: skip
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(driver), options=options)
    try:
        browser.get(f"{server.url}/")
        wait = WebDriverWait(browser, 60)
        wait.until(lambda b: "tiny on llama.cpp" in b.find_element(By.ID, "about").text)
        browser.find_element(By.ID, "message").send_keys(PROMPT)
        browser.find_element(By.ID, "send").click()
        turn = wait.until(
            lambda b: next(
                (t for t in b.find_elements(By.CSS_SELECTOR, ".turn.assistant")
                 if t.get_attribute("data-state") == "done"), None,
            )
        )  # fmt: skip
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "serve-chat-page.png"))
        assert browser.find_element(By.CSS_SELECTOR, ".turn.user").text == PROMPT
        assert turn.text == reference["chat"]["text"].strip()
        assert int(turn.get_attribute("data-pieces")) > 1  # it arrived piece by piece
        browser.find_element(By.ID, "new").click()
        assert browser.find_elements(By.CSS_SELECTOR, ".turn") == []
    finally:
        browser.quit()
    assert (ARTIFACTS / "serve-chat-page.png").stat().st_size > 1000


# --- refused before anything starts ------------------------------------------------------------


def test_bad_inputs_are_refused_and_nothing_starts(gguf, model_dir, tmp_path, cli, monkeypatch):
    monkeypatch.delenv("HANLM_API_KEY", raising=False)
    cases = []
    missing = cli("serve", tmp_path / "nope", "--port", "0")
    cases.append((missing, "no model at"))
    damaged = tmp_path / "damaged"
    shutil.copytree(model_dir, damaged)
    (damaged / "model.safetensors").write_bytes(b"\0" * 64)
    cases.append((cli("serve", damaged, "--port", "0"), "model.safetensors"))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    cases.append((cli("serve", not_gguf, "--port", "0"), "is not a GGUF file"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cases.append((cli("serve", gguf, "--port", port), f"port {port} on 127.0.0.1 is taken"))
    exposed = cli("serve", gguf, "--host", "0.0.0.0", "--port", "0")
    cases.append((exposed, "--api-key"))
    cases.append((cli("serve", gguf, "--engine", "tgi"), "unknown engine 'tgi'"))
    for result, needle in cases:
        assert result.code == 2, (needle, result.out, result.err)
        assert needle in result.err, (needle, result.err)
    assert port_is_free(port)  # given back, and nothing else took it


def test_a_missing_engine_names_its_extra(gguf, cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp.server.app", None)  # as if not installed
    result = cli("serve", gguf, "--port", "0")
    assert result.code == 2 and "hanlm[serve]" in result.err, result.err


def test_vllm_needs_its_extra_and_cuda(model_dir, cli, monkeypatch):
    import importlib.util

    import torch

    real_find_spec = importlib.util.find_spec
    installed = {"vllm": False}

    def find_spec(name, *args):
        if name == "vllm":
            return real_find_spec("json") if installed["vllm"] else None
        return real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    result = cli("serve", model_dir, "--engine", "vllm", "--port", "0")
    assert result.code == 2 and "hanlm[vllm]" in result.err, result.err
    installed["vllm"] = True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = cli("serve", model_dir, "--engine", "vllm", "--port", "0")
    assert result.code == 2 and "needs a CUDA GPU" in result.err, result.err
