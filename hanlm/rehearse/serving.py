"""The rehearsal's last path: `hanlm serve` on the rehearsal's chat model (its GGUF written and
loaded by llama.cpp) answering one chat request over HTTP, as a user's client would send it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from hanlm import ranks
from hanlm.errors import UserError
from hanlm.stages.rundir import RunDir

START_S = 600  # writing the GGUF and loading it, on a slow host
ANSWER_TOKENS = 8


def unavailable() -> str | None:
    """Why `hanlm serve` cannot be rehearsed here (its engine is not installed), or None."""
    try:
        import llama_cpp.server.app  # noqa: F401  (deferred: the optional engine, checked here)
    except ImportError:
        return "llama-cpp-python is not installed (pip install 'hanlm[serve]')"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(port: int, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UserError(
                f"hanlm serve ended (exit {process.returncode}) before it listened",
                where=str(log),
                fix="read its log",
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise UserError(f"hanlm serve did not listen within {START_S} s", where=str(log))


def one_request(sub: RunDir) -> dict[str, Any]:
    """Start `hanlm serve` on the rehearsal's run, ask one chat completion, stop it: the
    seconds to listen and to answer, and the answer's tokens."""
    port = _free_port()
    log = sub.root / "serve.log"
    env = ranks.without_launch(dict(os.environ))
    command = [sys.executable, "-m", "hanlm", "serve", str(sub.root), "--port", str(port)]
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for(port, process, log)
        listening = time.perf_counter() - started
        body = {
            "messages": [{"role": "user", "content": "안녕하세요?"}],
            "max_tokens": ANSWER_TOKENS,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        asked = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=START_S) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, ValueError) as e:
            raise UserError(f"hanlm serve did not answer ({e})", where=str(log)) from None
        if not answer.get("choices"):
            raise UserError(f"hanlm serve answered without a choice: {answer}", where=str(log))
        return {
            "listen_s": listening,
            "answer_s": time.perf_counter() - asked,
            "answer_tokens": (answer.get("usage") or {}).get("completion_tokens"),
        }
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
