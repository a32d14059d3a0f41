"""`hanlm serve --engine vllm`: vLLM's OpenAI-compatible server on the Hugging Face folder, on a
CUDA host. vLLM runs as its own command (`python -m vllm.entrypoints.openai.api_server`), with
hanlm's gateway (chat page, defaults, request checks) given through its `--middleware` option and
its settings in the environment (hanlm.serve.gateway). vLLM measures a prompt against the
context itself (a 400 in OpenAI's shape), and answers several requests at once."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from hanlm import remote_code
from hanlm.errors import UserError
from hanlm.serve.gateway import API_KEY_ENV, SETTINGS_ENV

EXTRA = "hanlm[vllm]"
MAX_ANSWERS = 16  # `n` per request: vLLM samples them in one batch


def require() -> None:
    """vLLM and a CUDA device, or a UserError saying which is missing."""
    if importlib.util.find_spec("vllm") is None:
        raise UserError(
            "--engine vllm needs vLLM, which is not installed",
            fix=f"pip install '{EXTRA}' on a CUDA host, or serve on llama.cpp (the default)",
        )
    import torch  # deferred: seconds to import

    if not torch.cuda.is_available():
        raise UserError(
            "--engine vllm needs a CUDA GPU, and this machine has none that torch can use",
            fix="serve on llama.cpp (the default engine runs on CPU), or run this on a CUDA host",
        )


def command(folder: Path, name: str, host: str, port: int, api_key: str | None) -> list[str]:
    """vLLM's server for the exported folder (its chat template is the tokenizer's)."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder)]
    cmd += ["--served-model-name", name, "--host", host, "--port", str(port)]
    cmd += ["--middleware", "hanlm.serve.gateway.Gateway", "--generation-config", "vllm"]
    if api_key:
        cmd += ["--api-key", api_key]
    if remote_code.allowed():  # the recipe's model.trust_remote_code reaches vLLM too
        cmd += ["--trust-remote-code"]
    return cmd


def add_limits(settings: dict[str, Any], folder: Path) -> None:
    """The model's context and vocabulary (its config.json) into the gateway's limits."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    settings["limits"] |= {
        "context": int(config["max_position_embeddings"]),
        "vocab_size": int(config["vocab_size"]),
        "max_n": MAX_ANSWERS,
    }
    settings["engine_metrics"] = True  # vLLM's own Prometheus /metrics, behind the API key


def run(cmd: list[str], page: dict[str, Any], api_key: str | None) -> int:
    """Run vLLM's server until it ends or this command is stopped (SIGINT and SIGTERM are passed
    on, and it stops as vLLM does); 0 when stopped by a signal."""
    env = {**os.environ, SETTINGS_ENV: json.dumps(page)}
    if api_key:
        env[API_KEY_ENV] = api_key  # the gateway guards its own routes with it
    server = subprocess.Popen(cmd, env=env)
    stopped = []

    def forward(signum, frame):
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = server.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0 if stopped else code
