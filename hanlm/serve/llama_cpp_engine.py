"""`hanlm serve` on llama.cpp: llama-cpp-python's OpenAI-compatible server (its FastAPI app, run
by uvicorn in this process) on a GGUF file, with hanlm's gateway in front (hanlm/serve/gateway.py).

The chat template is the one the GGUF carries (hanlm's export writes it from the tokenizer), and
generation stops at the file's end-of-turn token. The repetition window is the whole context, as
in `hanlm generate` (llama.cpp's default is the last 64 tokens). llama-cpp-python answers one
request at a time (it has no parallel slots): the others wait in its queue, none is dropped or
cut short, and a streamed answer whose client goes away stops after its next token."""

from __future__ import annotations

import contextlib
import io
import socket
from pathlib import Path
from typing import Any

from hanlm.errors import UserError
from hanlm.serve.gateway import Gateway
from hanlm.serve.requests import CHAT

EXTRA = "hanlm[serve]"
MAX_ANSWERS = 1  # llama-cpp-python's server answers `n` with one choice


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


def model_limits(gguf: Path) -> tuple[int, int]:
    """(the context the model was trained for, its vocabulary size), from the file's metadata."""
    from gguf import GGUFReader  # deferred: optional (hanlm[serve])

    reader = GGUFReader(str(gguf))
    context = vocab = None
    for name, field in reader.fields.items():
        if name.endswith(".context_length"):
            context = int(field.contents())
        elif name == "tokenizer.ggml.tokens":
            vocab = len(field.data)
    if context is None or vocab is None:
        raise UserError(
            f"{gguf} gives no context length or vocabulary", fix="export it again with hanlm export"
        )
    return context, vocab


def prompt_counter(gguf: Path, cleanup: contextlib.ExitStack):
    """(route, request) -> the prompt's tokens as the engine will count them: the chat template
    of the file rendered as llama-cpp-python renders it, tokenized by a vocabulary-only copy of
    the model (milliseconds; it never waits for the engine's queue), closed by `cleanup`."""
    import llama_cpp  # deferred: the optional engine
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    # A vocabulary-only model warns that it has no training context (which means nothing
    # here), through llama-cpp-python's log, which writes to sys.stderr.
    with contextlib.redirect_stderr(io.StringIO()):
        vocab = llama_cpp.Llama(str(gguf), vocab_only=True, verbose=False)
    cleanup.callback(vocab.close)  # before the interpreter's teardown, which it would fail in
    template = vocab.metadata.get("tokenizer.chat_template")

    def text_of(token: int) -> str:
        return vocab.detokenize([token], special=True).decode("utf-8") if token != -1 else ""

    formatter = None
    if template is not None:
        eos, bos = text_of(vocab.token_eos()), text_of(vocab.token_bos())
        formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)

    def count(route: str, request: dict[str, Any]) -> int:
        if route == CHAT:
            if formatter is None:
                return 0  # no template: llama-cpp-python refuses the chat itself
            rendered = formatter(messages=request["messages"])
            return len(vocab.tokenize(rendered.prompt.encode("utf-8"),
                                      add_bos=not rendered.added_special, special=True))  # fmt: skip
        return len(vocab.tokenize(request["prompt"].encode("utf-8"), add_bos=True, special=True))

    return count


def build_app(gguf: Path, name: str, settings: dict[str, Any], *, api_key: str | None,
              threads: int | None, cleanup: contextlib.ExitStack) -> Any:  # fmt: skip
    """The server's ASGI app, the model loaded; `settings` gets the model's limits."""
    from llama_cpp.server.app import create_app  # deferred: the optional engine
    from llama_cpp.server.settings import ModelSettings, ServerSettings

    n_ctx, vocab_size = model_limits(gguf)
    settings["limits"] |= {"context": n_ctx, "vocab_size": vocab_size, "max_n": MAX_ANSWERS}
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
    app.add_middleware(Gateway, settings=settings, api_key=api_key,
                       count_prompt=prompt_counter(gguf, cleanup))  # fmt: skip
    return app


def run(app: Any, listening: socket.socket, *, shutdown_s: float) -> None:
    """Serve until SIGINT or SIGTERM, on the socket already bound (so no other process can
    take the port between the check and the start); answers in flight get `shutdown_s` seconds
    to finish, then they are cancelled."""
    import uvicorn  # deferred: the engine's server, installed with it

    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=shutdown_s)
    uvicorn.Server(config).run(sockets=[listening])
