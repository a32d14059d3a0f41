"""`hanlm serve` on llama.cpp: llama-cpp-python's OpenAI-compatible server (its FastAPI app, run
by uvicorn in this process) on a GGUF file, with hanlm's chat page and defaults in front.

The chat template is the one the GGUF carries (hanlm's export writes it from the tokenizer), and
generation stops at the file's end-of-turn token. The repetition window is the whole context, as
in `hanlm generate` (llama.cpp's default is the last 64 tokens)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from hanlm.errors import UserError
from hanlm.serve.page import ChatPage

EXTRA = "hanlm[serve]"


def require() -> None:
    """llama-cpp-python with its server, or a UserError naming the extra."""
    try:
        import llama_cpp.server.app  # noqa: F401  (deferred: the optional engine, checked here)
    except ImportError as e:
        raise UserError(
            f"serving on llama.cpp needs llama-cpp-python with its server ({e})",
            fix=f"pip install '{EXTRA}' (llama-cpp-python builds llama.cpp from source: a few "
            "minutes), or --engine vllm on a CUDA host",
        ) from None


def context_length(gguf: Path) -> int:
    """The context the model was trained for, from the file's metadata."""
    from gguf import GGUFReader  # deferred: optional (hanlm[serve])

    reader = GGUFReader(str(gguf))
    for name, field in reader.fields.items():
        if name.endswith(".context_length"):
            return int(field.contents())
    raise UserError(f"{gguf} gives no context length", fix="export it again with hanlm export")


def build_app(gguf: Path, name: str, page: dict[str, Any], *, api_key: str | None,
              threads: int | None) -> Any:  # fmt: skip
    """The server's ASGI app, the model loaded."""
    from llama_cpp.server.app import create_app  # deferred: the optional engine
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    n_ctx = context_length(gguf)
    model = ModelSettings(
        model=str(gguf),
        model_alias=name,
        n_ctx=n_ctx,
        last_n_tokens_size=n_ctx,  # penalties look at every token seen, as hanlm generate's
        verbose=False,
        **({"n_threads": threads, "n_threads_batch": threads} if threads else {}),
    )
    # queue concurrent requests instead of cutting the one being answered short
    server = ServerSettings(api_key=api_key, interrupt_requests=False)
    app = create_app(server_settings=server, model_settings=[model])
    app.add_middleware(ChatPage, settings=page)
    return app


def run(app: Any, listening: socket.socket) -> None:
    """Serve until SIGINT or SIGTERM, on the socket already bound (so no other process can
    take the port between the check and the start)."""
    import uvicorn  # deferred: the engine's server, installed with it

    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    server.run(sockets=[listening])
