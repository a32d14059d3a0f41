"""`hanlm serve`: the model behind an OpenAI-compatible API (/v1/models, /v1/completions,
/v1/chat/completions, streamed or not) and a chat page at /, on an existing engine: llama.cpp
(llama-cpp-python's server on the run's GGUF, exported when missing; CPU or GPU) by default, or
vLLM on the Hugging Face folder (CUDA). Requests that leave out a sampling setting get the run's
[generate] value; where an engine decodes otherwise than `hanlm generate`, it is said at start
and on the page.

Everything that can be refused is refused before anything starts: an address that needs an API
key, a missing or damaged model, the engine and its extra, a taken port."""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path

from hanlm.config import Config
from hanlm.console import info, warn
from hanlm.errors import UserError
from hanlm.serve import settings as serve_settings
from hanlm.serve.gateway import API_KEY_ENV
from hanlm.serve.target import Target, resolve

LOOPBACK = "127.0.0.1"
# the [serve] settings that bound one request (hanlm.serve.requests.Limits)
REQUEST_LIMITS = ("max_messages", "max_message_chars", "max_total_chars", "max_stop",
                  "max_stop_chars", "max_logit_bias")  # fmt: skip


def serve(
    target: Path | str,
    cfg: Config,
    *,
    engine: str,
    host: str = LOOPBACK,
    port: int = 8000,
    api_key: str | None = None,
    gguf_type: str = "f16",
    threads: int | None = None,
) -> int:
    """Serve `target` until SIGINT or SIGTERM; 0 once stopped."""
    if engine not in serve_settings.ENGINES:
        raise UserError(
            f"unknown engine {engine!r}", fix=f"use one of {', '.join(serve_settings.ENGINES)}"
        )
    api_key = api_key or os.environ.get(API_KEY_ENV) or None
    _check_exposure(host, api_key)
    model = resolve(target)
    engine_module = _engine(engine)
    engine_module.require()
    if engine == serve_settings.VLLM and model.folder is None:
        raise UserError(
            "vLLM serves a Hugging Face folder, not a GGUF file",
            where=str(model.gguf),
            fix="give the run or its exported folder (RUN/sft/hf), or serve the GGUF on llama.cpp",
        )
    listening = bind(host, port)  # held from here: the port is ours until the server stops
    limits = cfg.serve
    settings = {
        "model": model.name,
        "engine": engine,
        "defaults": serve_settings.request_defaults(cfg.generate, engine),
        "notes": serve_settings.engine_notes(cfg.generate, engine),
        "api_key": api_key is not None,
        "limits": {"model": model.name, **limits.model_dump(include=set(REQUEST_LIMITS))},
        "max_body_bytes": limits.max_body_bytes,
        "body_timeout_s": limits.body_timeout_s,
    }
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(listening.close)
        if engine == serve_settings.VLLM:
            port = listening.getsockname()[1]
            listening.close()  # vLLM binds it itself
            cmd = engine_module.command(model.folder, model.name, host, port, api_key)
            engine_module.add_limits(settings, model.folder)
            _announce(model, engine, host, port, settings)
            return engine_module.run(cmd, settings, api_key)
        gguf = _gguf(model, cfg, gguf_type, cleanup)
        app = engine_module.build_app(gguf, model.name, settings, api_key=api_key,
                                      threads=threads, cleanup=cleanup)  # fmt: skip
        _announce(model, engine, host, listening.getsockname()[1], settings)
        with _stop_quietly():
            engine_module.run(app, listening, shutdown_s=limits.shutdown_s)
    info("serve: stopped")
    _exit_if_engine_busy()
    return 0


def _exit_if_engine_busy() -> None:
    """End the process now when an engine thread still computes an answer its client will
    never get (uvicorn cancelled the request at the end of the grace period, but llama.cpp's
    generation cannot be interrupted from Python): exiting normally would wait for it, as long
    as a whole answer takes."""
    busy = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if busy:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _engine(name: str):
    """The engine's module, imported lazily: each names a library only it needs."""
    if name == serve_settings.VLLM:
        from hanlm.serve import vllm_engine  # deferred: one engine's module, not both

        return vllm_engine
    from hanlm.serve import llama_cpp_engine  # deferred: as above

    return llama_cpp_engine


def _check_exposure(host: str, api_key: str | None) -> None:
    """An address other machines can reach needs an API key."""
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost"
    if not local and not api_key:
        raise UserError(
            f"serving on {host} lets anyone who can reach this machine use the model, and it "
            "has no API key",
            fix=f"give one with --api-key KEY or the {API_KEY_ENV} environment variable "
            f"(clients send it as a Bearer token), or serve on {LOOPBACK}",
        )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or a UserError when it is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listening.bind((host, port))
        listening.listen(128)
    except OSError as e:
        listening.close()
        if e.errno == errno.EADDRINUSE:
            raise UserError(
                f"port {port} on {host} is taken by another program",
                fix="choose another with --port N (--port 0 picks a free one), or stop the "
                "program that holds it",
            ) from None
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror}", fix="check --host") from e
    listening.set_inheritable(False)
    return listening


def _gguf(model: Target, cfg: Config, gguf_type: str, cleanup: contextlib.ExitStack) -> Path:
    """The GGUF file to serve: the one given; a run's own (RUN/gguf/LABEL-TYPE.gguf), written
    when missing or older than the model; else one written for this server alone."""
    if model.gguf is not None:
        return model.gguf
    from hanlm.stages import export  # deferred: torch

    weights = model.folder / "model.safetensors"
    if model.run is not None:
        gguf = model.run.gguf / f"{model.label}-{gguf_type}.gguf"
        if gguf.is_file() and gguf.stat().st_mtime >= weights.stat().st_mtime:
            return gguf
        info(f"serve: writing {gguf} for llama.cpp")
        export.run_gguf(cfg, model.run, gguf_type=gguf_type, source=model.folder, out=gguf,
                        force=True)  # fmt: skip
        return gguf
    from hanlm.share import gguf as gguf_lib  # deferred: torch

    folder = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="hanlm-serve-")))
    gguf = folder / f"{model.name}-{gguf_type}.gguf"
    info(f"serve: writing a {gguf_type} GGUF of {model.folder} for llama.cpp (kept until it stops)")
    gguf_lib.write_gguf(model.folder, gguf, gguf_type=gguf_type, name=model.name)
    return gguf


def _announce(model: Target, engine: str, host: str, port: int, page: dict) -> None:
    from rich.markup import escape  # deferred: rich, as hanlm.console loads it

    where = f"[{host}]" if ":" in host else host
    url = escape(f"http://{where}:{port}")
    info(f"serve: {escape(model.name)} on {engine} at {url}/v1 (OpenAI API) and {url}/ (chat page)")
    shown = ", ".join(f"{k} {v}" for k, v in page["defaults"].items())
    info(escape(f"serve: defaults from [generate]: {shown}"))
    for note in page["notes"]:
        warn(escape(f"serve: {note}"))
    limits = page["limits"]
    info(f"serve: a request takes at most {page['max_body_bytes']:,} bytes, "
         f"{limits['max_messages']} messages of {limits['max_message_chars']:,} characters "
         f"({limits['max_total_chars']:,} together) and the model's {limits['context']:,} "
         f"tokens of context; health at {url}/health, counters at {url}/metrics")  # fmt: skip
    if page["api_key"]:
        info("serve: every route but the chat page needs the API key (Authorization: Bearer KEY)")
    info("serve: Ctrl-C stops it")


@contextlib.contextmanager
def _stop_quietly():
    """SIGINT and SIGTERM stop the server (uvicorn's handlers, which then raise the signal
    again for the handler found before them): that one only notes it, so the command ends
    with status 0 rather than as interrupted."""
    previous = {
        s: signal.signal(s, lambda signum, frame: None) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
